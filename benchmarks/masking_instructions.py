"""Instructions per episode of masking, counted exactly (benchmarks/masking.py's phases under valgrind).

Run: ``python3 benchmarks/masking_instructions.py [--small N] [--large N]`` (needs valgrind;
about a minute). Before/after: run the same script from a detached worktree of the older
commit (it uses only ``mask`` and ``MaskRules``, which every version has).

benchmarks/masking.py times its phases by the clock, which a loaded machine moves by 2x;
this counts the user-space instructions of each phase at two sizes of fresh 25 KB episodes
(benchmarks/_instructions.py) and takes the difference per episode, start-up cancelled out:

* ``none``: only building the episodes, subtracted from the others;
* ``memo``: ``mask(episode, rules)``, one rules object for all: the writer's call, its memo
  answering from the second sighting of the seats' configs on;
* ``walk``: ``mask(episode, rules, memo=False)``: every node of every config walked;
* ``miss``: ``mask`` of episodes whose configs never repeat (a per-episode seed): the memo's
  worst case.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _instructions import bench_episodes, instructions  # noqa: E402

MODES = ("none", "memo", "walk", "miss")


def run_mode(mode: str, count: int) -> None:
    """One mode on ``count`` fresh episodes, in this process (what valgrind counts)."""
    from prime_runs_spool.content.masking import MaskRules, mask

    episodes = bench_episodes(count)
    if mode == "miss":
        for number, episode in enumerate(episodes):
            for trace in episode["traces"]:
                trace["agent"]["config"].setdefault("sampling", {})["seed"] = number
    # The episodes built are kept out of the collector's passes: a run holds one batch at a
    # time, and a pass over all of them would weigh the count by how often one is triggered.
    gc.freeze()
    rules = MaskRules.defaults_for_episode()
    if mode in ("memo", "miss"):
        for episode in episodes:
            mask(episode, rules)
    elif mode == "walk":
        for episode in episodes:
            mask(episode, rules, memo=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1200)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is not None:
        run_mode(args.mode, args.count)
        return
    counts = {}
    for mode in MODES:
        small = instructions(__file__, ["--mode", mode, "--count", str(args.small)])
        large = instructions(__file__, ["--mode", mode, "--count", str(args.large)])
        counts[mode] = (large - small) / (args.large - args.small)
    base = counts["none"]
    print(f"instructions per 25 KB episode ({args.small} and {args.large} episodes)")
    for mode in MODES[1:]:
        print(f"  {mode:5} {(counts[mode] - base) / 1000:8.1f} k")
    print(f"  walk/memo x{(counts['walk'] - base) / (counts['memo'] - base):.2f}")


if __name__ == "__main__":
    main()
