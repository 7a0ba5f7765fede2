"""Append throughput of the spool writer against what the disk itself allows.

Run: ``python3 benchmarks/append.py [--dir DIR] [--quick] [--rounds N] [--seconds S] [--cpu N] [--sync-delay MS]``

Each figure is measured in the same run, on the same disk (a scratch folder under --dir,
default the current directory; not /tmp if that is a tmpfs), with the same bytes:

* single: one appender, ``SegmentWriter.append`` per episode, against a bare loop of
  ``os.write`` + ``os.fdatasync`` of the same line, framing included, to a new file opened
  with the writer's flags (the writer syncs with fdatasync too: both pay for the same
  guarantee). The two take turns in blocks of 8 appends, so both see the same disk.
* grouped: against the disk's grouped ceiling, one thread writing the same lines, 64 per
  ``writev`` and one fdatasync per 64: 64 appender threads; the leanest threaded group
  commit (the same lines pre-serialized, see ``lean_grouped``), the floor for any threaded
  writer on this machine; 64 asyncio tasks awaiting ``append_async``.

On a shared machine the disk's sync latency drifts by a factor of two from one second to
the next, so each size is measured in N rounds; in a round the ceiling and the three 64-way runs
go right after each other (in an order that rotates from round to round), the single
appender and its bare loop in interleaved blocks; each round yields one ratio of each.
The table gives the median rates, the median ratio and the range of the N ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prime_runs_spool.spool.format import encode_line  # noqa: E402
from prime_runs_spool.spool import durable_file  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402

THREADS = 64

#: The sync every figure pays for; --sync-delay wraps it (and the writer's) to play a slower disk.
fdatasync = os.fdatasync


def slow_syncs(delay: float) -> None:
    """Make every sync, the writer's and the baselines', cost ``delay`` seconds more.

    A disk whose syncs reach stable storage takes a millisecond or more per sync; this VM's
    take 0.15-0.35 ms. Adding the same delay to every sync of every figure shows how the
    ratios move on such a disk.
    """
    global fdatasync
    real = os.fdatasync

    def delayed(fd: int) -> None:
        real(fd)
        time.sleep(delay)

    fdatasync = delayed
    durable_file._fdatasync = delayed
    real_pwritev = durable_file._pwritev

    def delayed_pwritev(fd: int, parts, offset: int, flags: int = 0) -> int:
        written = real_pwritev(fd, parts, offset, flags)
        if flags:  # a synced write (RWF_DSYNC): its sync, delayed as fdatasync is
            time.sleep(delay)
        return written

    if real_pwritev is not None:
        durable_file._pwritev = delayed_pwritev


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


def interleaved(bare: Callable[[], bool], ours: Callable[[], bool], seconds: float,
                block: int = 8) -> tuple[float, float]:
    """Rates of two one-at-a-time loops, run in turns of ``block`` steps each.

    The disk's sync latency drifts from one second to the next on a shared machine; blocks of
    a few milliseconds, taking turns (and turns at going first), see the same disk. A step
    returns False when it has nothing left to do, which ends the measurement.
    """
    times, counts = [0.0, 0.0], [0, 0]
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline:
        for turn in ((0, 1) if sum(counts) % (4 * block) == 0 else (1, 0)):
            step = bare if turn == 0 else ours
            start = time.perf_counter()
            for _ in range(block):
                if not step():
                    return counts[0] / times[0], counts[1] / times[1]
                counts[turn] += 1
            times[turn] += time.perf_counter() - start
    return counts[0] / times[0], counts[1] / times[1]


def single_pair(folder: Path, record: dict, line: bytes, seconds: float, block: int = 8) -> tuple[float, float]:
    """One appender: the bare loop and the spool, interleaved in blocks of ``block`` appends."""
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    writer = SegmentWriter.create(run_dir, "bench")
    fd = os.open(folder / "bare.jsonl", FLAGS, 0o600)

    def bare() -> bool:
        os.write(fd, line)
        fdatasync(fd)
        return True

    def spool() -> bool:
        writer.append("episode", record)
        return True

    try:
        return interleaved(bare, spool, seconds, block)
    finally:
        os.close(fd)
        os.unlink(folder / "bare.jsonl")
        writer.close()
        shutil.rmtree(run_dir)


def bare_grouped(folder: Path, line: bytes, seconds: float) -> float:
    fd = os.open(folder / "bare.jsonl", FLAGS, 0o600)
    group = [line] * THREADS
    count, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.writev(fd, group)
            fdatasync(fd)
            count += THREADS
    finally:
        os.close(fd)
        os.unlink(folder / "bare.jsonl")
    return count / (time.perf_counter() - start)


def lean_grouped(folder: Path, line: bytes, threads: int, seconds: float,
                 serialize: Callable[[int], bytes] | None = None,
                 stop: threading.Event | None = None) -> float:
    """The leanest group commit threads can have: the floor for any threaded design here.

    ``threads`` threads append the same pre-serialized line (no serializing, no checksum,
    no framing). A caller that finds nobody flushing leads: it writes its line, and after
    each flush hands the lead to the first thread queued behind it, which takes the whole
    queue in one writev and one fdatasync; followers sleep on their own lock until their
    group is synced. Whatever this reaches, no threaded writer reaches more on this machine:
    the gap between it and the ceiling is what waking a thread per append costs.

    With ``serialize``, each append first builds its own line (``serialize(thread)``), as a
    runner that serializes its episode before queueing it must (benchmarks/log_episodes.py);
    ``stop``, once set, ends the phase early.
    """
    path = folder / "lean.jsonl"
    fd = os.open(path, FLAGS, 0o600)
    mutex = threading.Lock()
    queued: list[bytes] = []
    waiters: list[threading.Lock] = []
    handed: list[threading.Lock | None] = [None]  # the follower that was handed the lead
    flushing = [False]

    def append(line: bytes) -> None:
        nonlocal queued, waiters
        with mutex:
            if flushing[0]:
                me: threading.Lock | None = threading.Lock()
                me.acquire()
                queued.append(line)
                waiters.append(me)
            else:
                flushing[0] = True
                me = None
        if me is not None:
            me.acquire()  # released once our group is synced, or when we are handed the lead
            if handed[0] is not me:
                return
            with mutex:
                parts, group = queued, waiters
                queued, waiters = [], []
        else:
            parts, group = [line], []
        os.writev(fd, parts)
        fdatasync(fd)
        with mutex:
            successor = waiters[0] if waiters else None
            handed[0] = successor
            if successor is None:
                flushing[0] = False
        if successor is not None:
            successor.release()
        for waiter in group:
            if waiter is not me:
                waiter.release()

    counts = [0] * threads
    deadline = time.perf_counter() + seconds

    def work(t: int) -> None:
        while time.perf_counter() < deadline:
            mine = serialize(t) if serialize is not None else line
            if stop is not None and stop.is_set():
                return
            append(mine)
            counts[t] += 1

    try:
        return run_threads(work, threads, counts)
    finally:
        os.close(fd)
        os.unlink(path)


def run_threads(work, threads: int, counts: list[int]) -> float:
    start = time.perf_counter()
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - start)


def spool_async(folder: Path, record: dict, tasks: int, seconds: float) -> float:
    """``tasks`` asyncio tasks on one event loop, each awaiting ``append_async`` in a loop."""
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    writer = SegmentWriter.create(run_dir, "bench")

    async def main() -> float:
        count = 0
        deadline = time.perf_counter() + seconds

        async def work() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                await writer.append_async("episode", record)
                count += 1

        start = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(tasks)))
        return count / (time.perf_counter() - start)

    try:
        return asyncio.run(main())
    finally:
        writer.close()
        shutil.rmtree(run_dir)


def spool_run(folder: Path, record: dict, threads: int, seconds: float) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    writer = SegmentWriter.create(run_dir, "bench")
    counts = [0] * threads
    deadline = time.perf_counter() + seconds

    def work(t: int) -> None:
        while time.perf_counter() < deadline:
            writer.append("episode", record)
            counts[t] += 1

    try:
        return run_threads(work, threads, counts)
    finally:
        writer.close()
        shutil.rmtree(run_dir)


def measure(folder: Path, size: int, seconds: float, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """``rounds`` pairs (baseline, measured) for each row of the table.

    In a round, the grouped ceiling and the three 64-way runs take turns right after each
    other, in an order that rotates from round to round, so drift in the disk cancels out.
    """
    record = episode(size)
    line = encode_line(record, 12345, "episode")
    pairs: dict[str, list[tuple[float, float]]] = {"single": [], "threads": [], "lean": [], "async": []}
    runs = {
        "threads": lambda: spool_run(folder, record, THREADS, seconds),
        "lean": lambda: lean_grouped(folder, line, THREADS, seconds),
        "async": lambda: spool_async(folder, record, THREADS, seconds),
    }
    for n in range(rounds):
        pairs["single"].append(single_pair(folder, record, line, seconds))
        order = ["ceiling", *runs]
        order = order[n % len(order):] + order[: n % len(order)]
        rates = {name: bare_grouped(folder, line, seconds) if name == "ceiling" else runs[name]() for name in order}
        for name in runs:
            pairs[name].append((rates["ceiling"], rates[name]))
    return pairs


def ratio(pairs: list[tuple[float, float]]) -> str:
    """The median ratio over the rounds and its range."""
    ratios = [s / b for b, s in pairs]
    return f"{statistics.median(ratios):>5.2f} {min(ratios):>4.2f}-{max(ratios):<4.2f}"


def rate(values) -> str:
    return f"{statistics.median(values):>7.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 0.4 s phases (about 40 s in all)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per size (default 7, quick 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per phase (default 0.6, quick 0.4)")
    parser.add_argument("--cpu", type=int, default=None,
                        help="run the whole benchmark on this one CPU (sched_setaffinity), to see what "
                             "waking threads across CPUs costs")
    parser.add_argument("--sync-delay", type=float, default=0.0, metavar="MS",
                        help="add MS milliseconds to every sync, the spool's and the baselines', "
                             "to see the ratios on a slower disk")
    args = parser.parse_args()
    if args.sync_delay:
        slow_syncs(args.sync_delay / 1000)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    seconds = args.seconds or (0.4 if args.quick else 0.6)
    rounds = args.rounds or (3 if args.quick else 7)
    folder = Path(tempfile.mkdtemp(prefix="spool-bench-", dir=args.dir))
    cpus = f"on CPU {args.cpu} of {os.cpu_count()}" if args.cpu is not None else f"{os.cpu_count()} cores"
    if args.sync_delay:
        cpus += f", every sync {args.sync_delay:g} ms slower"
    try:
        print(f"scratch folder: {folder} ({cpus}); appends per second, median of {rounds} rounds of "
              f"{seconds:g} s phases (2 MB: {2 * seconds:g} s); ratio: median and range over the rounds")
        print("one appender: the spool vs a bare write+fdatasync loop.  64-way: each against the grouped "
              "ceiling (one thread, 64 lines per writev+fdatasync): the spool from 64 threads, the leanest "
              "threaded group commit (pre-serialized lines) from 64 threads, the spool from 64 asyncio tasks")
        print(f"{'episode':>7} | {'bare':>7} {'spool 1':>7} {'ratio':>5} {'range':>9} | {'ceiling':>7} | "
              f"{'threads':>7} {'ratio':>5} {'range':>9} | {'lean':>7} {'ratio':>5} {'range':>9} | "
              f"{'async':>7} {'ratio':>5} {'range':>9}")
        for label, size in (("2 KB", 2_000), ("20 KB", 20_000), ("2 MB", 2_000_000)):
            # A 2 MB group of 64 takes about half a second to write: give those phases more time.
            pairs = measure(folder, size, seconds * (2 if size >= 1_000_000 else 1), rounds)
            single = pairs["single"]
            cells = [f"{label:>7}", f"{rate(b for b, _ in single)} {rate(s for _, s in single)} {ratio(single)}",
                     rate(b for b, _ in pairs["threads"])]
            cells += [f"{rate(s for _, s in pairs[name])} {ratio(pairs[name])}" for name in ("threads", "lean", "async")]
            print(" | ".join(cells), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
