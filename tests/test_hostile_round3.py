"""Hostile review, round 3, kept as regression tests: the command line and the viewer
against odd file names, received sync states, odd base URLs and slow platforms."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from support import platform_process
from support.env import CLI, REPO_ROOT, child_env
from support.runs import build_run

#: A folder name that is not UTF-8: Python decodes it to lone surrogates.
ODD_NAME = os.fsdecode(b"run-\xff\xfe")
VF040 = REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed"


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, env=child_env(**env))


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    """Two runs side by side: one in a folder whose name is not UTF-8, one plain."""
    root = tmp_path / "runs"
    build_run(root / ODD_NAME, "odd-name-run", 2)
    build_run(root / "plain", "plain-run", 2)
    return root


@pytest.mark.parametrize("command", ["verify", "status"])
def test_a_json_report_names_a_folder_whose_name_is_not_utf8(odd_tree: Path, command: str) -> None:
    """orjson refuses the surrogates such a name decodes to: `--json` ended in a traceback
    and the report of every other run was lost with it."""
    result = _cli(command, "--json", str(odd_tree))
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(result.stdout)
    paths = sorted(run.get("run_dir") or run.get("path") for run in document["runs"])
    assert paths == [f"{odd_tree}/plain", f"{odd_tree}/run-\\xff\\xfe"], paths
    assert result.returncode == 0, result.stderr


def test_a_json_import_and_sync_report_name_a_folder_whose_name_is_not_utf8(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    shutil.copytree(VF040, root / ODD_NAME)
    imported = _cli("import", "--json", str(root))
    assert "Traceback" not in imported.stderr, imported.stderr
    assert [r["state"] for r in json.loads(imported.stdout)["imports"]] == ["imported"]
    synced = _cli("sync", "--local", "--db", str(tmp_path / "local.db"), "--json", str(root))
    assert "Traceback" not in synced.stderr, synced.stderr
    document = json.loads(synced.stdout)
    assert [r["state"] for r in document["runs"]] == ["synced"], document
    assert document["runs"][0]["path"].endswith("run-\\xff\\xfe")


def test_the_viewer_lists_and_opens_a_run_whose_folder_name_is_not_utf8(odd_tree: Path) -> None:
    """The run's key went into the page's links as it was: urlencode raised, and the list
    of runs (every run's, not only this one's) answered 500."""
    proc = subprocess.Popen(CLI + ["view", str(odd_tree)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        url = platform_process.first_line(proc).rstrip("/")
        with httpx.Client(base_url=url, timeout=30) as client:
            index = client.get("/")
            assert index.status_code == 200, index.text[-500:]
            assert "/run?run=plain" in index.text
            page = client.get("/run", params={"run": "run-\\xff\\xfe"})
            assert page.status_code == 200
            assert client.get("/episode", params={"run": "run-\\xff\\xfe", "n": 1}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(15)
