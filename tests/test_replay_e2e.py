"""``prime-runs sync --replay``: runs pushed again as new evaluations, their earlier state
kept; an interrupted replay is continued, not started over (exactly once within it)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from support.env import child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, api, evaluations_of, run_sync, sample_ids, server, sync_cmd  # noqa: F401


def by_replay(api, run_id: str) -> dict[str | None, list[dict]]:
    found: dict[str | None, list[dict]] = {}
    for evaluation in evaluations_of(api, run_id):
        found.setdefault(evaluation["metadata"].get("replay_id"), []).append(evaluation)
    return found


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
