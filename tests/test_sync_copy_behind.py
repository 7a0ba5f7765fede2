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
from support.env import CLI, REPO_ROOT, child_env
from support.runs import RunBuilder
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
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=str(where / "home"),
                                        XDG_CACHE_HOME=str(where / "home" / ".cache")))
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


def test_an_earlier_copy_holding_every_sample_leaves_the_completed_evaluation_alone(tmp_path: Path, server,
                                                                                    api) -> None:
    """To samples, a copy behind by rows was already up to date; one that holds every row
    and only lacks the seal (the eval killed after its last episode, then resumed elsewhere
    to a ``completed`` seal with nothing left to run) recorded ``crashed`` over it."""
    builder = RunBuilder(tmp_path / "job-full" / "outputs" / "run", "copy-behind-samples")
    builder.open_segment()
    builder.add(4)
    builder.abandon()
    shutil.copytree(builder.run_dir, tmp_path / "job-early" / "outputs" / "run")
    builder.open_segment(counted=True)
    builder.seal("completed")

    runs = {}
    for name in ("job-full", "job-early"):
        (tmp_path / name / "home").mkdir()
        done = subprocess.run(sync_cmd(server.base_url, str(tmp_path / name / "outputs"), "--to", "samples", "-o",
                                       "json"), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env=child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path / name / "home"),
                                            XDG_CACHE_HOME=str(tmp_path / name / "home" / ".cache")))
        assert done.returncode == 0, done.stdout + done.stderr
        [runs[name]] = json.loads(done.stdout)["runs"]
        if name == "job-full":
            before = api.get(f"/evaluations/{runs[name]['evaluation_id']}").json()
    assert runs["job-full"]["state"] == "synced" and runs["job-early"]["state"] == "up_to_date", runs
    assert runs["job-early"]["pushed_now"] == 0
    after = api.get(f"/evaluations/{runs['job-full']['evaluation_id']}").json()
    assert (after["status"], after["total_samples"], after["finalize_count"]) == ("COMPLETED", 4, 1)
    assert after.get("metadata") == before.get("metadata")


def test_an_earlier_copy_behind_by_rows_shows_nothing_pending(tmp_path: Path, server, api) -> None:
    """To samples, a copy taken while the run was writing, synced after the full copy: its
    sync says ``up_to_date`` (the platform holds its rows, its first ones), but its state
    recorded none of them, so ``status`` said '0 samples pushed, 3 episodes pending' of a copy
    with nothing to push, after every sync of it (to Prime Traces: 0 pending)."""
    builder = RunBuilder(tmp_path / "job-full" / "outputs" / "run", "copy-behind-pending")
    builder.open_segment()
    builder.add(3)
    builder.wait_for_mark()
    shutil.copytree(builder.run_dir, tmp_path / "job-early" / "outputs" / "run")
    builder.add(3)
    builder.seal("completed")
    reports = {}
    for name in ("job-full", "job-early", "job-early"):
        (tmp_path / name / "home").mkdir(exist_ok=True)
        env = child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path / name / "home"),
                        XDG_CACHE_HOME=str(tmp_path / name / "home" / ".cache"))
        done = subprocess.run(sync_cmd(server.base_url, str(tmp_path / name / "outputs"), "--to", "samples", "-o",
                                       "json"), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        [reports[name]] = json.loads(done.stdout)["runs"]
        shown = subprocess.run(CLI + ["status", str(tmp_path / name / "outputs"), "--json"], capture_output=True,
                               text=True, timeout=60, env=env)
        [run] = json.loads(shown.stdout)["runs"]
        [destination] = run["destinations"]
        assert destination["pending"] == 0, (name, destination)
    assert reports["job-early"]["state"] == "up_to_date" and reports["job-early"]["pushed_now"] == 0, reports
    assert reports["job-early"]["pushed_total"] == 3, reports
    after = api.get(f"/evaluations/{reports['job-full']['evaluation_id']}").json()
    assert (after["status"], after["total_samples"], after["finalize_count"]) == ("COMPLETED", 6, 1)
