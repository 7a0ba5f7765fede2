"""The platform run ids vf-eval stamped on its episodes, as the segments that record them list
them (content/platform_runs.py), and the evaluation sync adopts from them.

Fast checks over real files and the committed vf-eval outputs; tests/test_vf_eval_adopt.py
runs the real vf-eval pushing to the local platform.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.platform_runs import is_platform_run_id, platform_runs_in, platform_runs_of
from prime_runs_spool.importer.outputs import import_output
from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.spool.manifests import segment_manifests
from support.env import CLI, REPO_ROOT, child_env

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def outputs(tmp_path: Path, run_id: str | None = None) -> Path:
    """The committed completed vf-eval run, its episodes stamped ``run_id`` (as a pushing vf-eval stamps them)."""
    run_dir = tmp_path / "outputs" / "vf040-completed"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", run_dir, symlinks=True)
    if run_id is not None:
        rows = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]
        for row in rows:
            row["run"]["id"] = run_id
        (run_dir / "traces.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]


def test_disabled_ids_are_not_platform_ids_and_the_newest_comes_first() -> None:
    assert not is_platform_run_id("disabled-0123456789abcdef") and not is_platform_run_id("")
    assert is_platform_run_id("7d85c6a9-6b85-4732-9427-ac66640d37c7")
    manifests = [{"platform_runs": ["a"]}, {}, {"platform_runs": ["b", "disabled-00", "a"]}]
    assert platform_runs_of(manifests) == ["a", "b"]  # newest first, each once


def test_an_import_lists_the_platform_run_its_episodes_carry_and_never_a_disabled_one(tmp_path: Path) -> None:
    pushed = outputs(tmp_path / "pushed", "eval-7d85c6a9")
    assert import_output(pushed).state == "imported"
    assert [m.get("platform_runs") for m in segment_manifests(pushed)] == [["eval-7d85c6a9"]]
    local = outputs(tmp_path / "local")  # the committed outputs: vf-eval ran with pushing off
    assert all(row["run"]["id"].startswith("disabled-") for row in rows_of(local))
    assert import_output(local).state == "imported"
    assert [m.get("platform_runs") for m in segment_manifests(local)] == [None]
    assert platform_runs_in(local / "traces.jsonl") == [] and platform_runs_in(pushed / "traces.jsonl") == [
        "eval-7d85c6a9"]


def test_a_catch_up_lists_the_platform_run_of_what_it_spools_never_the_spools_own_id(tmp_path: Path) -> None:
    run_dir = outputs(tmp_path, "eval-pushed-by-plain-vf-eval")
    rows = rows_of(run_dir)
    with open_run(run_dir, name="live") as run:  # prime-runs eval wrote the first ones under its own id
        run.log_episodes([{**row, "run": {**row["run"], "id": "x"}} for row in rows[:1]])
    report = import_output(run_dir)
    assert (report.state, report.episodes_added) == ("appended", len(rows) - 1)
    assert [m.get("platform_runs") for m in segment_manifests(run_dir)] == [None, ["eval-pushed-by-plain-vf-eval"]]
    assert read_run(run_dir).episodes_count == len(rows)


@pytest.mark.slow
def test_sync_adopts_the_evaluation_the_episodes_name_and_sends_only_what_it_lacks(tmp_path: Path) -> None:
    """An evaluation on the local platform that already holds the run's first rows (as
    vf-eval's samples fallback leaves it): sync adopts it, sends the rest, finalizes once."""
    db = tmp_path / "platform.db"
    first = cli_sync(tmp_path, outputs(tmp_path / "a"), db)  # one evaluation holding every row
    [evaluation] = first["runs"]
    rows = rows_of(tmp_path / "a" / "outputs" / "vf040-completed")
    # The same episodes stamped with that evaluation's id, as a pushing vf-eval stamps them: a
    # run no evaluation carries the local id of (the id is now the evaluation's own).
    second_dir = outputs(tmp_path / "b", evaluation["evaluation_id"])
    second = cli_sync(tmp_path, second_dir, db)
    [run] = second["runs"]
    assert (run["evaluation_id"], run["pushed_now"], run["pushed_total"]) == (
        evaluation["evaluation_id"], 0, len(rows))
    assert any("adopted evaluation" in warning for warning in run["warnings"])
    store = Store(db)
    try:
        evaluations, total = store.list_evaluations(skip=0, limit=10)
        assert total == 1 and store.get_evaluation(evaluation["evaluation_id"])["finalize_count"] == 1
    finally:
        store.close()


@pytest.mark.slow
def test_a_run_adopted_in_prime_traces_counts_what_vf_eval_pushed_there_in_its_total(tmp_path: Path) -> None:
    """The report's total is what the destination holds of the run, whoever sent it: in
    Prime Traces too the episodes vf-eval pushed count, as the samples table's rows do
    (above) and as status says them. It said "pushed 0 (total 0) to traces" of a run
    whose every episode was there."""
    db = tmp_path / "platform.db"
    first = cli_sync(tmp_path, outputs(tmp_path / "a"), db, "--to", "traces")
    [evaluation] = first["runs"]
    rows = rows_of(tmp_path / "a" / "outputs" / "vf040-completed")
    second_dir = outputs(tmp_path / "b", evaluation["evaluation_id"])
    [run] = cli_sync(tmp_path, second_dir, db, "--to", "traces")["runs"]
    assert any("adopted evaluation" in warning for warning in run["warnings"])
    assert (run["evaluation_id"], run["store"], run["pushed_now"], run["pushed_total"]) == (
        evaluation["evaluation_id"], "traces", 0, len(rows))
    [again] = cli_sync(tmp_path, second_dir, db, "--to", "traces")["runs"]
    assert (again["state"], again["pushed_total"]) == ("up_to_date", len(rows))


def cli_sync(tmp_path: Path, run_dir: Path, db: Path, *options: str) -> dict[str, Any]:
    done = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "--json", *options, str(run_dir)],
                          capture_output=True, text=True, timeout=120, env=child_env(HOME=str(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)
