"""A new folder's name is durable before anything in it is acknowledged (docs/spool-format.md).

A folder's name lives in its parent's entries: until the parent is fsync'd, a power cut may
take the name back, and every file below with it, fsync'd or not. These tests record every
fsync of a folder, and what the folder held at that moment, while a real run is opened and
logged to, and a real sync writes its first state (to the local platform over HTTP).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from support.episodes import small_episode
from support.local_client import CountingClient, local_settings
from prime_runs_spool import open_run
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.spool.layout import spool_dir
from prime_runs_spool.sync.state import sync_dir
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Destination
from prime_runs_spool.sync.store_sync import default_local_root


class FolderSyncs:
    """Every fsync of a folder: (device, inode) -> the names it held, each time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: dict[tuple[int, int], list[set[str]]] = {}
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                names = set(os.listdir(f"/proc/self/fd/{fd}"))
                real_fsync(fd)
                self.seen.setdefault((info.st_dev, info.st_ino), []).append(names)
                return
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def durable(self, entry: Path) -> bool:
        """Whether ``entry``'s parent was fsync'd while it held ``entry``'s name."""
        parent = os.stat(entry.parent)
        return any(entry.name in names for names in self.seen.get((parent.st_dev, parent.st_ino), []))


def _not_durable(syncs: FolderSyncs, entries: list[Path]) -> list[str]:
    return [str(entry) for entry in entries if not syncs.durable(entry)]


def test_open_run_makes_every_folder_it_created_durable_before_the_first_episode_returns(tmp_path, monkeypatch):
    syncs = FolderSyncs(monkeypatch)
    run_dir = tmp_path / "outputs" / "evals" / "gsm8k-run"
    with open_run(run_dir, name="gsm8k-run", environments=["gsm8k"]) as run:
        run.log_episodes([small_episode(None, 0)])
        created = [tmp_path / "outputs", tmp_path / "outputs" / "evals", run_dir, spool_dir(run_dir)]
        assert _not_durable(syncs, created) == []
        segment = next(spool_dir(run_dir).glob("seg-*.jsonl"))
        assert syncs.durable(segment)
        run.finish()


