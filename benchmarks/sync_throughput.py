"""Sync throughput against a bare httpx loop POSTing the same request bodies.

Run: ``python3 benchmarks/sync_throughput.py [--episodes 10000] [--size 20000] [--repeat 3]
[--quick] [--dir DIR]``

One sealed run of ``--episodes`` episodes of about ``--size`` bytes is written to a spool
(outside any timing). Then, ``--repeat`` times, alternately:

* **sync**: a fresh database behind a fresh ``prime-runs platform serve`` process; the
  library call ``sync_paths`` (the code ``prime-runs sync`` runs), timed from the call to
  its return: create the evaluation, read + project + batch + push every row (one state
  save, with its fsyncs, per request), record metadata, finalize.
* **bare**: a fresh database behind a fresh server of the same kind; an evaluation is
  created and the request bodies are built with the same projection and batching
  (``RowStream`` + ``batches``) *before* the clock starts; timed: a plain ``httpx.Client``
  loop POSTing those bodies, nothing else.

The server runs in its own process for both, so client and server never share a GIL.
Goal (issue 5): sync time at most 1.3x the bare loop's.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from _synccommon import (  # noqa: E402
    API_KEY, arguments, client_for, drop_state, human, now, platform, scratch, spread, write_run,
)

from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES  # noqa: E402
from prime_runs_spool.sync.options import SyncOptions  # noqa: E402
from prime_runs_spool.sync.rows import RowStream, batches  # noqa: E402
from prime_runs_spool.sync.many import sync_paths  # noqa: E402

GOAL = 1.3


def time_sync(work: Path, run_dir: Path, label: str, max_request_bytes: int) -> tuple[float, int, int]:
    drop_state(run_dir)
    with platform(work / f"sync-{label}.db") as server:
        client, destination = client_for(server.base_url)
        with client:
            options = SyncOptions(max_request_bytes=max_request_bytes)
            start = now()
            reports = sync_paths([run_dir], client, destination, options, jobs=1)
            elapsed = now() - start
    (report,) = reports
    if report.state != "synced":
        raise SystemExit(f"sync did not finish: {report.state} {report.error}")
    return elapsed, report.pushed_now, report.bytes_sent


def time_bare(work: Path, run_dir: Path, label: str, max_request_bytes: int) -> tuple[float, int, int]:
    with platform(work / f"bare-{label}.db") as server:
        client, _ = client_for(server.base_url)
        with client:
            env_id = client.resolve_environment("gsm8k")
            evaluation = client.create_evaluation({"name": "bare", "environments": [{"id": env_id}]})
        evaluation_id = str(evaluation["evaluation_id"])
        # Built outside the timed region: the same rows, in the same requests, sync sends.
        stream = RowStream(run_dir, None, evaluation_id, max_request_bytes)
        bodies = [bytes(batch.body()) for batch in batches(stream, max_request_bytes) if batch.count]
        rows = sum(b.count(b'"sample_id"') for b in bodies)  # one per row (row keys are fixed)
        headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json",
                   "Accept": "application/json"}
        url = f"{server.base_url}/api/v1/evaluations/{evaluation_id}/samples"
        with httpx.Client(timeout=120.0) as http:
            start = now()
            for body in bodies:
                http.post(url, content=body, headers=headers).raise_for_status()
            elapsed = now() - start
        sent = sum(len(b) for b in bodies)
        del bodies
    return elapsed, rows, sent


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="2,000 episodes, 2 repeats")
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--max-request-bytes", type=int, default=MAX_REQUEST_BYTES)
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeat = min(args.episodes, 2_000), min(args.repeat, 2)

    with scratch(args.dir, "syncbench-tp-") as work:
        run_dir = work / "run"
        spool_bytes = write_run(run_dir, "bench-throughput", args.episodes, args.size)
        print(f"spool: {args.episodes} episodes of ~{args.size} B, {human(spool_bytes)} on disk", flush=True)
        syncs, bares, ratios = [], [], []
        for i in range(args.repeat):
            s, s_rows, s_bytes = time_sync(work, run_dir, str(i), args.max_request_bytes)
            b, b_rows, b_bytes = time_bare(work, run_dir, str(i), args.max_request_bytes)
            if (s_rows, s_bytes) != (b_rows, b_bytes):
                print(f"  warning: sync sent {s_rows} rows / {s_bytes} B, bare {b_rows} rows / {b_bytes} B")
            syncs.append(s)
            bares.append(b)
            ratios.append(s / b)
            print(f"  round {i + 1}: sync {s:.3f} s, bare {b:.3f} s, ratio {s / b:.2f}  "
                  f"({s_rows} rows, {human(s_bytes)} sent)", flush=True)

    mb = s_bytes / 1e6
    print()
    print("| figure | seconds, median (min-max) | MB/s (median) |")
    print("| --- | ---: | ---: |")
    print(f"| bare httpx loop, pre-built bodies | {spread(bares)} | {mb / statistics.median(bares):.0f} |")
    print(f"| prime-runs sync (library) | {spread(syncs)} | {mb / statistics.median(syncs):.0f} |")
    print(f"| ratio sync / bare | {spread(ratios)} | |")
    met = statistics.median(ratios) <= GOAL
    print(f"\ngoal: sync <= {GOAL}x bare: {'MET' if met else 'MISSED'} (median ratio {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
