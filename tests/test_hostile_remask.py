"""Re-masking of old spools at sync against hostile spools (found by a hostile review):
held-back episodes, segments resumed by older writers, odd manifests and versions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from fixtures.episodes import make_episode
from prime_runs_spool.spool.writer import SegmentWriter
from support import platform_process
from support.env import CLI, child_env
from test_remask_e2e import SECRETS, old_manifest
from test_secrets_travel_e2e import API_KEY, LEAKED, all_bytes, leaky_seat


def write_old_spool_with_errors(run_dir: Path, run_id: str, manifest: dict | None = None) -> None:
    """An old spool (no masking_version) whose run completed with one errored episode."""
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", manifest if manifest is not None else old_manifest(run_id))
    items = []
    for number in range(3):
        episode = make_episode(number, run_id=run_id, ok=(number != 1))
        for trace in episode["traces"]:
            trace["agent"]["config"].update(leaky_seat())
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    writer.append_many(items)
    writer.seal("completed")


def sync_and_collect(tmp_path: Path, to: str) -> tuple[dict, bytes, str]:
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY, "--traces") as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "runs"), "--base-url", server.base_url, "--to", to, "--json"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        assert result.returncode == 0, result.stdout + result.stderr
        (report,) = json.loads(result.stdout)["runs"]
    return report, all_bytes(db.parent), result.stdout + result.stderr


@pytest.mark.parametrize("to", ["samples", "traces"])
def test_errored_episode_released_at_completion_is_remasked(tmp_path: Path, to: str) -> None:
    write_old_spool_with_errors(tmp_path / "runs" / "old", "old-err")
    report, database, output = sync_and_collect(tmp_path, to)
    assert report["state"] == "synced", report
    leaked = [s for s in LEAKED.values() if s.encode() in database]
    assert not leaked, f"held-back (errored) episode released unmasked: {leaked}"


def _leaky_items(run_id: str, numbers: range, salt: str = "") -> list:
    items = []
    for number in numbers:
        episode = make_episode(number, run_id=run_id, salt=salt)
        for trace in episode["traces"]:
            trace["agent"]["config"].update(leaky_seat())
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    return items


def test_segment_resumed_by_an_older_writer_is_remasked(tmp_path: Path) -> None:
    """Segment 1 written by today's package (masking_version 1, nothing to mask), the run
    then resumed by an older package (its segment's manifest lacks masking_version and its
    episodes hold credentials at today's locations). Sync reads only the first manifest."""
    from prime_runs_spool.content.masking import MASKING_VERSION
    run_dir = tmp_path / "runs" / "mixed"
    run_id = "mixed"
    first = SegmentWriter.create(run_dir, run_id)
    first.append("manifest", {**old_manifest(run_id), "config": {"model": "m"}, "masking_version": MASKING_VERSION,
                              "config_source": None})
    first.append_many([("episode", make_episode(0, run_id=run_id),
                        {"episode_id": make_episode(0, run_id=run_id)["id"], "rollout_number": 0})])
    first.close()  # crashed/stopped: no seal
    second = SegmentWriter.create(run_dir, run_id, expected_last=1, prior_episodes=1)
    second.append("manifest", {**old_manifest(run_id), "resumed": True})  # older writer: no masking_version
    second.append_many(_leaky_items(run_id, range(1, 3)))
    second.seal("completed")
    report, database, output = sync_and_collect(tmp_path, "samples")
    assert report["state"] == "synced", report
    leaked = [s for s in LEAKED.values() if s.encode() in database]
    assert not leaked, f"episodes of a segment written under older rules reached the platform unmasked: {leaked}"


def _old_spool_with_config(run_dir: Path, run_id: str, config) -> None:
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", {**old_manifest(run_id), "config": config, "config_source": None})
    writer.append_many(_leaky_items(run_id, range(1)))
    writer.seal("completed")


def test_an_old_manifest_whose_config_is_a_list_of_pairs_is_masked(tmp_path: Path) -> None:
    """remask_manifest masks only a Mapping config; v0_metadata then does dict(config), which
    turns a list of [key, value] pairs into a mapping that travels as the metadata unmasked."""
    _old_spool_with_config(tmp_path / "runs" / "pairs", "pairs",
                           [["model", "m"], ["client", {"api_key": LEAKED["client.api_key"]}],
                            ["env_vars", {"TOKEN": LEAKED["env_vars"]}]])
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY) as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "runs"), "--base-url", server.base_url, "--to", "samples", "--json"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        database = all_bytes(db.parent)
    assert LEAKED["client.api_key"].encode() not in database, "an unmasked config reached the evaluation's metadata"
    assert LEAKED["env_vars"].encode() not in database, "an unmasked config reached the evaluation's metadata"


def test_an_old_manifest_whose_config_is_a_string_is_one_line_not_a_crash(tmp_path: Path) -> None:
    _old_spool_with_config(tmp_path / "runs" / "str", "str", "not a table")
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY) as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "runs"), "--base-url", server.base_url, "--to", "samples", "--json"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.returncode in (0, 1) and result.stdout, (result.returncode, result.stdout, result.stderr)




@pytest.mark.parametrize("version", ["1", True, -1, 1.0, 0, None, [], {}, 1.5])
def test_bogus_masking_versions_are_masked_again(version) -> None:
    from prime_runs_spool.content.remask import needs_remask
    assert needs_remask({"masking_version": version})


@pytest.mark.parametrize("above", [1, 10**30])
def test_a_masking_version_this_package_does_not_know_is_masked_again(above) -> None:
    """A version above MASKING_VERSION is trusted as if this package knew its rules: a
    hand-edited manifest (or any producer) skips re-masking with masking_version: 999999."""
    from prime_runs_spool.content.masking import MASKING_VERSION
    from prime_runs_spool.content.remask import needs_remask
    assert needs_remask({"masking_version": MASKING_VERSION + above})
