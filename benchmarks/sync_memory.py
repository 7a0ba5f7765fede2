"""Peak memory (RSS) of ``prime-runs sync`` pushing a large spool to the local platform.

Run: ``python3 benchmarks/sync_memory.py [--mb 1024] [--runs 1] [--jobs 1] [--repeat 1] [--quick] [--dir DIR]``

A tree of ``--runs`` sealed runs holding ``--mb`` megabytes is written (not timed), then
synced by ``python -m commands sync TREE --base-url URL --jobs N`` as its own process, to a
``prime-runs platform serve`` process on a fresh database; the platform's memory is not
counted. Peak RSS is the sync process's own ``ru_maxrss``, read with ``os.wait4`` by
fixtures/peak_rss.py, which starts it (so this script's memory is not counted in). For scale,
the same interpreter importing the CLI and exiting is measured too.
Goal: under 150 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import PYTHON, ROOT, arguments, child_env, human, now, platform, scratch, write_tree  # noqa: E402

GOAL_MB = 150


def run_measured(argv: list[str]) -> tuple[int, float, str]:
    """Run ``argv`` through fixtures/peak_rss.py; returns (exit status, peak RSS in MB, stdout).

    Not a plain ``wait4`` on our own child: Linux would count this script's memory at the
    fork in the child's peak (fixtures/peak_rss.py explains).
    """
    with tempfile.TemporaryDirectory() as folder, open(os.devnull, "wb") as null:
        peak_file = Path(folder) / "peak"
        proc = subprocess.run([PYTHON, str(ROOT / "fixtures" / "peak_rss.py"), str(peak_file), *argv],
                              cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=null)
        peak_kb = int(peak_file.read_text()) if peak_file.exists() else 0
    return proc.returncode, peak_kb / 1024, proc.stdout.decode()


def main() -> None:
    parser = arguments(__doc__, repeat=1, quick="100 MB")
    parser.add_argument("--mb", type=float, default=1024, help="megabytes of spool")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="sync --jobs (runs in parallel)")
    args = parser.parse_args()
    if args.quick:
        args.mb = min(args.mb, 100)

    _, baseline, _ = run_measured([PYTHON, "-c", "import commands.cli, prime_runs_spool.sync.many"])
    rows = []
    with scratch(args.dir, "syncbench-mem-") as work:
        tree = work / "tree"
        start = now()
        episodes, written = write_tree(tree, args.runs, int(args.mb * 1e6), args.size)
        print(f"tree: {args.runs} run(s), {episodes} episodes, {human(written)} written in {now() - start:.1f} s",
              flush=True)
        for i in range(args.repeat):
            with platform(work / f"mem-{i}.db") as server:
                start = now()
                code, peak, out = run_measured([PYTHON, "-m", "commands", "sync", str(tree), "--base-url",
                                                server.base_url, "--jobs", str(args.jobs), "--json"])
                elapsed = now() - start
            report = json.loads(out) if out.strip() else {}
            runs = report.get("runs", [])
            if code != 0 or not all(r["state"] == "synced" for r in runs):
                raise SystemExit(f"sync failed ({code}): {out}")
            sent = sum(r["bytes_sent"] for r in runs)
            rows.append((peak, elapsed, sent))
            print(f"  round {i + 1}: peak RSS {peak:.1f} MB, {elapsed:.1f} s, {human(sent)} sent", flush=True)
            for db in work.glob(f"mem-{i}.db*"):
                db.unlink()

    print()
    print("| figure | peak RSS, MB |")
    print("| --- | ---: |")
    print(f"| interpreter + imports only | {baseline:.1f} |")
    for i, (peak, elapsed, sent) in enumerate(rows):
        print(f"| sync of {human(written)} ({args.runs} run(s), --jobs {args.jobs}), round {i + 1}: "
              f"{elapsed:.0f} s, {human(sent)} sent | {peak:.1f} |")
    worst = max(peak for peak, _, _ in rows)
    print(f"\ngoal: peak RSS < {GOAL_MB} MB: {'MET' if worst < GOAL_MB else 'MISSED'} (worst {worst:.1f} MB)")


if __name__ == "__main__":
    main()
