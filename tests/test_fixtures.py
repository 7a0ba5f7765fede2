"""The committed example tree (fixtures/outputs) matches what the generator writes today."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import read_run
from prime_runs_spool.spool.layout import find_runs
from support.env import CLI, REPO_ROOT, child_env
from support.files import all_bytes_under

COMMITTED = REPO_ROOT / "fixtures" / "outputs"
#: The fake credentials in the reference episodes and eval_example.toml.
FAKE_SECRETS = [b"EXAMPLE_NOT_A_REAL", b"team_0123456789abcdef", b"3f1c2b9e8d7a6f50.access"]


def shape(root: Path) -> dict[str, Any]:
    """What must not drift: per run, its status, episodes, segments and manifest's choices."""
    out = {}
    for run_dir in find_runs([root]):
        spool = read_run(run_dir)
        out[run_dir.name] = {
            "status": spool.status,
            "episodes": spool.episodes_count,
            "segments": [(s.sealed, s.episodes, s.torn_offset is not None) for s in spool.segments],
            "run_id": spool.run_id,
            "config_source": "config_source" in spool.manifest,
            "metas": [r.meta for r in spool.records() if r.type == "episode"],
        }
    return out


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("outputs")
    subprocess.run(["python3", "-m", "fixtures.make_outputs", str(out)], cwd=REPO_ROOT, env=child_env(),
                   check=True, timeout=120)
    return out


@pytest.mark.slow
def test_regenerating_gives_the_committed_runs(regenerated: Path) -> None:
    committed = shape(COMMITTED)
    assert committed == shape(regenerated)
    assert {name: run["status"] for name, run in committed.items()} == {
        "gsm8k-clean-source": "completed",
        "gsm8k-completed": "completed",
        "gsm8k-crashed-torn": "torn",
        "gsm8k-failed": "failed",
        "gsm8k-resumed": "completed",
        "judge-credentials": "completed",
    }
    assert committed["gsm8k-resumed"]["segments"] == [("cancelled", 3, False), ("completed", 3, False)]
    assert committed["gsm8k-clean-source"]["config_source"]
    assert not committed["judge-credentials"]["config_source"]


def test_committed_tree_verifies_clean_and_is_small() -> None:
    done = subprocess.run([*CLI, "verify", str(COMMITTED)], env=child_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    size = sum(path.stat().st_size for path in COMMITTED.rglob("*") if path.is_file())
    assert size < 1_000_000


@pytest.mark.slow
def test_no_fake_credential_in_either_tree(regenerated: Path) -> None:
    for tree in (COMMITTED, regenerated):
        raw = all_bytes_under(tree)
        for secret in FAKE_SECRETS:
            assert secret not in raw


def test_committed_tree_has_no_machine_state(tmp_path: Path) -> None:
    """Locks and sync state are git-ignored; a reader takes a missing lock as 'writer gone'."""
    tracked = subprocess.run(["git", "ls-files", "fixtures/outputs"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked and not [name for name in tracked if name.endswith(".lock") or "/sync/" in name]
    copy = tmp_path / "torn"
    shutil.copytree(COMMITTED / "gsm8k-crashed-torn", copy, ignore=shutil.ignore_patterns("*.lock"))
    torn = read_run(copy)
    assert not torn.segments[-1].live and torn.status == "torn"
