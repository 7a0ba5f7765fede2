"""Append throughput of the spool writer against what the disk itself allows.

Run: ``python3 benchmarks/append.py [--dir DIR] [--quick] [--seconds S]``

Each figure is measured in the same run, on the same disk (a scratch folder under --dir,
default the current directory; not /tmp, which may be a tmpfs), with the same bytes:

* single: one appender, ``SegmentWriter.append`` per episode, against a bare loop of
  ``os.write`` + ``os.fdatasync`` of the already-serialized line (the writer syncs with
  fdatasync too, so both pay for the same guarantee).
* grouped: 64 appender threads against the disk's grouped ceiling: one thread writing the
  same pre-serialized lines, 64 per ``writev`` and one fdatasync per 64.

Phases alternate (baseline, spool, baseline, spool) so drift in the disk affects both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prime_runs_spool.framing import encode_line  # noqa: E402
from prime_runs_spool.writer import SegmentWriter  # noqa: E402

THREADS = 64


def episode(size: int) -> dict:
    """An episode-shaped record whose serialized size is about ``size`` bytes."""
    return {
        "example_id": 17,
        "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
        "completion": [{"role": "assistant", "content": "w" * max(0, size - 200)}],
        "reward": 1.0,
        "metrics": {"correct": 1.0},
    }


def bare_single(folder: Path, line: bytes, seconds: float) -> float:
    fd = os.open(folder / "bare.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    count, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.write(fd, line)
            os.fdatasync(fd)
            count += 1
    finally:
        os.close(fd)
        os.unlink(folder / "bare.jsonl")
    return count / (time.perf_counter() - start)


def bare_grouped(folder: Path, line: bytes, seconds: float) -> float:
    fd = os.open(folder / "bare.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    group = [line] * THREADS
    count, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.writev(fd, group)
            os.fdatasync(fd)
            count += THREADS
    finally:
        os.close(fd)
        os.unlink(folder / "bare.jsonl")
    return count / (time.perf_counter() - start)


def spool_run(folder: Path, record: dict, threads: int, seconds: float) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    writer = SegmentWriter.create(run_dir, "bench")
    counts = [0] * threads
    deadline = time.perf_counter() + seconds

    def work(t: int) -> None:
        while time.perf_counter() < deadline:
            writer.append("episode", record)
            counts[t] += 1

    start = time.perf_counter()
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    writer.close()
    shutil.rmtree(run_dir)
    return sum(counts) / elapsed


def measure(folder: Path, size: int, seconds: float) -> tuple[float, float, float, float]:
    record = episode(size)
    line = encode_line(record, 12345, "episode")
    bare1 = spool1 = bareg = spoolg = 0.0
    for _ in range(2):  # alternate, and sum both rounds
        bare1 += bare_single(folder, line, seconds / 2)
        spool1 += spool_run(folder, record, 1, seconds / 2)
        bareg += bare_grouped(folder, line, seconds / 2)
        spoolg += spool_run(folder, record, THREADS, seconds / 2)
    return bare1 / 2, spool1 / 2, bareg / 2, spoolg / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    parser.add_argument("--quick", action="store_true", help="shorter phases (about 12 s in all)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per measurement (default 4, quick 1)")
    args = parser.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 4.0)
    folder = Path(tempfile.mkdtemp(prefix="spool-bench-", dir=args.dir))
    try:
        print(f"scratch folder: {folder} ({os.cpu_count()} cores); appends per second, {seconds:g} s per figure")
        print(f"{'episode':>8} | {'bare write+fdatasync':>20} {'spool, 1 appender':>18} {'ratio':>6} | "
              f"{'grouped ceiling':>15} {'spool, 64 threads':>18} {'ratio':>6}")
        for label, size in (("2 KB", 2_000), ("20 KB", 20_000), ("2 MB", 2_000_000)):
            bare1, spool1, bareg, spoolg = measure(folder, size, seconds)
            print(f"{label:>8} | {bare1:>20.0f} {spool1:>18.0f} {spool1 / bare1:>6.2f} | "
                  f"{bareg:>15.0f} {spoolg:>18.0f} {spoolg / bareg:>6.2f}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
