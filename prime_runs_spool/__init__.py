"""prime-runs-spool: an eval never loses an episode, and a sync never duplicates one.

The package is layered bottom-up, each layer importing only the ones below it: the list
and the rules are in docs/architecture.md, and tests/test_architecture.py holds them too and
checks them.

The command line (``commands/``) is a thin shell over these. This module re-exports the
public API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prime_runs_spool._version import __version__

#: Where each public name lives. Loaded on first use (PEP 562), so that importing one layer
#: (``prime_runs_spool.sync.state``, say) does not import the runner and everything under it:
#: a command's start-up costs only what that command uses.
_EXPORTS = {
    "Position": "prime_runs_spool.spool.reader",
    "Record": "prime_runs_spool.spool.reader",
    "SegmentInfo": "prime_runs_spool.spool.scan",
    "Spool": "prime_runs_spool.spool.scan",
    "iter_records": "prime_runs_spool.spool.reader",
    "read_run": "prime_runs_spool.spool.scan",
    "scan_segment": "prime_runs_spool.spool.scan",
    "SegmentWriter": "prime_runs_spool.spool.writer",
    "RunClosedError": "prime_runs_spool.errors",
    "Run": "prime_runs_spool.runner.run",
    "open_run": "prime_runs_spool.runner.run",
    "samples_df": "prime_runs_spool.export.tables",
    "runs_df": "prime_runs_spool.export.tables",
}

if TYPE_CHECKING:
    from prime_runs_spool.errors import RunClosedError
    from prime_runs_spool.export.tables import runs_df, samples_df
    from prime_runs_spool.runner.run import Run, open_run
    from prime_runs_spool.spool.reader import Position, Record, iter_records
    from prime_runs_spool.spool.scan import SegmentInfo, Spool, read_run, scan_segment
    from prime_runs_spool.spool.writer import SegmentWriter


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prime_runs_spool' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Position",
    "Record",
    "Run",
    "RunClosedError",
    "SegmentInfo",
    "SegmentWriter",
    "Spool",
    "__version__",
    "iter_records",
    "open_run",
    "read_run",
    "runs_df",
    "samples_df",
    "scan_segment",
]
