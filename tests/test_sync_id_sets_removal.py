"""Files of ids (sync/id_sets.py) that no sync state names are removed, by the holder of the
run's lock alone, before its pass writes: lost states, an older release's reconcile, adopted
and copied leftovers and crashes leave a bounded number of them, and no file a state names,
or is about to name, is ever removed.

Against the embedded local platform with its traces service on, in process; a crash in a
child process holding the run's lock, as a sync holds it."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import TRACES, RunReport, SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import local_destination, read_state, save_state, sync_state_path
from prime_runs_spool.sync.state_adoption import adopt_states
from support.children import reaped
from support.env import child_env
from support.local_client import local_settings
from support.runs import RunBuilder

from test_sync_state_id_sets import DESTINATION, _ids, _state


def _sync(root: Path, db: Path, **options: object) -> RunReport:
    """A Prime Traces sync of the runs under ``root`` into the local platform at ``db``."""
    with EmbeddedPlatform(db, traces=True) as platform:
        with PlatformClient(local_settings(platform), timeout=10) as client:
            (report,) = sync_paths([root], client, local_destination(db, None), SyncOptions(
                to=TRACES, request_lifetime=0.5, backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)), **options)
    return report


def _stored_once(db: Path, builder: RunBuilder) -> None:
    """Every episode of the run stored by the traces service, each once (no batch sent twice)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        stored = dict(conn.execute("SELECT episode_id, COUNT(*) FROM trace_episodes GROUP BY episode_id"))
    assert sorted(stored) == sorted(builder.ids) and set(stored.values()) == {1}, stored


def _files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "spool" / "sync").glob("ids-*.ids"))


def _named(run_dir: Path) -> list[str]:
    """The files of ids the run's states name."""
    names = []
    for path in (run_dir / "spool" / "sync").glob("*.json"):
        state, _ = read_state(path)
        names += [f"ids-{found.digest}.ids" for found in (state.held_there, state.on_platform) if found is not None]
    return sorted(names)


def _lose_state(run_dir: Path) -> None:
    for path in (run_dir / "spool" / "sync").glob("*.json"):
        path.unlink()


def _segment(builder: RunBuilder, episodes: int) -> None:
    builder.open_segment()
    builder.add(episodes)
    builder.seal()


@pytest.mark.slow
def test_the_files_of_lost_states_do_not_pile_up(tmp_path: Path) -> None:
    """A state lost (deleted, moved aside as a damaged one's line says) and found again on the
    platform writes a file of the ids its Prime Traces run holds then, more each time: each
    earlier file was left beside the state for good (4 after 4 losses)."""
    builder, db = RunBuilder(tmp_path / "runs" / "run", "lost-states"), tmp_path / "p.db"
    _segment(builder, 2)
    assert _sync(tmp_path / "runs", db).pushed_now == 2
    for _ in range(4):
        _lose_state(builder.run_dir)
        _segment(builder, 1)
        report = _sync(tmp_path / "runs", db)
        assert (report.state, report.pushed_now, report.error) == ("synced", 1, None), report
        assert len(_files(builder.run_dir)) <= 2, _files(builder.run_dir)  # the one named, and the last loss's
    _segment(builder, 1)
    assert _sync(tmp_path / "runs", db).pushed_now == 1
    assert _files(builder.run_dir) == _named(builder.run_dir) and len(_files(builder.run_dir)) == 1
    _stored_once(db, builder)


def _as_an_older_release_writes_it(path: Path, held: list[str]) -> None:
    """The state at ``path`` rewritten as a release before files of ids (state version 1)
    writes it back over a version 2 state, which it reads as damaged: its reconcile found the
    run's evaluation again, every episode there held (inline), nothing counted as pushed by
    it, the cursor where the last state left it; by a rename, the twin left as it was."""
    document = orjson.loads(path.read_bytes())
    del document["checksum"]
    document.update(version=1, held_there=sorted(held), on_platform=[], uploads=[], episodes_pushed=0,
                    traces_pushed=0, segments={str(document["cursor"]["segment_index"]): {
                        "offset": document["cursor"]["offset"], "seq": document["cursor"]["next_seq"]}})
    content = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    path.write_bytes(content[:-1] + b',"checksum":"%s"}' % hashlib.sha256(content).hexdigest()[:32].encode())


