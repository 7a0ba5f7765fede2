"""CPU per episode of ``Run.log_episodes``, stage by stage, with the disk taken out.

Run: ``python3 benchmarks/log_episodes_cpu.py [--episodes N] [--rounds R] [--threads T] [--sync-delay MS]``

benchmarks/log_episodes.py says how far the append path is from its floors in wall-clock
time; on a 2-core machine shared with others that moves with the load. This one says where
the CPU goes, in microseconds of ``time.process_time`` per episode (the whole process's CPU,
so the helper threads' and the woken threads' work counts), which the load moves far less.

The episodes are log_episodes.py's (its ``Pool``: the reference record padded to 25 KB,
each a fresh object tree with its own ids). Each stage runs over a fresh pool of
``--episodes`` episodes, fed what the stage before it produced, ``--rounds`` times; the
table gives the median and the range over rounds:

* the stages of runner/admission.py's ``prepare_episode`` one by one: ``to_jsonable``,
  ``check_episode``, ``mask`` (the run's own rules and memo, warmed as a run's is),
  ``prepare`` (orjson + CRC-32C), ``check_sendable``; then the whole of it;
* the writer's part before the disk: ``_prepare_item`` and ``_number`` (the line's tail);
* the summary's ``add``, which ``Run._settle`` does under the run's lock;
* ``orjson.dumps`` alone: what the floors pay;
* end to end: ``log_episodes([episode])`` from one thread, and from ``--threads`` threads,
  with ``fdatasync`` replaced by a sleep of ``--sync-delay`` ms (no CPU, GIL released, as a
  disk's sync), against the lean group commit of log_episodes.py under the same sleep.
"""

from __future__ import annotations

import argparse
import gc
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402

import append as append_bench  # noqa: E402
from append import lean_grouped  # noqa: E402
from append import run_threads as timed_threads  # noqa: E402
from log_episodes import Pool  # noqa: E402
from prime_runs_spool import open_run  # noqa: E402
from prime_runs_spool.content.episodes import check_episode  # noqa: E402
from prime_runs_spool.content.masking import mask  # noqa: E402
from prime_runs_spool.content.summary import SummaryAccumulator  # noqa: E402
from prime_runs_spool.platform_api.v0 import check_sendable  # noqa: E402
from prime_runs_spool.runner.admission import prepare_episode  # noqa: E402
from prime_runs_spool.spool import durable_file  # noqa: E402
from prime_runs_spool.spool.format import EPISODE, prepare, to_jsonable  # noqa: E402


