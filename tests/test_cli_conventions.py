"""The command line's conventions, run as a user runs it: ``-o/--output json`` as the prime
CLI spells it (``--json`` kept), an Examples section in each command's help, ``verify``
defaulting to ``.`` like the others, counts in good English, and the local platform's
database in the user's data folder, shared by ``sync --local`` and ``platform serve``."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, REPO_ROOT, child_env
from support.runs import build_run


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=child_env(**env))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("conventions") / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "outputs", root)
    build_run(root / "one-episode", "one-episode", 1)
    return root


def test_verify_defaults_to_the_current_folder(outputs: Path) -> None:
    done = cli("verify", cwd=outputs)
    assert done.returncode == 0, done.stderr
    assert "one-episode" in done.stdout


@pytest.mark.parametrize("command", [["status"], ["verify"], ["sync", "--dry-run"]])
def test_dash_o_json_is_the_json_report(outputs: Path, command: list[str]) -> None:
    by_flag = cli(*command, str(outputs), "--json", HOME=str(outputs.parent))
    by_output = cli(*command, str(outputs), "-o", "json", HOME=str(outputs.parent))
    table = cli(*command, str(outputs), "--output", "table", HOME=str(outputs.parent))
    assert by_output.returncode == by_flag.returncode, by_output.stderr
    assert json.loads(by_output.stdout).keys() == json.loads(by_flag.stdout).keys()
    assert not table.stdout.lstrip().startswith("{")


def test_status_counts_in_good_english(outputs: Path) -> None:
    done = cli("status", str(outputs / "one-episode"))
    assert "1 episode in 1 segment" in done.stdout, done.stdout
    assert "1 episodes" not in done.stdout and "segment(s)" not in done.stdout


@pytest.mark.parametrize("command", [["sync"], ["verify"], ["status"], ["import"], ["view"], ["mirror"],
                                     ["export"], ["platform", "serve"]])
def test_each_command_has_examples_in_its_help(command: list[str]) -> None:
    done = cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Examples:" in done.stdout and f"prime-runs {' '.join(command)}" in done.stdout


def test_sync_help_says_where_the_key_comes_from() -> None:
    text = " ".join(cli("sync", "--help").stdout.split())
    assert "PRIME_API_KEY" in text and "~/.prime/config.json" in text


def test_the_local_platforms_database_is_in_the_data_folder_and_shared(tmp_path: Path) -> None:
    build_run(tmp_path / "runs" / "r", "local-db-place", 2)
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    env = {"HOME": str(home), "XDG_DATA_HOME": str(data)}
    done = cli("sync", str(tmp_path / "runs"), "--local", **env)
    assert done.returncode == 0, done.stderr
    database = data / "prime-runs" / "local-platform.db"
    assert database.is_file()
    assert not (home / ".prime").exists()
    served = subprocess.Popen(CLI + ["platform", "serve", "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env(**env))
    try:
        base = served.stdout.readline().strip()
        import httpx

        page = httpx.get(f"{base}/api/v1/evaluations/", timeout=30).json()
        assert page["total"] == 1, page  # what sync --local wrote, served by default
    finally:
        served.terminate()
        served.wait(30)
