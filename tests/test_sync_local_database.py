"""``prime-runs sync --local`` when its database is not the one its runs were synced into.

A run's state records the database it was pushed into by its path, and a run its state says
is finished is up to date without a request (a no-op re-sync costs nothing). Delete the
database (to start afresh, or by a clean-up) and the next ``sync --local`` made a new,
empty one and said every run was ``up_to_date``: exit 0, nothing in the database, and
nothing said. Now it says which runs are not in the new database and prints the
``--replay`` that pushes them there. The real command, in a child process.
"""

from __future__ import annotations

import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from support.cli import last_line, run_cli
from support.env import CLI, child_env
from support.runs import RunBuilder


def samples_in(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from samples").fetchone()[0]


def delete_database(db: Path) -> None:
    for path in db.parent.glob(db.name + "*"):  # the database with its -wal and -shm
        path.unlink()


@pytest.mark.slow  # five syncs
def test_a_deleted_local_database_is_said_and_the_printed_replay_fills_the_new_one(tmp_path: Path) -> None:
    runs, db = tmp_path / "runs", tmp_path / "local.db"
    for name in ("a", "b"):
        builder = RunBuilder(runs / name, f"run-{name}")
        builder.open_segment()
        builder.add(3)
        builder.seal()
    first = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert first.returncode == 0 and samples_in(db) == 6, first.stderr
    assert "did not exist" not in first.stderr  # a new database, but no run was synced before

    delete_database(db)
    again = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert again.returncode == 0, again.stderr
    assert samples_in(db) == 0
    replay = f"prime-runs sync {runs / 'a'} {runs / 'b'} --local --db {db} --replay"
    assert last_line(again) == (
        f"prime-runs: warning: {db} did not exist before this sync, so what 2 runs pushed into a database at that "
        f"path before (deleted or moved since?) is not in it; push them into it again with: {replay}")

    pasted = run_cli(*shlex.split(replay)[1:])
    assert pasted.returncode == 0, pasted.stderr
    assert samples_in(db) == 6
    quiet = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert quiet.returncode == 0 and "did not exist" not in quiet.stderr, quiet.stderr
    assert samples_in(db) == 6


@pytest.mark.slow  # two syncs
def test_a_copy_synced_in_the_same_sync_into_a_new_database_is_not_said_to_be_missing(tmp_path: Path) -> None:
    """One artifact unpacked twice (``cp -r``), both copies synced into a new database: the
    copy is answered ``synced already`` (its twin pushed the episodes in this very sync), so
    its total exceeds what it pushed. It was named as a run whose episodes were lost with the
    old database, and the printed ``--replay`` pushed the run a second time."""
    runs, db = tmp_path / "runs", tmp_path / "local.db"
    builder = RunBuilder(runs / "one", "run-copied")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    shutil.copytree(runs / "one", runs / "two")
    first = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert first.returncode == 0 and samples_in(db) == 3, first.stderr
    assert "synced already" in first.stdout, first.stdout
    assert "did not exist" not in first.stderr, first.stderr
    again = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert again.returncode == 0 and "did not exist" not in again.stderr, again.stderr
    assert samples_in(db) == 3


@pytest.mark.slow  # three syncs
def test_copies_of_a_run_whose_database_was_deleted_are_named_once_and_pushed_once(tmp_path: Path) -> None:
    """A run synced into a database, then copied (``cp -r``, its state with it), the database
    deleted: both copies are up to date by their states, and the warning named both paths in
    its ``--replay``, which, pasted, pushed the run once per copy (two evaluations, 6 rows
    of 3). One copy is named, and the run pushed once."""
    runs, db = tmp_path / "runs", tmp_path / "local.db"
    builder = RunBuilder(runs / "one", "run-copied-old-database")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    assert run_cli("sync", str(runs), "--local", "--db", str(db)).returncode == 0
    shutil.copytree(runs / "one", runs / "two")
    db.unlink()
    again = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert again.returncode == 0, again.stderr
    (line,) = [line for line in again.stderr.splitlines() if "did not exist" in line]
    command = shlex.split(line.split("push them into it again with: ", 1)[1])
    assert "what 1 run pushed" in line and len([word for word in command if word.startswith(str(runs))]) == 1, line
    pasted = run_cli(*command[1:])
    assert pasted.returncode == 0, pasted.stderr
    assert samples_in(db) == 3


def test_a_database_named_by_the_environment_that_cannot_be_opened_names_the_variable(tmp_path: Path) -> None:
    """PRIME_RUNS_LOCAL_DB naming a folder (or a file that is no database) was told as
    'prime-runs: --db: cannot open database ...' to a user who gave no --db."""
    runs = tmp_path / "runs"
    build = RunBuilder(runs / "a", "run-env-db")
    build.open_segment()
    build.add(1)
    build.seal()
    done = run_cli("sync", str(runs), "--local", PRIME_RUNS_LOCAL_DB=str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert last_line(done).startswith(f"prime-runs: PRIME_RUNS_LOCAL_DB: cannot open database {tmp_path}: "), done.stderr
    given = run_cli("sync", str(runs), "--local", "--db", str(tmp_path), PRIME_RUNS_LOCAL_DB=str(tmp_path / "x.db"))
    assert given.returncode == 2 and last_line(given).startswith("prime-runs: --db: cannot open database"), given.stderr


@pytest.mark.parametrize("given", ["--db", "PRIME_RUNS_LOCAL_DB"])
@pytest.mark.parametrize("kind", ["blanks", "link loop", "dangling link", "below a dangling link"])
def test_a_database_no_file_can_be_made_at_is_one_line_and_nothing_is_made(tmp_path: Path, given: str,
                                                                          kind: str) -> None:
    """A loop of symbolic links was an internal error ('RuntimeError: Symlink loop', exit 1);
    a symbolic link to a folder not there (a disk not mounted) had the folders made through
    it, on the disk below the mount point, and the database written there; a name of blanks
    only made a database so named in the current folder. Each is one line naming what is in
    the way, exit 2, nothing made; a link to a database not made yet, in a folder that is
    there, is one SQLite makes."""
    runs = tmp_path / "runs"
    build = RunBuilder(runs / "a", "run-db-links")
    build.open_segment()
    build.add(1)
    build.seal()
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    (tmp_path / "mnt").symlink_to(tmp_path / "not-mounted" / "disk")
    value = {"blanks": "  ", "link loop": str(tmp_path / "loop-a"), "dangling link": str(tmp_path / "mnt"),
             "below a dangling link": str(tmp_path / "mnt" / "platform.db")}[kind]
    said = {"blanks": "'  ' is blanks only and names no file",
            "link loop": f"{tmp_path / 'loop-a'} is a loop of symbolic links",
            "dangling link": f"{tmp_path / 'mnt'} is a symbolic link to {tmp_path / 'not-mounted' / 'disk'}, "
                             "which does not exist"}
    said["below a dangling link"] = said["dangling link"]
    args = ["--db", value] if given == "--db" else []
    env = {"PRIME_RUNS_LOCAL_DB": value} if given != "--db" else {}
    done = subprocess.run(CLI + ["sync", str(runs), "--local", *args], capture_output=True, text=True, timeout=120,
                          cwd=work, env=child_env(**env))
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last_line(done) == f"prime-runs: {given}: cannot open database {value}: {said[kind]}", done.stderr
    assert list(work.iterdir()) == [] and not (tmp_path / "not-mounted").exists()
    assert not (runs / "a" / "spool" / "sync").exists() or not any((runs / "a" / "spool" / "sync").iterdir())


def test_a_link_to_a_database_not_made_yet_in_a_folder_that_is_there_is_made(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    build = RunBuilder(runs / "a", "run-db-leaf-link")
    build.open_segment()
    build.add(1)
    build.seal()
    (tmp_path / "disk").mkdir()
    (tmp_path / "platform.db").symlink_to(tmp_path / "disk" / "platform.db")
    done = run_cli("sync", str(runs), "--local", "--db", str(tmp_path / "platform.db"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert samples_in(tmp_path / "disk" / "platform.db") == 1


@pytest.mark.slow  # two syncs, the first retrying
def test_a_local_database_that_cannot_grow_is_one_line_naming_it_and_nothing_is_pushed_twice(tmp_path: Path) -> None:
    """``sync --local`` under a file size limit (``ulimit -f``; a full disk alike): SQLite's
    'disk I/O error' came out of the embedded platform as a traceback per try on the
    terminal ("Exception in ASGI application", then "cannot rollback - no transaction is
    active") and the run's error said only 'answered 500'. Now each try's line and the run's
    error name the database and the likely cause (its path whole: the local platform's key
    was "local", scrubbed out of every error line as a key is); the next sync, the limit
    lifted, pushes every episode once. The answer's words are quoted, not its JSON
    (``({"detail":"..."})``)."""
    import resource

    runs, db = tmp_path / "runs", tmp_path / "local.db"
    builder = RunBuilder(runs / "r", "local-db-cannot-grow")
    builder.open_segment()
    builder.add(40, size=20_000)
    builder.seal()
    limit = 200 * 1024  # the database's first pages fit, the rows do not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    full = subprocess.run(CLI + ["sync", str(runs), "--local", "--db", str(db), "--max-attempts", "2"],
                          capture_output=True, text=True, env=child_env(), timeout=300, preexec_fn=limited)
    assert full.returncode == 1, full.stderr
    assert "Traceback" not in full.stderr and "ASGI" not in full.stderr, full.stderr
    said = f"the platform's database {db} failed: disk I/O error (a full disk, or a file size limit: ulimit -f?)"
    assert f"answered 507 ({said})" in full.stdout, full.stdout  # its words, not its JSON
    assert '{"detail"' not in full.stdout + full.stderr, full.stdout + full.stderr
    assert samples_in(db) == 0
    again = run_cli("sync", str(runs), "--local", "--db", str(db))
    assert again.returncode == 0, again.stderr
    assert samples_in(db) == 40
