"""A no-op re-sync of many small synced runs: wall time, CPU and instructions.

Run: ``python3 benchmarks/sync_noop_many.py [--runs 2000] [--repeat 5] [--tree PATH ...]
[--instructions] [--dir DIR]``

A tree of ``--runs`` sealed one-episode runs (one environment, as a sweep writes them) is
written and synced once to a local platform process (not timed). Then ``prime-runs sync
TREE --json`` runs as a fresh process with nothing to send: once per checkout to begin with
(the *first re-sync*: a sync keeps what it found up to date, sync/unchanged.py, for files
left alone 2 s, so the script waits that long first), then ``--repeat`` rounds, the
checkouts in turns. Each must report every run ``up_to_date`` and send nothing.

Printed per checkout: the median wall time (min-max) and the process's CPU (user +
system, from the children's rusage: on a shared machine it moves far less than the wall
time), and with ``--instructions`` the user-space instructions of one more re-sync under
valgrind (start-up included; the same whatever the load). ``--tree`` runs the command from
another checkout (a ``git worktree`` of the revision to compare); given more than once, the
checkouts take turns. Goal: under 1 s for 2,000 runs.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _instructions import instructions  # noqa: E402
from _synccommon import PYTHON, ROOT, arguments, child_env, now, platform, scratch, spread, write_run  # noqa: E402

GOAL = 1.0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def command(tree_checkout: Path, runs_tree: Path, base_url: str) -> tuple[list[str], dict[str, str]]:
    env = child_env()
    env["PYTHONPATH"] = f"{tree_checkout}{os.pathsep}{env['PYTHONPATH']}"
    return ["-m", "commands", "sync", str(runs_tree), "--base-url", base_url, "--json"], env


def resync(checkout: Path, runs_tree: Path, base_url: str, runs: int) -> tuple[float, float]:
    """One no-op re-sync by ``checkout``'s command: (wall seconds, CPU seconds)."""
    args, env = command(checkout, runs_tree, base_url)
    cpu, start = children_cpu(), now()
    proc = subprocess.run([PYTHON, *args], cwd=checkout, env=env, capture_output=True, text=True)
    wall, cpu = now() - start, children_cpu() - cpu
    if proc.returncode != 0 or proc.stdout.count('"up_to_date"') != runs or '"pushed_now": 0' not in proc.stdout:
        raise SystemExit(f"{checkout}: the re-sync did not find every run up to date: "
                         f"{proc.stderr or proc.stdout[-2000:]}")
    return wall, cpu


def main() -> None:
    parser = arguments(__doc__, repeat=5, quick="400 runs, 3 rounds")
    parser.set_defaults(size=2_000)
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--tree", type=Path, action="append", help="a checkout whose command is run (repeatable)")
    parser.add_argument("--instructions", action="store_true", help="count one re-sync per checkout under valgrind")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeat = min(args.runs, 400), 3
    checkouts = [tree.resolve() for tree in args.tree or [ROOT]]
    with scratch(args.dir, "syncbench-noop-many-") as work:
        runs_tree = work / "runs"
        for number in range(args.runs):
            write_run(runs_tree / f"run-{number:05d}", f"noop-{number:05d}-{uuid.uuid4().hex[:8]}", 1, args.size)
        with platform(work / "platform.db") as server:
            sync_args, env = command(checkouts[0], runs_tree, server.base_url)
            first = subprocess.run([PYTHON, *sync_args], cwd=checkouts[0], env=env, capture_output=True, text=True)
            if first.returncode != 0:
                raise SystemExit(f"the first sync failed: {first.stderr or first.stdout[-2000:]}")
            print(f"{args.runs} runs written and synced", flush=True)
            time.sleep(2.5)  # past sync/unchanged.py's SETTLED: what the first re-sync reads, it keeps
            firsts = {checkout: resync(checkout, runs_tree, server.base_url, args.runs) for checkout in checkouts}
            rounds: dict[Path, list[tuple[float, float]]] = {checkout: [] for checkout in checkouts}
            for _ in range(args.repeat):
                for checkout in checkouts:
                    rounds[checkout].append(resync(checkout, runs_tree, server.base_url, args.runs))
            counted = {}
            if args.instructions:
                here = os.getcwd()
                for checkout in checkouts:
                    sync_args, env = command(checkout, runs_tree, server.base_url)
                    os.chdir(checkout)  # ``-m commands`` finds the checkout's own first
                    try:
                        counted[checkout] = instructions(sync_args[0], sync_args[1:], env)
                    finally:
                        os.chdir(here)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[1]:.1f} (5 min)")
    print(f"\nno-op re-sync of {args.runs} runs, a fresh process each:\n")
    print("| checkout | first re-sync: wall, CPU | re-sync: wall, median (min-max) | CPU, median | instructions |")
    print("| --- | --- | --- | --- | ---: |")
    for checkout in checkouts:
        walls = [wall for wall, _ in rounds[checkout]]
        cpus = [cpu for _, cpu in rounds[checkout]]
        first_wall, first_cpu = firsts[checkout]
        count = f"{counted[checkout] / 1e6:,.0f} M" if checkout in counted else "-"
        print(f"| {checkout} | {first_wall:.3f} s, {first_cpu:.3f} s | {spread(walls)} s | "
              f"{statistics.median(cpus):.3f} s | {count} |")
    best = min(statistics.median(wall for wall, _ in rounds[c]) for c in checkouts)
    print(f"\ngoal: under {GOAL:g} s: {best:.3f} s ({'met' if best < GOAL else 'missed'} at this load)")


if __name__ == "__main__":
    main()
