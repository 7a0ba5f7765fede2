"""verifiers' outputs of a completed run, as many episodes as a test needs, and the spool
``prime-runs eval`` would have written beside them.

The committed ``vf040-completed`` fixture is copied and its ``traces.jsonl`` rewritten with
its own rows in turn, each with a fresh id: runs of several tests then never share an
episode on one platform, and the count is the test's."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from support.env import VF040, child_env

#: The eval's process, as ``prime-runs eval`` leaves a run: every episode of traces.jsonl
#: logged (durable when log_episodes returns), the run sealed completed, its id printed.
EVAL = """
import json, sys
from pathlib import Path
from prime_runs_spool import open_run
run_dir = Path(sys.argv[1])
rows = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]
run = open_run(run_dir, name=run_dir.name)
run.log_episodes(rows)
run.finish()
print(run.id, flush=True)
"""


def vf040_outputs(run_dir: Path, episodes: int, *, errored: int = 0) -> list[str]:
    """``run_dir``: a copy of the fixture holding ``episodes`` episodes, the first
    ``errored`` of them errored (``ok`` false); their ids in ``traces.jsonl`` order."""
    shutil.copytree(VF040, run_dir, symlinks=True)
    traces = run_dir / "traces.jsonl"
    model = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    rows = []
    for number in range(episodes):
        row = copy.deepcopy(model[number % len(model)])
        row["id"] = uuid.uuid4().hex
        if errored:
            row["ok"] = number >= errored
        rows.append(row)
    traces.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return [row["id"] for row in rows]


def spooled_as_eval(run_dir: Path) -> str:
    """The spool ``prime-runs eval`` writes beside ``run_dir``'s traces.jsonl (the run named
    after the folder), by a process of its own; the run's local id."""
    ran = subprocess.run([sys.executable, "-c", EVAL, str(run_dir)], env=child_env(), timeout=120,
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()
