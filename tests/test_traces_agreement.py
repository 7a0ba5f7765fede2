"""A spool the eval wrote and the ``traces.jsonl`` beside it, compared by episode id
(importer/agreement.py): both directions named by ``status`` and ``verify``, caught up by
``import`` (and so by ``sync``), a live writer left alone, an unchanged run not read again.
Real files and the committed vf-eval outputs; the real vf-eval is in tests/test_vf_eval_mixed.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import open_run, read_run
from prime_runs_spool.importer.agreement import disagreement, needs_catching_up
from prime_runs_spool.importer.outputs import import_output
from prime_runs_spool.spool.manifests import segment_manifests
from support.env import CLI, REPO_ROOT, child_env

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def run_folder(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    run_dir = tmp_path / "outputs" / "vf040-completed"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", run_dir, symlinks=True)
    rows = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]
    return run_dir, rows


def write_traces(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """As verifiers' --resume rewrites it: a temporary file and a rename."""
    tmp = run_dir / "traces.jsonl.tmp"
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(run_dir / "traces.jsonl")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, env=child_env())


@pytest.mark.slow
def test_a_spool_holding_what_a_resume_dropped_is_named_then_superseded(tmp_path: Path) -> None:
    run_dir, rows = run_folder(tmp_path)
    rows[0] = {**rows[0], "ok": False}  # what verifiers' default keep-verdict has a resume redo
    with open_run(run_dir, name="live") as run:
        run.log_episodes(rows)
    write_traces(run_dir, rows[1:])  # a --resume dropped the first one (it will retry its slot)
    found = disagreement(run_dir)
    assert found is not None and (found.only_in_traces, found.only_in_spool) == (0, 1)
    status = cli("status", str(run_dir))
    assert "the spool holds 1 episode " in status.stdout and "traces.jsonl" in status.stdout, status.stdout
    verify = cli("verify", "--json", str(run_dir))
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["runs"][0]["traces_disagree"]["only_in_spool"] == 1
    assert "1 disagree with their traces.jsonl" in cli("verify", str(run_dir)).stdout

    report = import_output(run_dir)
    assert (report.state, report.superseded, report.episodes_total) == ("appended", 1, len(rows) - 1)
    assert list(segment_manifests(run_dir))[-1]["supersedes"] == [rows[0]["id"]]
    assert disagreement(run_dir) is None and not needs_catching_up(run_dir)
    assert "DISAGREES" not in cli("status", str(run_dir)).stdout


def test_a_live_writer_is_left_alone(tmp_path: Path) -> None:
    """While prime-runs eval runs, traces.jsonl is ahead of its spool by design."""
    run_dir, rows = run_folder(tmp_path)
    run = open_run(run_dir, name="live")
    try:
        run.log_episodes(rows[:1])
        assert not needs_catching_up(run_dir) and disagreement(run_dir) is None
        report = import_output(run_dir)
        assert report.state == "spooled" and "still writing" in (report.reason or "")
        assert read_run(run_dir).episodes_count == 1
    finally:
        run.finish()
    assert needs_catching_up(run_dir)  # its writer gone: compared now


def test_an_agreeing_run_is_not_read_again_until_traces_jsonl_changes(tmp_path: Path) -> None:
    run_dir, rows = run_folder(tmp_path)
    with open_run(run_dir, name="live") as run:
        run.log_episodes(rows)
    assert needs_catching_up(run_dir)  # never compared yet
    assert import_output(run_dir).state == "spooled"
    assert not needs_catching_up(run_dir)
    extra = {**rows[-1], "id": "f" * 32}
    with open(run_dir / "traces.jsonl", "a") as handle:  # plain vf-eval appends one more
        handle.write(json.dumps(extra) + "\n")
    assert needs_catching_up(run_dir)
    assert (import_output(run_dir).episodes_added, read_run(run_dir).episodes_count) == (1, len(rows) + 1)
    assert not needs_catching_up(run_dir)


def test_accepted_episodes_lost_from_a_traces_jsonl_cut_short_are_kept(tmp_path: Path) -> None:
    """The eval died as verifiers wrote its last line (or the artifact was packed then):
    traces.jsonl ends torn, one line short. No resume dropped the accepted episodes missing
    from it, so none is superseded: the spool's durable episodes all stay, and it says so."""
    run_dir, rows = run_folder(tmp_path)
    assert all(row["ok"] is True for row in rows)
    with open_run(run_dir, name="live") as run:
        run.log_episodes(rows)
    kept = "".join(json.dumps(row) + "\n" for row in rows[:-2])
    (run_dir / "traces.jsonl").write_text(kept + json.dumps(rows[-2])[:40])  # a torn last line
    report = import_output(run_dir)
    assert (report.state, report.superseded, report.episodes_total) == ("spooled", 0, len(rows)), report
    assert [w for w in report.warnings if "lacks 2 episodes the spool accepted and holds" in w and "kept" in w]
    assert read_run(run_dir).episodes_count == len(rows) and len(list(segment_manifests(run_dir))) == 1
    assert not needs_catching_up(run_dir)


def test_an_accepted_episode_whose_task_ran_again_is_superseded(tmp_path: Path) -> None:
    """An env whose keep-verdict refused an ``ok`` episode: the resume dropped it and ran its
    task again, so the new attempt takes its place."""
    run_dir, rows = run_folder(tmp_path)
    with open_run(run_dir, name="live") as run:
        run.log_episodes(rows)
    write_traces(run_dir, [*rows[1:], {**rows[0], "id": "e" * 32}])
    report = import_output(run_dir)
    assert (report.state, report.superseded, report.episodes_added) == ("appended", 1, 1), report
    assert list(segment_manifests(run_dir))[-1]["supersedes"] == [rows[0]["id"]]
