"""A run synced to one sink, its sync state lost, is never pushed again through the other.

A sync that finds the run's evaluation again with no state of its own (the file deleted, or
another ``--state-dir``) asks the platform which sink holds the run (docs/sync.md, "Sinks"):
the real ``prime-runs sync`` against a real ``prime-runs platform serve --traces`` over HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from support import platform_process
from support.env import child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, evaluations_of, sync_cmd


def sync(base_url: str, runs: Path, to: str, cache: Path) -> subprocess.CompletedProcess[str]:
    # A cache of its own (the copy locks' notes): a fresh machine, which knows nothing of the run.
    return subprocess.run(sync_cmd(base_url, str(runs), "--json", "--to", to), capture_output=True, text=True,
                          timeout=120, env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root"),
                                                     XDG_CACHE_HOME=str(cache)))


def held(api: httpx.Client, evaluation_id: str) -> tuple[list[str], int]:
    """The episode ids Prime Traces holds for the evaluation, and its sample rows."""
    episodes = api.get("/episodes", params={"run_id": evaluation_id, "limit": 100}).json()["items"]
    samples = api.get(f"/evaluations/{evaluation_id}").json()["total_samples"]
    return sorted(item["episode_id"] for item in episodes), samples


@pytest.mark.slow
def test_a_run_in_traces_with_its_state_lost_is_never_pushed_to_samples(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "in-traces", 6)
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        first = sync(server.base_url, tmp_path / "runs", "traces", tmp_path / "cache1")
        assert first.returncode == 0, first.stdout + first.stderr
        (evaluation,) = evaluations_of(api, builder.run_id)
        evaluation_id = evaluation["evaluation_id"]
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)

        for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
            path.unlink()
        refused = sync(server.base_url, tmp_path / "runs", "samples", tmp_path / "cache2")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        (report,) = json.loads(refused.stdout)["runs"]
        assert report["state"] == "error" and "went to traces" in report["error"], report
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)

        for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
            path.unlink()
        followed = sync(server.base_url, tmp_path / "runs", "auto", tmp_path / "cache3")
        assert followed.returncode == 0, followed.stdout + followed.stderr
        (report,) = json.loads(followed.stdout)["runs"]
        assert (report["store"], report["pushed_now"], report["evaluation_id"]) == ("traces", 0, evaluation_id)
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)
        assert len(evaluations_of(api, builder.run_id)) == 1