def per_episode(work: Callable[[list], None], inputs: list) -> float:
    """Microseconds of process CPU per input for ``work(inputs)``.

    The garbage collector is off meanwhile: a stage that keeps its outputs (for the next
    stage) would otherwise pay for collections over all it kept, which an append, freeing
    what it built as it goes, does not (the collector counts allocations net of frees).
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        start = time.process_time()
        work(inputs)
        return (time.process_time() - start) / len(inputs) * 1e6
    finally:
        gc.enable()


def stage_loop(fn: Callable[[object], object]) -> Callable[[list], None]:
    def work(inputs: list) -> None:
        for item in inputs:
            fn(item)
    return work


def stages(pool_size: int, folder: Path) -> dict[str, float]:
    """One round of every stage over fresh pools; returns us per episode by stage."""
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    run = open_run(run_dir, name="bench", model="Qwen/Qwen3-8B", environments=["gsm8k"])
    rules = run._episode_rules
    out: dict[str, float] = {}
    try:
        # Warm the run's masking memo as a run's first episodes do.
        for episode in Pool(8).episodes:
            mask(episode, rules)
        fresh = Pool(pool_size).episodes
        out["orjson.dumps (the floors' cost)"] = per_episode(stage_loop(orjson.dumps), fresh)
        fresh = Pool(pool_size).episodes
        out["to_jsonable"] = per_episode(stage_loop(to_jsonable), fresh)
        out["check_episode"] = per_episode(stage_loop(check_episode), fresh)
        masked: list = []
        out["mask"] = per_episode(lambda eps: masked.extend(mask(e, rules) for e in eps), fresh)
        payloads: list = []
        out["prepare (orjson + CRC-32C)"] = per_episode(
            lambda eps: payloads.extend(prepare(e, EPISODE) for e in eps), masked)
        pairs = list(zip(masked, payloads))
        out["check_sendable"] = per_episode(
            lambda ps: [check_sendable(record, len(payload.data)) for record, payload in ps], pairs)
        fresh = Pool(pool_size).episodes
        # Nothing kept, as an append keeps nothing: what it built is freed episode by episode.
        out["prepare_episode (all of the above)"] = per_episode(stage_loop(lambda e: prepare_episode(e, rules)), fresh)
        prepared = [prepare_episode(e, rules) for e in fresh]
        items = [[(EPISODE, p[1], {"episode_id": p[2], "rollout_number": 1})] for p in prepared]  # payload, id
        preps: list = []
        out["writer: _prepare_item"] = per_episode(
            lambda its: preps.extend(run._writer._prepare_items(it) for it in its), items)
        writer = run._writer
        def number(ps: list) -> None:
            for p in ps:
                with writer._group._mutex:
                    writer._number(*p)  # _prepare_items: (lines, how many are episodes)
        out["writer: _number (seq, line tail)"] = per_episode(number, preps)
        accumulator = SummaryAccumulator()
        out["summary add"] = per_episode(stage_loop(accumulator.add), [p[0] for p in prepared])
    finally:
        run.finish()
        shutil.rmtree(run_dir)
    return out


def end_to_end(pool_size: int, folder: Path, threads: int) -> tuple[float, float]:
    """us of CPU per episode: log_episodes from ``threads`` threads; the lean floor, same threads."""
    pool = Pool(pool_size)
    run_dir = Path(tempfile.mkdtemp(dir=folder))
    run = open_run(run_dir, name="bench", model="Qwen/Qwen3-8B", environments=["gsm8k"])
    counts = [0] * threads

    def work(t: int) -> None:
        while True:
            episode = pool.take()
            if episode is None:
                return
            run.log_episodes([episode])
            counts[t] += 1

    try:
        gc.collect()
        gc.freeze()
        start = time.process_time()
        if threads == 1:
            work(0)
        else:
            timed_threads(work, threads, counts)
        ours = (time.process_time() - start) / sum(counts) * 1e6
    finally:
        run.finish()
        shutil.rmtree(run_dir)

    pool = Pool(pool_size)
    stop = threading.Event()
    lean_count = [0]

    def serialize(t: int) -> bytes:
        episode = pool.take()
        if episode is None:
            stop.set()
            return b""
        lean_count[0] += 1
        return orjson.dumps(episode) + b"\n"

    gc.collect()
    gc.freeze()
    start = time.process_time()
    lean_grouped(folder, b"", threads, 3600, serialize=serialize, stop=stop)
    lean = (time.process_time() - start) / lean_count[0] * 1e6
    return ours, lean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=2000, help="fresh episodes per stage and round (2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    parser.add_argument("--threads", type=int, default=64, help="threads of the end-to-end figure (64)")
    parser.add_argument("--sync-delay", type=float, default=0.3, help="ms each fdatasync sleeps instead (0.3)")
    parser.add_argument("--dir", default=None, help="scratch folder parent (default: the temp dir)")
    args = parser.parse_args()

    delay = args.sync_delay / 1000
    fake_sync = (lambda fd: time.sleep(delay)) if delay > 0 else (lambda fd: None)
    durable_file._fdatasync = fake_sync
    durable_file._RWF_DSYNC = 0  # writers write, then call the fake sync (no synced pwritev)
    append_bench.fdatasync = fake_sync
    os.fdatasync = fake_sync  # lean_grouped's own sync

    folder = Path(tempfile.mkdtemp(prefix="log-episodes-cpu-", dir=args.dir))
    rows: dict[str, list[float]] = {}
    try:
        for _ in range(args.rounds):
            for name, value in stages(args.episodes, folder).items():
                rows.setdefault(name, []).append(value)
            ours, lean = end_to_end(args.episodes, folder, 1)
            rows.setdefault("log_episodes, 1 thread", []).append(ours)
            rows.setdefault("lean floor, 1 thread", []).append(lean)
            ours, lean = end_to_end(args.episodes, folder, args.threads)
            rows.setdefault(f"log_episodes, {args.threads} threads", []).append(ours)
            rows.setdefault(f"lean floor, {args.threads} threads", []).append(lean)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"us of CPU per 25 KB episode (process_time), median of {args.rounds} rounds of {args.episodes} "
          f"episodes; fdatasync replaced by a {args.sync_delay:g} ms sleep")
    for name, values in rows.items():
        print(f"  {name:<38} {statistics.median(values):7.1f}   ({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
