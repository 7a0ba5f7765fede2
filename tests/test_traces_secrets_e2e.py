"""Secrets never travel to Prime Traces either: a run written through ``open_run`` with
credentials in its config and every episode, synced with ``--to traces`` to the real
platform process. The masked bytes are what is stamped, hashed and stored: no credential
and no byte of the API key reaches the run directory, the platform's database or the output."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from prime_traces import TracesClient
import pytest

from fixtures.episodes import FAKE_ENV_SECRET, FAKE_HEADER_SECRET
from prime_runs_spool import open_run
from support import platform_process
from support.env import CLI, child_env
from support.files import all_bytes_under
from support.leaky import API_KEY, LEAKED, leaky_episodes, leaky_seat


@pytest.mark.slow
def test_no_secret_reaches_prime_traces(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "run"
    os.environ["PRIME_API_KEY"] = API_KEY  # the runner's environment holds the key
    try:
        with open_run(run_dir, name="secrets-traces", environments=["gsm8k"], model="Qwen/Qwen3-8B",
                      config={"model": "Qwen/Qwen3-8B", **leaky_seat()}, num_examples=3,
                      rollouts_per_example=1) as run:
            run.log_episodes(leaky_episodes(run.id))
    finally:
        del os.environ["PRIME_API_KEY"]
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY, "--traces") as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "outputs"), "--base-url", server.base_url, "--to", "traces", "--json", "-v"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        assert result.returncode == 0, result.stdout + result.stderr
        (report,) = json.loads(result.stdout)["runs"]
        assert (report["state"], report["store"], report["pushed_now"]) == ("synced", "traces", 3)
        with TracesClient(api_key=API_KEY, base_url=server.base_url) as traces:
            (member, *_) = traces.list(run_id=report["evaluation_id"], limit=100).items
            raw = json.loads(traces.get_raw(member.trace_id))
    # what arrived is the spool's masked document, stamped with the evaluation id
    assert raw["agent"]["config"]["harness"]["env"] == {"HF_TOKEN": "***"}
    assert raw["run"]["id"] == report["evaluation_id"] and raw["run"]["type"] == "eval"
    places = {"run directory": all_bytes_under(run_dir), "platform database": all_bytes_under(db.parent),
              "sync output": (result.stdout + result.stderr).encode()}
    for secret in [API_KEY, FAKE_HEADER_SECRET, FAKE_ENV_SECRET, *LEAKED.values()]:
        for where, data in places.items():
            assert secret.encode() not in data, f"a secret reached the {where}"
