"""A run synced to Prime Traces while live, its sync state then lost, synced again: the
service stores each episode once.

The first sync cut the live run's tail into a batch; the writer then appended more, so a
re-cut from the start of the spool closes its first batch elsewhere (another key). Sent as
cut, the episodes of the earlier batch would be stored a second time: the service keeps the
current copy and its listing shows each once, so only its stored copies tell. After a lost
state the pass reads which episodes the run holds there and sends only the others.

In process, against the embedded local platform with its traces service on, over HTTP; the
copies are counted in the platform's own database."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import TRACES, RunReport, SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import SyncState, local_destination, read_state
from prime_runs_spool.sync.status import run_status
from support.env import CLI, child_env
from support.runs import RunBuilder


def _sync(tmp_path: Path, db: Path) -> RunReport:
    with EmbeddedPlatform(db, traces=True) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with PlatformClient(settings, timeout=10) as client:
            (report,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None),
                                   SyncOptions(to=TRACES, traces_batch_bytes=8_000, request_lifetime=0.5,
                                               backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)))
    return report


def _state(run_dir: Path) -> SyncState:
    (path,) = (run_dir / "spool" / "sync").glob("*.json")
    return read_state(path)[0]  # its files of ids beside it (sync/id_sets.py)


def _lose_state(run_dir: Path) -> None:
    for path in (run_dir / "spool" / "sync").glob("*.json"):
        path.unlink()


def _stored(db: Path, run_id: str) -> dict[str, int]:
    """Every copy of an episode the service stored for the run, by episode id (current or not)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT episode_id, COUNT(*) FROM trace_episodes WHERE run_id = ? GROUP BY episode_id",
                            (run_id,)).fetchall()
    return dict(rows)


@pytest.mark.slow
def test_a_live_runs_episodes_are_stored_once_after_its_state_is_lost(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "live-lost-state")
    builder.open_segment()
    builder.add(2)  # ~4.2 kB of lines: the live tail is one batch well under 8 kB
    db = tmp_path / "p.db"
    live = _sync(tmp_path, db)
    assert (live.state, live.pushed_now) == ("live", 2), live
    first = _state(builder.run_dir)
    assert len(first.uploads) == 1
    builder.add(5)  # the writer goes on: a re-cut's first batch now takes a third episode
    builder.seal()
    _lose_state(builder.run_dir)
    again = _sync(tmp_path, db)
    assert (again.state, again.pushed_now, again.pushed_total) == ("synced", 5, 7), again
    state = _state(builder.run_dir)
    assert state.evaluation_id == first.evaluation_id
    stored = _stored(db, str(first.evaluation_id))
    assert sorted(stored) == sorted(builder.ids)
    assert {i: n for i, n in stored.items() if n > 1} == {}, "an episode was stored a second time"
    # status says why 2 of the 7 were not sent by this state: they were there already
    status = subprocess.run(CLI + ["status", str(builder.run_dir)], capture_output=True, text=True, timeout=60,
                            env=child_env(HOME=str(tmp_path)))
    assert ("to traces: 5 episodes (5 traces) in 2 uploads, and 2 episodes already there (an earlier sync's, "
            "its state lost: not sent again)") in status.stdout, status.stdout
    (dest,) = run_status(builder.run_dir).destinations
    assert (dest.episodes_pushed, dest.held_there) == (5, 2)
    # lost once more: the listing now holds every episode, and nothing is sent
    _lose_state(builder.run_dir)
    third = _sync(tmp_path, db)
    assert (third.state, third.pushed_now, third.bytes_sent) == ("synced", 0, 0), third
    assert max(_stored(db, str(first.evaluation_id)).values()) == 1


@pytest.mark.slow
def test_a_release_batch_re_cut_after_a_resume_stores_none_of_its_episodes_twice(tmp_path: Path) -> None:
    """A completed run's errored episodes go in a release batch; a resume then supersedes one
    of them and the state is lost. Cut again from nothing, the release batch would close
    without the superseded one (another key), so the service would store the other two a
    second time: the listing's ids are held instead, and only the retried episode is sent."""
    builder = RunBuilder(tmp_path / "runs" / "run", "release-recut")
    builder.open_segment()
    builder.add(2)
    builder.add(3, ok=False)  # ~6.3 kB of lines: one release batch under 8 kB
    builder.add(1)
    builder.seal()  # completed: the errored three are released
    db = tmp_path / "p.db"
    first = _sync(tmp_path, db)
    assert (first.state, first.pushed_total) == ("synced", 6), first
    state = _state(builder.run_dir)
    errored = builder.ids[2:5]
    assert state.released == errored
    builder.open_segment(supersedes=[errored[0]])  # verifiers --resume retried one of them
    builder.add(1)
    builder.seal()
    _lose_state(builder.run_dir)
    again = _sync(tmp_path, db)
    assert again.state == "synced", again
    stored = _stored(db, str(state.evaluation_id))
    assert sorted(stored) == sorted(builder.ids)  # the superseded one too: it cannot be taken back
    assert {i: n for i, n in stored.items() if n > 1} == {}, "an episode was stored a second time"
    assert again.pushed_now == 1, again
    assert sorted(_state(builder.run_dir).held_there.ids()) == sorted(builder.ids[:6])
