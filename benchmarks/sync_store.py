"""Sync from an object store (S3 API: moto's server on loopback) against the same spools on disk.

Run: ``python3 benchmarks/sync_store.py [--episodes 10000] [--runs 1000] [--size 2000]
[--peak-mb 300] [--repeat 3] [--only throughput|noop|grown|peak] [--quick] [--dir DIR]``

Two measurements, each against a baseline in the same run (ratios printed):

1. **Throughput**: one sealed run of ``--episodes`` episodes, uploaded to a bucket. Synced
   from the bucket (``sync_store``) and, as the baseline, from the same spool on local disk
   (``sync_paths``), each to a fresh ``prime-runs platform serve`` database, alternately,
   ``--repeat`` times.
2. **No-op re-sync** of ``--runs`` small synced runs: from the bucket (counting the store's
   requests: it must be one listing and nothing else) and, as the baseline, the same runs on
   local disk.
3. **Reading a grown segment** (``--only grown``): one live run mirrored (``prime-runs
   mirror``'s pass) and synced, grown by ``--episodes`` / 10 more episodes, mirrored and
   synced again: the bytes the second sync read from the store (every ranged GET counted)
   against the bytes the segment grew by; the goal is at most 1.1 x new + 256 KiB.
4. **Peak memory** of the ``prime-runs sync`` process syncing one run of ``--peak-mb`` MB
   (episodes of 20 KB) from the bucket, and the same run from local disk (fixtures/peak_rss.py).

The data is generated in a scratch folder (``--dir``) at run time and removed after; moto
keeps the bucket in its own memory. Needs ``obstore`` and ``moto[server]`` (the ``test`` extra).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import (  # noqa: E402
    API_KEY, PYTHON, ROOT, arguments, child_env, client_for, drop_state, human, now, platform, scratch, spread,
    write_run,
)

from prime_runs_spool import SegmentWriter  # noqa: E402
from prime_runs_spool.content.masking import MaskRules, mask  # noqa: E402
from prime_runs_spool.spool.layout import list_segments  # noqa: E402
from prime_runs_spool.content.remask import copy_masking  # noqa: E402
from prime_runs_spool.store.mirror import mirror_pass  # noqa: E402
from prime_runs_spool.store.objects import ObjectStore  # noqa: E402
from prime_runs_spool.sync.many import sync_paths  # noqa: E402
from prime_runs_spool.sync.options import SyncOptions  # noqa: E402
from prime_runs_spool.sync.store_sync import sync_store  # noqa: E402


def start_moto() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    box: list[str] = []
    seen = threading.Event()

    def watch() -> None:
        for line in proc.stdout:
            match = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            if match and not box:
                box.append(match.group(1))
                seen.set()

    threading.Thread(target=watch, daemon=True).start()
    if not seen.wait(30):
        proc.kill()
        raise SystemExit("moto's server did not start")
    endpoint = box[0]
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
                       "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false", "AWS_EC2_METADATA_DISABLED": "true"})
    return proc, endpoint


def new_bucket(endpoint: str) -> str:
    import httpx

    name = f"bench-{uuid.uuid4().hex[:10]}"
    httpx.put(f"{endpoint}/{name}").raise_for_status()
    return f"s3://{name}/outputs"


def upload(url: str, run_dir: Path, relative: str) -> None:
    import obstore
    from obstore.store import from_url

    store = from_url(url)
    for _, path in list_segments(run_dir):
        with open(path, "rb") as f:  # streamed in parts: a large segment is never held whole
            with obstore.open_writer(store, f"{relative}/spool/{path.name}") as out:
                while chunk := f.read(8 << 20):
                    out.write(chunk)


def throughput(work: Path, endpoint: str, episodes: int, size: int, repeat: int) -> None:
    run_dir = work / "big" / "run-000"
    written = write_run(run_dir, f"bench-store-{uuid.uuid4().hex[:8]}", episodes, size)
    url = new_bucket(endpoint)
    upload(url, run_dir, "run-000")
    print(f"throughput: 1 run, {episodes} episodes, {human(written)}", flush=True)
    times: dict[str, list[float]] = {"bucket": [], "bucket-state-dir": [], "local": []}
    for n in range(repeat):
        kinds = list(times) if n % 2 == 0 else list(reversed(times))
        for kind in kinds:
            with platform(work / f"{kind}-{n}.db") as server:
                client, destination = client_for(server.base_url)
                with client:
                    os.environ["XDG_CACHE_HOME"] = str(work / f"cache-{kind}-{n}")
                    start = now()
                    if kind == "local":
                        drop_state(work / "big")
                        reports = sync_paths([work / "big"], client, destination, SyncOptions())
                    else:
                        state_dir = work / f"state-{n}" if kind == "bucket-state-dir" else None
                        reports = sync_store(url, client, destination, SyncOptions(), state_dir=state_dir,
                                             store=ObjectStore(url))
                        if state_dir is None:  # the next round starts from nothing in the bucket
                            import obstore
                            from obstore.store import from_url

                            raw = from_url(url)
                            for page in obstore.list(raw, prefix="run-000/spool/sync"):
                                obstore.delete(raw, [m["path"] for m in page])
                    times[kind].append(now() - start)
                assert [r.state for r in reports] == ["synced"] and reports[0].pushed_now == episodes, reports
    best = {kind: min(values) for kind, values in times.items()}
    for kind in ("bucket", "bucket-state-dir", "local"):
        print(f"  {kind:<17} {spread(times[kind])} s ({episodes / best[kind]:,.0f} episodes/s)"
              + ("" if kind == "local" else f"; /local = {best[kind] / best['local']:.2f}x"), flush=True)
    print(f"  (best of {repeat}; 'bucket' keeps the state in the bucket, the default)", flush=True)


def noop(work: Path, endpoint: str, runs: int, repeat: int) -> None:
    tree = work / "many"
    url = new_bucket(endpoint)
    start = now()
    for number in range(runs):
        run_dir = tree / f"run-{number:04d}"
        write_run(run_dir, f"bench-noop-{number:04d}-{uuid.uuid4().hex[:6]}", 1, 500)
        upload(url, run_dir, f"run-{number:04d}")
    print(f"no-op: {runs} runs written and uploaded in {now() - start:.1f} s", flush=True)
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    with platform(work / "noop-store.db") as server:
        client, destination = client_for(server.base_url)
        with client:
            start = now()
            first = sync_store(url, client, destination, SyncOptions(), jobs=8)
            assert all(r.state == "synced" for r in first), {r.state for r in first}
            print(f"  first sync from the bucket: {now() - start:.1f} s", flush=True)
            store_times, listing_times = [], []
            for _ in range(repeat):
                start = now()
                ObjectStore(url).list()
                listing_times.append(now() - start)
                store = ObjectStore(url)
                start = now()
                again = sync_store(url, client, destination, SyncOptions(), store=store)
                store_times.append(now() - start)
                assert all(r.state == "up_to_date" for r in again) and len(again) == runs
                assert dict(store.stats) == {"list": 1}, dict(store.stats)
    with platform(work / "noop-local.db") as server:
        client, destination = client_for(server.base_url)
        with client:
            sync_paths([tree], client, destination, SyncOptions(), jobs=8)
            local_times = []
            for _ in range(repeat):
                start = now()
                again = sync_paths([tree], client, destination, SyncOptions())
                local_times.append(now() - start)
                assert all(r.state == "up_to_date" for r in again) and len(again) == runs
    s, l = min(store_times), min(local_times)
    print(f"  no-op re-sync of {runs} runs: from the bucket {spread(store_times)} s "
          f"(store requests: 1 listing, 0 GET, 0 PUT; the listing alone {spread(listing_times)} s), "
          f"local {spread(local_times)} s; "
          f"bucket/local = {s / l:.2f}x (best of {repeat})", flush=True)


def grown(work: Path, endpoint: str, episodes: int, size: int) -> None:
    """A live run's segment, synced from the bucket, grown by a tenth, synced again: the
    second sync's bytes read from the store against the bytes the segment grew by."""
    from fixtures.episodes import make_episode
    from prime_runs_spool.content.episodes import RolloutCounter

    run_id = f"bench-grown-{uuid.uuid4().hex[:8]}"
    writer = SegmentWriter.create(work / "grown" / "run-000", run_id)
    writer.append("manifest", {"run_id": run_id, "name": f"bench-{run_id}", "environments": ["gsm8k"],
                               "model": "Qwen/Qwen3-8B", "framework": "verifiers",
                               "config": {"model": "Qwen/Qwen3-8B"}})
    rules, counter, written = MaskRules.defaults_for_episode(), RolloutCounter(), [0]

    def add(count: int) -> None:
        episodes_now = [mask(make_episode(written[0] + n, size=size, run_id=run_id, salt=run_id), rules)
                        for n in range(count)]
        writer.append_many([("episode", e, {"episode_id": e["id"], "rollout_number": counter.next_number(e)})
                            for e in episodes_now])
        written[0] += count

    url = new_bucket(endpoint)
    with platform(work / "grown.db") as server:
        client, destination = client_for(server.base_url)
        with client:
            os.environ["XDG_CACHE_HOME"] = str(work / "cache-grown")
            sizes, read = [], []
            for count in (episodes, max(1, episodes // 10)):
                add(count)
                _wait_for_mark(writer)
                mirror_pass([work / "grown"], ObjectStore(url), masking=copy_masking)
                sizes.append(next(i.size for i in ObjectStore(url).list() if i.key.endswith(".jsonl")))
                store = ObjectStore(url)
                reports = sync_store(url, client, destination, SyncOptions(), store=store)
                assert [(r.state, r.pushed_now) for r in reports] == [("live", count)], reports
                read.append(store.stats)
    writer.seal("completed")
    new = sizes[1] - sizes[0]
    second = read[1]
    goal = 1.1 * new + 256 * 1024
    print(f"grown segment: {human(sizes[0])} synced, then {human(new)} more ({max(1, episodes // 10)} episodes)",
          flush=True)
    print(f"  second sync read {second['bytes_read']:,} bytes in {second['get']} GETs for {new:,} new bytes "
          f"({second['bytes_read'] / new:.2f}x new; goal <= 1.1 x new + 256 KiB = {goal:,.0f}: "
          f"{'met' if second['bytes_read'] <= goal else 'NOT met'})", flush=True)


def _wait_for_mark(writer: SegmentWriter) -> None:
    """Until the writer's durable mark is published (at most every 10 ms): the mirror reads it."""
    import time

    from prime_runs_spool.spool.durable_mark import durable_mark

    deadline = time.monotonic() + 5
    while durable_mark(writer.path) != writer.durable_bytes and time.monotonic() < deadline:
        time.sleep(0.002)


def peak_rss(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Run ``argv`` through fixtures/peak_rss.py (so this script's memory is not counted)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "peak"
        proc = subprocess.run([PYTHON, str(ROOT / "fixtures" / "peak_rss.py"), str(out), *argv], cwd=ROOT,
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"sync exited {proc.returncode}: {proc.stderr or proc.stdout}")
        return proc.returncode, int(out.read_text()) / 1024


def peak_memory(work: Path, endpoint: str, mb: float) -> None:
    run_dir = work / "peak" / "run-000"
    episodes = max(1, int(mb * 1e6 // 20_400))
    written = write_run(run_dir, f"bench-peak-{uuid.uuid4().hex[:8]}", episodes, 20_000)
    url = new_bucket(endpoint)
    upload(url, run_dir, "run-000")
    print(f"peak memory: 1 run, {episodes} episodes, {human(written)}", flush=True)
    figures = {}
    for kind, target in (("bucket", url), ("local", str(work / "peak"))):
        with platform(work / f"peak-{kind}.db") as server:
            env = {**child_env(), "XDG_CACHE_HOME": str(work / "peak-cache")}
            start = now()
            _, figures[kind] = peak_rss([PYTHON, "-m", "commands", "sync", target, "--base-url", server.base_url,
                                         "--json"], env)
            print(f"  from the {kind}: peak RSS {figures[kind]:.1f} MB ({now() - start:.1f} s)", flush=True)
    print(f"  bucket/local peak = {figures['bucket'] / figures['local']:.2f}x", flush=True)


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="1,000 episodes, 100 runs, 1 repeat")
    parser.set_defaults(size=2_000)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--peak-mb", type=float, default=300, help="spool size for the peak-memory figure")
    parser.add_argument("--only", choices=("throughput", "noop", "grown", "peak"), help="one measurement only")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.runs, args.repeat, args.peak_mb = 1_000, 100, 1, 30
    os.environ["PRIME_API_KEY"] = API_KEY
    proc, endpoint = start_moto()
    try:
        with scratch(args.dir, "bench-store-") as work:
            if args.only in (None, "throughput"):
                throughput(work, endpoint, args.episodes, args.size, args.repeat)
            if args.only in (None, "noop"):
                noop(work, endpoint, args.runs, args.repeat)
            if args.only in (None, "grown"):
                grown(work, endpoint, args.episodes, args.size)
            if args.only in (None, "peak"):
                peak_memory(work, endpoint, args.peak_mb)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
