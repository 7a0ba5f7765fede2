"""``prime-runs sync --replay``: runs pushed again as new evaluations, their earlier state
kept; an interrupted replay is continued, not started over (exactly once within it)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from prime_runs_spool.sync.state import sync_dir

from support.env import CLI, child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, api, evaluations_of, run_sync, sample_ids, server, sync_cmd  # noqa: F401
from support import platform_process


def by_replay(api, run_id: str) -> dict[str | None, list[dict]]:
    found: dict[str | None, list[dict]] = {}
    for evaluation in evaluations_of(api, run_id):
        found.setdefault(evaluation["metadata"].get("replay_id"), []).append(evaluation)
    return found


@pytest.mark.slow
def test_replay_makes_new_evaluations_and_keeps_the_earlier_state(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "run", "replay-basic", 12)
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    state_dir = tmp_path / "run" / "spool" / "sync"
    (original,) = state_dir.glob("*.json")
    before = original.read_bytes()
    result = run_sync(server.base_url, str(tmp_path), "--replay", "--json", "--name", "gsm8k-fixed",
                      "--tag", "replayed")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)["runs"][0]
    assert (report["state"], report["pushed_now"]) == ("synced", 12) and report["replay_id"]
    again = json.loads(run_sync(server.base_url, str(tmp_path), "--replay", "--json").stdout)["runs"][0]
    assert again["replay_id"] != report["replay_id"]  # the first replay was finished: a new one
    assert original.read_bytes() == before
    assert len(list(state_dir.glob("*-replay-*.json"))) == 2
    evaluations = by_replay(api, builder.run_id)
    assert sorted(len(v) for v in evaluations.values()) == [1, 1, 1]
    (replayed,) = evaluations[report["replay_id"]]
    assert replayed["evaluation_id"] == report["evaluation_id"] != evaluations[None][0]["evaluation_id"]
    assert replayed["name"] == "gsm8k-fixed" and "replayed" in replayed["tags"]
    for (evaluation,) in evaluations.values():
        assert sample_ids(api, evaluation["evaluation_id"]) == builder.ids
        assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["finalize_count"] == 1


@pytest.mark.slow
def test_an_interrupted_replay_is_continued_exactly_once(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "run", "replay-killed", 600, size=1_800)
    cmd = sync_cmd(server.base_url, str(tmp_path), "--replay", "--max-request-bytes", "6000")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=child_env(PRIME_API_KEY=TOKEN))

    def pushed_so_far() -> int:
        found = [e for group in by_replay(api, builder.run_id).values() for e in group]
        return api.get(f"/evaluations/{found[0]['evaluation_id']}").json()["total_samples"] if found else 0

    deadline = time.monotonic() + 60
    while pushed_so_far() == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # kill it as soon as the replay is under way: one request per episode
    assert proc.poll() is None, "the replay finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (partial,) = by_replay(api, builder.run_id).values()
    assert 0 < api.get(f"/evaluations/{partial[0]['evaluation_id']}").json()["total_samples"] < 600
    result = run_sync(server.base_url, str(tmp_path), "--replay", "--json")
    report = json.loads(result.stdout)["runs"][0]
    assert report["state"] == "synced" and report["evaluation_id"] == partial[0]["evaluation_id"]
    assert sample_ids(api, report["evaluation_id"]) == builder.ids
    explicit = run_sync(server.base_url, str(tmp_path), "--replay", "--replay-id", report["replay_id"], "--json")
    assert json.loads(explicit.stdout)["runs"][0]["state"] == "up_to_date"
    assert len(evaluations_of(api, builder.run_id)) == 1


REPLAY_TOKEN = "attack-token"


def _sync(base_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + ["sync", *args, "--base-url", base_url, "--request-lifetime", "1.0",
                                 "--backoff-cap", "0.2", "--timeout", "5"],
                          capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=REPLAY_TOKEN))


@pytest.mark.slow
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
    with platform_process.running(db, "--token", REPLAY_TOKEN) as server:
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


@pytest.mark.slow
def test_replay_id_on_the_command_line_stays_inside_the_spool(tmp_path: Path) -> None:
    build_run(tmp_path / "runs" / "r", "replay-id-cli", 2)
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", REPLAY_TOKEN) as server:
        result = _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay",
                       "--replay-id", "/../../../../../escaped")
    escaped = list(tmp_path.glob("escaped*"))
    assert not escaped and result.returncode == 2, (escaped, result.returncode, result.stdout, result.stderr)


@pytest.mark.slow
def test_an_empty_replay_id_is_refused_or_found_again(tmp_path: Path) -> None:
    """`--replay-id ""` is taken: the replay's evaluation gets no metadata.replay_id (so it
    looks like a plain sync's), and once its state file is lost, the same id makes yet
    another evaluation instead of finding it again (docs/sync.md, "Replay")."""
    from support.sync_e2e import evaluations_of
    import httpx

    builder = build_run(tmp_path / "runs" / "r", "empty-replay-id", 2)
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", REPLAY_TOKEN) as server:
        assert _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples").returncode == 0
        first = _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay", "--replay-id", "")
        if first.returncode == 2:
            return  # refused as a usage error: fine
        for path in sync_dir(builder.run_dir).glob("*-replay-*.json"):
            path.unlink()  # the replay's state is lost
        _sync(server.base_url, str(tmp_path / "runs"), "--to", "samples", "--replay", "--replay-id", "")
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {REPLAY_TOKEN}"}) as api:
            evaluations = evaluations_of(api, builder.run_id)
    assert len(evaluations) == 2, f"{len(evaluations)} evaluations: the replay with id '' was not found again"
