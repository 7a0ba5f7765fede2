"""A run's durable listeners: the eval's in-process consumers, told when there is more to read.

A listener hears after each durable append and after the seal, and reads the spool itself,
so it never sees anything that is not durable. Its failure is logged, never raised into the
eval: a dashboard must not stop the run it shows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from prime_runs_spool.runner.error_line import describe_error

_log = logging.getLogger("prime_runs_spool")

#: What a listener is told about: the run (runner/run.py), handed over as it is.
Subject = TypeVar("Subject")


class Listeners(Generic[Subject]):
    """The listeners of one run; safe to add to while appends are notifying.

    Held as a tuple that ``add`` replaces: a snapshot is the tuple itself, with no lock and
    no copy, which every append takes (usually of none)."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self._lock = threading.Lock()
        self._listeners: tuple[Callable[[Subject], None], ...] = ()

    def add(self, listener: Callable[[Subject], None]) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def snapshot(self) -> tuple[Callable[[Subject], None], ...]:
        """The listeners as they are now: taken under the run's lock, called outside it."""
        return self._listeners

    def notify(self, run: Subject, listeners: tuple[Callable[[Subject], None], ...]) -> None:
        for listener in listeners:
            try:
                listener(run)
            except Exception as exc:
                _log.warning("a durable-append listener of run %s failed: %s", self._run_id, describe_error(exc))
