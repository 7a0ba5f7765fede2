"""Secrets never travel, end to end: an eval writes a run through ``open_run`` with
credentials in its config, its ``@`` file and every episode, and the API key in its
environment; ``prime-runs sync`` ships it to the real platform process. No credential and
no byte of the API key may appear anywhere: not in the run directory (spool, sync state),
not in the platform's database files, not in anything sync printed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support import platform_process
from support.env import CLI, child_env
from fixtures.episodes import FAKE_ENV_SECRET, FAKE_HEADER_SECRET, make_episode
from prime_runs_spool import open_run

API_KEY = "prk-live-9f8e7d6c5b4a39281706"
CONFIG_HEADER_SECRET = "cfs_CONFIG_HEADER_SECRET_5521"
JUDGE_HEADER_SECRET = "judge_HEADER_SECRET_9910"
HARNESS_SECRET = "hf_HARNESS_ENV_SECRET_3377"

EVAL_TOML = f"""\
model = "Qwen/Qwen3-8B"

[client]
type = "eval"
api_key_var = "VLLM_API_KEY"

[client.headers]
CF-Access-Client-Secret = "{CONFIG_HEADER_SECRET}"

[env.solver.harness.env]
HF_TOKEN = "{HARNESS_SECRET}"
"""


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_no_secret_reaches_disk_the_platform_or_the_output(tmp_path: Path) -> None:
    launch = tmp_path / "eval.toml"
    launch.write_text(EVAL_TOML)
    config = {
        "model": "Qwen/Qwen3-8B",
        "client": {"type": "eval", "headers": {"CF-Access-Client-Secret": CONFIG_HEADER_SECRET}},
        "env": {"solver": {"harness": {"env": {"HF_TOKEN": HARNESS_SECRET}}},
                "taskset": {"task": {"judges": [{"headers": {"Authorization": JUDGE_HEADER_SECRET}}]}}},
    }
    run_dir = tmp_path / "outputs" / "run"
    os.environ["PRIME_API_KEY"] = API_KEY  # the runner's environment holds the key
    try:
        with open_run(run_dir, name="secrets", environments=["gsm8k"], model="Qwen/Qwen3-8B",
                      config=config, config_file=str(launch), num_examples=3, rollouts_per_example=1) as run:
            run.log_episodes([make_episode(n, run_id=run.id) for n in range(3)])
    finally:
        del os.environ["PRIME_API_KEY"]
    secrets = [API_KEY, CONFIG_HEADER_SECRET, JUDGE_HEADER_SECRET, HARNESS_SECRET,
               FAKE_HEADER_SECRET, FAKE_ENV_SECRET]

    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY) as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "outputs"), "--base-url", server.base_url, "--json", "-v"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)["runs"][0]
        assert (report["state"], report["pushed_now"]) == ("synced", 3)
        import httpx

        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {API_KEY}"}) as api:
            evaluation = api.get(f"/evaluations/{report['evaluation_id']}").json()
            rows = api.get(f"/evaluations/{report['evaluation_id']}/samples").json()["samples"]
    # The masked tables arrived, with their keys and the mask where the values were.
    assert evaluation["metadata"]["client"]["headers"] == {"CF-Access-Client-Secret": "***"}
    assert "config_source" not in evaluation["metadata"]
    wrapper = rows[0]["info"]["native_wrapper"]
    assert wrapper["traces"][0]["agent"]["config"]["harness"]["env"] == {"HF_TOKEN": "***"}

    places = {
        "run directory": all_bytes(run_dir),
        "platform database": all_bytes(db.parent),
        "sync output": (result.stdout + result.stderr).encode(),
    }
    for secret in secrets:
        for where, data in places.items():
            assert secret.encode() not in data, f"a secret reached the {where}"