def test_the_first_sync_state_is_durable_with_the_folder_it_created(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    with open_run(run_dir, name="r", environments=["gsm8k"]) as run:
        run.log_episodes([small_episode(None, n) for n in range(3)])
        run.finish()
    assert not sync_dir(run_dir).exists()
    syncs = FolderSyncs(monkeypatch)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        client = PlatformClient(local_settings(platform))
        destination = Destination(key="local", base_url=platform.base_url)
        report = RunSync(run_dir, client, destination, SyncOptions()).run()
        client.close()
    assert report.pushed_total == 3 and report.state == "synced", report
    state = next(sync_dir(run_dir).glob("*.json"))
    assert _not_durable(syncs, [sync_dir(run_dir), state]) == []


def test_a_state_dir_for_a_store_is_made_durable_level_by_level(tmp_path, monkeypatch):
    syncs = FolderSyncs(monkeypatch)
    state_dir = tmp_path / "state" / "machine-a"
    root = default_local_root("s3://bucket/outputs", state_dir)
    levels = [tmp_path / "state", state_dir, state_dir / "store", root]
    assert _not_durable(syncs, levels) == []


def test_a_state_write_that_announces_a_request_is_durable_with_its_folder_and_the_last_one_needs_not(
        tmp_path, monkeypatch):
    """A new run's pass writes its state four times: three announce a request (the create,
    the samples, the finalize), each durable before the write returns (before the request
    can be acted on: test_sync_announce_alongside.py), and the pass's end, which announces
    nothing. The first makes the file's twin (sync/state_file.py) and is renamed into place
    beside it, the folder fsync'd after both; the others overwrite the file in place, an announcement its twin
    first, each made durable by one fdatasync, no folder fsync'd; the end the file alone (a
    cut that tears it leaves the twin, one write behind). A power cut that takes the last
    write back leaves the finalize's announcement, whole, which the next sync settles by
    reading the evaluation, sending nothing again. Folders fsync'd: the spool folder once
    (for the new ``sync/``), ``sync/`` once; it was three times, each write renamed."""
    import json

    run_dir = tmp_path / "run"
    with open_run(run_dir, name="r", environments=["gsm8k"]) as run:
        run.log_episodes([small_episode(None, n) for n in range(3)])
        run.finish()
    events: list[tuple[str, object]] = []
    real_fsync, real_fdatasync, real_replace, real_pwrite = os.fsync, os.fdatasync, os.replace, os.pwrite

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        real_fsync(fd)
        events.append(("folder" if stat.S_ISDIR(info.st_mode) else "file", (info.st_dev, info.st_ino)))

    def fdatasync(fd: int) -> None:
        info = os.fstat(fd)
        real_fdatasync(fd)
        events.append(("datasync", (info.st_dev, info.st_ino)))

    written: list[bytes] = []

    def replace(source, target) -> None:  # noqa: ANN001
        real_replace(source, target)
        if Path(target).parent == sync_dir(run_dir):
            written.append(Path(target).read_bytes())
            events.append(("renamed", json.loads(written[-1])["in_flight"]))

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        done = real_pwrite(fd, data, offset)
        if target.parent == sync_dir(run_dir).resolve() and not data.isspace():
            twin = target.name.endswith(".twin")
            if not twin:
                written.append(data)
            events.append(("twin" if twin else "overwritten", json.loads(data)["in_flight"]))
        return done

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        destination = Destination(key="local", base_url=platform.base_url)
        with PlatformClient(local_settings(platform)) as client:
            report = RunSync(run_dir, client, destination, SyncOptions()).run()
        monkeypatch.undo()
        # The power cut took the last write back: the finalize's announcement is the file.
        state_file = next(sync_dir(run_dir).glob("*.json"))
        inode = lambda path: (os.stat(path).st_dev, os.stat(path).st_ino)  # noqa: E731
        file, twin = inode(state_file), inode(state_file.parent / f".{state_file.name}.twin")
        state_file.write_bytes(written[-2])
        with CountingClient(local_settings(platform)) as client:
            again = RunSync(run_dir, client, destination, SyncOptions()).run()
        assert (again.state, again.pushed_now, again.pushed_total) == ("synced", 0, 3), again
        # Reads (its status: completed; the state checked against the platform) and the
        # metrics PUT again (idempotent), as after a kill between the two writes: no POST.
        assert not [name for name in client.requests if name.startswith("POST")], client.requests
        (evaluation,) = httpx.get(f"{platform.base_url}/api/v1/evaluations/").json()["evaluations"]
        assert evaluation["status"] == "COMPLETED" and evaluation["total_samples"] == 3, evaluation
    assert report.state == "synced", report
    kind = lambda what: (what or {}).get("kind")  # noqa: E731
    writes = [(name, kind(what)) for name, what in events if name in ("renamed", "overwritten", "twin")]
    assert writes == [("renamed", "create"), ("twin", "samples"), ("overwritten", "samples"),
                      ("twin", "finalize"), ("overwritten", "finalize"), ("overwritten", None)], events
    created = [name for name, _ in events].index("renamed")
    first_overwrite = [name for name, _ in events].index("twin")
    assert ("file", twin) in events[:created], events  # made, and its bytes durable, before the rename
    assert ("folder", inode(sync_dir(run_dir))) in events[created:first_overwrite], events
    for at, (name, _) in enumerate(events):  # each overwrite durable before the next step
        if name in ("twin", "overwritten"):
            assert events[at + 1] == ("datasync", twin if name == "twin" else file), events[at:at + 2]
    assert events.count(("folder", inode(sync_dir(run_dir)))) == 1, events
    assert events.count(("folder", inode(spool_dir(run_dir)))) == 1, events
