"""``python -m prime_runs_spool.sync``: the library's own sync entry point (the one the
online shipper runs) syncs like ``prime-runs sync``, against the real local platform."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.env import child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, server  # noqa: F401

MODULE = [sys.executable, "-m", "prime_runs_spool.sync"]


def test_the_module_syncs_exactly_once_and_reports_like_the_cli(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "run", "module-sync", 7)
    cmd = MODULE + [str(tmp_path), "--base-url", server.base_url, "--json", "--request-lifetime", "1.0",
                    "--backoff-cap", "0.2", "--timeout", "5"]
    env = child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path))
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert [(r["state"], r["pushed_now"]) for r in json.loads(first.stdout)["runs"]] == [("synced", 7)]
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert json.loads(second.stdout)["runs"][0]["state"] == "up_to_date"
    assert_exactly_once(api, builder)


def test_the_module_rejects_bad_usage_in_one_line(tmp_path: Path) -> None:
    missing = subprocess.run(MODULE + [str(tmp_path / "nope")], capture_output=True, text=True,
                             env=child_env(PRIME_API_KEY="k", HOME=str(tmp_path)), timeout=60)
    no_key = subprocess.run(MODULE + [str(tmp_path)], capture_output=True, text=True,
                            env=child_env(HOME=str(tmp_path)), timeout=60)
    for result, what in ((missing, "no such file or directory"), (no_key, "no API key")):
        assert result.returncode == 2
        assert what in result.stderr and len(result.stderr.strip().splitlines()) == 1
