"""prime-runs-spool: an eval never loses an episode, and a sync never duplicates one.

The package is layered bottom-up; each layer only imports the ones before it
(docs/architecture.md, checked by tests/test_architecture.py):

1. ``errors``         – every exception, one tree under ``SpoolError``
2. ``spool``          – the on-disk format and files: durable appends, streaming reads
3. ``content``        – what a run carries: masking, manifest, summary, episode numbering
4. ``platform_api``   – the real platform's contract: settings, client, v0 wire format
5. ``sync``           – exactly-once shipping of spools to a platform
6. ``runner``         – the eval runner's API: ``open_run`` and ``Run``, the verifiers
                        adapter, the online shipper
7. ``local_platform`` – the evaluations API on SQLite, for tests and ``--local``

The command line (``commands/``) is a thin shell over these. This module re-exports the
public API.
"""

from prime_runs_spool._version import __version__
from prime_runs_spool.errors import RunClosedError
from prime_runs_spool.spool.reader import Position, Record, SegmentInfo, Spool, iter_records, read_run, scan_segment
from prime_runs_spool.runner.run import Run, open_run
from prime_runs_spool.spool.writer import SegmentWriter

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
    "scan_segment",
]
