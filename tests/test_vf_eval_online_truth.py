"""``PRIME_RUNS_MODE=online prime-runs eval``: when episodes were not shipped, the terminal
is told. verifiers sends our log records to its ``eval.log`` alone, so the run's closing
line about a platform that is down or a refused key never reached the user: the eval
exited 0 with nothing said. The real vf-eval, the real shipper child, the real local
platform behind a token, a closed port; stderr captured from the subprocess."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from support import platform_process  # noqa: E402
from support.env import CLI, child_env  # noqa: E402
from support.ports import closed_port  # noqa: E402
from support.vf_eval import RUN_NAME, TASKS, launch_file, run_eval  # noqa: E402

pytestmark = pytest.mark.slow  # real vf-eval runs


@pytest.fixture(scope="module")
def chat_server():
    with FakeChatServer() as server:
        yield server


def not_shipped_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "not shipped" in line]
    assert len(lines) == 1, stderr[-4000:]
    return lines[0]


@pytest.mark.parametrize("ui", [[], ["--no-rich"]], ids=["dashboard", "no-rich"])
def test_a_platform_that_is_down_is_told_on_stderr_once(tmp_path: Path, chat_server: FakeChatServer,
                                                        ui: list[str]) -> None:
    """Under the dashboard (the default, also when piped) the line is the command's own;
    with ``--no-rich`` verifiers' log on stderr already holds it, and it is not repeated."""
    port = closed_port()
    launch = launch_file(tmp_path, chat_server.base_url, rollouts=1)
    result = run_eval(tmp_path, "@", launch.name, *ui, PRIME_RUNS_MODE="online", PRIME_API_KEY="any-key",
                      PRIME_API_BASE_URL=f"http://127.0.0.1:{port}", PRIME_RUNS_BACKOFF_CAP="0.5")
    assert result.returncode == 0, result.stderr[-4000:]  # the eval's own exit status
    line = not_shipped_line(result.stderr)
    assert f"online mode: {TASKS} episodes not shipped" in line, line
    assert line.startswith("prime-runs: ") == (not ui), line
    assert f"connection refused by 127.0.0.1:{port}" in line, line
    assert line.endswith(f"ship them with: prime-runs sync outputs/{RUN_NAME} --base-url http://127.0.0.1:{port}"), line


def test_a_refused_key_is_told_on_stderr(tmp_path: Path, chat_server: FakeChatServer) -> None:
    launch = launch_file(tmp_path, chat_server.base_url, rollouts=1)
    with platform_process.running(tmp_path / "platform.db", "--token", "the-platforms-key") as platform:
        result = run_eval(tmp_path, "@", launch.name, PRIME_RUNS_MODE="online",
                          PRIME_API_KEY="not-the-platforms-key", PRIME_API_BASE_URL=platform.base_url)
        assert result.returncode == 0, result.stderr[-4000:]
        line = not_shipped_line(result.stderr)
        # The base URL was the eval's alone: the command, pasted where it is not set, ships there.
        command = line.split("ship them with: ", 1)[1]
        pasted = subprocess.run(["sh", "-c", shlex.join(CLI) + command.removeprefix("prime-runs") + " --json"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=120,
                                env=child_env(PRIME_API_KEY="the-platforms-key", HOME=str(tmp_path)))
        assert pasted.returncode == 0, command + pasted.stdout + pasted.stderr
        assert json.loads(pasted.stdout)["runs"][0]["state"] == "synced", pasted.stdout
    assert f"{TASKS} episodes not shipped" in line and "(401)" in line, line
    assert "not-the-platforms-key" not in result.stderr + result.stdout
