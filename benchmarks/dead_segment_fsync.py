"""What a shipping read pays to fsync a dead writer's segment before reading it
(docs/spool-format.md, section 5, "Reading a dead writer's segment").

A writer killed between its write and its sync leaves lines only the page cache holds.
Sync makes them durable with one fsync on a read-only descriptor before it ships them.
This measures that fsync with 0 bytes to 1 MiB left dirty after a synced 64 KiB file,
as a killed writer leaves a segment, on the filesystem holding ``--dir``.

    python benchmarks/dead_segment_fsync.py [--dir DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def one(directory: str, dirty: int) -> float:
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        os.write(fd, os.urandom(64 * 1024))
        os.fsync(fd)
        if dirty:
            os.write(fd, b"x" * dirty)  # written, never synced: the writer was killed here
        os.close(fd)
        reader = os.open(path, os.O_RDONLY)
        try:
            start = time.perf_counter()
            os.fsync(reader)
            return time.perf_counter() - start
        finally:
            os.close(reader)
    finally:
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".", help="a folder on the filesystem to measure (default: here)")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    for dirty in (0, 4096, 64 * 1024, 1 << 20):
        times = [one(args.dir, dirty) for _ in range(args.rounds)]
        print(f"{dirty:>8} bytes dirty: median {statistics.median(times) * 1e3:.1f} ms, "
              f"p90 {statistics.quantiles(times, n=10)[-1] * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
