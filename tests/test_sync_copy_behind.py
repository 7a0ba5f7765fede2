"""Replaying an old artifact: a run completed and synced from one copy, then an earlier copy
of it (an artifact packed as the eval died: its ``traces.jsonl`` torn) synced on another
machine with no state. Into Prime Traces (content addressed) its episodes are answered
again and nothing is stored twice; its end, ``crashed``, must not be recorded over the
evaluation the full copy completed: the report says so, and the evaluation stays as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from support import platform_process
from support.env import REPO_ROOT, child_env
from support.sync_e2e import TOKEN, sync_cmd

pytestmark = pytest.mark.slow  # sync processes against a platform process

server, api = platform_process.module_fixtures(TOKEN, "api", "--traces", "--request-deadline", "0.4")

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def job(base_url: str, tmp_path: Path, fixture: str, job_name: str) -> dict:
    """One CI job: the artifact unpacked afresh into its own folder, a fresh home, piped."""
    where = tmp_path / job_name
    shutil.copytree(EVAL_OUTPUTS / fixture, where / "outputs" / "run", symlinks=True)
    (where / "home").mkdir()
    done = subprocess.run(sync_cmd(base_url, str(where / "outputs"), "--to", "traces", "-o", "json"),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=str(where / "home")))
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = json.loads(done.stdout)["runs"]
    return run


def test_an_earlier_copy_synced_after_the_run_completed_leaves_its_evaluation_completed(tmp_path: Path, server,
                                                                                        api) -> None:
    full = job(server.base_url, tmp_path, "vf040-completed", "job-full")
    assert (full["state"], full["pushed_total"]) == ("synced", 4), full
    before = api.get(f"/evaluations/{full['evaluation_id']}").json()
    assert before["status"] == "COMPLETED" and "prime_runs" not in (before.get("metadata") or {})

    torn = job(server.base_url, tmp_path, "vf040-torn", "job-partial")
    assert torn["evaluation_id"] == full["evaluation_id"]
    assert torn["state"] == "up_to_date", torn
    assert any("another copy of this run, further on, completed its evaluation; this copy ends crashed" in warning
               for warning in torn["warnings"]), torn
    after = api.get(f"/evaluations/{full['evaluation_id']}").json()
    assert after["status"] == "COMPLETED" and after["finalize_count"] == 1
    assert after.get("metadata") == before.get("metadata")
    episodes = api.get("/episodes", params={"run_id": full["evaluation_id"], "limit": 100}).json()["items"]
    assert len(episodes) == 4  # stored once, however often they were sent
