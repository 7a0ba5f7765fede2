"""A run pushed to Prime Traces, its sync state lost, synced again while the service's
episode listing answers 404 (a deployment without that route), or 403 to a key that may
write but not read: the pass cannot tell which episodes the run holds there, so it stops
and says so. It resends nothing to Prime Traces and pushes nothing to samples.

In process, against the embedded local platform with its traces service on, over HTTP: the
listing's 404 is the platform's own answer to a path it does not serve."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.runs import build_run
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.platform_api.traces_probe import PROBE_PATH
from prime_runs_spool.sync.many import sync_run
from prime_runs_spool.sync.options import TRACES, RunReport, SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import local_destination


class ListingGoneClient(PlatformClient):
    """A client of a platform whose Prime Traces episode listing is gone: each GET of it goes
    to a path the platform does not serve, which answers 404; uploads and the evaluations
    API go where they always did."""

    def _get(self, url: str, **options: Any) -> httpx.Response:
        if url.endswith(PROBE_PATH):
            url += "-gone"
        return super()._get(url, **options)


class WriteOnlyKeyClient(PlatformClient):
    """A client whose key may upload to Prime Traces but not read it: the episode listing
    answers 403 ``forbidden`` (the service's answer about the key, not ``service_not_enabled``,
    its answer about the account); everything else goes to the platform as it is."""

    def _get(self, url: str, **options: Any) -> httpx.Response:
        if url.endswith(PROBE_PATH) and "run_id" in (options.get("params") or {}):
            return httpx.Response(403, json={"error": {"code": "forbidden", "message": "this key may not read"}},
                                  request=httpx.Request("GET", url))
        return super()._get(url, **options)


def _sync(platform: EmbeddedPlatform, db: Path, run_dir: Path, to: str,
          client_type: type[PlatformClient] = PlatformClient) -> RunReport:
    settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                        frontend_url=platform.base_url)
    with client_type(settings, timeout=10) as client:
        return sync_run(run_dir, client, local_destination(db, None),
                        SyncOptions(to=to, traces_batch_bytes=8_000, request_lifetime=0.5,
                                    backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)))


def _replays(db: Path) -> int:
    """How many uploads the traces service answered by replaying a committed receipt."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (replays,) = conn.execute("SELECT COALESCE(SUM(replays), 0) FROM trace_uploads").fetchone()
    return replays


def _resynced_with_its_state_lost(tmp_path: Path, name: str, to: str,
                                  client_type: type[PlatformClient]) -> tuple[RunReport, RunReport]:
    """20 episodes pushed to Prime Traces, the run's sync state deleted, the run synced again
    with ``to`` through ``client_type``: nothing sent again, to either sink; both reports."""
    builder = build_run(tmp_path / "runs" / "run", name, 20)
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db, traces=True) as platform:
        first = _sync(platform, db, builder.run_dir, TRACES)
        assert (first.state, first.store, first.pushed_now) == ("synced", TRACES, 20), first
        for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
            path.unlink()
        again = _sync(platform, db, builder.run_dir, to, client_type)
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{first.evaluation_id}").json()
    assert again.state == "error", again
    assert (again.pushed_now, again.bytes_sent) == (0, 0), again
    assert _replays(db) == 0, "no batch was sent to Prime Traces again"
    assert evaluation["total_samples"] == 0, "nothing went to samples"
    return first, again


@pytest.mark.parametrize("to", [TRACES, "auto"])
def test_a_lost_state_reconcile_whose_listing_answers_404_stops_and_resends_nothing(tmp_path: Path, to: str) -> None:
    _, again = _resynced_with_its_state_lost(tmp_path, f"listing-gone-{to}", to, ListingGoneClient)
    assert again.error == ("the episode listing of Prime Traces answered 404 (no such route), so which of this "
                           "run's episodes it holds cannot be told and none was sent again; check the Prime Traces "
                           "URL (PRIME_TRACES_URL, or traces_url in the config file)"), again.error


def test_a_lost_state_reconcile_whose_key_may_not_read_the_listing_stops_and_resends_nothing(tmp_path: Path) -> None:
    """The listing's 403 ``forbidden`` was read as "nothing there": every batch went to the
    service again, counted pushed now (20), and a run adopted from vf-eval's own push would
    have had its episodes stored a second time. Only ``service_not_enabled`` means nothing
    can be there."""
    _, again = _resynced_with_its_state_lost(tmp_path, "listing-forbidden", TRACES, WriteOnlyKeyClient)
    assert "403" in again.error and "may not read" in again.error and "\n" not in again.error, again.error


def test_a_listing_gone_is_named_as_a_route_for_every_caller(tmp_path: Path) -> None:
    """The listing's 404 reaches callers other than the reconcile (the adoption of a run
    vf-eval pushed) as the platform client words it: it said "the platform does not know this
    id; if the evaluation was deleted, replay the run with --replay", the advice for an
    evaluation, which would send every episode again to a new one."""
    from prime_runs_spool.errors import PlatformError

    with EmbeddedPlatform(tmp_path / "p.db", traces=True) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with ListingGoneClient(settings, timeout=10) as client:
            with pytest.raises(PlatformError) as raised:
                client.trace_run_episode_ids("some-run")
    assert raised.value.status == 404
    assert "--replay" not in str(raised.value) and "PRIME_TRACES_URL" in str(raised.value), str(raised.value)
