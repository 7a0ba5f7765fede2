"""A no-op re-sync of a fully synced tree, for a small and a large tree of spools.

Run: ``python3 benchmarks/sync_noop.py [--small-mb 10] [--large-mb 1024] [--runs 4]
[--repeat 7] [--quick] [--dir DIR]``

For each size, a tree of ``--runs`` sealed runs holding that many bytes (episodes of
``--size`` bytes) is written, synced once to a ``prime-runs platform serve`` process (not
timed), then re-synced ``--repeat`` times, timed two ways, alternately:

* **CLI**: ``python -m commands sync TREE --base-url URL --json`` as a fresh process, end
  to end (interpreter start and imports included);
* **library**: ``sync_paths`` in this process (the same call the CLI makes).

Every re-sync must report every run ``up_to_date`` with nothing pushed. The number of runs
is the same for both sizes, so the comparison isolates the size of the spools.
Goal: the large tree's time at most 1.5x the small one's.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import (  # noqa: E402
    arguments, cli_sync, client_for, human, now, platform, scratch, spread, write_tree,
)

from prime_runs_spool.sync.options import SyncOptions  # noqa: E402
from prime_runs_spool.sync.many import sync_paths  # noqa: E402

GOAL = 1.5


def measure(work: Path, label: str, total_bytes: int, runs: int, size: int, repeat: int) -> dict:
    tree = work / f"tree-{label}"
    start = now()
    episodes, written = write_tree(tree, runs, total_bytes, size)
    print(f"{label}: {runs} runs, {episodes} episodes, {human(written)} written in {now() - start:.1f} s",
          flush=True)
    with platform(work / f"{label}.db") as server:
        start = now()
        _, first = cli_sync(tree, server.base_url)
        assert all(r["state"] == "synced" for r in first["runs"]), first
        print(f"  first sync: {now() - start:.1f} s", flush=True)
        client, destination = client_for(server.base_url)
        cli, lib = [], []
        with client:
            for _ in range(repeat):
                t, report = cli_sync(tree, server.base_url)
                assert all(r["state"] == "up_to_date" and r["pushed_now"] == 0 for r in report["runs"]), report
                cli.append(t)
                start = now()
                reports = sync_paths([tree], client, destination, SyncOptions(), jobs=4)
                lib.append(now() - start)
                assert len(reports) == runs and all(r.state == "up_to_date" for r in reports), reports
    print(f"  no-op CLI {spread(cli)} s, library {spread(lib)} s", flush=True)
    return {"label": label, "bytes": written, "cli": cli, "lib": lib}


def main() -> None:
    parser = arguments(__doc__, repeat=7, quick="10 MB against 100 MB, 3 repeats")
    parser.add_argument("--small-mb", type=float, default=10)
    parser.add_argument("--large-mb", type=float, default=1024)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    if args.quick:
        args.large_mb, args.repeat = min(args.large_mb, 100), min(args.repeat, 3)

    with scratch(args.dir, "syncbench-noop-") as work:
        small = measure(work, "small", int(args.small_mb * 1e6), args.runs, args.size, args.repeat)
        large = measure(work, "large", int(args.large_mb * 1e6), args.runs, args.size, args.repeat)

    print()
    print("| tree | on disk | no-op CLI, s, median (min-max) | no-op library, s, median (min-max) |")
    print("| --- | ---: | ---: | ---: |")
    for m in (small, large):
        print(f"| {m['label']} ({args.runs} runs) | {human(m['bytes'])} | {spread(m['cli'])} | {spread(m['lib'])} |")
    ratio_cli = statistics.median(large["cli"]) / statistics.median(small["cli"])
    ratio_lib = statistics.median(large["lib"]) / statistics.median(small["lib"])
    print(f"| ratio large / small | {large['bytes'] / small['bytes']:.0f}x | {ratio_cli:.2f} | {ratio_lib:.2f} |")
    met = ratio_cli <= GOAL and ratio_lib <= GOAL
    print(f"\ngoal: large <= {GOAL}x small: {'MET' if met else 'MISSED'} "
          f"(CLI {ratio_cli:.2f}, library {ratio_lib:.2f})")


if __name__ == "__main__":
    main()
