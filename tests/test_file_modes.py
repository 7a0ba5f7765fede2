"""Everything the package writes is 0600 and every directory it creates 0700, whatever the
umask lets through (docs/spool-format.md, section 1): spool files and locks, sync state,
the local platform's database with its WAL files, and the online shipper's log."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_runs_spool import open_run
from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.runner.online import SHIPPER_LOG_NAME
from prime_runs_spool.spool.layout import spool_dir
from support.env import CLI, child_env
from support.episodes import small_episode
from support.runs import build_run


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """A umask that would let 0644 through: only our own modes can keep files private."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, str]:
    out = {}
    for path in [root, *root.rglob("*")]:
        out[str(path.relative_to(root.parent))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return out


def _loose(modes: dict[str, str], root: Path) -> dict[str, str]:
    return {name: mode for name, mode in modes.items()
            if mode != ("0o700" if (root.parent / name).is_dir() else "0o600")}


def test_the_local_platform_database_and_its_wal_files_are_0600(tmp_path: Path):
    db = tmp_path / "db" / "platform.db"
    db.parent.mkdir(mode=0o700)
    store = Store(db)  # open, with its schema written: the WAL files exist now
    try:
        assert {p.name for p in db.parent.iterdir()} == {"platform.db", "platform.db-wal", "platform.db-shm"}
        assert _loose(_modes(db.parent), db.parent) == {}
    finally:
        store.close()
    os.chmod(db, 0o644)  # an older version's database: tightened when opened
    Store(db).close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


@pytest.mark.slow
def test_sync_local_writes_nothing_others_can_read(tmp_path: Path):
    build_run(tmp_path / "runs" / "run", "modes-run", 3)
    db = tmp_path / "home" / "platform" / "local.db"
    done = subprocess.run([*CLI, "sync", "--local", "--db", str(db), str(tmp_path / "runs")],
                          capture_output=True, text=True, env=child_env(HOME=str(tmp_path / "home")), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _loose(_modes(db.parent.parent), db.parent.parent) == {}  # the folders it created too
    assert {p.name for p in db.parent.iterdir()} >= {"local.db"}
    assert _loose(_modes(tmp_path / "runs" / "run"), tmp_path / "runs" / "run") == {}
    assert (spool_dir(tmp_path / "runs" / "run") / "sync.lock").exists()


def test_the_spool_and_the_shipper_log_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIME_API_KEY", "not-a-real-key")
    monkeypatch.setenv("PRIME_API_BASE_URL", "http://127.0.0.1:9")  # nothing listens: the shipper just retries
    run = open_run(tmp_path / "outputs" / "run", name="t", mode="online", ship_timeout=0.5)
    run.log_episodes([small_episode("a")])
    run.finish()
    log = spool_dir(tmp_path / "outputs" / "run") / SHIPPER_LOG_NAME
    assert log.exists()
    assert _loose(_modes(tmp_path / "outputs"), tmp_path / "outputs") == {}  # outputs/ was created too


@pytest.mark.slow
def test_a_viewer_export_is_private_folders_included(tmp_path: Path):
    build_run(tmp_path / "runs" / "run", "modes-export", 2)
    out = tmp_path / "site" / "export"  # "site" is created too
    done = subprocess.run([*CLI, "view", str(tmp_path / "runs"), "--export", str(out)], capture_output=True,
                          text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(out.rglob("*.html"))
    assert _loose(_modes(tmp_path / "site"), tmp_path / "site") == {}


def test_a_state_file_is_0600_in_a_0700_folder_made_only_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """save_state makes the folder on a run's first state only: a mkdir per write was two
    syscalls of four state writes a new run (docs/benchmarks.md, `sync_many_cpu.py`)."""
    from prime_runs_spool.sync.state import Destination, SyncState, save_state

    made: list[Path] = []
    real_mkdir = os.mkdir

    def mkdir(folder, *a, **k) -> None:  # noqa: ANN001, ANN002, ANN003
        real_mkdir(folder, *a, **k)
        made.append(Path(folder))  # made, not only tried

    monkeypatch.setattr(os, "mkdir", mkdir)
    path = tmp_path / "run" / "spool" / "sync" / "dest.json"
    state = SyncState(destination=Destination(key="dest", base_url="http://x"), local_run_id="r")
    save_state(path, state)
    assert made == [tmp_path / "run", tmp_path / "run" / "spool", path.parent]  # its missing parents on the way
    first = len(made)
    save_state(path, state)
    save_state(path, state)
    assert len(made) == first
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SyncState.from_json(path.read_bytes()).local_run_id == "r"


def test_the_cache_folder_and_every_parent_it_makes_are_0700(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``XDG_CACHE_HOME`` missing: sync's cache (copy locks, runs up to date, store states)
    and the viewer's search indexes made it with the umask's mode (0755), as ``Path.mkdir``
    makes a parent; every folder made is 0700 now, as the XDG specification asks too."""
    from prime_runs_spool.sync.user_cache import private_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / "cache"))
    folder = private_folder("copies")
    assert folder == tmp_path / "home" / "cache" / "prime-runs" / "copies"
    assert _loose(_modes(tmp_path / "home"), tmp_path / "home") == {}
    (tmp_path / "home" / "cache" / "prime-runs" / "taken").write_bytes(b"")
    with pytest.raises(FileExistsError):
        private_folder("taken")
    assert stat.S_IMODE((tmp_path / "home" / "cache" / "prime-runs" / "taken").stat().st_mode) == 0o644
