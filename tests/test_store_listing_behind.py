"""A listing older than the sync state read after it: the store's syncers read the state
after they list the runs, so another syncer may have pushed segments that listing does not
show yet (a resumed run's next segment, a live segment grown), uploaded by the mirror in
between. Read from that listing, the state's cursor pointed past the run's end: the run was
reported ``lost`` (exit 1, advising a --replay that pushes every episode again), ``status``
said LOST, and a grown segment was an error (docs/sync.md, "Object stores")."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_runs_spool.sync.store_sync import store_status
from support.store_runs import Fleet, ListedBefore, live_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, server  # noqa: F401


@pytest.mark.slow
@pytest.mark.parametrize("states", ["in the bucket", "in one --state-dir"])
def test_a_listing_taken_before_a_resumed_segment_was_synced_loses_no_line(
        tmp_path: Path, server, api, monkeypatch: pytest.MonkeyPatch, states: str) -> None:
    fleet = Fleet(tmp_path, server.base_url, monkeypatch, tmp_path / "states" if states != "in the bucket" else None)
    builder, first = fleet.crashed_run(f"behind-resumed-{states.split()[-1]}", "b")
    assert (first.state, first.pushed_now) == ("crashed", 3), first
    listed = fleet.listing()  # machine a lists the bucket: seg-000001 only
    fleet.resume(builder, 2)
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
    fleet = Fleet(tmp_path, server.base_url, monkeypatch)
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
    fleet = Fleet(tmp_path, server.base_url, monkeypatch)
    builder, _ = fleet.crashed_run("behind-status", "b")
    listed = fleet.listing()
    fleet.resume(builder, 2)
    fleet.sync("b")
    [status] = store_status(fleet.url, ListedBefore(fleet.url, listed))
    [destination] = status.destinations
    assert destination.lost is None and destination.mismatch is None, destination
    assert (status.segments, status.episodes) == (2, 5)
