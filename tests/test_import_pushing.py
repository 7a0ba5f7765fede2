"""A pushing vf-eval that may still be running is not spooled yet (importer/pushing.py).

Its background queue uploads each episode to its own platform run right after the line
reaches ``traces.jsonl``; a sync that spooled the line and adopted the run would send it
too. The real race, with vf-eval's upload held by a proxy, is in
tests/test_vf_eval_adopt.py; here the rule itself, on real verifiers 0.4.0 outputs of a
killed eval (``fixtures/eval_outputs/vf040-killed``: its log ends mid-run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from prime_runs_spool.importer.outputs import import_output
from prime_runs_spool.spool.format import LIVE
from prime_runs_spool.importer.pushing import QUIET_SECONDS
from support.env import CLI, REPO_ROOT, child_env

KILLED = REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-killed"
PLATFORM_RUN = "5f786a90-1cd2-480c-8dde-13eb038ab261"


def killed_outputs(tmp_path: Path, run_id: str, *, age: float = 0.0) -> Path:
    """The killed eval's outputs, its episodes stamped ``run_id``, its files last changed ``age`` s ago."""
    run_dir = tmp_path / "outputs" / "killed"
    shutil.copytree(KILLED, run_dir, symlinks=True)
    traces = run_dir / "traces.jsonl"
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    for row in rows:
        row["run"]["id"] = run_id
    traces.write_text("".join(json.dumps(row) + "\n" for row in rows))
    then = time.time() - age
    for path in (traces, run_dir / "logs" / "attempt_1" / "eval.log"):
        os.utime(path, (then, then))
    return run_dir


@pytest.mark.slow  # a sync in a subprocess
def test_a_pushing_eval_whose_log_shows_no_end_and_whose_files_just_changed_is_left(tmp_path: Path) -> None:
    run_dir = killed_outputs(tmp_path, PLATFORM_RUN)
    report = import_output(run_dir)
    assert report.state == LIVE and PLATFORM_RUN in report.reason, report
    assert not (run_dir / "spool").exists()  # nothing written: a later sync spools it

    done = subprocess.run(CLI + ["sync", "--local", "--db", str(tmp_path / "p.db"), "outputs"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=child_env(HOME=str(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr  # a run left for later, not a failure
    assert f"live        outputs/killed: vf-eval may still be running here, pushing to its platform run " \
           f"{PLATFORM_RUN}" in done.stdout, done.stdout
    assert "no runs found" not in done.stdout and not (run_dir / "spool").exists()


def test_once_its_files_have_been_still_long_enough_a_killed_pushing_eval_is_spooled(tmp_path: Path) -> None:
    run_dir = killed_outputs(tmp_path, PLATFORM_RUN, age=QUIET_SECONDS + 5)
    report = import_output(run_dir)
    assert (report.state, report.status, report.episodes_added) == ("imported", "crashed", 1), report


def test_a_time_far_ahead_of_this_clock_does_not_hold_the_folder(tmp_path: Path) -> None:
    run_dir = killed_outputs(tmp_path, PLATFORM_RUN, age=-(QUIET_SECONDS + 5))
    assert import_output(run_dir).state == "imported"


def test_an_eval_that_did_not_push_or_that_tore_down_is_spooled_at_once(tmp_path: Path) -> None:
    not_pushing = killed_outputs(tmp_path / "a", "disabled-cd3b85e57ab34ecb")
    assert import_output(not_pushing).state == "imported"

    torn_down = killed_outputs(tmp_path / "b", PLATFORM_RUN)
    with open(torn_down / "logs" / "attempt_1" / "eval.log", "a") as log:
        log.write("19:06:18    INFO interception down: url=http://127.0.0.1:40961\n")
    report = import_output(torn_down)
    assert (report.state, report.status) == ("imported", "failed"), report


@pytest.mark.slow  # status and verify in subprocesses, twice
def test_status_and_verify_advise_the_import_once_a_pushing_eval_has_exited(tmp_path: Path) -> None:
    """While a pushing vf-eval may still be running, the import that status and verify
    suggested ('run: prime-runs import PATH') leaves the folder as it is (state live): the
    advice says to run it once vf-eval has exited. Still long enough, the plain command."""
    run_dir = killed_outputs(tmp_path, PLATFORM_RUN)
    for command in ("status", "verify"):
        done = subprocess.run(CLI + [command, "outputs"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              env=child_env(HOME=str(tmp_path)))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "prime-runs import outputs/killed once vf-eval has exited: it may still be running here, pushing" \
            in done.stdout, done.stdout
    assert import_output(run_dir).state == LIVE  # what that import does meanwhile
    then = time.time() - QUIET_SECONDS - 5
    for path in (run_dir / "traces.jsonl", run_dir / "logs" / "attempt_1" / "eval.log"):
        os.utime(path, (then, then))
    still = subprocess.run(CLI + ["status", "outputs", "--json"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env=child_env(HOME=str(tmp_path)))
    assert json.loads(still.stdout)["not_spooled"] == [{"path": "outputs/killed", "fix": "prime-runs import outputs/killed"}]
