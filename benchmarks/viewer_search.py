"""How fast ``prime-runs view``'s full-text search indexes a run and answers, and its size.

Run: ``python3 benchmarks/viewer_search.py [--episodes 100000] [--kb 20] [--repeat 5] [--dir DIR]``

A sealed run of ``--episodes`` episodes of about ``--kb`` KB of text each is written at
benchmark time in a scratch folder (removed after): an assistant answer and a tool output
of words drawn from a 20,000-word vocabulary (Zipf-like, so some words are everywhere and
most are rare), and one rare word planted in every 1,000th episode. Then, with the user
cache in the scratch folder:

* **indexing**: the row index caught up, then the search index built from nothing
  (``SearchIndex.refresh`` until it holds every episode): episodes per second;
* **search**: ``GET /run?run=bench&text=WORD`` over real HTTP once indexed, for the rare
  word (100 hits per 100,000) and for a common one (most episodes), median of ``--repeat``;
* **size**: the index file against the spool's segments.

Goal: a search over 100,000 episodes of about 20 KB under 1 s once
indexed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import scratch  # noqa: E402

from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool.spool.layout import list_segments  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402

GOAL_SECONDS = 1.0
RARE = "quokkaplanted"
VOCABULARY = [f"w{n}" for n in range(20_000)]
CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))


def words(rng: random.Random, chars: int) -> str:
    out, size = [], 0
    while size < chars:
        chunk = rng.choices(VOCABULARY, cum_weights=CUMULATIVE, k=256)
        out += chunk
        size += sum(len(w) + 1 for w in chunk)
    return " ".join(out)


def write_run(run_dir: Path, episodes: int, kb: int) -> int:
    rng = random.Random(7)
    writer = SegmentWriter.create(run_dir, "bench-search")
    writer.append("manifest", {"run_id": "bench-search", "name": "bench-search", "environments": ["gsm8k"],
                               "model": "m", "created_at": "2026-12-01T00:00:00Z"})
    batch = []
    half = kb * 1024 // 2
    for n in range(episodes):
        episode = make_episode(n, size=0, run_id="bench-search", idx=n % 1000)
        nodes = episode["traces"][0]["nodes"]
        nodes[1]["message"]["content"] = words(rng, half) + (f" {RARE}" if n % 1000 == 0 else "")
        nodes.append({"parent": 1, "message": {"role": "tool", "tool_call_id": "c", "content": words(rng, half)}})
        batch.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": 1}))
        if len(batch) == 500:
            writer.append_many(batch)
            batch = []
    if batch:
        writer.append_many(batch)
    writer.seal("completed")
    return sum(path.stat().st_size for _, path in list_segments(run_dir))


def load() -> str:
    """The machine's 1-minute load average, printed with each figure: the machine is shared."""
    return f"load {os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--kb", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk, not tmpfs)")
    args = parser.parse_args()
    with scratch(args.dir, "bench-search-") as work:
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")
        from prime_runs_spool.viewer.app import create_viewer_app
        from prime_runs_spool.viewer.server import EmbeddedServer
        from prime_runs_spool.viewer.sources import SpoolSource

        started = time.perf_counter()
        size = write_run(work / "tree" / "bench", args.episodes, args.kb)
        print(f"run: {args.episodes} episodes, {size / 1e6:.0f} MB, written in {time.perf_counter() - started:.1f} s; {load()}",
              flush=True)
        source = SpoolSource([work / "tree"])
        run = source.get("bench")
        started = time.perf_counter()
        while run.behind:
            run.refresh(1.0)
        rows_seconds = time.perf_counter() - started
        search = run.search()
        assert search is not None
        started = time.perf_counter()
        while search.count < len(run.rows):
            search.refresh(1.0)
        index_seconds = time.perf_counter() - started
        index_size = search.path.stat().st_size
        print(f"row index: {rows_seconds:.1f} s; search index: {index_seconds:.1f} s, "
              f"{args.episodes / index_seconds:.0f} episodes/s; index {index_size / 1e6:.0f} MB "
              f"({index_size / size:.2f}x the spool); {load()}", flush=True)
        timings: dict[str, list[float]] = {"rare": [], "common": []}
        with EmbeddedServer(create_viewer_app(source)) as server, \
                httpx.Client(base_url=server.base_url, timeout=600) as client:
            for _ in range(args.repeat):
                for label, word in (("rare", RARE), ("common", VOCABULARY[0])):
                    start = time.perf_counter()
                    page = client.get("/run", params={"run": "bench", "text": word})
                    timings[label].append(time.perf_counter() - start)
                    assert page.status_code == 200
                    if label == "rare":
                        expected = -(-args.episodes // 1000)
                        assert f'<b class="total">{expected}</b>' in page.text, page.text[-400:]
        rare, common = statistics.median(timings["rare"]), statistics.median(timings["common"])
        print(f"search (median of {args.repeat}): rare word {rare * 1e3:.0f} ms, common word {common * 1e3:.0f} ms; {load()}")
        verdict = "met" if max(rare, common) < GOAL_SECONDS else "NOT met"
        print(f"goal (a search under {GOAL_SECONDS:.0f} s once indexed): {verdict}")


if __name__ == "__main__":
    main()
