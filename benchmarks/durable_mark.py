"""What the durable mark costs a lone appender: written after every sync, at most every
10 ms (spool/durable_mark.py), or not at all.

Run: ``python3 benchmarks/durable_mark.py [--seconds 20] [--dir DIR]``

Four one-at-a-time loops take turns in blocks of 8 appends, on the same disk, for
``--seconds`` in all: log_episodes.py's bare loop (orjson, write, fdatasync) and three
runs logging the same kind of 25 KB episodes through ``Run.log_episodes``: with the mark
as it is, with the mark written after every sync (``interval`` 0: the writer before
2026-12-02), and with no mark at all (the floor for any way of publishing it). Each loop's
wall time and CPU time (user + system, ``getrusage``) per episode are summed over its
blocks; the CPU time shows the kernel work each mark write adds to the next sync.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from append import FLAGS  # noqa: E402
from log_episodes import Pool, bare_loop, fresh_run  # noqa: E402

BLOCK = 8  # --block
LOOPS = ("bare loop", "mark <= every 10 ms", "mark every sync", "no mark")


def spool_loop(folder: Path, pool: Pool, loop: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    run_dir, run = fresh_run(folder)
    writer = run._writer
    if loop == "mark every sync":
        writer._file.mark.interval = 0.0
    elif loop == "no mark":
        writer._file.mark.close()
        writer._file.mark = None

    def step() -> bool:
        episode = pool.take()
        if episode is None:
            return False
        run.log_episodes([episode])
        return True

    def done() -> None:
        run.finish()
        shutil.rmtree(run_dir)

    return step, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds for all four loops (default 20)")
    parser.add_argument("--block", type=int, default=BLOCK, help=f"appends per turn (default {BLOCK})")
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    args = parser.parse_args()
    pool = Pool(int(args.seconds * 4000) + 1000)  # more than the fastest disk here takes
    folder = Path(tempfile.mkdtemp(prefix="durable-mark-bench-", dir=args.dir))
    bare_fd = os.open(folder / "bare.jsonl", FLAGS, 0o600)
    steps: dict[str, Callable[[], bool]] = {LOOPS[0]: bare_loop(bare_fd, pool)}
    finishers = []
    for loop in LOOPS[1:]:
        steps[loop], done = spool_loop(folder, pool, loop)
        finishers.append(done)
    totals = {loop: [0.0, 0.0, 0] for loop in LOOPS}  # wall, cpu, episodes
    try:
        deadline = time.perf_counter() + args.seconds
        turn = 0
        spent = False
        while time.perf_counter() < deadline and not spent:
            order = LOOPS[turn % 4:] + LOOPS[:turn % 4]  # turns at going first
            turn += 1
            for loop in order:
                usage = resource.getrusage(resource.RUSAGE_SELF)
                start = time.perf_counter()
                done_here = 0
                for _ in range(args.block):
                    if not steps[loop]():
                        spent = True
                        break
                    done_here += 1
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_SELF)
                total = totals[loop]
                total[0] += wall
                total[1] += after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
                total[2] += done_here
        base_wall = totals[LOOPS[0]][0] / totals[LOOPS[0]][2]
        every_wall = totals["mark every sync"][0] / totals["mark every sync"][2]
        print(f"episodes of {pool.episode_bytes / 1000:.1f} KB, {args.seconds:g} s in blocks of {BLOCK}; "
              f"per episode: wall and CPU (user + system) in microseconds")
        print(f"{'loop':<22} {'episodes':>8} {'wall':>7} {'cpu':>7} {'vs bare':>8} {'vs every sync':>14}")
        for loop in LOOPS:
            wall, cpu, count = totals[loop]
            print(f"{loop:<22} {count:>8} {wall / count * 1e6:>7.1f} {cpu / count * 1e6:>7.1f} "
                  f"{base_wall / (wall / count):>8.3f} {every_wall / (wall / count):>14.3f}")
    finally:
        os.close(bare_fd)
        for done in finishers:
            done()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
