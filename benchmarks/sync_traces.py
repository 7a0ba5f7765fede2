"""Syncing a run to Prime Traces, against the samples path and against prime-traces' own upload.

Run: ``python3 benchmarks/sync_traces.py [--episodes 10000] [--size 2000] [--repeat 3] [--quick] [--dir DIR]``

One sealed run of ``--episodes`` episodes (about ``--size`` bytes each) is written outside
any timing, and so is the same run as a JSONL file of the exact lines sync uploads (each
episode stamped with a run id, encoded as prime-traces encodes records). Then, each
``--repeat`` times, against a local platform in its own process (``platform serve
--traces``) with an empty database, each a fresh process (start-up included):

- ``prime-runs sync --to traces``: the spool read, stamped, cut into batches, uploaded;
  evaluation created and finalized;
- ``prime-runs sync --to samples``: the same spool projected to v0 rows and appended;
- ``TracesClient.upload_file`` of the JSONL file: the library alone, nothing read from a
  spool and no evaluation, which is the floor for the traces path.

It prints each median and the ratios (traces / samples, traces / library).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import (  # noqa: E402
    API_KEY, PYTHON, ROOT, arguments, child_env, cli_sync, drop_state, now, platform, scratch, spread, write_run)

from prime_runs_spool.platform_api.traces import encode_line, stamp_run  # noqa: E402
from prime_runs_spool.spool.reader import iter_records  # noqa: E402

LIBRARY_UPLOAD = """
import sys
from prime_traces import LineFormat, TracesClient
with TracesClient(api_key=sys.argv[2], base_url=sys.argv[1]) as client:
    receipts = client.upload_file(sys.argv[3], line_format=LineFormat.EPISODE)
print(len(receipts))
"""


def timed(cmd: list[str]) -> float:
    start = now()
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    elapsed = now() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} exited {proc.returncode}: {proc.stderr or proc.stdout[-2000:]}")
    return elapsed


def sync(tree: Path, base_url: str, to: str, episodes: int) -> float:
    elapsed, report = cli_sync(tree, base_url, "--to", to)
    (run,) = report["runs"]
    assert (run["state"], run["store"], run["pushed_total"]) == ("synced", to, episodes), run
    return elapsed


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="1,000 episodes, one repeat")
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.set_defaults(size=2_000)
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeat = 1_000, 1
    with scratch(args.dir, "bench-traces-") as work:
        tree = work / "tree"
        start = now()
        size = write_run(tree / "run", "bench-traces", args.episodes, args.size)
        jsonl = work / "episodes.jsonl"
        with open(jsonl, "wb") as out:
            for record in iter_records(tree / "run"):
                if record.type == "episode":
                    out.write(encode_line(stamp_run(record.data, "bench-traces-run")))
        print(f"{args.episodes} episodes: spool {size / 1e6:.1f} MB, JSONL {jsonl.stat().st_size / 1e6:.1f} MB, "
              f"written in {now() - start:.1f} s", flush=True)
        figures: dict[str, list[float]] = {"traces": [], "samples": [], "library": []}
        for attempt in range(args.repeat):
            for what in figures:
                drop_state(tree)
                with platform(work / f"{what}-{attempt}.db", "--traces") as server:
                    if what == "library":
                        elapsed = timed([PYTHON, "-c", LIBRARY_UPLOAD, server.base_url, API_KEY, str(jsonl)])
                    else:
                        elapsed = sync(tree, server.base_url, what, args.episodes)
                figures[what].append(elapsed)
                print(f"  {what:<8} {elapsed:.2f} s", flush=True)
        medians = {what: statistics.median(values) for what, values in figures.items()}
        for what, values in figures.items():
            print(f"{what:<8} {spread(values)} s  ({args.episodes / medians[what]:,.0f} episodes/s)")
        print(f"ratio traces/samples {medians['traces'] / medians['samples']:.2f}, "
              f"traces/library {medians['traces'] / medians['library']:.2f}")


if __name__ == "__main__":
    main()
