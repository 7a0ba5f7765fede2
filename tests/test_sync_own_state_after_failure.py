"""A process trusts a state file it wrote itself (a follower's next pass, sync/state.py
``written_here``) without checking it against the platform: so no pass may leave, as its
own write, a state that says less than the platform holds. A pass that found the run's
evaluation again (its state lost) and failed while it read what the platform holds must not
write the evaluation's id with nothing counted as pushed: the next pass of the same process
pushed every row again.

In process against the embedded local platform, as a follower runs its passes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from prime_runs_spool.errors import FailureKind, PlatformError
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import local_destination
from support.local_client import local_settings
from support.runs import RunBuilder


class _Refusing(PlatformClient):
    """A client whose samples listing is refused while ``refuse`` is set (a key revoked
    mid-sync, or the platform failing past the retries)."""

    refuse = False

    def list_samples(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        if self.refuse:
            raise PlatformError(FailureKind.FATAL, "401 Unauthorized: the key was refused", status=401)
        return super().list_samples(*args, **kwargs)


def _rows(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]


def test_a_pass_that_failed_reading_what_a_lost_state_pushed_leaves_its_next_pass_nothing_to_push_twice(
        tmp_path: Path) -> None:
    builder, db = RunBuilder(tmp_path / "runs" / "run", "own-state-after-failure"), tmp_path / "p.db"
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    options = SyncOptions(request_lifetime=0.2, backoff=Backoff(base=0.01, cap=0.05, max_attempts=2))
    with EmbeddedPlatform(db) as platform, _Refusing(local_settings(platform), timeout=10) as client:
        def sync() -> RunReport:
            (report,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None), options)
            return report

        assert sync().pushed_now == 3
        for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
            path.unlink()  # lost
        client.refuse = True
        failed = sync()
        assert failed.state == "error" and "reading samples" in (failed.error or ""), failed
        client.refuse = False
        again = sync()  # the same process's next pass, as a follower's
        assert again.error is None, again
        assert again.pushed_now == 0, again
    assert _rows(db) == 3
