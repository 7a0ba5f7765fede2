"""Online mode tells the truth at the eval's end: one line when episodes were not shipped,
saying how many, why (the platform unreachable, the key refused) and the command that ships
them; a platform that is down adds a bounded time, not the whole drain timeout. The real
shipper child, the real local platform, a closed port."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import Run, open_run
from prime_runs_spool.runner.online import CHILD_RETRY_FOR
from prime_runs_spool.runner.online import SHIPPER_LOG_NAME
from test_online_mode import episodes, platform_env  # noqa: F401
from support.sync_e2e import server  # noqa: F401


def not_shipped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not shipped" in r.getMessage()]


def finished_online(run_dir: Path, name: str, count: int, **options: Any) -> tuple[Run, float]:
    """An online run that logged ``count`` episodes and finished, and the seconds ``finish``
    took: the time the eval's end waited on its shipper."""
    run = open_run(run_dir, name=name, environments=["gsm8k"], model="m", mode="online", **options)
    run.log_episodes(episodes(run.id, 0, count))
    started = time.monotonic()
    run.finish()
    return run, time.monotonic() - started


@pytest.mark.slow
def test_a_platform_that_is_down_costs_a_bounded_time_and_one_line_says_what_was_not_shipped(
        tmp_path: Path, platform_env, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    platform_env(f"http://127.0.0.1:{port}")
    monkeypatch.delenv("PRIME_RUNS_BACKOFF_CAP")  # the real backoff: up to 30 s between tries
    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        _, took = finished_online(tmp_path / "run", "online-down-truth", 7)  # the default drain timeout, 30 s
    assert took < CHILD_RETRY_FOR + 8, f"{took:.1f} s added by a platform that is down"
    (line,) = not_shipped_lines(caplog)
    assert "7 episodes not shipped" in line and "unreachable" in line, line
    assert f"connection refused by 127.0.0.1:{port}" in line, line
    assert line.endswith(f"prime-runs sync {tmp_path / 'run'} --base-url http://127.0.0.1:{port}"), line
    log = (tmp_path / "run" / "spool" / SHIPPER_LOG_NAME).read_text()
    assert "failed: " in log and "; try 2 in " in log, "the shipper's retries are in its log"


@pytest.mark.slow
def test_a_refused_key_is_named_at_the_end(tmp_path: Path, server, platform_env,
                                           caplog: pytest.LogCaptureFixture) -> None:
    platform_env(server.base_url, key="not-the-platforms-key")
    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        _, took = finished_online(tmp_path / "run", "online-401", 3, ship_timeout=20)
    (line,) = not_shipped_lines(caplog)
    assert "3 episodes not shipped" in line and "refused the API key (401)" in line, line
    assert f"the platform at {server.base_url} refused" in line, line  # a wrong base URL shows
    assert line.endswith(f"prime-runs sync {tmp_path / 'run'} --base-url {server.base_url}"), line
    assert "not-the-platforms-key" not in caplog.text
    assert took < 15, f"{took:.1f} s"


class Refusing:
    """A real HTTP server on loopback that answers every request ``status``, counting them."""

    def __init__(self, status: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        asked: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _refuse(self) -> None:
                asked.append(f"{self.command} {self.path}")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"detail": "no"}')

            do_GET = do_POST = do_PUT = do_PATCH = _refuse

        self.asked = asked
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.slow
def test_a_refused_key_is_asked_once_when_the_shipper_starts_not_on_every_pass(
        tmp_path: Path, platform_env, caplog: pytest.LogCaptureFixture) -> None:
    """The shipper checks the key before it follows the run, as ``prime-runs sync`` does: a
    refused key stops it at once, after one request, instead of a refused pass (and its
    retries) for every batch the eval logs; the end still says why, and how to ship."""
    platform = Refusing(401)
    platform_env(platform.base_url, key="not-the-platforms-key")
    try:
        with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
            run = open_run(tmp_path / "run", name="online-401-once", environments=["gsm8k"], model="m",
                           mode="online", ship_timeout=20)
            for batch in range(6):  # an eval that goes on for a few seconds
                run.log_episodes(episodes(run.id, 2 * batch, 2))
                time.sleep(0.5)
            run.finish()
    finally:
        platform.close()
    assert len(platform.asked) == 1, platform.asked
    (line,) = not_shipped_lines(caplog)
    assert "12 episodes not shipped" in line and f"the platform at {platform.base_url} refused" in line, line
    assert line.endswith(f"prime-runs sync {tmp_path / 'run'} --base-url {platform.base_url}"), line


@pytest.mark.slow
def test_a_key_not_allowed_to_write_is_named_at_the_end(tmp_path: Path, platform_env,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A platform (a real HTTP server) that answers every request 403: the line says the key
    may not write there, names where, and gives the command that ships the episodes."""
    platform = Refusing(403)
    base_url = platform.base_url
    platform_env(base_url, key="a-key-of-another-team")
    try:
        with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
            _, took = finished_online(tmp_path / "run", "online-403", 2, ship_timeout=20)
    finally:
        platform.close()
    (line,) = not_shipped_lines(caplog)
    assert "2 episodes not shipped" in line and f"may not write at {base_url} (403)" in line, line
    assert line.endswith(f"prime-runs sync {tmp_path / 'run'} --base-url {base_url}"), line
    assert "a-key-of-another-team" not in caplog.text
    assert took < 15, f"{took:.1f} s"


@pytest.mark.slow
def test_nothing_is_said_when_everything_was_shipped(tmp_path: Path, server, platform_env,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from support.sync_e2e import TOKEN

    platform_env(server.base_url, key=TOKEN)
    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        run, _ = finished_online(tmp_path / "run", "online-ok", 3, ship_timeout=20)
    assert run.pending == 0
    assert not_shipped_lines(caplog) == []


@pytest.mark.slow
def test_a_shipper_that_stops_while_the_run_goes_on_is_said_then_not_only_at_the_end(
        tmp_path: Path, platform_env, caplog: pytest.LogCaptureFixture) -> None:
    """A refused key stops the shipper at its first request, but the eval learned it only at
    its end, hours later for a long eval: nothing was shipped and nothing said. One warning
    now says so while the run goes on (the spool keeps every episode), and the end's line
    still counts what was not shipped."""
    platform = Refusing(401)
    platform_env(platform.base_url, key="not-the-platforms-key")
    try:
        with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
            run = open_run(tmp_path / "run", name="online-401-early", environments=["gsm8k"], model="m",
                           mode="online", ship_timeout=20)
            run.log_episodes(episodes(run.id, 0, 2))
            deadline = time.monotonic() + 30
            while not [r for r in caplog.records if "the shipper stopped" in r.getMessage()]:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.05)
            [early] = [r.getMessage() for r in caplog.records if "the shipper stopped" in r.getMessage()]
            run.log_episodes(episodes(run.id, 2, 2))
            run.finish()
    finally:
        platform.close()
    assert f"the platform at {platform.base_url} refused the API key (401)" in early, early
    assert early.endswith(f"prime-runs sync {tmp_path / 'run'} --base-url {platform.base_url} ships them once it "
                          "ends"), early
    (line,) = not_shipped_lines(caplog)
    assert "4 episodes not shipped" in line, line
    assert [r for r in caplog.records if "the shipper stopped" in r.getMessage()] == [
        r for r in caplog.records if r.getMessage() == early]  # said once
    assert "not-the-platforms-key" not in caplog.text