@pytest.mark.slow
def test_a_fleet_bouncing_the_state_with_an_older_release_sends_nothing_twice_and_piles_up_nothing(
        tmp_path: Path) -> None:
    """A release before files of ids reads a version 2 state as damaged, reconciles, and
    writes version 1 back; this release reads that, carries on, and writes version 2 again.
    Each round the ids held grow (the episodes pushed since), so each new version 2 state
    named a new file and the last one was left: 5 files after 5 rounds. Nothing is sent twice
    nor lost, through every round."""
    builder, db = RunBuilder(tmp_path / "runs" / "run", "bounce"), tmp_path / "p.db"
    _segment(builder, 2)
    _sync(tmp_path / "runs", db)
    _lose_state(builder.run_dir)
    _segment(builder, 1)
    assert _sync(tmp_path / "runs", db).pushed_now == 1  # a state that names a file of ids
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    for _ in range(5):
        _segment(builder, 1)
        report = _sync(tmp_path / "runs", db)
        assert (report.state, report.pushed_now, report.error) == ("synced", 1, None), report
        _as_an_older_release_writes_it(path, builder.ids)
        again = _sync(tmp_path / "runs", db)
        assert (again.pushed_now, again.error) == (0, None), again
        assert len(_files(builder.run_dir)) <= 1, _files(builder.run_dir)
    _stored_once(db, builder)


def test_an_adoption_copies_only_the_files_its_states_name(tmp_path: Path) -> None:
    """A read-only spool's states are copied to the state directory with the files of ids
    they name: not with every file beside them (an older sync's leftovers), which would
    lie there named by nothing."""
    run, home = tmp_path / "run", tmp_path / "home"
    path = sync_state_path(run, DESTINATION.key)
    for n in range(3):  # three states found again in turn: three files, one named
        save_state(path, _state(_ids(10 + n)))
    assert len(_files(run)) == 3
    adopt_states(run, home)
    assert _files(home) == _named(run) and len(_files(home)) == 1


def _orphans(folder: Path, n: int) -> list[str]:
    """``n`` files of ids no state names, as a lost state or an older sync leaves them, and
    the temporary file a write of one killed part way leaves."""
    names = []
    for k in range(n):
        data = orjson.dumps(_ids(3, salt=100 + k))
        name = f"ids-{hashlib.sha256(data).hexdigest()[:32]}.ids"
        (folder / name).write_bytes(data)
        names.append(name)
    (folder / f".{names[0]}.{os.getpid()}.1.tmp").write_bytes(b"[")
    return names


@pytest.mark.slow
def test_a_copy_carrying_files_no_state_names_is_cleaned_by_its_next_pass(tmp_path: Path) -> None:
    """``cp -r`` of a run folder, or a CI artifact of it, carries whatever lay beside the
    state, orphans included: the copy's next pass removes those, and keeps what its state
    names (it pushes the one new episode, each stored once)."""
    builder, db = RunBuilder(tmp_path / "one" / "run", "copied"), tmp_path / "p.db"
    _segment(builder, 2)
    _sync(tmp_path / "one", db)
    _lose_state(builder.run_dir)
    _segment(builder, 1)
    _sync(tmp_path / "one", db)
    _orphans(builder.run_dir / "spool" / "sync", 3)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    shutil.rmtree(tmp_path / "one")
    copy = tmp_path / "two" / "run"
    builder.run_dir = copy
    _segment(builder, 1)
    report = _sync(tmp_path / "two", db)
    assert (report.pushed_now, report.error) == (1, None), report
    assert _files(copy) == _named(copy) and len(_files(copy)) == 1
    assert not list((copy / "spool" / "sync").glob(".ids-*"))
    _stored_once(db, builder)


