"""prime-runs-spool: an eval never loses an episode, and a sync never duplicates one.

The package is layered bottom-up; each layer only imports the ones below it:

1. ``framing``      – the byte format of one spool line (see docs/spool-format.md)
2. ``writer`` / ``reader`` – segment files: durable group-committed appends, streaming reads
3. ``masking`` / ``manifest`` / ``summary`` / ``projection`` – what a run carries
   ``run`` (with ``modes``, ``resume``) – the eval runner's API: ``open_run`` and ``Run``;
   ``integrations.verifiers`` adapts it to verifiers' ``EvalConfig``
4. ``client``       – the platform's HTTP API
5. ``sync``         – exactly-once shipping of spools to a platform

The command line (``commands/``) is a thin shell over these.
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
