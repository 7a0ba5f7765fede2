"""The first sync of many new runs, and the re-sync of them all with nothing to do.

Run: ``python3 benchmarks/sync_many.py [--runs 2000] [--episodes 3] [--repeat 3] [--quick] [--dir DIR]``

Trees of small sealed runs (``--episodes`` episodes of about ``--size`` bytes each, all in
one environment, as an eval sweep writes them) are written outside any timing: one of
``--runs`` runs and one of a quarter as many. Each is synced by ``prime-runs sync`` as a
fresh process (start-up included, ``--jobs`` at its default) to a local platform in its own
process with an empty database, then re-synced ``--repeat`` times with nothing to do.

What is linear shows in the per-run time: if the first sync is linear in the number of runs,
the large tree's seconds per run equal the small one's (the last line's ratio stays near 1;
a quadratic sync makes it about 4). The CPU the sync process and the platform process spent
on the first sync is printed per run too: on a shared machine it moves far less than the
wall time. Goals: 2,000 new runs in under 30 s, and
their no-op re-sync in under 5 s.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import arguments, cli_sync, now, platform, scratch, spread, write_run  # noqa: E402

FIRST_GOAL, NOOP_GOAL = 30.0, 5.0


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children: the syncs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds a running process has used (Linux /proc; 0 elsewhere): the platform."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(work: Path, runs: int, episodes: int, size: int, repeat: int) -> tuple[float, list[float]]:
    tree = work / f"tree-{runs}"
    start = now()
    for number in range(runs):
        write_run(tree / f"run-{number:05d}", f"many-{number:05d}-{uuid.uuid4().hex[:8]}", episodes, size)
    print(f"{runs} runs of {episodes} episodes written in {now() - start:.1f} s", flush=True)
    with platform(work / f"many-{runs}.db") as server:
        cpu, served = children_cpu(), process_cpu(server.proc.pid)
        first, report = cli_sync(tree, server.base_url)
        cpu, served = children_cpu() - cpu, process_cpu(server.proc.pid) - served
        assert len(report["runs"]) == runs and all(r["state"] == "synced" for r in report["runs"]), report
        print(f"  first sync: {first:.1f} s ({1000 * first / runs:.1f} ms a run); CPU a run: the sync's "
              f"{1000 * cpu / runs:.1f} ms, the platform's {1000 * served / runs:.1f} ms", flush=True)
        noop = []
        for _ in range(repeat):
            elapsed, report = cli_sync(tree, server.base_url)
            assert all(r["state"] == "up_to_date" and r["pushed_now"] == 0 for r in report["runs"]), report
            noop.append(elapsed)
        print(f"  no-op re-sync: {spread(noop)} s", flush=True)
    return first, noop


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="400 runs against 100, one re-sync")
    parser.set_defaults(size=2_000)
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--episodes", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeat = min(args.runs, 400), 1
    small_runs = max(1, args.runs // 4)
    with scratch(args.dir, "syncbench-many-") as work:
        small_first, small_noop = measure(work, small_runs, args.episodes, args.size, args.repeat)
        large_first, large_noop = measure(work, args.runs, args.episodes, args.size, args.repeat)
    per_run_ratio = (large_first / args.runs) / (small_first / small_runs)
    print()
    print("| runs | first sync, s | ms a run | no-op re-sync, s, median (min-max) |")
    print("| ---: | ---: | ---: | ---: |")
    for runs, first, noop in ((small_runs, small_first, small_noop), (args.runs, large_first, large_noop)):
        print(f"| {runs} | {first:.1f} | {1000 * first / runs:.1f} | {spread(noop)} |")
    print(f"\nper-run time, {args.runs} runs against {small_runs}: {per_run_ratio:.2f}x (1.0 is linear, "
          f"4 quadratic)")
    print(f"goals at {args.runs} runs: first sync < {FIRST_GOAL:g} s: {large_first:.1f} s; no-op < {NOOP_GOAL:g} s: "
          f"{statistics.median(large_noop):.1f} s")


if __name__ == "__main__":
    main()
