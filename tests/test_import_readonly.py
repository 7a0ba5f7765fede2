"""Read-only sources: ``--state-dir`` (or ``PRIME_RUNS_STATE_DIR``) keeps the imported spool
and the sync state outside the source, so a read-only artifact syncs exactly once and is
never written; without it, a read-only source is a clear error naming the option.

The tests run as root, which the kernel lets write anywhere a mode forbids, and a
read-only bind mount is not available. So the source is made read-only twice over: every
file and folder loses its write bits (0444/0555), which the importer honours even for
root (``is_read_only``), and, where the filesystem and capabilities allow, ``chattr +i``
makes the kernel refuse any write, root's included, so a write the code attempted would
fail the test rather than go unnoticed. Either way the test compares every byte, name and
mode under the source before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.make_eval_outputs import FAKE_CREDENTIAL
from support.env import CLI, REPO_ROOT, child_env
from support.files import all_bytes_under

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, env=child_env(**env))


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str]]:
    out: dict[str, tuple[int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        content: bytes | str = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else ""
        out[str(path.relative_to(root))] = (mode, content)
    return out


def _chattr(flag: str, paths: list[Path]) -> bool:
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def read_only_artifact(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "artifact"
    for name in ("vf040-completed", "vf040-cancelled"):
        shutil.copytree(EVAL_OUTPUTS / name, root / name, symlinks=True)
    everything = sorted((p for p in [root, *root.rglob("*")] if not p.is_symlink()), reverse=True)
    for path in everything:  # deepest first: a folder keeps its x bits
        path.chmod(0o555 if path.is_dir() else 0o444)
    immutable = _chattr("+i", everything)
    try:
        yield root
    finally:
        if immutable:
            _chattr("-i", everything)
        for path in everything:
            path.chmod(stat.S_IRWXU)


@pytest.mark.slow
def test_read_only_source_synced_twice_with_a_state_dir_is_pushed_once(read_only_artifact: Path,
                                                                        tmp_path: Path) -> None:
    before = snapshot(read_only_artifact)
    state, db = tmp_path / "state", tmp_path / "p.db"
    first = cli("sync", str(read_only_artifact), "--local", "--db", str(db), "--state-dir", str(state), "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(first.stdout)
    assert sorted(r["pushed_now"] for r in report["runs"]) == [1, 4]
    assert all(Path(r["run_dir"]).is_relative_to(state) for r in report["imports"])
    # The second time through the environment variable, as a CI job would set it.
    second = cli("sync", str(read_only_artifact), "--local", "--db", str(db), "--json", PRIME_RUNS_STATE_DIR=str(state))
    assert second.returncode == 0, second.stdout + second.stderr
    again = json.loads(second.stdout)
    assert [r["pushed_now"] for r in again["runs"]] == [0, 0]
    assert {r["state"] for r in again["imports"]} == {"up_to_date"}
    # A fresh state directory (a CI cache lost): the run is found again by its local id, nothing twice.
    third = cli("sync", str(read_only_artifact), "--local", "--db", str(db), "--json",
                "--state-dir", str(tmp_path / "other-state"))
    assert third.returncode == 0, third.stdout + third.stderr
    assert [r["pushed_now"] for r in json.loads(third.stdout)["runs"]] == [0, 0]
    assert snapshot(read_only_artifact) == before  # not a byte, name or mode written

    from prime_runs_spool.local_platform.store import Store

    store = Store(db)
    try:
        evaluations, total = store.list_evaluations(skip=0, limit=100)
        assert total == 2  # one evaluation per run, once
        assert sorted(e["total_samples"] for e in evaluations) == [1, 4]
    finally:
        store.close()
    assert FAKE_CREDENTIAL.encode() not in all_bytes_under(state)
    assert FAKE_CREDENTIAL.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("p.db*"))
    status = cli("status", str(read_only_artifact), "--state-dir", str(state))
    assert status.returncode == 0 and "not spooled" not in status.stdout and "finalized" in status.stdout


@pytest.mark.slow
def test_read_only_source_without_a_state_dir_names_the_option(read_only_artifact: Path, tmp_path: Path) -> None:
    before = snapshot(read_only_artifact)
    done = cli("import", str(read_only_artifact))
    assert done.returncode == 1
    assert "is read-only" in done.stderr and "--state-dir DIR" in done.stderr and "PRIME_RUNS_STATE_DIR" in done.stderr
    assert "Traceback" not in done.stderr
    synced = cli("sync", str(read_only_artifact), "--local", "--db", str(tmp_path / "p.db"))
    assert synced.returncode == 1 and "--state-dir" in synced.stderr
    assert snapshot(read_only_artifact) == before


@pytest.mark.parametrize("command", [["status"], ["verify"], ["export", "-o", "out.csv"]])
def test_the_import_hint_for_a_read_only_folder_names_state_dir(read_only_artifact: Path, tmp_path: Path,
                                                                command: list[str]) -> None:
    """The hint said ``prime-runs import PATH``, which a read-only folder refuses: it names
    ``--state-dir`` there."""
    command = [part if part != "out.csv" else str(tmp_path / "out.csv") for part in command]
    done = cli(*command, str(read_only_artifact))
    said = done.stdout + done.stderr
    for name in ("vf040-completed", "vf040-cancelled"):
        assert f"prime-runs import {read_only_artifact / name} --state-dir DIR" in said, said


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare to mount a folder read-only")
def test_a_read_only_bind_mount_is_read_only(tmp_path: Path) -> None:
    """A folder mounted read-only (a bind mount, in a user and mount namespace of its own)
    whose modes allow writing is read-only: on Linux ``access`` says so (``EROFS``), and
    ``is_read_only`` asks nothing else there (no ``statvfs``)."""
    source, mount = tmp_path / "source", tmp_path / "mounted"
    source.mkdir()
    mount.mkdir()
    script = (f"mount --bind {source} {mount} && mount -o remount,bind,ro {mount} && "
              f"python3 -c 'import sys; from prime_runs_spool.files import is_read_only; "
              f"print(is_read_only(sys.argv[1]), is_read_only(sys.argv[2]))' {mount} {source}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=60,
                          env=child_env())
    if done.returncode != 0 and "mount" in done.stderr and "python3" not in done.stderr:
        pytest.skip(f"no read-only bind mount here: {done.stderr.strip()}")
    assert done.stdout.split() == ["True", "False"], (done.stdout, done.stderr)
