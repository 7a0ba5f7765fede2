"""Instructions per episode of sync's push path in this process, counted by valgrind: a
figure no load moves.

Run: ``python3 benchmarks/sync_push_instructions.py [--small N] [--large N] [--dir DIR]``
(needs valgrind; about 4 minutes)

The push path's CPU, without the network: the same episodes as ``sync_throughput.py``
(about 20 KB each, one sealed run) read by sync's own code, stage by stage:

* ``read``: every durable record, each line checked (``durable_records``);
* ``rows``: those records as encoded v0 rows (``RowStream``): the projection and its encoding;
* ``batches``: those rows laid out as request bodies (``batches``, each body finished as
  the pieces it is sent in and released as the sending does), what the sending thread is
  handed.

Each stage runs over a run of ``--small`` and one of ``--large`` episodes (written once,
outside valgrind, under ``--dir``) under ``cachegrind --cache-sim=no`` with
``PYTHONHASHSEED=0``; the difference over the difference in episodes is one episode's cost,
start-up and imports cancelled out. Instructions are not the whole cost: these stages move
about 80 KB of memory per episode, whose cache misses no count shows; ``--cpu`` prints each
stage's CPU seconds over the large run too (min of three; they move with the load).
``--cli`` counts the whole ``prime-runs sync RUN`` process too (start-up, sending and the
state saves included), each run to a fresh local platform in a process of its own (not
counted): its count for the small run is mostly start-up, the difference is per episode.

``--bare`` counts ``sync_throughput.py``'s bare loop too: a process POSTing the same request
bodies with a plain ``httpx.Client`` (built and written to files outside valgrind, read back
inside), each run to a fresh local platform: the floor the sync process is compared with.

``--stage S --run DIR`` runs one stage without valgrind (what each valgrind run executes).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

STAGES = {
    "read": "read and check every line",
    "rows": "... and project each episode as an encoded row",
    "batches": "... and lay the rows out as request bodies",
}
#: Any evaluation id: the projection writes it into every row's ``native_wrapper``.
EVALUATION_ID = "0b5e4f7c-6c1a-4a3e-9a4f-3f3b1f0d2c11"


def run_stage(stage: str, run_dir: Path) -> int:
    """Run one stage over ``run_dir``; returns how many bytes it produced (a check)."""
    sys.path.insert(0, str(ROOT))
    from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
    from prime_runs_spool.sync.records import durable_records
    from prime_runs_spool.sync.rows import RowStream, batches

    total = 0
    if stage == "read":
        for record in durable_records(run_dir):
            total += record.end_offset - record.offset
    elif stage == "rows":
        for row in RowStream(run_dir, None, EVALUATION_ID, MAX_REQUEST_BYTES).rows():
            total += len(row.data)
    elif stage == "batches":
        for batch in batches(RowStream(run_dir, None, EVALUATION_ID, MAX_REQUEST_BYTES), MAX_REQUEST_BYTES):
            for piece in batch.parts():  # what the sending thread is handed
                total += len(piece)
            batch.release()
    return total


def bare_bodies(run_dir: Path) -> Path:
    """The run's request bodies, one file each, as the sync cuts them (written once, kept)."""
    sys.path.insert(0, str(ROOT))
    from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
    from prime_runs_spool.sync.rows import RowStream, batches

    folder = run_dir.parent / f"{run_dir.name}-bodies"
    if not folder.exists():
        folder.mkdir()
        for number, batch in enumerate(batches(RowStream(run_dir, None, EVALUATION_ID, MAX_REQUEST_BYTES),
                                               MAX_REQUEST_BYTES)):
            if batch.count:
                (folder / f"{number:04d}.json").write_bytes(batch.body())
            batch.release()
    return folder


def post_bodies(folder: Path, base_url: str) -> None:
    """The bare loop: each body read from its file and POSTed whole, as sync_throughput.py's."""
    import httpx

    headers = {"Authorization": "Bearer bench-key", "Content-Type": "application/json",
               "Accept": "application/json"}
    with httpx.Client(timeout=120.0) as http:
        env = http.post(f"{base_url}/api/v1/environmentshub/resolve", json={"name": "gsm8k"}, headers=headers)
        created = http.post(f"{base_url}/api/v1/evaluations/", headers=headers,
                            json={"name": "bare", "environments": [{"id": env.json()["data"]["id"]}]})
        url = f"{base_url}/api/v1/evaluations/{created.json()['evaluation_id']}/samples"
        for path in sorted(folder.iterdir()):
            http.post(url, content=path.read_bytes(), headers=headers).raise_for_status()


