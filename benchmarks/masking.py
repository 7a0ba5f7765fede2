"""Masking cost per realistic episode: the memo against walking every config afresh.

Run: ``python3 benchmarks/masking.py [--episodes N] [--rounds R] [--before REV]``

Episodes are the reference record (fixtures/reference/episode_example.json: two traces,
each carrying its seat's resolved config) padded with 15 KB of text in one trace's
``info``, about 25 KB serialized, each a fresh deep copy with its own ids: what an eval's
``to_record()`` hands ``Run.log_episodes``. The configs are equal from one episode to the
next but never the same objects, so only an equality-verified memo can help.

Measured in one run, in the same process, on the same episodes: in each round every phase
takes its turn on each block of 25 episodes, in an order that rotates and reverses from
block to block (so each phase goes before each other one as often as after it: the first
to touch a block warms the caches for the rest), so a load that drifts within a second
weighs on every phase alike:

* ``memo``: ``mask(record, rules)``, the writer's call; a fresh ``MaskRules`` per round,
  so every round starts with an empty memo and pays its misses;
* ``walk``: the same rules with ``memo=False``, every node of every config walked (the
  code before the memo, with today's locations);
* ``before``: the masking module of git revision ``--before`` (default: main before the
  issue-11 locations and the memo), fewer locations, walked as it was. Skipped when git
  cannot show that revision.
* ``dumps``: ``orjson.dumps`` of the masked record, the serialization every episode pays
  anyway, for scale;
* ``miss`` against ``miss-walk``: the worst case for the memo, episodes whose configs
  never repeat (a per-episode seed), with and without the memo: what a useless memo costs.

Prints microseconds per episode (median over rounds) and the ratios walk/memo and
before/memo per round (median and range): how many times faster the memo is; and
miss/miss-walk: how much slower it is when it never hits.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from prime_runs_spool.content import masking  # noqa: E402

EXAMPLE = ROOT / "fixtures" / "reference" / "episode_example.json"
BEFORE_REV = "217fb85"
#: Episodes per turn of a phase.
BLOCK = 25


def episodes(count: int, *, unique_configs: bool = False) -> list[dict]:
    base = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    base["traces"][0]["info"] = {"notes": "lorem ipsum dolor sit amet " * 560}  # ~15 KB
    out = []
    for number in range(count):
        record = copy.deepcopy(base)
        record["id"] = f"{base['id']}-{number}"
        for t, trace in enumerate(record["traces"]):
            trace["id"] = f"{trace['id']}-{number}-{t}"
            if unique_configs:  # a per-episode seed: no config ever repeats, every lookup misses
                trace["agent"]["config"]["sampling"]["seed"] = number
        out.append(record)
    return out


def module_at(rev: str) -> types.ModuleType | None:
    """The masking module as it was at ``rev``, imported under another name."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:prime_runs_spool/content/masking.py"], cwd=ROOT,
                                capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    spec = importlib.util.spec_from_loader("masking_before", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["masking_before"] = module  # dataclasses look their module up
    exec(compile(source, f"masking.py@{rev}", "exec"), module.__dict__)
    return module


def timed(work, numbers: range) -> float:
    """Seconds spent by ``work`` on episodes ``numbers``."""
    start = time.perf_counter()
    for number in numbers:
        work(number)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", default=BEFORE_REV, help="git revision of the 'before' masking module")
    args = parser.parse_args()

    records = episodes(args.episodes)
    unique = episodes(args.episodes, unique_configs=True)
    size = len(orjson.dumps(records[0]))
    before = module_at(args.before)

    # The memo must not change a single byte of any result.
    check_rules = masking.MaskRules.defaults_for_episode()
    for record in records[:50]:
        assert orjson.dumps(masking.mask(record, check_rules)) == orjson.dumps(
            masking.mask(record, check_rules, memo=False))

    def phases() -> dict:
        # A rules object (and so a memo) per phase, as each run has its own.
        rules, rules_dumps, rules_miss = (masking.MaskRules.defaults_for_episode() for _ in range(3))
        out = {
            "memo": lambda n: masking.mask(records[n], rules),
            "walk": lambda n: masking.mask(records[n], rules, memo=False),
            "dumps": lambda n: orjson.dumps(masking.mask(records[n], rules_dumps)),
            # The worst case: configs that never repeat, so every lookup misses.
            "miss": lambda n: masking.mask(unique[n], rules_miss),
            "miss-walk": lambda n: masking.mask(unique[n], rules_miss, memo=False),
        }
        if before is not None:
            old_rules = before.MaskRules.defaults_for_episode()
            out["before"] = lambda n: before.mask(records[n], old_rules)
        return out

    samples: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {"walk/memo": [], "before/memo": [], "miss/miss-walk": []}
    for round_number in range(args.rounds):
        work = phases()
        names = list(work)
        spent = dict.fromkeys(names, 0.0)
        # Blocks of BLOCK episodes, each phase in turn on the same block, the order rotating:
        # on a shared machine the load drifts within a second, and every phase sees the same.
        for block_number, start in enumerate(range(0, len(records), BLOCK)):
            block = range(start, min(start + BLOCK, len(records)))
            turn = (round_number + block_number // 2) % len(names)
            order = names[turn:] + names[:turn]
            if block_number % 2:  # every pair of phases in both orders: the first warms the caches
                order.reverse()
            for name in order:
                spent[name] += timed(work[name], block)
        got = {name: seconds / len(records) for name, seconds in spent.items()}
        got["dumps"] -= got["memo"]  # the serialization alone
        for name, value in got.items():
            samples.setdefault(name, []).append(value)
        ratios["walk/memo"].append(got["walk"] / got["memo"])
        ratios["miss/miss-walk"].append(got["miss"] / got["miss-walk"])
        if "before" in got:
            ratios["before/memo"].append(got["before"] / got["memo"])

    print(f"{args.episodes} episodes of {size / 1000:.1f} KB, {args.rounds} rounds; "
          f"microseconds per episode (median over rounds)")
    for name in ("memo", "walk", "before", "dumps", "miss", "miss-walk"):
        if name in samples:
            print(f"  {name:7s} {statistics.median(samples[name]) * 1e6:8.1f} us")
    for name, values in ratios.items():
        if values:
            print(f"  {name:12s} x{statistics.median(values):.1f} (range {min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
