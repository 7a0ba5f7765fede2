"""A run moved (``mv``) while a plain ``prime-runs sync`` (no ``--follow``) reads it
(docs/sync.md, "Lines lost under the cursor"; docs/cli.md, the sync's states): it lost
nothing, so it is ``gone``, not ``lost`` or ``error``, no mismatch is recorded, nothing is
made again at its old path, and a sync where it went carries on, each episode once."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.fault_proxy import FaultProxy
from support.children import reaped
from support.env import child_env
from support.runs import RunBuilder
from support.sync_e2e import TOKEN, api, assert_exactly_once, run_sync, server, sync_cmd  # noqa: F401


def _moved_while_held(tmp_path: Path, proxy: FaultProxy, builder: RunBuilder, *args: str) -> tuple[int, dict]:
    """Sync the run through ``proxy``, move its folder while the proxy holds the request it
    holds, then let that request go on: the sync's exit code and the run's report."""
    cmd = sync_cmd(proxy.base_url, str(builder.run_dir), "--json", "--to", "samples", *args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN))
    with reaped(proc):
        deadline = time.monotonic() + 60
        while not proxy.holding():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        builder.run_dir.rename(tmp_path / "moved")
        proxy.release_held()
        out, err = proc.communicate(timeout=120)
    [report] = json.loads(out)["runs"]
    return proc.returncode, report | {"stderr": err}


@pytest.mark.slow
def test_a_run_moved_before_its_first_state_is_gone_and_its_old_folder_is_not_made_again(
        tmp_path: Path, server, api) -> None:
    """Moved while the pass waited for the platform's first answer, before its state's first
    save: that save made the run's folder again (``replace_private`` made every missing
    parent), an empty run folder holding only a state at the old path."""
    builder = RunBuilder(tmp_path / "run", "moved-before-first-state")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/resolve$") as proxy:
        code, report = _moved_while_held(tmp_path, proxy, builder)
    assert not builder.run_dir.exists(), sorted(str(p) for p in builder.run_dir.rglob("*"))
    assert report["state"] == "gone" and code == 1, report
    assert "moved away or deleted" in report["error"], report
    again = run_sync(server.base_url, str(tmp_path / "moved"), "--json", "--to", "samples")
    assert again.returncode == 0, again.stdout + again.stderr
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_run_moved_as_its_batch_is_sent_is_gone_not_lost(tmp_path: Path, server, api) -> None:
    """Moved while its batch was on the wire: the pass, reading once more for what a dead
    writer may have appended, read at the old path and said ``lost`` ('the segment of the
    recorded position is missing'), exit 1, for a run that lost nothing."""
    builder = RunBuilder(tmp_path / "run", "moved-between-batches")
    builder.open_segment()
    builder.add(4)
    builder.abandon()  # a killed writer: unsealed, read again once its batch is sent
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/samples$") as proxy:
        code, report = _moved_while_held(tmp_path, proxy, builder)
    assert report["state"] == "gone" and code == 1, report
    assert "moved away or deleted" in report["error"] and report["pushed_now"] >= 1, report
    assert not builder.run_dir.exists(), sorted(str(p) for p in builder.run_dir.rglob("*"))
    again = run_sync(server.base_url, str(tmp_path / "moved"), "--json", "--to", "samples")
    assert again.returncode == 0, again.stdout + again.stderr
    detail = assert_exactly_once(api, builder, finalized=False)
    assert "prime_runs_mismatch" not in (detail.get("metadata") or {}), detail


@pytest.mark.slow
def test_a_mirrored_run_moved_before_its_first_state_is_not_made_again(tmp_path: Path, server, api) -> None:
    """As a local run's (above), for a run ``prime-runs mirror`` copies into a store, synced
    from its folder under the store's lease: that pass's state saves still made every
    missing parent, so a run moved away before its first save got its folder back at the
    old path, holding only that state."""
    from support.store_runs import mirror_once

    (tmp_path / "bucket").mkdir()
    builder = RunBuilder(tmp_path / "outputs" / "run", "mirrored-moved-before-first-state")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    mirrored = mirror_once(tmp_path / "outputs", f"file://{tmp_path}/bucket")
    assert mirrored.returncode == 0, mirrored.stdout + mirrored.stderr
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/resolve$") as proxy:
        code, report = _moved_while_held(tmp_path, proxy, builder)
    assert not builder.run_dir.exists(), sorted(str(p) for p in builder.run_dir.rglob("*"))
    assert (code, report["state"]) == (1, "gone"), report
