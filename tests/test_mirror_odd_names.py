"""``prime-runs mirror`` of a tree where one run's folder name is not UTF-8 (an artifact
unpacked from another locale): no object store key can hold that name. It ended the whole
command in ``internal error: TypeError: str is not valid UTF-8`` (exit 1), before the
other runs were mirrored. Now that run is its own error, in one line, and the others go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import build_run


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file systems refuse names that are not UTF-8")
def test_a_run_whose_name_is_not_utf8_is_its_own_error_and_the_others_are_mirrored(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    build_run(root / "good", "odd-name-good", 2)
    odd = os.path.join(os.fsencode(root), b"bad\xff\x1b[31mname")
    build_run(Path(os.fsdecode(odd)), "odd-name-bad", 2)
    store = tmp_path / "store"
    result = subprocess.run(CLI + ["mirror", "--once", str(root), store.as_uri()], capture_output=True, text=True,
                            errors="backslashreplace", env=child_env(), timeout=120)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    (error,) = [line for line in result.stdout.splitlines() if line.startswith("error ")]
    assert "\x1b" not in error and "bad\\xff\\x1b[31mname" in error, error
    assert error.endswith("its folder's name is not UTF-8, which no object store key can hold; rename the folder "
                          "(its name in UTF-8) and mirror again"), error
    assert (store / "good" / "spool" / "seg-000001.jsonl").is_file(), "the other run was mirrored"
    assert sorted(os.listdir(store)) == ["good"]


@pytest.mark.parametrize("inside", ["store", "."])
def test_a_folder_store_inside_the_tree_it_mirrors_is_refused_before_anything_is_copied(
        tmp_path: Path, inside: str) -> None:
    """``prime-runs mirror outputs file://$PWD/outputs/backup`` found, at every pass, the
    copies the last one made as runs, and copied them again a level deeper
    (``backup/backup/backup/...``) until the disk was full. It is bad usage now."""
    root = tmp_path / "runs"
    build_run(root / "r", "store-inside", 2)
    store = (root / inside).resolve()
    result = subprocess.run(CLI + ["mirror", "--once", str(root), store.as_uri()], capture_output=True, text=True,
                            env=child_env(), timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr == (f"prime-runs: {store.as_uri()} is inside {root}, which it mirrors: every pass would "
                             "copy its own copies again; give a store outside the paths mirrored\n"), result.stderr
    assert sorted(os.listdir(root)) == ["r"], "nothing copied"
    assert not (root / "r" / "spool" / "mirror.json").exists()
