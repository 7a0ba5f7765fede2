"""Instructions per episode of ``Run.log_episodes``, counted exactly: a figure the load barely moves.

Run: ``python3 benchmarks/log_episodes_instructions.py [--small N] [--large N]`` (needs valgrind;
about 3 minutes)

On a 2-core machine shared with others, wall-clock and even CPU-time figures move by 2x
from run to run. valgrind's ``cachegrind --cache-sim=no`` counts the instructions a process
runs in user space (system calls and the disk are outside it), the same on every run, but
for what a writer does by the clock (its durable mark at most every 10 ms, its lock check
every 0.1 s): valgrind slows an append tens of times, so more of that falls on each append
than at full speed, the more so the busier the machine (``spool`` and ``threads`` move by up
to 10k between runs at a load of 8; log_episodes_pieces.py is steadier for one piece). Each
mode runs twice, with ``--small`` and ``--large`` fresh episodes (log_episodes.py's: the
reference record padded to 25 KB, ids changed); the difference over the difference in
episodes is the cost of one episode, start-up and imports cancelled out:

* ``none``: only building the episodes, subtracted from the others;
* ``dumps``: ``orjson.dumps`` of each episode, nothing else: the goal's unit (an append at
  most 2x it);
* ``bare``: the bare loop, ``orjson.dumps`` and ``os.write`` per episode;
* ``floor``: what no spool of these episodes can skip, and nothing else: the shape check
  (``check_episode``), masking as the run masks (``mask_for_writing`` under the run's rules,
  or ``mask`` where they mask outside trace configs), orjson and CRC-32C
  (``format.prepare``), the framed line with its meta (``episode_rest``, ``frame_line``)
  and one ``os.writev``; no numbering by task, no summary, no lock, no durable mark. Any
  spool costs at least this: ``bare / floor`` bounds the one-appender ratio where the
  CPU is the bottleneck;
* ``spool``: ``log_episodes([episode])`` from one appender, fdatasync a no-op;
* ``lean``: 64 threads through the lean threaded group commit (benchmarks/append.py
  ``lean_grouped``), each serializing its episode with orjson, fdatasync a no-op: the
  threaded floor's CPU;
* ``leanfloor``: the same 64 threads, each doing ``floor``'s work on its episode before
  queueing its line: ``lean / leanfloor`` bounds the 64-thread ratio any spool can reach
  where the CPU is the bottleneck;
* ``threads``: 64 threads through ``log_episodes([episode])``, fdatasync a no-op. valgrind
  runs one thread at a time, so the groups are not a loaded machine's: the count is the
  CPU of the threaded path (wake-ups and hand-offs included), which is what the threaded
  wall-time ratio comes down to on 2 cores busy with it;
* ``tasks``: 64 asyncio tasks on one loop through ``log_episodes_async([episode])``,
  fdatasync a no-op: what an episode costs from a task (the future, the loop's wake-ups,
  the writer's helper thread) against ``threads``, the async goal's 1.0 where the CPU is
  the bottleneck.

``--threads`` adds the last four (about 5 minutes more).

valgrind counts a ``rep movsb`` one step per byte, so a copy of a line costs about one
instruction a byte here (25k for an episode's), tens of times what it costs the CPU: the
bare loop's ``dumps + b"\\n"`` and the lean threads' copy are counted so, the spool and
``floor`` (one ``writev`` of the line's parts) copy nothing.

``--mode M --episodes N`` runs one mode without valgrind (what each valgrind run executes).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _instructions import bench_episodes  # noqa: E402
from _instructions import instructions as count_instructions  # noqa: E402
MODES = ("none", "dumps", "bare", "floor", "spool")
THREAD_MODES = ("lean", "leanfloor", "threads", "tasks")


def run_mode(mode: str, count: int) -> None:
    sys.path.insert(0, str(ROOT))
    import orjson

    from prime_runs_spool import open_run
    from prime_runs_spool.spool import durable_file

    durable_file._fdatasync = lambda fd: None
    durable_file._RWF_DSYNC = 0  # writers write, then call the no-op sync (no synced pwritev)
    # The episodes built with the collector off, then out of its reach: how often building
    # them set off a collection, and what it walked, depends on what else was imported, which
    # differs from mode to mode (a mode's count moved by 10-20k an episode with the imports).
    gc.disable()
    episodes = bench_episodes(count)
    gc.collect()
    gc.freeze()
    gc.enable()
    folder = Path(tempfile.mkdtemp(prefix="log-episodes-ir-"))
    try:
        if mode == "spool":
            run = open_run(folder / "run", name="bench", model="m", environments=["gsm8k"])
            for episode in episodes:
                run.log_episodes([episode])
            run.finish()
        elif mode == "tasks":
            run_tasks(episodes, folder)
        elif mode in THREAD_MODES:
            run_threaded(mode, episodes, folder)
        elif mode == "dumps":
            for episode in episodes:
                orjson.dumps(episode)
        elif mode in ("bare", "floor"):
            floor_parts = floor_line()
            fd = os.open(folder / "bare.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            for seq, episode in enumerate(episodes):
                if mode == "floor":
                    os.writev(fd, floor_parts(episode, seq))
                else:
                    os.write(fd, orjson.dumps(episode) + b"\n")
            os.close(fd)
    finally:
        shutil.rmtree(folder)


def floor_line():
    """The work no spool of these episodes can skip, as a function of an episode and its
    sequence number that returns its line's parts for ``os.writev``: the shape check,
    masking as the run masks, orjson and CRC-32C, the framed line with its meta."""
    from prime_runs_spool.content.episodes import check_episode
    from prime_runs_spool.content.mask_fragments import mask_for_writing
    from prime_runs_spool.content.masking import MaskRules, mask
    from prime_runs_spool.runner.admission import masks_plainly
    from prime_runs_spool.spool.format import EPISODE, episode_rest, frame_line, prepare

    rules = MaskRules.defaults_for_episode()
    masked = mask if masks_plainly(rules) else mask_for_writing

    def parts(episode: dict, seq: int) -> tuple[bytes, bytes, bytes]:
        check_episode(episode)
        return frame_line(prepare(masked(episode, rules), EPISODE), seq, episode_rest(episode["id"], seq))

    return parts


def run_threaded(mode: str, episodes: list, folder: Path) -> None:
    """64 threads taking the episodes in turn: through ``lean_grouped`` or ``log_episodes``."""
    import threading

    import orjson

    import append
    from prime_runs_spool import open_run

    append.fdatasync = lambda fd: None
    pending = iter(episodes)
    take = threading.Lock()

    def next_episode():
        with take:
            return next(pending, None)

    if mode in ("lean", "leanfloor"):
        stop = threading.Event()
        floor_parts = floor_line()
        seqs = iter(range(len(episodes)))  # next() of a range iterator is atomic under the GIL

        def serialize(_thread: int) -> bytes:
            episode = next_episode()
            if episode is None:
                stop.set()
                return b""
            if mode == "leanfloor":
                return b"".join(floor_parts(episode, next(seqs)))
            return orjson.dumps(episode) + b"\n"

        append.lean_grouped(folder, b"", append.THREADS, 1e9, serialize=serialize, stop=stop)
        return
    run = open_run(folder / "run", name="bench", model="m", environments=["gsm8k"])

    def work() -> None:
        while (episode := next_episode()) is not None:
            run.log_episodes([episode])

    workers = [threading.Thread(target=work) for _ in range(append.THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    run.finish()


def run_tasks(episodes: list, folder: Path) -> None:
    """64 asyncio tasks on one loop taking the episodes in turn through ``log_episodes_async``."""
    import asyncio

    import append
    from prime_runs_spool import open_run

    run = open_run(folder / "run", name="bench", model="m", environments=["gsm8k"])
    pending = iter(episodes)

    async def work() -> None:
        while (episode := next(pending, None)) is not None:
            await run.log_episodes_async([episode])

    async def main() -> None:
        await asyncio.gather(*(work() for _ in range(append.THREADS)))

    asyncio.run(main())
    run.finish()


def instructions(mode: str, count: int) -> int:
    return count_instructions(__file__, ["--mode", mode, "--episodes", str(count)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=500)
    parser.add_argument("--threads", action="store_true", help="also the 64-thread modes")
    parser.add_argument("--mode", choices=MODES + THREAD_MODES)
    parser.add_argument("--episodes", type=int)
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args.episodes)
        return
    modes = MODES + THREAD_MODES if args.threads else MODES
    per = {mode: (instructions(mode, args.large) - instructions(mode, args.small)) / (args.large - args.small)
           for mode in modes}
    print("thousands of instructions per 25 KB episode (user space), building the episodes taken out")
    for mode in modes[1:]:
        print(f"  {mode:<6} {(per[mode] - per['none']) / 1000:8.0f}")
    spool, dumps = per["spool"] - per["none"], per["dumps"] - per["none"]
    bare, floor = per["bare"] - per["none"], per["floor"] - per["none"]
    print(f"  spool over floor {(spool - floor) / 1000:.0f}: what the spool does beyond the work no spool can skip")
    print(f"  spool / dumps {spool / dumps:.2f} (goal: at most 2.00)")
    print(f"  bare / spool {bare / spool:.2f}; bare / floor {bare / floor:.2f}: the one-appender ratio's ceiling "
          "for the spool and for any spool, where the CPU is the bottleneck (goal 1.0)")
    if args.threads:
        lean = per["lean"] - per["none"]
        print(f"  lean / threads {lean / (per['threads'] - per['none']):.2f}; lean / leanfloor "
              f"{lean / (per['leanfloor'] - per['none']):.2f}: the 64-thread ratio's ceiling for the spool and for "
              "any spool, where the CPU is the bottleneck (goal 0.9)")
        print(f"  threads / tasks {(per['threads'] - per['none']) / (per['tasks'] - per['none']):.2f}: the 64-task "
              "ratio's ceiling where the CPU is the bottleneck (goal 1.0)")


if __name__ == "__main__":
    main()
