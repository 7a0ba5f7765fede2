"""The runner's own append path, ``Run.log_episodes``, with realistic episodes, against
what the disk and the interpreter allow.

Run: ``python3 benchmarks/log_episodes.py [--dir DIR] [--quick] [--rounds N] [--seconds S] [--sync-delay MS] [--only tasks]``

An eval does not call the writer: it calls ``Run.log_episodes`` with verifiers episode
records whose traces carry their seat's resolved config, so masking, admission, numbering
and the summary are all on the path. The episodes here are
``fixtures/reference/episode_example.json`` (a real record: two traces, each with its
config) padded with 15 KB of text in one trace's ``info``: about 25 KB serialized. Each is a
fresh object tree (parsed anew, its ids changed), as an eval's episodes are, so nothing is
shared between them that a cache keyed by identity could exploit.

Three ratios, each measured in the same round as its baseline, on the same disk:

* one appender: ``log_episodes([episode])`` per episode against a bare loop that serializes
  the same episode with orjson, writes it and fdatasyncs; the two take turns in blocks of 8
  (``--block``). Short turns follow the disk's drifting sync latency closely, but they are
  not how an eval appends: the durable mark is written at most every 10 ms
  (spool/durable_mark.py), so in turns of 8 (about 3 ms) nearly every turn starts with a
  mark write, and the trailing one lands in the bare loop's turn. ``--block 64`` (about
  25 ms a turn) is closer to an eval's steady appending.
* 64 threads: ``log_episodes`` from 64 threads against the leanest threaded group commit
  (benchmarks/append.py ``lean_grouped``), where each thread serializes its episode with
  orjson and queues it, a leader writes the queue with one writev and one fdatasync, and
  followers sleep on their own lock.
* 64 asyncio tasks: ``log_episodes_async`` from 64 tasks on one loop against the 64 threads.
* the floor with the work no spool can skip: the lean group commit whose threads also do
  it before queueing their line (benchmarks/log_episodes_instructions.py ``floor_line``:
  the shape check, masking as the run masks, orjson and CRC-32C, the line framed with its
  meta); against the lean floor it says how much of the 64-thread gap that work alone costs
  on this machine, a ceiling on any spool's ratio, and the 64 threads against it what the
  rest of the spool (numbering, the summary, the durable mark, the hand-offs) costs.
* the same for one appender: the bare loop against itself doing the work no spool can skip
  and writing the framed line, in turns of 8. Its ratio is a ceiling on the single
  appender's: a spool also numbers, summarizes, locks and publishes its durable mark.
* one appender against the bare loop that also writes into padding, as the writer does
  (docs/spool-format.md, section 5: NUL bytes written ahead, ``PADDING_BYTES`` at a time,
  the lines written into them with ``pwrite``), in turns of 8: the spool's own cost with the
  disk's part the same on both sides. The bare loop and the lean floors append to a
  growing file, so each of their syncs also commits the filesystem's journal; the spool's
  do not, which is most of what it gains on them.

``--sync-delay MS`` adds the same sleep (the GIL released, as in a sync) to every sync of
every figure, the spool's and the baselines' (benchmarks/append.py ``slow_syncs``): a disk
whose syncs take longer than this VM's. With 64 threads a group commit is capped at 64
episodes a sync, so the threaded figures are disk-bound only where a sync takes longer
than 64 episodes' CPU (about 6 ms for the spool's, at 25 KB, on this machine); on a faster
disk they compare CPU, and the lean floor's ratio is the ceiling.

Goals: 1.0 (one appender), 0.9 (64 threads) and 1.0 (tasks). Each phase draws from a pool of distinct episodes and
ends early if the pool runs out, so a rate is episodes over the time actually spent.
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

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import append  # noqa: E402
from append import FLAGS, THREADS, interleaved, lean_grouped, slow_syncs  # noqa: E402
from append import run_threads as timed_threads  # noqa: E402
from log_episodes_instructions import floor_line  # noqa: E402
from prime_runs_spool import open_run  # noqa: E402
from prime_runs_spool.spool.format import PADDING_BYTES  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "fixtures" / "reference" / "episode_example.json"
PADDING = 15_000


class Pool:
    """Distinct, freshly parsed episodes, handed out once each per phase."""

    def __init__(self, size: int) -> None:
        template = orjson.loads(EXAMPLE.read_bytes())
        template["traces"][0].setdefault("info", {})["notes"] = "y" * PADDING
        self.template = orjson.dumps(template)
        self.episode_bytes = len(self.template)
        self.episodes = [self._make(n) for n in range(size)]
        self.lock = threading.Lock()
        self.next = 0

    def _make(self, n: int) -> dict:
        episode = orjson.loads(self.template)
        episode["id"] = f"bench-{n:08d}"
        episode["task"]["data"]["idx"] = n % 100
        for t, trace in enumerate(episode["traces"]):
            trace["id"] = f"bench-{n:08d}-{t}"
            trace["task"]["data"]["idx"] = n % 100
            runtime = trace["agent"].get("runtime")
            if runtime:  # each rollout's box has its own id
                runtime["id"] = f"vf-{n:08x}{t:04x}"
        return episode

    def reset(self) -> None:
        self.next = 0

    def take(self) -> dict | None:
        with self.lock:
            if self.next >= len(self.episodes):
                return None
            self.next += 1
            return self.episodes[self.next - 1]


def fresh_run(folder: Path):
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    return run_dir, open_run(run_dir, name="bench", model="Qwen/Qwen3-8B", environments=["gsm8k"])


#: A file the bare loop writes into padding, as the writer does (so not O_APPEND).
PADDED_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def bare_loop(fd: int, pool: Pool, *, must: bool = False, padded: bool = False) -> Callable[[], bool]:
    """One step of the bare loop: take an episode, serialize it with orjson, write it, fdatasync.

    With ``must``, the step does what no spool of these episodes can skip instead
    (``floor_line``: check the episode's shape, mask it as the run does, serialize and
    checksum it with CRC-32C, frame the line with its meta) and writes the line's parts
    into padding, as the writer does. No numbering, no summary, no lock, no durable mark:
    whatever else a spool does only adds to it, so its rate against the bare loop's is a
    ceiling on the single appender's ratio.

    With ``padded`` (implied by ``must``), the line goes into NUL padding written ahead of
    it, ``PADDING_BYTES`` whenever a line passes its end, as the writer's ``_pad`` does
    (``fd`` not O_APPEND).
    """
    floor_parts = floor_line()
    seq = [0]
    zeros = bytes(PADDING_BYTES)
    ends = [0, 0]  # where the lines end, where the padding ends

    def step() -> bool:
        episode = pool.take()
        if episode is None:
            return False
        if must or padded:
            if must:
                seq[0] += 1
                parts = floor_parts(episode, seq[0])
            else:
                parts = (orjson.dumps(episode) + b"\n",)
            ends[0] += os.pwritev(fd, parts, ends[0])
            if ends[0] > ends[1]:
                ends[1] = ends[0] + os.pwrite(fd, zeros, ends[0])
        else:
            os.write(fd, orjson.dumps(episode) + b"\n")
        append.fdatasync(fd)  # os.fdatasync, or with --sync-delay a slower disk's
        return True

    return step


def single_pair(folder: Path, pool: Pool, seconds: float, block: int = 8, *,
                padded: bool = False) -> tuple[float, float]:
    """The bare serialize+write+fdatasync loop (``padded``: writing into padding) and
    ``log_episodes``, in interleaved blocks."""
    pool.reset()
    run_dir, run = fresh_run(folder)
    fd = os.open(folder / "bare.jsonl", PADDED_FLAGS if padded else FLAGS, 0o600)

    def spool() -> bool:
        episode = pool.take()
        if episode is None:
            return False
        run.log_episodes([episode])
        return True

    try:
        return interleaved(bare_loop(fd, pool, padded=padded), spool, seconds, block)
    finally:
        os.close(fd)
        os.unlink(folder / "bare.jsonl")
        run.finish()
        shutil.rmtree(run_dir)


def single_floor(folder: Path, pool: Pool, seconds: float, block: int = 8) -> tuple[float, float]:
    """The bare loop and the same loop doing the work no spool can skip (writing into
    padding, as the spool does), in interleaved blocks."""
    pool.reset()
    fds = [os.open(folder / "bare.jsonl", FLAGS, 0o600), os.open(folder / "must.jsonl", PADDED_FLAGS, 0o600)]
    try:
        return interleaved(bare_loop(fds[0], pool), bare_loop(fds[1], pool, must=True), seconds, block)
    finally:
        for fd, name in zip(fds, ("bare.jsonl", "must.jsonl")):
            os.close(fd)
            os.unlink(folder / name)


def run_threads(folder: Path, pool: Pool, seconds: float) -> float:
    pool.reset()
    run_dir, run = fresh_run(folder)
    counts = [0] * THREADS
    deadline = time.perf_counter() + seconds

    def work(t: int) -> None:
        while time.perf_counter() < deadline:
            episode = pool.take()
            if episode is None:
                return
            run.log_episodes([episode])
            counts[t] += 1

    try:
        return timed_threads(work, THREADS, counts)
    finally:
        run.finish()
        shutil.rmtree(run_dir)


def lean_threads(folder: Path, pool: Pool, seconds: float, *, must: bool = False) -> float:
    """The lean group commit; with ``must``, each thread does what no spool of these
    episodes can skip (``floor_line``) in place of serializing its episode."""
    pool.reset()
    stop = threading.Event()
    floor_parts = floor_line()
    seqs = iter(range(10**12))  # next() of a range iterator is atomic under the GIL

    def serialize(t: int) -> bytes:
        episode = pool.take()
        if episode is None:  # pool spent: end this phase (lean_grouped counts what was done)
            stop.set()
            return b""
        if must:
            return b"".join(floor_parts(episode, next(seqs)))
        return orjson.dumps(episode) + b"\n"

    return lean_grouped(folder, b"", THREADS, seconds, serialize=serialize, stop=stop)


def run_tasks(folder: Path, pool: Pool, seconds: float) -> float:
    pool.reset()
    run_dir, run = fresh_run(folder)

    async def main() -> float:
        count = 0
        deadline = time.perf_counter() + seconds

        async def work() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                episode = pool.take()
                if episode is None:
                    return
                await run.log_episodes_async([episode])
                count += 1

        start = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(THREADS)))
        return count / (time.perf_counter() - start)

    try:
        return asyncio.run(main())
    finally:
        run.finish()
        shutil.rmtree(run_dir)


def summary(pairs: list[tuple[float, float]]) -> str:
    ratios = [measured / baseline for baseline, measured in pairs]
    return (f"{statistics.median(b for b, _ in pairs):>7.0f} {statistics.median(m for _, m in pairs):>7.0f} "
            f"{statistics.median(ratios):>5.2f} {min(ratios):>4.2f}-{max(ratios):<4.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 0.4 s phases")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per phase (default 0.6, quick 0.4)")
    parser.add_argument("--pool", type=int, default=8_000, help="distinct episodes per phase (default 8000)")
    parser.add_argument("--block", type=int, default=8,
                        help="appends per turn of the one-appender pairs (default 8; see the docstring)")
    parser.add_argument("--only", choices=("tasks",),
                        help="tasks: only the 64 threads and the 64 tasks, in turns (each going first every other round)")
    parser.add_argument("--sync-delay", type=float, default=0.0, metavar="MS",
                        help="add MS milliseconds to every sync of every figure: a slower disk (default 0)")
    args = parser.parse_args()
    if args.sync_delay:
        slow_syncs(args.sync_delay / 1000)
    seconds = args.seconds or (0.4 if args.quick else 0.6)
    rounds = args.rounds or (3 if args.quick else 5)
    pool = Pool(args.pool)
    folder = Path(tempfile.mkdtemp(prefix="log-episodes-bench-", dir=args.dir))
    results: dict[str, list[tuple[float, float]]] = {"single": [], "single_floor": [], "single_padded": [],
                                                      "threads": [], "tasks": [], "floor": []}
    try:
        delay = f"; every sync {args.sync_delay:g} ms slower" if args.sync_delay else ""
        print(f"scratch folder: {folder}; episodes of {pool.episode_bytes / 1000:.1f} KB, {os.cpu_count()} cores{delay}; "
              f"episodes per second, median of {rounds} rounds of {seconds:g} s phases; ratio: median, range")
        if args.only == "tasks":
            for n in range(rounds):
                if n % 2:
                    tasks = run_tasks(folder, pool, seconds)
                    threads = run_threads(folder, pool, seconds)
                else:
                    threads = run_threads(folder, pool, seconds)
                    tasks = run_tasks(folder, pool, seconds)
                results["tasks"].append((threads, tasks))
                print(f"  round {n + 1}: tasks/threads {tasks / threads:.2f}", flush=True)
            print(f"{'path':<34} | {'base/s':>7} {'ours/s':>7} {'ratio':>5} {'range':>9} | goal")
            print(f"{'64 asyncio tasks vs 64 threads':<34} | {summary(results['tasks'])} | 1.0")
            return
        for n in range(rounds):
            results["single"].append(single_pair(folder, pool, seconds, args.block))
            results["single_floor"].append(single_floor(folder, pool, seconds, args.block))
            results["single_padded"].append(single_pair(folder, pool, seconds, args.block, padded=True))
            lean = lean_threads(folder, pool, seconds)
            threads = run_threads(folder, pool, seconds)
            must = lean_threads(folder, pool, seconds, must=True)
            tasks = run_tasks(folder, pool, seconds)
            results["threads"].append((lean, threads))
            results["floor"].append((must, threads))
            results["tasks"].append((threads, tasks))
            print(f"  round {n + 1}: single {results['single'][-1][1] / results['single'][-1][0]:.2f}, "
                  f"floor/bare {results['single_floor'][-1][1] / results['single_floor'][-1][0]:.2f}, "
                  f"single/padded {results['single_padded'][-1][1] / results['single_padded'][-1][0]:.2f}, "
                  f"threads/lean {threads / lean:.2f}, threads/leanfloor {threads / must:.2f}, "
                  f"leanfloor/lean {must / lean:.2f}, tasks/threads {tasks / threads:.2f}", flush=True)
        print(f"{'path':<34} | {'base/s':>7} {'ours/s':>7} {'ratio':>5} {'range':>9} | goal")
        print(f"{'1 appender vs serialize+write+sync':<34} | {summary(results['single'])} | 1.0")
        print(f"{'floor (no spool skips) vs bare':<34} | {summary(results['single_floor'])} | -")
        print(f"{'1 appender vs bare loop, padded':<34} | {summary(results['single_padded'])} | -")
        print(f"{'64 threads vs lean group commit':<34} | {summary(results['threads'])} | 0.9")
        print(f"{'64 threads vs lean floor':<34} | {summary(results['floor'])} | -")
        print(f"{'lean floor vs lean':<34} | "
              f"{summary([(lean, must) for (lean, _), (must, _) in zip(results['threads'], results['floor'])])} | -")
        print(f"{'64 asyncio tasks vs 64 threads':<34} | {summary(results['tasks'])} | 1.0")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
