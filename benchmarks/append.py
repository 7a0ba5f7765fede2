"""Append throughput of the spool writer against what the disk itself allows.

Run: ``python3 benchmarks/append.py [--dir DIR] [--quick] [--rounds N] [--seconds S]``

Each figure is measured in the same run, on the same disk (a scratch folder under --dir,
default the current directory; not /tmp if that is a tmpfs), with the same bytes:

* single: one appender, ``SegmentWriter.append`` per episode, against a bare loop of
  ``os.write`` + ``os.fdatasync`` of the same line, framing included, to a new file opened
  with the writer's flags (the writer syncs with fdatasync too: both pay for the same
  guarantee). The two take turns in blocks of 8 appends, so both see the same disk.
* grouped: 64 appender threads against the disk's grouped ceiling: one thread writing the
  same lines, 64 per ``writev`` and one fdatasync per 64.

On a shared machine the disk's sync latency drifts by a factor of two from one second to
the next, so each size is measured in N rounds; in a round the 64-thread spool and its
ceiling run right after each other (in alternating order from round to round), the single
appender and its bare loop in interleaved blocks; each round yields one ratio of each.
The table gives the median rates, the median ratio and the range of the N ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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


#: The flags the writer opens a segment with.
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


def single_pair(folder: Path, record: dict, line: bytes, seconds: float, block: int = 8) -> tuple[float, float]:
    """One appender: the bare loop and the spool, interleaved in blocks of ``block`` appends.

    The disk's sync latency drifts from one second to the next on a shared machine; blocks of
    a few milliseconds, taking turns (and turns at going first), see the same disk.
    """
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    writer = SegmentWriter.create(run_dir, "bench")
    fd = os.open(folder / "bare.jsonl", FLAGS, 0o600)
    bare_time = spool_time = 0.0
    count = 0
    deadline = time.perf_counter() + 2 * seconds
    try:
        while time.perf_counter() < deadline:
            for turn in ((0, 1) if count % (2 * block) == 0 else (1, 0)):
                start = time.perf_counter()
                if turn == 0:
                    for _ in range(block):
                        os.write(fd, line)
                        os.fdatasync(fd)
                    bare_time += time.perf_counter() - start
                else:
                    for _ in range(block):
                        writer.append("episode", record)
                    spool_time += time.perf_counter() - start
            count += block
    finally:
        os.close(fd)
        os.unlink(folder / "bare.jsonl")
        writer.close()
        shutil.rmtree(run_dir)
    return count / bare_time, count / spool_time


def bare_grouped(folder: Path, line: bytes, seconds: float) -> float:
    fd = os.open(folder / "bare.jsonl", FLAGS, 0o600)
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


def measure(folder: Path, size: int, seconds: float, rounds: int) -> tuple[list[tuple[float, float]], ...]:
    """``rounds`` pairs (baseline, spool) for one appender, then for 64 threads."""
    record = episode(size)
    line = encode_line(record, 12345, "episode")
    single: list[tuple[float, float]] = []
    grouped: list[tuple[float, float]] = []
    for n in range(rounds):
        single.append(single_pair(folder, record, line, seconds))
        if n % 2:  # alternate which goes first, so drift in the disk cancels out
            s = spool_run(folder, record, THREADS, seconds)
            b = bare_grouped(folder, line, seconds)
        else:
            b = bare_grouped(folder, line, seconds)
            s = spool_run(folder, record, THREADS, seconds)
        grouped.append((b, s))
    return single, grouped


def summary(pairs: list[tuple[float, float]]) -> str:
    ratios = [s / b for b, s in pairs]
    bare = statistics.median(b for b, _ in pairs)
    spool = statistics.median(s for _, s in pairs)
    return f"{bare:>9.0f} {spool:>9.0f} {statistics.median(ratios):>6.2f} {min(ratios):>5.2f}-{max(ratios):<5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 0.4 s phases (about 20 s in all)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per size (default 7, quick 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per phase (default 0.6, quick 0.4)")
    args = parser.parse_args()
    seconds = args.seconds or (0.4 if args.quick else 0.6)
    rounds = args.rounds or (3 if args.quick else 7)
    folder = Path(tempfile.mkdtemp(prefix="spool-bench-", dir=args.dir))
    try:
        print(f"scratch folder: {folder} ({os.cpu_count()} cores); appends per second, median of "
              f"{rounds} rounds of {seconds:g} s phases (2 MB: {2 * seconds:g} s); ratio: median and range over the rounds")
        print(f"{'episode':>8} | {'bare':>9} {'spool 1':>9} {'ratio':>6} {'range':>11} | "
              f"{'ceiling':>9} {'spool 64':>9} {'ratio':>6} {'range':>11}")
        for label, size in (("2 KB", 2_000), ("20 KB", 20_000), ("2 MB", 2_000_000)):
            # A 2 MB group of 64 takes about half a second to write: give those phases more time.
            single, grouped = measure(folder, size, seconds * (2 if size >= 1_000_000 else 1), rounds)
            print(f"{label:>8} | {summary(single)} | {summary(grouped)}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
