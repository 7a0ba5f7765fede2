"""Start ``prime-runs platform serve`` as a real subprocess, for the platform's tests."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.env import CLI, child_env

STARTUP_TIMEOUT = 30.0


@dataclass
class PlatformProcess:
    proc: subprocess.Popen[str]
    base_url: str

    @property
    def api(self) -> str:
        return self.base_url + "/api/v1"

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def first_line(proc: subprocess.Popen[str], timeout: float = STARTUP_TIMEOUT) -> str:
    """The child's first stdout line, or an AssertionError (with its stderr) in time."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        proc.kill()
        raise AssertionError(f"no first line from {proc.args}: {proc.stderr.read()}")
    return box[0].rstrip("\n")


def start(db: Path, *extra: str) -> PlatformProcess:
    proc = subprocess.Popen(
        CLI + ["platform", "serve", "--db", str(db), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )
    return PlatformProcess(proc, first_line(proc))


@contextmanager
def running(db: Path, *extra: str) -> Iterator[PlatformProcess]:
    """A platform process for the block; stopped with SIGTERM, which must exit 0."""
    platform = start(db, *extra)
    try:
        yield platform
    finally:
        if platform.proc.poll() is None:
            status = platform.terminate()
            assert status == 0, platform.proc.stderr.read()


def module_fixtures(token: str, client_name: str = "api", *extra: str) -> tuple[object, object]:
    """A module-scoped ``server`` (a platform process requiring ``token``) and a client
    fixture named ``client_name`` (httpx, to its ``/api/v1``, carrying the token)."""
    import httpx
    import pytest

    @pytest.fixture(scope="module", name="server")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformProcess]:
        db = tmp_path_factory.mktemp("platform") / "platform.db"
        with running(db, "--token", token, *extra) as proc:
            yield proc

    @pytest.fixture(scope="module", name=client_name)
    def api(server: PlatformProcess) -> Iterator[httpx.Client]:
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
            yield c

    return server, api


def synced_evaluation(runs: Path, db: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``prime-runs sync --to samples --json`` of the one run under ``runs`` into a platform
    process on ``db`` (real HTTP, a key of its own): the run's report, its evaluation as the
    platform holds it, and all the command printed (for what it must never say)."""
    import httpx

    key = "platform-token-not-a-secret"
    with running(db, "--token", key) as server:
        result = subprocess.run(CLI + ["sync", str(runs), "--base-url", server.base_url, "--to", "samples", "--json"],
                                capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=key))
        assert result.returncode == 0, result.stdout + result.stderr
        [report] = json.loads(result.stdout)["runs"]
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {key}"}) as api:
            evaluation = api.get(f"/evaluations/{report['evaluation_id']}").json()
    return report, evaluation, result.stdout + result.stderr
