"""Online mode: ``open_run(mode="online")`` writes the spool exactly as offline and ships it
from a child ``prime-runs sync --follow``; it never blocks or fails the eval."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.env import CLI, child_env
from fixtures.episodes import make_episode
from prime_runs_spool import open_run, read_run
from prime_runs_spool.runner.online import SHIPPER_LOG_NAME as LOG_NAME
from test_follow_e2e import wait_for
from support.sync_e2e import TOKEN, api, assert_exactly_once, server, sync_cmd  # noqa: F401


def episodes(run_id: str, start: int, count: int) -> list[dict]:
    return [make_episode(n, size=1_600, run_id=run_id, salt=run_id) for n in range(start, start + count)]


@pytest.fixture
def platform_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Credentials and quick protocol timings for the shipper child, from the environment."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.prime/config.json
    monkeypatch.setenv("PRIME_RUNS_REQUEST_LIFETIME", "0.5")
    monkeypatch.setenv("PRIME_RUNS_BACKOFF_CAP", "0.2")

    def point_at(base_url: str, key: str = TOKEN) -> None:
        monkeypatch.setenv("PRIME_API_BASE_URL", base_url)
        monkeypatch.setenv("PRIME_API_KEY", key)

    return point_at


@pytest.mark.slow
def test_online_run_ships_while_live_and_a_final_sync_adds_nothing(tmp_path: Path, server, api,
                                                                    platform_env) -> None:
    platform_env(server.base_url)
    run = open_run(tmp_path / "run", name="online-live", environments=["gsm8k"], model="m",
                   run_id="online-live", mode="online", ship_timeout=20)
    logged: list[dict] = []
    try:
        wait_for(lambda: run.evaluation_url is not None, what="the evaluation url while the run is live")
        for batch in range(3):
            logged += episodes(run.id, len(logged), 4)
            run.log_episodes(logged[-4:])
            wait_for(lambda: run.pushed == len(logged), what=f"batch {batch} on the platform")
        assert run.pending == 0
        logged += episodes(run.id, len(logged), 2)
        run.log_episodes(logged[-2:])  # left for finish() to drain
    finally:
        started = time.monotonic()
        run.finish()
    assert time.monotonic() - started < 20
    assert (run.pushed, run.pending) == (len(logged), 0)
    expected = SimpleNamespace(run_id=run.id, ids=[e["id"] for e in logged])
    evaluation = assert_exactly_once(api, expected)
    assert run.evaluation_url.endswith("/dashboard/evaluations/" + evaluation["evaluation_id"])
    final = subprocess.run(sync_cmd(server.base_url, str(tmp_path), "--json"), capture_output=True, text=True,
                           env=child_env(PRIME_API_KEY=TOKEN), timeout=60)
    assert json.loads(final.stdout)["runs"][0]["state"] == "up_to_date"
    assert_exactly_once(api, expected)
    log = (tmp_path / "run" / "spool" / LOG_NAME).read_text()
    assert TOKEN not in log


def test_online_run_with_the_platform_unreachable_completes_within_the_bound(tmp_path: Path,
                                                                              platform_env) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    platform_env(f"http://127.0.0.1:{port}", key="unreachable-key-value")
    run = open_run(tmp_path / "run", name="online-down", environments=["gsm8k"], model="m",
                   mode="online", ship_timeout=1.0)
    logged = episodes(run.id, 0, 30)
    for n in range(0, 30, 5):
        run.log_episodes(logged[n:n + 5])
    started = time.monotonic()
    run.finish()
    assert time.monotonic() - started < 1.0 + 4.0  # the drain bound, plus the child's stop
    spool = read_run(tmp_path / "run")
    assert (spool.status, spool.episodes_count) == ("completed", 30)
    assert (run.pushed, run.pending, run.evaluation_url) == (0, 30, None)
    assert "unreachable-key-value" not in (tmp_path / "run" / "spool" / LOG_NAME).read_text()
    verify = subprocess.run(CLI + ["verify", str(tmp_path)], capture_output=True, text=True, env=child_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_online_run_without_credentials_spools_and_warns(tmp_path: Path, platform_env, monkeypatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        with open_run(tmp_path / "run", name="online-nokey", mode="online") as run:
            run.log_episodes(episodes(run.id, 0, 3))
    assert "no API key" in caplog.text
    assert not (tmp_path / "run" / "spool" / LOG_NAME).exists()
    assert (read_run(tmp_path / "run").episodes_count, run.pending) == (3, 3)


def test_the_unreachable_reason_keeps_the_causes_own_parentheses() -> None:
    """A platform that took the connection and never answered was said as "(the platform
    was unreachable: timed out (ReadTimeout); ship them ...": the cause cut at its own
    first ")". The whole cause, as the shipper's retry line gives it."""
    from prime_runs_spool.runner.online import reason_from

    for line, cause in (
        ("prime-runs: listing evaluations failed: GET /evaluations/: no answer (timed out (ReadTimeout)); try 3 in "
         "0.8 s", "timed out (ReadTimeout)"),
        ("prime-runs: listing evaluations failed: GET /evaluations/: cannot connect (connection refused by "
         "127.0.0.1:9); try 2 in 0.4 s", "connection refused by 127.0.0.1:9"),
        ("error: creating the evaluation: still failing after 3 attempts (POST /evaluations/: no answer (timed out "
         "(ReadTimeout)))", "timed out (ReadTimeout)"),
    ):
        assert reason_from(line, "http://127.0.0.1:9") == f"the platform was unreachable: {cause}"
