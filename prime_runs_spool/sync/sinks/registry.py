"""The sinks a state file may name: the built-in ones, and any registered beside them.

The state file records a run's sink by name (``store``) and announces a sink's batch under
that name (``InFlight.kind``), so reading a state must know every name without importing
any sink: this module imports nothing of sync but the names' definitions.
"""

from __future__ import annotations

from typing import Any

from prime_runs_spool.sync.options import SAMPLES, TRACES

#: The sinks this package ships, in the order ``auto`` tries them (docs/sync.md, "Sinks").
BUILT_IN = (TRACES, SAMPLES)

_registered: dict[str, Any] = {}


def register(sink: Any) -> Any:
    """Make ``sink`` (a :class:`~prime_runs_spool.sync.sinks.base.Sink` subclass) one a run
    can be synced to, under its ``name``: the built-in ones register themselves when their
    module is imported, another one (tests/support/memory_sink.py) the same way."""
    _registered[sink.name] = sink
    return sink


def is_sink(name: object) -> bool:
    """Whether a state file may name ``name`` as a run's sink."""
    return name in BUILT_IN or name in _registered


def known() -> tuple[str, ...]:
    """Every sink name, the built-in ones first."""
    return (*BUILT_IN, *(name for name in _registered if name not in BUILT_IN))


def sink_class(name: str) -> Any:
    """The class registered under ``name`` (the built-in ones once sinks.choice imported them)."""
    return _registered[name]
