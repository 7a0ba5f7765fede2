"""Sync to Prime Traces ends a run only on its last segment's seal (docs/spool-format.md,
section 7), as sync to samples does: a run sealed and then resumed is live while its new
writer appends, and a failed segment followed by a killed one is crashed.

In process, against the embedded local platform with its traces service on."""

from __future__ import annotations

from pathlib import Path

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import TRACES, SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import local_destination
from support.runs import RunBuilder


def _sync(root: Path, db: Path):
    with EmbeddedPlatform(db, traces=True) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with PlatformClient(settings, timeout=10) as client:
            (report,) = sync_paths([root], client, local_destination(db, None),
                                   SyncOptions(to=TRACES, request_lifetime=0.5,
                                               backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)))
    return report


def test_a_completed_then_resumed_run_is_live_while_its_new_writer_appends(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-resumed")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    builder.open_segment()
    builder.add(2)  # the new writer stays open
    report = _sync(tmp_path / "runs", tmp_path / "p.db")
    assert (report.state, report.pushed_now) == ("live", 5), report
    builder.seal()
    report = _sync(tmp_path / "runs", tmp_path / "p.db")
    assert report.state == "synced", report


def test_a_resumed_segment_with_only_its_header_keeps_the_run_open(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-header-only")
    builder.open_segment()
    builder.add(2)
    builder.seal()
    writer = SegmentWriter.create(builder.run_dir, builder.run_id)
    try:
        assert _sync(tmp_path / "runs", tmp_path / "p.db").state == "live"
    finally:
        writer.close()


def test_a_failed_segment_then_a_killed_one_is_crashed(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-crashed")
    builder.open_segment()
    builder.add(3)
    builder.seal("failed", error="RuntimeError: the first process failed")
    builder.open_segment()
    builder.add(2)
    builder.abandon()
    report = _sync(tmp_path / "runs", tmp_path / "p.db")
    assert (report.state, report.pushed_now) == ("crashed", 5), report
    assert "first process failed" not in (report.error or "")
