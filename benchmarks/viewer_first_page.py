"""How fast ``prime-runs view`` opens a big run's first table page.

Run: ``python3 benchmarks/viewer_first_page.py [--episodes 100000] [--repeat 5] [--quick] [--dir DIR]``

A sealed run of ``--episodes`` small episodes (``fixtures.episodes.make_episode`` with no
padding, about 1.6 KB each) is written at benchmark time in a scratch folder (removed after;
nothing is committed). Then, ``--repeat`` times, with a fresh viewer each time (nothing
indexed yet), over real HTTP to the viewer's uvicorn server on a loopback port:

* **first page**: ``GET /run?run=KEY``, the run page with its first 50 rows (spool order);
* **baseline, raw first page**: read the first 50 episode lines of the segment and parse
  them with orjson, the least any viewer must do to show 50 rows;
* **baseline, full scan**: ``read_run`` (what ``prime-runs status`` does): every line read
  and verified once, the cost a viewer that indexed everything before answering would pay;
* **indexed**: the time until the background index has caught up with the whole run, then
  a page sorted by reward (descending) and a text search over the prompts, over all rows.

Goal: the first page in under 1 s, as fast for 100,000 episodes as for 100.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import scratch  # noqa: E402

from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool.content.episodes import RolloutCounter  # noqa: E402
from prime_runs_spool.spool.layout import list_segments  # noqa: E402
from prime_runs_spool.spool.scan import read_run  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402
from prime_runs_spool.viewer.app import create_viewer_app  # noqa: E402
from prime_runs_spool.viewer.server import EmbeddedServer  # noqa: E402
from prime_runs_spool.viewer.sources import SpoolSource  # noqa: E402

GOAL_SECONDS = 1.0
PAGE = 50


def write_run(run_dir: Path, episodes: int) -> int:
    counter = RolloutCounter()
    writer = SegmentWriter.create(run_dir, "bench-viewer")
    writer.append("manifest", {"run_id": "bench-viewer", "name": "bench-viewer", "environments": ["gsm8k"],
                               "model": "Qwen/Qwen3-8B", "framework": "verifiers", "config": {"model": "Qwen/Qwen3-8B"},
                               "created_at": "2026-12-01T00:00:00Z"})
    batch = []
    for n in range(episodes):
        episode = make_episode(n, size=0, run_id="bench-viewer", idx=n % 1000)
        batch.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": counter.next_number(episode)}))
        if len(batch) == 1000:
            writer.append_many(batch)
            batch = []
    if batch:
        writer.append_many(batch)
    writer.seal("completed")
    return sum(path.stat().st_size for _, path in list_segments(run_dir))


def raw_first_page(run_dir: Path) -> float:
    start = time.perf_counter()
    rows = 0
    with open(list_segments(run_dir)[0][1], "rb") as handle:
        for line in handle:
            record = orjson.loads(line)
            if record.get("type") == "episode":
                rows += 1
                if rows == PAGE:
                    break
    return time.perf_counter() - start


def full_scan(run_dir: Path) -> float:
    start = time.perf_counter()
    read_run(run_dir)
    return time.perf_counter() - start


def viewer_round(tree: Path) -> dict[str, float]:
    source = SpoolSource([tree])
    with EmbeddedServer(create_viewer_app(source)) as server, httpx.Client(base_url=server.base_url, timeout=120) as c:
        start = time.perf_counter()
        page = c.get("/run", params={"run": "bench"})
        first = time.perf_counter() - start
        assert page.status_code == 200 and 'data-n="50"' in page.text, page.text[-500:]
        run = source.get("bench")
        while run.behind:
            time.sleep(0.01)
        indexed = time.perf_counter() - start
        start = time.perf_counter()
        page = c.get("/run", params={"run": "bench", "sort": "reward", "desc": "1"})
        sorted_page = time.perf_counter() - start
        assert page.status_code == 200
        start = time.perf_counter()
        page = c.get("/run", params={"run": "bench", "q": "what is 7 + 7"})
        search = time.perf_counter() - start
        assert page.status_code == 200
        return {"first": first, "indexed": indexed, "sorted": sorted_page, "search": search,
                "rows": float(len(run.rows))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10,000 episodes, 2 rounds")
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk, not tmpfs)")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeat = 10_000, 2
    with scratch(args.dir, "bench-viewer-") as work:
        tree = work / "tree"
        started = time.perf_counter()
        size = write_run(tree / "bench", args.episodes)
        print(f"run: {args.episodes} episodes, {size / 1e6:.0f} MB, written in {time.perf_counter() - started:.1f} s",
              flush=True)
        rounds = []
        for i in range(args.repeat):
            raw, scan = raw_first_page(tree / "bench"), full_scan(tree / "bench")
            result = viewer_round(tree)
            assert result["rows"] == args.episodes
            rounds.append({**result, "raw": raw, "scan": scan})
            print(f"  round {i + 1}: first page {result['first'] * 1e3:.0f} ms, raw first page {raw * 1e3:.1f} ms, "
                  f"full scan {scan:.2f} s, indexed in {result['indexed']:.2f} s, sorted page "
                  f"{result['sorted'] * 1e3:.0f} ms, search {result['search'] * 1e3:.0f} ms", flush=True)
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(f"median of {args.repeat}: first page {med['first'] * 1e3:.0f} ms "
          f"({med['first'] / med['raw']:.0f}x the raw first page, {med['first'] / med['scan']:.2f}x a full scan); "
          f"whole run indexed in {med['indexed']:.2f} s ({med['indexed'] / med['scan']:.2f}x a full scan); "
          f"sorted page {med['sorted'] * 1e3:.0f} ms; search {med['search'] * 1e3:.0f} ms")
    verdict = "met" if med["first"] < GOAL_SECONDS else "NOT met"
    print(f"goal (first page under {GOAL_SECONDS:.0f} s): {verdict}")


if __name__ == "__main__":
    main()
