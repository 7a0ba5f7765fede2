"""How far the durable mark trails a burst's last sync when the writer then falls silent
(it stays open): the time from the last append returning to the write that brings the mark
up to date, which is what a follower waits for (spool/durable_mark.py promises 10 ms).

Run: ``python3 benchmarks/durable_mark_trail.py [--rounds 100] [--burst 10] [--dir DIR]``

Each round appends ``--burst`` 2 KB episodes to one ``SegmentWriter`` (each one fsync'd),
then waits until the mark says all of it, then 30 ms more. Twice: in a quiet process, and
with one more Python thread that only counts (an eval's own CPU-bound Python: the
publisher thread must then wait for the GIL, ``sys.getswitchinterval()``, before it can
write). The write's time is taken inside the mark's ``pwrite``, so the measuring thread's
own wait for the GIL does not count. Wall clock: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prime_runs_spool.spool import durable_mark as mark_module  # noqa: E402
from prime_runs_spool.spool.durable_mark import durable_mark  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402

written: dict[int, float] = {}
_real_pwrite = mark_module._pwrite


def _timed_pwrite(fd: int, data: bytes, offset: int) -> int:
    written[int(data)] = time.monotonic()  # before the call: the reader may see it at once
    return _real_pwrite(fd, data, offset)


def trail(folder: Path, rounds: int, burst: int) -> list[float]:
    writer = SegmentWriter.create(folder, "trail")
    delays = []
    try:
        for r in range(rounds):
            for n in range(burst):
                writer.append("episode", {"id": f"{r}-{n}", "pad": "x" * 2000})
            end = time.monotonic()
            size = writer.path.stat().st_size
            while durable_mark(writer.path) != size:
                time.sleep(0.0002)
            delays.append(written[size] - end)
            time.sleep(0.03)
    finally:
        writer.close()
    return delays


def _count(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    args = parser.parse_args()
    mark_module._pwrite = _timed_pwrite
    scratch = Path(tempfile.mkdtemp(prefix="mark-trail-", dir=args.dir))
    try:
        for label, busy in (("quiet process", False), ("one CPU-bound thread", True)):
            stop = threading.Event()
            counter = threading.Thread(target=_count, args=(stop,), daemon=True)
            if busy:
                counter.start()
            try:
                delays = sorted(trail(scratch / label.replace(" ", "-"), args.rounds, args.burst))
            finally:
                stop.set()
            p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
            print(f"{label}: p50 {statistics.median(delays) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
                  f"max {delays[-1] * 1e3:.1f} ms")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
