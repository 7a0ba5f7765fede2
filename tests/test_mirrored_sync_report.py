"""A mirrored run synced to a platform from its store copy, then from its own folder, as a
user would (real CLI processes, the real local platform's database, a file:// store): the
second sync pushes nothing, and its report says so, whichever sink holds the run."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import build_run
from support.store_runs import mirror_once


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["traces", "samples"])
def test_the_folder_sync_after_the_store_sync_reports_nothing_pushed_and_names_the_copy(
        tmp_path: Path, sink: str) -> None:
    build_run(tmp_path / "outputs" / "r", f"mirrored-{sink}", 6)
    store = f"file://{tmp_path / 'store'}"
    assert mirror_once(tmp_path / "outputs", store).returncode == 0
    db = tmp_path / "local.db"
    env = child_env(XDG_CACHE_HOME=str(tmp_path / "cache"))

    def sync(source: str) -> str:
        done = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "--to", sink, source],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.splitlines()[0]

    from_store = sync(store)
    assert from_store.startswith("synced") and "pushed 6 (total 6)" in from_store, from_store
    from_folder = sync(str(tmp_path / "outputs"))
    assert from_folder.startswith("synced") and "pushed 0 (total 6)" in from_folder, from_folder
    assert f"(a copy of {store}/r, synced already)" in from_folder, from_folder
    with sqlite3.connect(db) as conn:  # nothing stored twice either way
        if sink == "traces":
            assert conn.execute("SELECT COUNT(*) FROM trace_uploads").fetchone() == (1,)
            assert conn.execute("SELECT COUNT(*) FROM trace_episodes").fetchone() == (6,)
        else:
            assert conn.execute("SELECT COUNT(*) FROM samples").fetchone() == (6,)
