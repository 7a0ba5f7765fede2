"""Sync over runs of several segments, end to end (real ``prime-runs sync``, real local
platform): only the last segment's seal ends a run, and segments that disagree with their
run are refused, never pushed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool import open_run
from prime_runs_spool.spool.layout import lock_path, segment_path
from prime_runs_spool.spool.writer import SegmentWriter
from support.env import CLI, child_env
from support.episodes import small_episode
from support.runs import RunBuilder
from support.sync_e2e import api, evaluations_of, run_sync, sample_ids, server  # noqa: F401


def _report(result) -> dict:
    return json.loads(result.stdout)["runs"][0]


def _episodes(run_id: str, first: int, count: int) -> list[dict]:
    return [small_episode(f"{run_id}-e{i}", idx=i, run_id=run_id) for i in range(first, first + count)]


@pytest.mark.slow
def test_a_resumed_run_is_not_finalized_while_its_new_writer_is_live(tmp_path: Path, server, api) -> None:
    with open_run(tmp_path / "run", name="resumed", environments=["gsm8k"], run_id="e2e-seal-live") as first:
        first.log_episodes(_episodes(first.id, 0, 3))
    second = open_run(tmp_path / "run", name="resumed", environments=["gsm8k"])
    second.log_episodes(_episodes(second.id, 3, 2))

    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (_report(result)["state"], _report(result)["pushed_now"]) == ("live", 5)
    evaluation = api.get(f"/evaluations/{evaluations_of(api, 'e2e-seal-live')[0]['evaluation_id']}").json()
    assert evaluation["finalize_count"] == 0 and evaluation["status"] != "COMPLETED"

    second.log_episodes(_episodes(second.id, 5, 1))
    second.finish()
    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert (_report(result)["state"], _report(result)["pushed_now"]) == ("synced", 1)
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert (evaluation["finalize_count"], evaluation["total_samples"]) == (1, 6)
    assert len(sample_ids(api, evaluation["evaluation_id"])) == 6


@pytest.mark.slow
def test_a_failed_segment_then_a_killed_one_is_crashed_not_the_first_failure(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-seal-crashed")
    builder.open_segment()
    builder.add(3)
    builder.seal("failed", error="RuntimeError: the first process failed")
    builder.open_segment()
    builder.add(2)
    builder.abandon()  # as SIGKILL leaves it: unsealed, lock released

    result = run_sync(server.base_url, str(tmp_path), "--json")
    report = _report(result)
    assert (report["state"], report["pushed_now"]) == ("crashed", 5), result.stdout + result.stderr
    assert "first process failed" not in (report["error"] or "")
    evaluation = api.get(f"/evaluations/{evaluations_of(api, builder.run_id)[0]['evaluation_id']}").json()
    assert evaluation["metadata"]["prime_runs"]["status"] == "crashed"
    assert "first process failed" not in json.dumps(evaluation["metadata"])


def test_a_resumed_segment_with_only_its_header_keeps_the_run_open(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-seal-header-only")
    builder.open_segment()
    builder.add(2)
    builder.seal()
    writer = SegmentWriter.create(tmp_path / "run", builder.run_id)  # live, nothing after its header
    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert _report(result)["state"] == "live", result.stdout + result.stderr
    writer.close()


def test_a_duplicated_segment_is_refused_by_sync_naming_file_and_offset(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-dup-segment")
    for _ in range(3):
        builder.open_segment()
        builder.add(2)
        builder.seal()
    shutil.copy(segment_path(tmp_path / "run", 2), segment_path(tmp_path / "run", 4))
    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = _report(result)
    assert report["state"] == "corrupt" and "seg-000004.jsonl: corrupt at byte 0" in report["error"]
    evaluations = evaluations_of(api, builder.run_id)
    assert not evaluations or api.get(f"/evaluations/{evaluations[0]['evaluation_id']}").json()["finalize_count"] == 0
    if evaluations:
        assert len(sample_ids(api, evaluations[0]["evaluation_id"])) <= 6


@pytest.mark.slow
def test_a_deleted_lock_that_let_a_second_writer_in_is_reported_and_counted_pending(
        tmp_path: Path, server, api) -> None:
    first = RunBuilder(tmp_path / "run", "e2e-two-writers")
    first.open_segment()
    first.add(2)
    assert _report(run_sync(server.base_url, str(tmp_path), "--json"))["pushed_now"] == 2
    lock_path(tmp_path / "run", 1).unlink()
    second = RunBuilder(tmp_path / "run", "e2e-two-writers", salt="second")
    second.writer = SegmentWriter.create(tmp_path / "run", second.run_id)  # admitted: an old opener, no checks
    second.add(1)
    assert _report(run_sync(server.base_url, str(tmp_path), "--json"))["pushed_now"] == 1
    first.add(2)  # behind the cursor, which is in segment 2 now

    status = subprocess.run([*CLI, "status", "--json", str(tmp_path)], capture_output=True, text=True,
                            env=child_env(), timeout=60)
    run = json.loads(status.stdout)["runs"][0]
    assert run["destinations"][0]["pending"] == 2, run
    assert "two processes are writing this run" in run["error"]
    human = subprocess.run([*CLI, "status", str(tmp_path)], capture_output=True, text=True, env=child_env(),
                           timeout=60).stdout
    assert "0 episodes pending" not in human and "2 episodes pending" in human
    verify = subprocess.run([*CLI, "verify", str(tmp_path)], capture_output=True, text=True, env=child_env(),
                            timeout=60)
    assert verify.returncode == 1 and "two processes are writing this run" in verify.stdout + verify.stderr
    first.abandon()
    second.abandon()


@pytest.mark.slow
def test_an_earlier_segment_damaged_after_it_was_synced(tmp_path: Path, server, api) -> None:
    """Resuming at its cursor, sync still checks the headers before it: a plain sync refuses,
    ``--skip-corrupt`` notes it and goes on from the cursor, never reading anything twice."""
    builder = RunBuilder(tmp_path / "run", "e2e-late-damage")
    for _ in range(3):
        builder.open_segment()
        builder.add(2)
        builder.abandon()
    assert _report(run_sync(server.base_url, str(tmp_path), "--json"))["pushed_now"] == 6  # cursor in seg 3
    second = segment_path(tmp_path / "run", 2)
    data = bytearray(second.read_bytes())
    data[20] ^= 0x01  # inside its header line
    second.write_bytes(bytes(data))
    builder.open_segment()
    builder.add(2)
    builder.seal()

    plain = run_sync(server.base_url, str(tmp_path), "--json")
    assert plain.returncode == 1 and _report(plain)["state"] == "corrupt"
    assert "seg-000002.jsonl: corrupt at byte 0" in _report(plain)["error"]
    skipping = run_sync(server.base_url, str(tmp_path), "--json", "--skip-corrupt")
    assert skipping.returncode == 0, skipping.stdout + skipping.stderr
    assert (_report(skipping)["state"], _report(skipping)["pushed_now"]) == ("synced", 2)
    evaluation = api.get(f"/evaluations/{evaluations_of(api, builder.run_id)[0]['evaluation_id']}").json()
    assert sample_ids(api, evaluation["evaluation_id"]) == builder.ids
    assert evaluation["metadata"]["skipped_corruption"][0]["segment"] == 2
