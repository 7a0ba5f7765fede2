"""A listing older than the sync state read after it: the store's syncers read the state
after they list the runs, so another syncer may have pushed segments that listing does not
show yet (a resumed run's next segment, a live segment grown), uploaded by the mirror in
between. Read from that listing, the state's cursor pointed past the run's end: the run was
reported ``lost`` (exit 1, advising a --replay that pushes every episode again), ``status``
said LOST, and a grown segment was an error (docs/sync.md, "Object stores")."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_runs_spool.content.remask import copy_masking
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import load_settings
from prime_runs_spool.store.mirror import MirrorMemory, mirror_pass
from prime_runs_spool.store.object_info import ObjectInfo
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import remote_destination
from prime_runs_spool.sync.store_sync import store_status, sync_store
from support.runs import RunBuilder
from support.store_runs import live_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, server  # noqa: F401


class _ListedBefore(ObjectStore):
    """The store as a syncer sees it whose listing of the whole prefix was taken earlier
    (``listing``); every other request, a listing of one run's folder included, is today's."""

    def __init__(self, url: str, listing: list[ObjectInfo]) -> None:
        super().__init__(url)
        self._listing = listing

    def list(self, under: str = "") -> list[ObjectInfo]:
        return list(self._listing) if not under else super().list(under)


class _Fleet:
    """One run's eval machine (its spool, its mirror into a ``file://`` bucket) and the
    machines syncing the bucket, each with its own cache (``home``)."""

    def __init__(self, tmp_path: Path, base_url: str, monkeypatch: pytest.MonkeyPatch,
                 state_dir: Path | None = None) -> None:
        (tmp_path / "bucket").mkdir()
        self.url, self.outputs, self.tmp_path = f"file://{tmp_path}/bucket", tmp_path / "outputs", tmp_path
        self.base_url, self.monkeypatch, self.state_dir = base_url, monkeypatch, state_dir
        self.memory = MirrorMemory()

    def mirror(self) -> None:
        [report] = mirror_pass([self.outputs], ObjectStore(self.url), self.memory, masking=copy_masking)
        assert report.error is None, report.error

    def listing(self) -> list[ObjectInfo]:
        return ObjectStore(self.url).list()

    def sync(self, home: str, listed: list[ObjectInfo] | None = None):  # noqa: ANN201
        env = {"PRIME_API_KEY": TOKEN}
        self.monkeypatch.setenv("XDG_CACHE_HOME", str(self.tmp_path / home / "cache"))
        settings = load_settings(base_url=self.base_url, env=env)
        options = SyncOptions(request_lifetime=1.0, backoff=Backoff(base=0.05, cap=0.2, max_attempts=10))
        store = ObjectStore(self.url) if listed is None else _ListedBefore(self.url, listed)
        with PlatformClient(settings, timeout=5) as client:
            [report] = sync_store(self.url, client, remote_destination(settings.base_url, None), options,
                                  store=store, state_dir=self.state_dir)
        return report


@pytest.mark.slow
@pytest.mark.parametrize("states", ["in the bucket", "in one --state-dir"])
def test_a_listing_taken_before_a_resumed_segment_was_synced_loses_no_line(
        tmp_path: Path, server, api, monkeypatch: pytest.MonkeyPatch, states: str) -> None:
    fleet = _Fleet(tmp_path, server.base_url, monkeypatch, tmp_path / "states" if states != "in the bucket" else None)
    builder = RunBuilder(fleet.outputs / "eval-1", f"behind-resumed-{states.split()[-1]}")
    builder.open_segment()
    builder.add(3)
    builder.abandon()  # crashed: its mirror uploads all of it
    fleet.mirror()
    first = fleet.sync("b")
    assert (first.state, first.pushed_now) == ("crashed", 3), first
    listed = fleet.listing()  # machine a lists the bucket: seg-000001 only
    builder.open_segment(counted=True)  # the run resumed: its next segment
    builder.add(2)
    fleet.mirror()
    assert (fleet.sync("b").state, builder.count) == ("live", 5)  # machine b pushes it
    late = fleet.sync("a", listed)  # machine a comes to the run: the state names seg-000002
    assert late.state in ("live", "up_to_date") and late.pushed_now == 0, late.error
    builder.seal()
    fleet.mirror()
    last = fleet.sync("b")
    assert (last.state, last.pushed_now) == ("synced", 0), last.error
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_listing_taken_before_a_live_segment_grew_and_was_synced_is_no_error(
        tmp_path: Path, server, api, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _Fleet(tmp_path, server.base_url, monkeypatch)
    builder, _ = live_run(fleet.outputs / "eval-1", "behind-grown", 3)
    fleet.mirror()
    assert fleet.sync("b").pushed_now == 3
    listed = fleet.listing()
    builder.add(2)
    fleet.mirror()  # the segment re-uploaded, grown
    assert fleet.sync("b").pushed_now == 2
    late = fleet.sync("a", listed)  # the state's cursor past the size listed: read under the old etag, refused
    assert late.state in ("live", "up_to_date") and late.pushed_now == 0, late.error
    builder.seal()
    fleet.mirror()
    assert fleet.sync("b").state == "synced"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_status_over_a_listing_taken_before_a_resumed_segment_was_synced_says_nothing_lost(
        tmp_path: Path, server, api, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _Fleet(tmp_path, server.base_url, monkeypatch)
    builder = RunBuilder(fleet.outputs / "eval-1", "behind-status")
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    fleet.mirror()
    fleet.sync("b")
    listed = fleet.listing()
    builder.open_segment(counted=True)
    builder.add(2)
    fleet.mirror()
    fleet.sync("b")
    [status] = store_status(fleet.url, _ListedBefore(fleet.url, listed))
    [destination] = status.destinations
    assert destination.lost is None and destination.mismatch is None, destination
    assert (status.segments, status.episodes) == (2, 5)