def bare_instructions(run_dir: Path, env: dict[str, str]) -> int:
    """User-space instructions of the bare loop over ``run_dir``'s bodies to a fresh local platform."""
    from _instructions import instructions
    from _synccommon import platform

    folder = bare_bodies(run_dir)
    with tempfile.TemporaryDirectory(dir=run_dir.parent) as scratch, platform(Path(scratch) / "db") as server:
        return instructions(__file__, ["--stage", "bare", "--run", str(folder), "--base-url", server.base_url], env)


def ensure_run(folder: Path, episodes: int, size: int) -> Path:
    """A sealed run of ``episodes`` episodes under ``folder``, written once and kept."""
    from _synccommon import write_run

    run_dir = folder / f"push-{episodes}x{size}"
    if not (run_dir / "spool").exists():
        write_run(run_dir, f"bench-push-{episodes}", episodes, size)
    return run_dir


def cli_instructions(run_dir: Path, env: dict[str, str]) -> int:
    """User-space instructions of ``prime-runs sync RUN --jobs 1`` to a fresh local platform."""
    from _instructions import instructions
    from _synccommon import API_KEY, child_env, drop_state, platform

    drop_state(run_dir)
    with tempfile.TemporaryDirectory(dir=run_dir.parent) as folder, platform(Path(folder) / "db") as server:
        command_env = {**child_env(), "PRIME_API_KEY": API_KEY, "PYTHONHASHSEED": env["PYTHONHASHSEED"]}
        os.chdir(ROOT)  # ``-m commands`` is this checkout's
        return instructions("-m", ["commands", "sync", str(run_dir), "--base-url", server.base_url, "--json",
                                   "--jobs", "1"], command_env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=[*STAGES, "bare"])
    parser.add_argument("--run", type=Path)
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1200)
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--cpu", action="store_true", help="CPU seconds of each stage over the large run too")
    parser.add_argument("--cli", action="store_true", help="the whole prime-runs sync process too")
    parser.add_argument("--bare", action="store_true", help="the bare httpx loop POSTing the same bodies too")
    parser.add_argument("--base-url", help="for --stage bare: the platform")
    parser.add_argument("--dir", type=Path, default=ROOT.parent / "sync-push-runs",
                        help="where the runs are written and kept (a real disk)")
    args = parser.parse_args()
    if args.stage == "bare":
        post_bodies(args.run, args.base_url)
        return
    if args.stage:
        run_stage(args.stage, args.run)
        return
    from _instructions import instructions

    args.dir.mkdir(parents=True, exist_ok=True)
    small, large = ensure_run(args.dir, args.small, args.size), ensure_run(args.dir, args.large, args.size)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    print(f"instructions per episode of ~{args.size} B ({args.large} - {args.small} episodes)")
    for stage, what in STAGES.items():
        count = [instructions(__file__, ["--stage", stage, "--run", str(run)], env) for run in (small, large)]
        print(f"  {(count[1] - count[0]) / (args.large - args.small):11,.0f}  {stage}: {what}", flush=True)
    if args.cli:
        count = [cli_instructions(run, env) for run in (small, large)]
        print(f"  {(count[1] - count[0]) / (args.large - args.small):11,.0f}  the prime-runs sync process "
              f"({count[0] / 1e6:,.0f} M for {args.small} episodes, start-up included)", flush=True)
    if args.bare:
        count = [bare_instructions(run, env) for run in (small, large)]
        print(f"  {(count[1] - count[0]) / (args.large - args.small):11,.0f}  the bare loop POSTing the same "
              f"bodies ({count[0] / 1e6:,.0f} M for {args.small} episodes, start-up included)", flush=True)
    if args.cpu:
        print(f"CPU seconds over {args.large} episodes (min of 3)")
        for stage in STAGES:
            best = float("inf")
            for _ in range(3):
                start = time.process_time()
                run_stage(stage, large)
                best = min(best, time.process_time() - start)
            print(f"  {best:8.3f}  {stage}", flush=True)


if __name__ == "__main__":
    main()
