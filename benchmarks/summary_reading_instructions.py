"""Instructions per call of the summary's reading of one episode, counted by valgrind.

Run: ``python3 benchmarks/summary_reading_instructions.py`` (needs valgrind; about a minute)

The run reads each episode as it was written (``read_episode(record, payload)``,
docs/projection.md): this holds that reading to the cost of the plain one
(``read_episode(record)``, compute_summary's) on log_episodes.py's 25 KB episode, and
shows what the rare episode with a NaN score costs, which is parsed back from its payload
and read again. Each reading runs 4,000 and 20,000 times under ``cachegrind
--cache-sim=no`` with ``PYTHONHASHSEED=0``; the difference over 16,000 is one call,
start-up and the episode's preparation cancelled out.

``--mode M --calls N`` runs one reading without valgrind (what each valgrind run executes).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _instructions import instructions as count_instructions  # noqa: E402
from _instructions import padded_episode  # noqa: E402
MODES = {
    "plain": "read_episode(record): compute_summary's reading",
    "written": "read_episode(record, payload): the run's",
    "written-nan": "the run's, one trace's score NaN (parsed back, read again)",
}


def run_mode(mode: str, calls: int) -> None:
    sys.path.insert(0, str(ROOT))
    import orjson

    from prime_runs_spool.content.masking import MaskRules, mask
    from prime_runs_spool.content.summary import read_episode

    episode = padded_episode()
    if mode == "written-nan":
        next(iter(episode["traces"][0]["rewards"].values()))["score"] = float("nan")
    record = mask(episode, MaskRules.defaults_for_episode())
    payload = orjson.dumps(record)
    if mode == "plain":
        for _ in range(calls):
            read_episode(record)
    else:
        for _ in range(calls):
            read_episode(record, payload)


def instructions(mode: str, calls: int) -> int:
    return count_instructions(__file__, ["--mode", mode, "--calls", str(calls)], {**os.environ, "PYTHONHASHSEED": "0"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES)
    parser.add_argument("--calls", type=int)
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args.calls)
        return
    print("instructions per reading of the 25 KB benchmark episode (two traces)")
    for mode, what in MODES.items():
        print(f"  {(instructions(mode, 20_000) - instructions(mode, 4_000)) / 16_000:9,.0f}  {what}")


if __name__ == "__main__":
    main()
