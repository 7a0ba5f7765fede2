"""``prime-runs import`` against the live path it reuses: what the import's own work costs.

Run: ``python3 benchmarks/import_outputs.py [--episodes N] [--rounds R] [--dir DIR]``

The import reads ``traces.jsonl`` twice (a checking pass that keeps only ids, then the
episodes), and writes them through ``open_run`` / ``log_episodes`` in batches of 32. The
baseline, in the same round and on the same disk, is the write alone: the same episodes,
already parsed, through ``open_run`` / ``log_episodes`` in the same batches. The ratio
(baseline time / import time) says how much of the live path's speed an import keeps; the
episodes are ``fixtures/eval_outputs/vf040-completed``'s (about 3 KB each) under fresh ids.
A second figure: re-importing the unchanged folder (the idempotent case, which writes
nothing) against the first import.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prime_runs_spool import open_run  # noqa: E402
from prime_runs_spool.importer.outputs import BATCH, import_output  # noqa: E402

SOURCE = Path(__file__).resolve().parent.parent / "fixtures" / "eval_outputs" / "vf040-completed"


def make_source(folder: Path, episodes: int) -> list[dict]:
    shutil.copytree(SOURCE, folder, symlinks=True)
    originals = [json.loads(line) for line in (SOURCE / "traces.jsonl").read_text().splitlines()]
    records = []
    with open(folder / "traces.jsonl", "w") as handle:
        for n in range(episodes):
            record = json.loads(json.dumps(originals[n % len(originals)]))
            record["id"] = f"{n:07d}-{record['id']}"
            records.append(record)
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    return records


def baseline(folder: Path, records: list[dict]) -> float:
    start = time.perf_counter()
    run = open_run(folder, name="baseline", run_id=records[0]["run"]["id"])
    for i in range(0, len(records), BATCH):
        run.log_episodes(records[i:i + BATCH])
    run.finish()
    return time.perf_counter() - start


def timed_import(folder: Path) -> float:
    start = time.perf_counter()
    report = import_output(folder)
    elapsed = time.perf_counter() - start
    assert report.state in ("imported", "up_to_date"), report.error
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    logging.getLogger("prime_runs_spool").addHandler(logging.NullHandler())  # the launch-file warning
    ratios, again = [], []
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            work = Path(tmp)
            records = make_source(work / "source", args.episodes)
            base = baseline(work / "baseline", [json.loads(json.dumps(r)) for r in records])
            first = timed_import(work / "source")
            second = timed_import(work / "source")
            ratios.append(base / first)
            again.append(second / first)
            print(f"round {round_ + 1}: {args.episodes} episodes: live path {base:.2f} s, import {first:.2f} s "
                  f"(ratio {base / first:.2f}), re-import {second:.2f} s ({second / first:.2f} of the import)")
    print(f"median: live path / import = {statistics.median(ratios):.2f}; "
          f"re-import / import = {statistics.median(again):.2f}")


if __name__ == "__main__":
    main()
