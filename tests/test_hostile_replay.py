"""Hostile review, kept as regression tests: --replay / --replay-id (sync/replay.py, sync/store_sync.py, sync/state.py)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from prime_runs_spool.sync.state import sync_dir
from support import platform_process
from support.env import CLI, child_env
from support.runs import build_run

TOKEN = "attack-token"


def _sync(base_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + ["sync", *args, "--base-url", base_url, "--request-lifetime", "1.0",
                                 "--backoff-cap", "0.2", "--timeout", "5"],
                          capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=TOKEN))


def test_a_replay_state_in_a_received_spool_cannot_write_outside_it(tmp_path: Path) -> None:
    """A spool received from elsewhere (a CI artifact, a shared disk) carries a replay state
    whose replay_id climbs out of the spool: `prime-runs sync --replay` continues it and
    writes the sync state over an arbitrary *.json file of the user (here a stand-in for
    ~/.prime/config.json)."""
    victim = tmp_path / "home" / ".prime" / "config.json"
    victim.parent.mkdir(parents=True)
    victim.write_text('{"api_key": "the-users-own-key"}')
    builder = build_run(tmp_path / "runs" / "r", "replay-traversal", 3)
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", TOKEN) as server:
        first = _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--json")
        assert first.returncode == 0, first.stderr
        (state_file,) = sync_dir(builder.run_dir).glob("*.json")
        state = json.loads(state_file.read_text())
        key = state["destination"]["key"]
        climb = "/" + "../" * 30 + str(victim.with_suffix(""))[1:]
        state.update(replay_id=climb, evaluation_id=None, viewer_url=None, cursor=None, segments={}, seal=None,
                     finalized=False, terminal=None, terminal_size=None, samples_pushed=0, fence=None,
                     updated_at=time.time() + 1000)
        (sync_dir(builder.run_dir) / f"{key}-replay-x.json").write_text(json.dumps(state))
        _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay", "--json")
    assert victim.read_text() == '{"api_key": "the-users-own-key"}', \
        "sync --replay wrote its state over a file outside the spool"


def test_replay_id_on_the_command_line_stays_inside_the_spool(tmp_path: Path) -> None:
    build_run(tmp_path / "runs" / "r", "replay-id-cli", 2)
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", TOKEN) as server:
        result = _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay",
                       "--replay-id", "/../../../../../escaped")
    escaped = list(tmp_path.glob("escaped*"))
    assert not escaped and result.returncode == 2, (escaped, result.returncode, result.stdout, result.stderr)


def test_an_empty_replay_id_is_refused_or_found_again(tmp_path: Path) -> None:
    """`--replay-id ""` is taken: the replay's evaluation gets no metadata.replay_id (so it
    looks like a plain sync's), and once its state file is lost, the same id makes yet
    another evaluation instead of finding it again (docs/sync.md, "Replay")."""
    from support.sync_e2e import evaluations_of
    import httpx

    builder = build_run(tmp_path / "runs" / "r", "empty-replay-id", 2)
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", TOKEN) as server:
        assert _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples").returncode == 0
        first = _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay", "--replay-id", "")
        if first.returncode == 2:
            return  # refused as a usage error: fine
        for path in sync_dir(builder.run_dir).glob("*-replay-*.json"):
            path.unlink()  # the replay's state is lost
        _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay", "--replay-id", "")
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
            evaluations = evaluations_of(api, builder.run_id)
    assert len(evaluations) == 2, f"{len(evaluations)} evaluations: the replay with id '' was not found again"
