"""What the writer's per-flush checks cost against the sync they follow (docs/spool-format.md,
section 5: a segment deleted or a lock file deleted under a live writer).

Run: ``python3 benchmarks/writer_checks.py [--dir DIR] [--rounds N]``

After every sync the writer takes one ``fstat`` of its segment (a link count of 0: deleted
or replaced) and, at most every 0.1 s, one of a descriptor on its lock file. Both figures
come from the same run, on the same disk (a scratch folder under --dir, default the current
directory): the checks as the writer calls them, and a bare ``os.write`` + ``os.fdatasync``
of a 2 KB line, the cheapest durable append there is. Printed: each one's median time per
call over the rounds, and the ratio, the share of a bare append the checks add.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402


def _per_call(fn, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".", help="where the scratch folder goes (the disk to measure)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="writer-checks-", dir=args.dir))
    try:
        writer = SegmentWriter.create(scratch / "run", "bench")
        fd = os.open(scratch / "bare", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        line = b"x" * 2047 + b"\n"

        def bare() -> None:
            os.write(fd, line)
            os.fdatasync(fd)

        checks, syncs = [], []
        for _ in range(args.rounds):
            checks.append(_per_call(writer._file.check_names, 20_000))
            syncs.append(_per_call(bare, 200))
        writer.close()
        os.close(fd)
        check, sync = statistics.median(checks), statistics.median(syncs)
        print(f"checks per flush: {check * 1e6:.2f} us; bare 2 KB write+fdatasync: {sync * 1e6:.0f} us; "
              f"ratio {check / sync:.4f} (median of {args.rounds} rounds)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
