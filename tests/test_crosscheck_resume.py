"""The checks between segments hold on a read from a position too (docs/spool-format.md,
section 4.1): a copy whose later segment arrived before its earlier one's last lines (any
copier uploads in parallel, in any order) is never pushed and finalized with episodes
missing. Locally (a folder copied file by file) and through moto's S3."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.spool.layout import ensure_spool_dir, lock_path_of, segment_path
from support import moto_server
from support.env import child_env
from support.runs import RunBuilder
from support.store_runs import put_object
from support.sync_e2e import TOKEN, api, evaluations_of, run_sync, sample_ids, server, sync_cmd  # noqa: F401

moto = moto_server.module_fixture()


def _report(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.stdout, result.stderr
    return json.loads(result.stdout)["runs"][0]


def _scenario(tmp_path: Path, run_id: str, copy) -> tuple[RunBuilder, list]:
    """The writer's side of the issue's scenario, each copy step handed to ``copy(index,
    bytes)``; returns the builder and the steps still to run in order (each a callable)."""
    builder = RunBuilder(tmp_path / "src", run_id)
    writer = builder.open_segment()
    builder.add(4)
    first = segment_path(builder.run_dir, 1)

    def durable_prefix() -> None:  # what a mirror copies of a live segment: up to its mark
        copy(1, first.read_bytes()[:writer.durable_bytes])

    def more_then_resumed() -> None:  # 2 more episodes, the writer dies, a resume completes the run
        builder.add(2)
        builder.abandon()
        builder.open_segment(counted=True)
        builder.add(2)
        builder.seal()
        copy(2, segment_path(builder.run_dir, 2).read_bytes())  # the new segment arrives first

    def first_arrives_whole() -> None:
        copy(1, first.read_bytes())

    return builder, [durable_prefix, more_then_resumed, first_arrives_whole]


def _check(builder: RunBuilder, api, results: list[dict]) -> None:
    pushed, late, whole = results
    assert (pushed["state"], pushed["pushed_now"]) == ("crashed", 4)
    # The new segment's header counts 6 episodes before it; the copy holds 4: refused,
    # nothing of it pushed, not finalized.
    assert (late["state"], late["pushed_now"]) == ("corrupt", 0), late
    assert "seg-000002.jsonl: corrupt at byte 0" in late["error"], late
    assert "hold 6 episodes, but they hold 4" in late["error"].replace("says the earlier segments hold", "hold")
    evaluation = api.get(f"/evaluations/{evaluations_of(api, builder.run_id)[0]['evaluation_id']}").json()
    assert whole["state"] == "synced" and whole["pushed_now"] == 4, whole
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert sample_ids(api, evaluation["evaluation_id"]) == builder.ids  # all 8, in spool order, once
    assert evaluation["finalize_count"] == 1


@pytest.mark.slow
def test_a_later_segment_copied_before_the_earlier_ones_end_is_not_pushed_locally(tmp_path: Path, server,
                                                                                   api) -> None:
    destination = tmp_path / "copy" / "run"
    ensure_spool_dir(destination)

    def copy(index: int, data: bytes) -> None:
        path = segment_path(destination, index)
        path.write_bytes(data)
        path.chmod(0o600)
        # rsync copies the lock file too (unlocked, as every copy is): the copy's writer is
        # gone, though the header names this very process (which a missing lock would mean).
        lock_path_of(path).touch(mode=0o600)

    builder, steps = _scenario(tmp_path, "resume-crosscheck-local", copy)
    results = []
    for step in steps:
        step()
        results.append(_report(run_sync(server.base_url, str(tmp_path / "copy"), "--json")))
    _check(builder, api, results)
    shutil.rmtree(tmp_path / "src")


@pytest.mark.slow
def test_a_later_segment_uploaded_before_the_earlier_ones_end_is_not_pushed_through_s3(
        tmp_path: Path, server, api, moto: moto_server.MotoServer) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/outputs"

    def copy(index: int, data: bytes) -> None:
        put_object(bucket_url, f"run/spool/seg-{index:06d}.jsonl", data)

    builder, steps = _scenario(tmp_path, "resume-crosscheck-s3", copy)
    results = []
    for step in steps:
        step()
        result = subprocess.run(sync_cmd(server.base_url, bucket_url, "--json"), capture_output=True, text=True,
                                timeout=120, env=child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path / "m"),
                                                           XDG_CACHE_HOME=str(tmp_path / "m" / "cache"),
                                                           **moto.env(None)))
        results.append(_report(result))
    _check(builder, api, results)
    # And verify over the URL agrees with what sync refused, then accepted.
    verdict = subprocess.run(sync_cmd(server.base_url, bucket_url, "--json"), capture_output=True, text=True,
                             timeout=120, env=child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path / "m"),
                                                        XDG_CACHE_HOME=str(tmp_path / "m" / "cache"),
                                                        **moto.env(None)))
    assert _report(verdict)["state"] == "up_to_date"
