"""An episode no request can carry, met by sync in a spool written before the runner refused
such episodes at append: passed over and recorded, never a run blocked for good."""

from __future__ import annotations

from pathlib import Path

from support.fake_platform import FakePlatform
from support.runs import RunBuilder
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import Destination
from prime_runs_spool.sync.status import run_status

DEST = Destination(key="dest1", base_url="http://fake")
#: A request ceiling small enough that a 40 KB episode cannot fit even as per-trace rows.
LIMIT = 20_000


def sync(run_dir: Path, platform: FakePlatform):
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    client = PlatformClient(settings, transport=platform.transport())
    options = SyncOptions(request_lifetime=30.0, backoff=Backoff(base=0.01, cap=0.05, max_attempts=3),
                          max_request_bytes=LIMIT)
    return RunSync(run_dir, client, DEST, options, clock=lambda: 1_000_000.0, sleep=lambda s: None).run()


def test_an_over_limit_row_is_skipped_and_recorded_not_blocking_the_run(tmp_path: Path) -> None:
    platform = FakePlatform()
    builder = RunBuilder(tmp_path / "run", "too-large")
    builder.open_segment()
    builder.add(2)
    builder.add(1, size=40_000)  # its row needs about twice this: no request can carry it
    huge = builder.ids[-1]
    builder.add(2)
    builder.seal()

    report = sync(builder.run_dir, platform)
    assert report.state == "synced", report.error
    assert any(huge in warning and str(LIMIT) in warning for warning in report.warnings)
    (evaluation_id, evaluation), = platform.evaluations.items()
    pushed = [row["sample_id"] for row in platform.samples[evaluation_id]]
    assert pushed == [i for i in builder.ids if i != huge]  # everything after it went too
    assert evaluation["finalize_count"] == 1
    (skipped,) = evaluation["metadata"]["skipped_too_large"]
    assert skipped["episode_id"] == huge and str(LIMIT) in skipped["reason"]

    (destination,) = run_status(builder.run_dir).destinations
    assert destination.skipped_too_large == 1 and destination.pending == 0 and destination.finalized

    again = sync(builder.run_dir, platform)  # not failing forever: nothing left to do
    assert again.state in ("up_to_date", "synced"), again.error
    assert len(platform.samples[evaluation_id]) == len(builder.ids) - 1
