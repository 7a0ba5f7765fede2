"""The first sync of many new runs in instructions: the whole command, a run at a time.

Run: ``python3 benchmarks/sync_many_instructions.py [--runs 30 90] [--tree CHECKOUT ...] [--jobs N] [--dir DIR]``

Trees of one-episode runs of about 2 KB (as ``sync_many.py`` writes them) are written
outside valgrind, one per ``--runs``; each is synced by ``prime-runs sync TREE --json`` as a
fresh process under ``valgrind --tool=cachegrind`` (start-up, the walks, the probes, the
passes' threads and the waits all counted; valgrind runs one thread at a time), to a local
platform in its own process (not counted) on an empty database. Printed: each sync's
instructions, and the difference between the largest and smallest tree over their runs,
a new run's instructions whatever the load. ``--tree`` runs the command of another
checkout (a ``git worktree`` of the revision to compare), the checkouts in turns on the same
trees. Work that grows faster than the runs shows as a per-run figure that grows with
``--runs`` (e.g. ``--runs 30 90 2000``; 2,000 runs take a few minutes).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _instructions import instructions  # noqa: E402
from _synccommon import ROOT, arguments, child_env, drop_state, platform, scratch, write_run  # noqa: E402


def main() -> None:
    parser = arguments(__doc__, repeat=1, quick="30 and 60 runs")
    parser.set_defaults(size=2_000)
    parser.add_argument("--runs", type=int, nargs="+", default=[30, 90])
    parser.add_argument("--jobs", type=int, default=None, help="default: the command's")
    parser.add_argument("--tree", type=Path, action="append", help="a checkout whose command runs (repeatable)")
    args = parser.parse_args()
    if args.quick:
        args.runs = [30, 60]
    runs_list = sorted(set(args.runs))
    checkouts = [tree.resolve() for tree in args.tree or [ROOT]]
    counted: dict[tuple[Path, int], int] = {}
    with scratch(args.dir, "syncbench-many-instructions-") as work:
        trees = {}
        for runs in runs_list:
            trees[runs] = work / f"tree-{runs}"
            for number in range(runs):
                write_run(trees[runs] / f"run-{number:05d}", f"ins-{number:05d}-{uuid.uuid4().hex[:8]}", 1, args.size)
        for _ in range(args.repeat):
            for runs in runs_list:
                for checkout in checkouts:
                    drop_state(trees[runs])
                    env = child_env()
                    env["PYTHONPATH"] = f"{checkout}{os.pathsep}{env['PYTHONPATH']}"
                    env["XDG_CACHE_HOME"] = str(work / "cache")  # the runs found up to date: none kept across
                    with platform(work / f"platform-{uuid.uuid4().hex[:8]}.db") as server:
                        sync_args = ["-m", "commands", "sync", str(trees[runs]), "--base-url", server.base_url, "--json"]
                        sync_args += ["--jobs", str(args.jobs)] if args.jobs else []
                        here = os.getcwd()
                        os.chdir(checkout)  # ``-m commands`` finds the checkout's own first
                        try:
                            count = instructions(sync_args[0], sync_args[1:], env)
                        finally:
                            os.chdir(here)
                    counted[(checkout, runs)] = min(count, counted.get((checkout, runs), count))
                    print(f"{checkout.name}: {runs} runs, {count / 1e6:,.0f} M instructions", flush=True)
    small, large = runs_list[0], runs_list[-1]
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    print(f"\n| checkout | {' | '.join(f'{runs} runs, M' for runs in runs_list)} | a run ({large} less {small}), M |")
    print(f"| --- | {' | '.join('---:' for _ in runs_list)} | ---: |")
    for checkout in checkouts:
        per_run = (counted[(checkout, large)] - counted[(checkout, small)]) / (large - small) / 1e6
        cells = " | ".join(f"{counted[(checkout, runs)] / 1e6:,.0f}" for runs in runs_list)
        print(f"| {checkout.name} | {cells} | {per_run:.2f} |")


if __name__ == "__main__":
    main()
