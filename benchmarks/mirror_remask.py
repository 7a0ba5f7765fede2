"""Time and peak memory (RSS) of ``prime-runs mirror --once`` of a spool written under older
masking rules (uploaded as a copy masked again, store/mirror.py) against the same spool
marked as today's (its bytes copied), into a ``file://`` store.

Run: ``python3 benchmarks/mirror_remask.py [--mb 200] [--size 20000] [--repeat 3] [--quick] [--dir DIR]``

Two one-segment runs of about ``--mb`` megabytes are written (not timed) with the segment
writer, every episode's seat config holding credentials in clear text: one whose manifest
has no ``masking_version`` (masked again by the mirror), one whose manifest says today's
(copied as it is). Each is mirrored by ``python -m commands mirror --once`` as its own process,
into a fresh store folder each round; peak RSS is that process's ``ru_maxrss``
(fixtures/peak_rss.py, as benchmarks/sync_memory.py reads it). No goal: the masked copy's
cost is to be of the order of the byte copy's, and its memory not to grow with the spool.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import PYTHON, arguments, human, scratch  # noqa: E402
from sync_memory import run_measured  # noqa: E402

from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool.content.mask_locations import MASKING_VERSION  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402

SEAT = {"client": {"api_key": "sk-bench-not-a-secret", "headers": {"X-Key": "bench-header"}},
        "env_args": {"judge_api_key": "jk-bench"}}


def write_run(run_dir: Path, run_id: str, nbytes: int, size: int, version: int | None) -> int:
    """A sealed run of about ``nbytes``; its episodes."""
    manifest = {"run_id": run_id, "name": run_id, "environments": ["gsm8k"], "model": "m", "format_version": 1,
                "config": {"model": "m", **SEAT}}
    if version is not None:
        manifest["masking_version"] = version
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", manifest)
    count = max(1, nbytes // size)
    for start in range(0, count, 100):
        items = []
        for number in range(start, min(count, start + 100)):
            episode = make_episode(number, run_id=run_id, size=size)
            episode["traces"][0]["agent"]["config"].update(SEAT)
            items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
        writer.append_many(items)
    writer.seal("completed")
    writer.close()
    return count


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="20 MB, one round")
    parser.add_argument("--mb", type=float, default=200, help="megabytes of spool")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.repeat = min(args.mb, 20), 1
    _, baseline, _ = run_measured([PYTHON, "-c", "import commands.cli, prime_runs_spool.store.mirror"])
    with scratch(args.dir, "mirrorbench-") as work:
        for name, version in (("older", None), ("today", MASKING_VERSION)):
            episodes = write_run(work / name / "run", f"bench-{name}", int(args.mb * 1e6), args.size, version)
            size = (work / name / "run" / "spool" / "seg-000001.jsonl").stat().st_size
            print(f"{name}: {episodes} episodes, {human(size)}", flush=True)
        for round_number in range(args.repeat):
            for name in ("older", "today"):
                store = work / f"store-{name}"
                shutil.rmtree(store, ignore_errors=True)
                store.mkdir()
                start = time.perf_counter()
                status, peak, out = run_measured([PYTHON, "-m", "commands", "mirror", "--once", str(work / name),
                                                  f"file://{store}"])
                elapsed = time.perf_counter() - start
                assert status == 0, out
                masked = "masked again" in out
                print(f"round {round_number + 1} {name}: {elapsed:.2f} s, peak RSS {peak:.1f} MB"
                      f"{' (masked again)' if masked else ''}", flush=True)
    print(f"the interpreter importing the mirror and exiting: {baseline:.1f} MB")


if __name__ == "__main__":
    main()
