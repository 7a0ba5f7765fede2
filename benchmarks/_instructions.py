"""What the instruction-counting benchmarks share: the 25 KB episodes log_episodes.py's Pool
makes, and a valgrind run's instruction count.

valgrind's ``cachegrind --cache-sim=no`` counts the instructions a process runs in user
space, the same on every run however loaded the machine is; each script runs its own
``--mode`` (or piece) under it at two sizes and takes the difference.
"""

from __future__ import annotations

import compileall
import functools
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "fixtures" / "reference" / "episode_example.json"
#: The text added to one trace's ``info``: the reference record becomes about 25 KB.
PADDING = 15_000


def padded_episode() -> dict[str, Any]:
    """The reference record padded as log_episodes.py's Pool pads it."""
    import orjson

    episode = orjson.loads(EXAMPLE.read_bytes())
    episode["traces"][0].setdefault("info", {})["notes"] = "y" * PADDING
    return episode


def bench_episodes(count: int) -> list[dict[str, Any]]:
    """``count`` fresh episodes (parsed anew, their ids changed, their runtime records' box
    ids too), as an eval's are."""
    import orjson

    raw = orjson.dumps(padded_episode())
    episodes = []
    for n in range(count):
        episode = orjson.loads(raw)
        episode["id"] = f"bench-{n:08d}"
        episode["task"]["data"]["idx"] = n % 100
        for t, trace in enumerate(episode["traces"]):
            trace["id"] = f"bench-{n:08d}-{t}"
            trace["task"]["data"]["idx"] = n % 100
            runtime = trace["agent"].get("runtime")
            if runtime:  # each rollout's box has its own id (verifiers: ``vf-`` and 12 hex digits)
                runtime["id"] = f"vf-{n:08x}{t:04x}"
        episodes.append(episode)
    return episodes


@functools.cache
def _compiled() -> None:
    """The checkout's modules compiled before the first count: a ``.pyc`` out of date (after a
    rebase) is compiled by whichever valgrind run imports it first, which put about 125k
    instructions an episode on that run alone (a baseline mode's, so every ratio moved)."""
    for package in ("prime_runs_spool", "commands"):
        compileall.compile_dir(ROOT / package, quiet=1)


def instructions(script: str, args: list[str], env: Mapping[str, str] | None = None) -> int:
    """User-space instructions of ``python3 script *args`` under valgrind."""
    _compiled()
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, script, *args],
        capture_output=True, text=True, env=dict(env) if env is not None else None,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"{Path(script).name} {' '.join(args)!r} failed under valgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))
