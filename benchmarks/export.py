"""Peak memory (RSS) and speed of ``prime-runs export`` over one large spool.

Run: ``python3 benchmarks/export.py [--episodes 200000] [--size 1500] [--formats parquet,csv,jsonl] [--quick] [--dir DIR]``

One sealed run of ``--episodes`` episodes of about ``--size`` bytes is written (not timed),
then exported by ``python -m commands export RUN -o FILE`` in its own process, once per
format. Peak RSS is that process's own ``ru_maxrss``, read by fixtures/peak_rss.py (so this
script's memory is not counted in). For scale, the same interpreter importing the command
and pyarrow and exiting is measured too. ``--episodes 1000000`` is the million-episode run.
Goal: 200,000 episodes of about 1.5 KB under 400 MB peak RSS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import PYTHON, ROOT, arguments, child_env, human, now, scratch, write_run  # noqa: E402

GOAL_MB = 400


def run_measured(argv: list[str]) -> tuple[int, float, str]:
    """Run ``argv`` through fixtures/peak_rss.py: (exit status, peak RSS in MB, stdout)."""
    with tempfile.TemporaryDirectory() as folder:
        peak_file = Path(folder) / "peak"
        proc = subprocess.run([PYTHON, str(ROOT / "fixtures" / "peak_rss.py"), str(peak_file), *argv], cwd=ROOT,
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak_kb = int(peak_file.read_text()) if peak_file.exists() else 0
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return proc.returncode, peak_kb / 1024, proc.stdout.decode()


def main() -> None:
    parser = arguments(__doc__, repeat=1, quick="20,000 episodes")
    parser.set_defaults(size=1_500)
    parser.add_argument("--episodes", type=int, default=200_000)
    parser.add_argument("--formats", default="parquet,csv,jsonl")
    args = parser.parse_args()
    if args.quick:
        args.episodes = min(args.episodes, 20_000)

    _, baseline, _ = run_measured([PYTHON, "-c", "import commands.cli, prime_runs_spool.export.tables, "
                                                 "pyarrow.parquet"])
    rows = []
    with scratch(args.dir, "exportbench-") as work:
        start = now()
        written = write_run(work / "run", "export-bench", args.episodes, args.size)
        print(f"spool: {args.episodes} episodes, {human(written)} written in {now() - start:.1f} s", flush=True)
        for fmt in args.formats.split(","):
            out = work / f"samples.{fmt}"
            for i in range(args.repeat):
                start = now()
                _, peak, _ = run_measured([PYTHON, "-m", "commands", "export", str(work / "run"), "-o", str(out)])
                elapsed = now() - start
                rows.append((fmt, peak, elapsed, os.path.getsize(out)))
                print(f"  {fmt} round {i + 1}: peak RSS {peak:.1f} MB, {elapsed:.1f} s, "
                      f"{args.episodes / elapsed:,.0f} episodes/s, file {human(os.path.getsize(out))}", flush=True)

    print()
    print(f"| format | peak RSS, MB | seconds | episodes/s | file |  ({args.episodes:,} episodes of ~{args.size} B, "
          f"{human(written)} of spool; interpreter + imports only: {baseline:.1f} MB)")
    print("| --- | ---: | ---: | ---: | ---: |")
    for fmt, peak, elapsed, size in rows:
        print(f"| {fmt} | {peak:.1f} | {elapsed:.1f} | {args.episodes / elapsed:,.0f} | {human(size)} |")
    worst = max(peak for _, peak, _, _ in rows)
    print(f"\ngoal: under {GOAL_MB} MB peak RSS: {'met' if worst < GOAL_MB else 'NOT met'} ({worst:.1f} MB)")


if __name__ == "__main__":
    main()
