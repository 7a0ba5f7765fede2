"""Where the wall time of ``prime-runs sync`` goes, from timestamps inside its process.

Run: ``python3 benchmarks/sync_timeline.py [--episodes 10000] [--size 20000] [--repeat 3]
[--quick] [--dir DIR] [--tree PATH ...]``

One sealed run is written (as benchmarks/sync_throughput.py writes it), then ``--repeat``
times ``prime-runs sync RUN --json --jobs 1`` runs as a fresh process against a fresh
``prime-runs platform serve``, under benchmarks/_synctrace.py, which stamps every request,
every state write and the pass with the wall clock and the process's CPU. Per round:

* **to first samples**: from the process's spawn to the first samples request (start-up,
  imports, the evaluation's requests, the first batch read, projected and announced), wall
  and the process's CPU by then;
* **samples**: from the first samples request to the last answer; **gaps**: the time
  between one answer and the next request, summed (what the sync itself adds between
  requests: acknowledging, announcing, the next batch if it is not ready);
* **after**: from the last samples answer to the process's exit (metadata, finalize, the
  report, the interpreter's exit), wall and CPU.

On a shared machine the wall figures move with the load; the CPU figures and the gaps move
far less. ``--tree`` runs the command from another checkout; given more than once, the
checkouts take turns in each round on the same spool (an A/B of two branches). docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import (  # noqa: E402
    PYTHON, ROOT, arguments, child_env, drop_state, human, platform, scratch, spread, write_run,
)

TRACER = Path(__file__).resolve().parent / "_synctrace.py"


def one_round(work: Path, run_dir: Path, label: str, tree: Path) -> dict[str, float]:
    drop_state(run_dir)
    trace = work / f"trace-{label}.json"
    with platform(work / f"timeline-{label}.db") as server:
        env = child_env()
        env["PYTHONPATH"] = f"{tree}:{env['PYTHONPATH']}"
        env["PRIME_RUNS_TRACE"] = str(trace)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        spawned = time.time()
        proc = subprocess.run([PYTHON, str(TRACER), "sync", str(run_dir), "--base-url", server.base_url, "--json",
                               "--jobs", "1"], cwd=tree, env=env, capture_output=True, text=True)
        exited = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"sync exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    events = json.loads(trace.read_text())
    starts = [e for e in events if e[3] == "samples start"]
    ends = [e for e in events if e[3] == "samples end"]
    gaps = [nxt[0] - end[0] for end, nxt in zip(ends, starts[1:])]
    return {"wall": exited - spawned, "cpu": cpu,
            "first": starts[0][0] - spawned, "first cpu": starts[0][1],
            "samples": ends[-1][0] - starts[0][0], "requests": len(starts), "gaps": sum(gaps),
            "widest gap": max(gaps, default=0.0),
            "after": exited - ends[-1][0], "after cpu": cpu - ends[-1][1]}


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="2,000 episodes, 2 repeats")
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--tree", type=Path, action="append", help="a checkout whose command is run (repeatable)")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeat = min(args.episodes, 2_000), min(args.repeat, 2)
    trees = [tree.resolve() for tree in args.tree or [ROOT]]
    rounds: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    with scratch(args.dir, "syncbench-tl-") as work:
        run_dir = work / "run"
        spool_bytes = write_run(run_dir, "bench-timeline", args.episodes, args.size)
        print(f"spool: {args.episodes} episodes of ~{args.size} B, {human(spool_bytes)} on disk", flush=True)
        for i in range(args.repeat):
            for number, tree in enumerate(trees):
                result = one_round(work, run_dir, f"{i}-{number}", tree)
                rounds[tree].append(result)
                print(f"  round {i + 1}, {tree}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()
                                                           if k != "requests"), flush=True)
    for tree, results in rounds.items():
        print(f"\n{tree}, {statistics.median(r['requests'] for r in results):.0f} samples requests a round:\n")
        print("| figure | seconds, median (min-max) |")
        print("| --- | ---: |")
        for key in results[0]:
            if key != "requests":
                print(f"| {key} | {spread([r[key] for r in results])} |")


if __name__ == "__main__":
    main()