def test_a_file_any_other_file_may_name_is_kept(tmp_path: Path) -> None:
    """What is named is read as text, in every other file of the folder: a state moved aside
    (under another name), a twin, one a newer release wrote or a damaged one keep their
    files; a file that cannot be read (a FIFO) keeps them all."""
    from prime_runs_spool.sync.id_sets import sweep

    folder = tmp_path / "spool" / "sync"
    save_state(folder / "dest.json", _state(_ids(5)))
    (named,) = _files(tmp_path)
    aside, newer, orphan = _orphans(folder, 3)
    (folder / "dest.json.aside").write_bytes(orjson.dumps({"held_there": {"digest": aside[4:-4]}}))
    (folder / "other.json").write_bytes(b'{"version": 9, "sets": ["%s"' % newer[4:-4].encode())  # cut short
    os.mkfifo(folder / "a-fifo")
    assert sweep(folder) == [] and len(_files(tmp_path)) == 4
    (folder / "a-fifo").unlink()
    assert sweep(folder) == [f".{aside}.{os.getpid()}.1.tmp", orphan]
    assert _files(tmp_path) == sorted([named, aside, newer])


_CHILD = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from prime_runs_spool.sync import state_file
from prime_runs_spool.sync.id_sets import IdSet
from prime_runs_spool.sync.many import sync_lock
from prime_runs_spool.sync.state import read_state, save_state

lock = sync_lock(Path({home!r}))
assert lock.acquire()
path = Path({path!r})
state, _ = read_state(path)
state.held_there = IdSet.of([*state.held_there.ids(), "one-more"])
write = state_file.write

def stopped(*args, **kwargs):  # the file of ids written, durable; its state not yet
    print("between", flush=True)
    os.kill(os.getpid(), getattr(signal, {signal!r}))
    return write(*args, **kwargs)

state_file.write = stopped
save_state(path, state)
print("written", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGSTOP", "SIGKILL"])
def test_a_crash_between_a_file_of_ids_and_its_state_never_costs_a_named_file(tmp_path: Path,
                                                                            signal_name: str) -> None:
    """A sync holding the run's lock stopped (SIGSTOP) or killed (SIGKILL) at the worst point:
    its file of ids written, the state that will name it not yet. Stopped, another sync
    skips the run (the lock) and removes nothing: the state written on SIGCONT names a file
    that is there. Killed, the next sync removes the file no state will name, and keeps the
    one its state names; nothing sent twice."""
    builder, db = RunBuilder(tmp_path / "runs" / "run", f"crash-{signal_name}"), tmp_path / "p.db"
    _segment(builder, 2)
    _sync(tmp_path / "runs", db)
    _lose_state(builder.run_dir)
    _segment(builder, 1)
    _sync(tmp_path / "runs", db)
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    before = _files(builder.run_dir)
    script = _CHILD.format(tests=str(Path(__file__).parent), home=str(builder.run_dir), path=str(path),
                           signal=signal_name)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=child_env())
    with reaped(child):
        assert child.stdout is not None and child.stdout.readline().strip() == "between"
        if signal_name == "SIGSTOP":
            assert os.waitpid(child.pid, os.WUNTRACED)[1] and len(_files(builder.run_dir)) == 2
            _segment(builder, 1)
            held = _sync(tmp_path / "runs", db)
            assert held.state == "skipped", held
            assert len(_files(builder.run_dir)) == 2
            os.kill(child.pid, signal.SIGCONT)
            assert child.communicate(timeout=30)[0].strip() == "written"
            assert _named(builder.run_dir) != before and set(_named(builder.run_dir)) <= set(_files(builder.run_dir))
            assert read_state(path)[0].held_there.ids() >= {"one-more"}
        else:
            child.wait(timeout=30)
            assert child.returncode == -signal.SIGKILL and len(_files(builder.run_dir)) == 2
            assert _named(builder.run_dir) == before
    _segment(builder, 1)
    report = _sync(tmp_path / "runs", db)
    assert (report.state, report.error) == ("synced", None), report
    assert _files(builder.run_dir) == _named(builder.run_dir) and len(_files(builder.run_dir)) == 1
    _stored_once(db, builder)
