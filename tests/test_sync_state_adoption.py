"""A read-only spool's first sync from a state directory carries on from the sync states
beside it (sync/state_adoption.py); one that cannot be read is still waited out, never taken
for a run nothing was sent for.

Against the embedded local platform, in process: a first sync's samples request is held by
its transport (the platform never answers it, as a request still on its way), and landed
later by hand, when a late request would land."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import SAMPLES, RunReport, SyncOptions
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import local_destination
from support.local_client import local_settings
from support.runs import RunBuilder


class _Holding(httpx.HTTPTransport):
    """Sends every request but the samples ones, which it keeps (the platform has not seen
    them yet) and answers with a timeout: requests in doubt, to be landed later."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[str, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/samples"):
            self.held.append((request.url.path, request.read()))
            raise httpx.ReadTimeout("no answer yet", request=request)
        return super().handle_request(request)


def _sync(root: Path, db: Path, transport: httpx.BaseTransport | None = None, *, lifetime: float = 600,
          on_platform: list[str] | None = None, **options: object) -> RunReport:
    with EmbeddedPlatform(db) as platform:
        if on_platform is not None:
            on_platform.append(platform.base_url)
        with PlatformClient(local_settings(platform), timeout=10, transport=transport) as client:
            (report,) = sync_paths([root], client, local_destination(db, None), SyncOptions(
                to=SAMPLES, request_lifetime=lifetime,
                backoff=Backoff(base=0.01, cap=0.05, max_attempts=1)), **options)
    return report


def _rows(db: Path) -> list[int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return [count for (count,) in conn.execute("SELECT COUNT(*) FROM samples GROUP BY evaluation_id")]


@pytest.mark.slow
def test_a_state_that_cannot_be_read_on_a_read_only_spool_is_waited_out_not_taken_for_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync stopped with its samples request on its way (announced in its state), then the
    spool archived read-only, its state not readable (here a FIFO where it was; another
    user's file, an I/O error), and synced by someone else (another user, or another machine
    the folder is shared with, whose copy lock knows nothing of that request). The sync from
    a state directory did not copy that state, so
    its pass started as if the run had never been synced: it found the evaluation, counted
    the rows there, and sent the request's rows again; the request landed after, each row
    twice. Now the state left behind is waited out as a damaged one is (one request lifetime),
    then the run is reconciled: the late request's rows are counted, never sent again."""
    builder = RunBuilder(tmp_path / "runs" / "run", "adopt-unreadable-state")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    db = tmp_path / "p.db"
    holding = _Holding()
    first = _sync(tmp_path / "runs", db, holding, lifetime=2.0)  # sent, never answered: in doubt
    assert first.state == "error" and len(holding.held) == 1, first
    (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    state.unlink()
    os.mkfifo(state)  # a state that cannot be read
    (path, body), landed = holding.held[0], []
    platform_urls: list[str] = []

    def land(base_url: str) -> None:  # the held request reaches the platform, late
        if not landed:
            landed.append(httpx.post(base_url + path, content=body, headers={
                "Content-Type": "application/json", "Authorization": "Bearer local"}).status_code)

    fences: list[tuple[str, str]] = []

    def fence(self: Protocol, sent_at: float, why: str = "", skip: str = "") -> None:
        fences.append((why, skip))
        land(platform_urls[-1])  # what may land while the sync waits lands then

    monkeypatch.setattr(Protocol, "fence", fence)
    # Synced by another user, or on another machine the folder is shared with: their cache,
    # not this one, holds the copy lock whose note says a request was left in doubt.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-cache"))
    spool = builder.run_dir / "spool"
    for found in [spool, *spool.rglob("*")]:  # archived read-only
        found.chmod(0o555 if found.is_dir() else 0o444)
    try:
        report = _sync(tmp_path / "runs", db, on_platform=platform_urls, state_dir=tmp_path / "state")
        with EmbeddedPlatform(db) as platform:
            land(platform.base_url)  # no wait: it lands after the sync
    finally:
        for found in [spool, *spool.rglob("*")]:
            found.chmod(0o755 if found.is_dir() else 0o644)
    assert landed and 200 <= landed[0] < 300, landed
    assert _rows(db) == [3]  # each row once
    (skip,) = [skip for why, skip in fences if "cannot be trusted" in why]
    assert f"make {state} readable and remove {tmp_path / 'state'}" in skip, skip  # else it is put back
    (line,) = [w for w in report.warnings if str(state) in w]
    assert "cannot be read" in line and "\n" not in line, line
    assert (report.state, report.pushed_now, report.pushed_total) == ("synced", 0, 3), report
