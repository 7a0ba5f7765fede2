"""Instructions per episode of ``Run.log_episodes``, counted exactly: a figure no load moves.

Run: ``python3 benchmarks/log_episodes_instructions.py [--small N] [--large N]`` (needs valgrind;
about 3 minutes)

On a 2-core machine shared with others, wall-clock and even CPU-time figures move by 2x
from run to run. valgrind's ``cachegrind --cache-sim=no`` counts the instructions a process
runs in user space (system calls and the disk are outside it), the same on every run. Each
mode runs twice, with ``--small`` and ``--large`` fresh episodes (log_episodes.py's: the
reference record padded to 25 KB, ids changed); the difference over the difference in
episodes is the cost of one episode, start-up and imports cancelled out:

* ``none``: only building the episodes, subtracted from the others;
* ``dumps``: ``orjson.dumps`` of each episode, nothing else: the goal's unit (an append at
  most 2x it);
* ``bare``: the bare loop, ``orjson.dumps`` and ``os.write`` per episode;
* ``must``: the bare loop after ``check_episode`` and ``mask`` (the run's rules, their memo):
  the work no spool of these episodes can skip;
* ``spool``: ``log_episodes([episode])`` from one appender, fdatasync a no-op.

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
MODES = ("none", "dumps", "bare", "must", "spool")


def run_mode(mode: str, count: int) -> None:
    sys.path.insert(0, str(ROOT))
    import orjson

    from prime_runs_spool import open_run
    from prime_runs_spool.content.episodes import check_episode
    from prime_runs_spool.content.masking import MaskRules, mask
    from prime_runs_spool.spool import durable_file

    durable_file._fdatasync = lambda fd: None
    durable_file._RWF_DSYNC = 0  # writers write, then call the no-op sync (no synced pwritev)
    episodes = bench_episodes(count)
    # The episodes out of the collector's reach: how often building them set off a full
    # collection depends on what else was imported, which differs from mode to mode.
    gc.collect()
    gc.freeze()
    folder = Path(tempfile.mkdtemp(prefix="log-episodes-ir-"))
    try:
        if mode == "spool":
            run = open_run(folder / "run", name="bench", model="m", environments=["gsm8k"])
            for episode in episodes:
                run.log_episodes([episode])
            run.finish()
        elif mode == "dumps":
            for episode in episodes:
                orjson.dumps(episode)
        elif mode in ("bare", "must"):
            rules = MaskRules.defaults_for_episode()
            fd = os.open(folder / "bare.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            for episode in episodes:
                if mode == "must":
                    check_episode(episode)
                    episode = mask(episode, rules)
                os.write(fd, orjson.dumps(episode) + b"\n")
            os.close(fd)
    finally:
        shutil.rmtree(folder)


def instructions(mode: str, count: int) -> int:
    return count_instructions(__file__, ["--mode", mode, "--episodes", str(count)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=500)
    parser.add_argument("--mode", choices=MODES)
    parser.add_argument("--episodes", type=int)
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args.episodes)
        return
    per = {mode: (instructions(mode, args.large) - instructions(mode, args.small)) / (args.large - args.small)
           for mode in MODES}
    print("thousands of instructions per 25 KB episode (user space), building the episodes taken out")
    for mode in MODES[1:]:
        print(f"  {mode:<6} {(per[mode] - per['none']) / 1000:8.0f}")
    print(f"  spool over bare {(per['spool'] - per['bare']) / 1000:.0f}, of which check + mask "
          f"{(per['must'] - per['bare']) / 1000:.0f}")
    spool, dumps = per["spool"] - per["none"], per["dumps"] - per["none"]
    print(f"  spool / dumps {spool / dumps:.2f} (goal: at most 2.00); spool / bare "
          f"{spool / (per['bare'] - per['none']):.2f}")


if __name__ == "__main__":
    main()
