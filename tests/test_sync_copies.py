"""Copies of one spool folder (``cp -r``, one CI artifact unpacked twice) synced on one machine:
the copy lock and the holder note (sync/copies.py, docs/sync.md "Concurrency").

tests/test_hostile_round3.py races two syncs of two copies through a gate; these pin the
rest against the in-memory platform: a state this process wrote is not trusted once another
copy pushed, a held lock is waited for only as long as allowed and then reported
``skipped`` in one line, ``--wait`` and the follower, and the kernel dropping the lock of a
process killed while holding it.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.env import CLI, child_env
from support.fake_platform import FakePlatform
from support.runs import RunBuilder, build_run
from test_sync_engine import FakeTime
from prime_runs_spool.errors import CopyBusyError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.copies import COPY_LOCKS_DIRNAME
from prime_runs_spool.sync.copies import CopyLock
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.follow import FollowOptions, Follower
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import sync_state_path
from prime_runs_spool.sync.state import Destination, InFlight, local_destination
from prime_runs_spool.sync.user_cache import cache_root

DEST = Destination(key="dest-copies", base_url="http://fake")


def _client(platform: FakePlatform) -> PlatformClient:
    return PlatformClient(Settings("http://fake", Secret("key"), None, "http://app"), transport=platform.transport())


def _options(**extra) -> SyncOptions:
    return SyncOptions(**{"request_lifetime": 0.05, "backoff": Backoff(base=0.01, cap=0.05, max_attempts=3), **extra})


def _pass(run_dir: Path, platform: FakePlatform, **extra):
    return RunSync(run_dir, _client(platform), DEST, _options(**extra)).run()


def _rows(platform: FakePlatform) -> list[str]:
    assert len(platform.evaluations) == 1, platform.evaluations
    (rows,) = platform.samples.values()
    return [row["sample_id"] for row in rows]


def _holding(run_dir: Path, run_id: str, destination: Destination = DEST) -> CopyLock:
    """The copy lock of ``run_id``, taken as a sync of the copy at ``run_dir`` takes it."""
    return CopyLock(destination.key, run_id, None, sync_state_path(run_dir, destination.key), str(run_dir)).hold(0)


def test_a_state_this_process_wrote_is_checked_again_once_a_copy_pushed(tmp_path: Path) -> None:
    """A follower trusts the state it wrote itself (SyncState.written_here): with a copy
    pushed in between, that state is behind the platform, and trusting it appended the
    copy's rows a second time (then refused to finalize over the mismatch)."""
    platform = FakePlatform()
    builder = RunBuilder(tmp_path / "one" / "r", "copied")
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    assert _pass(builder.run_dir, platform).state == "crashed"
    builder.open_segment()  # resumed, and completed
    builder.add(2)
    builder.seal()
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    second = _pass(tmp_path / "two" / "r", platform)
    assert (second.state, second.pushed_now) == ("synced", 2), second.error
    again = _pass(builder.run_dir, platform)  # the first copy, whose state this process wrote
    assert (again.state, again.pushed_now) == ("synced", 0), again.error
    assert _rows(platform) == builder.ids
    (evaluation,) = platform.evaluations.values()
    assert evaluation["finalize_count"] == 1


class _Stop(BaseException):
    """A pass stopped where it waits (as a follower's stop, or a kill, ends it)."""


#: The engine tests' clock, which moves only when slept on (and lets delayed requests land).
_Time = FakeTime


def _first_append_lands_late(platform: FakePlatform, clock: _Time) -> list:
    """Make the platform's first samples append time out while still on its way: it lands 20
    s (of ``clock``) later. Returns the list that holds that request once it was sent."""
    held: list = []

    def handle(request):
        if request.url.path.endswith("/samples") and request.method == "POST" and not held:
            held.append(request)
            clock.delayed.append((clock.now + 20.0, request))
            raise httpx.ReadTimeout("no answer yet")
        return FakePlatform.handle(platform, request)

    platform.handle = handle  # type: ignore[method-assign]
    return held


@pytest.mark.parametrize("ending", ["stopped", "killed"])
def test_a_request_another_copy_left_in_doubt_is_waited_out_before_the_platform_is_read(
        tmp_path: Path, ending: str) -> None:
    """Copy one's append times out while still on its way (it lands 20 s later) and its pass
    ends there: stopped (it notes the request in doubt as it lets go of the lock) or killed
    (its note still says "under way"; its state file announced the request). Copy two must
    not read the platform's count and append before that request can no longer land: the
    late commit then doubled every row of it."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", "in-doubt", 6)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    held = _first_append_lands_late(platform, clock)

    def stop(seconds: float) -> None:
        if seconds > 0:  # a first wait; sleeping no time is the pass asking whether to stop (Protocol.checkpoint)
            raise _Stop

    release = CopyLock.release
    if ending == "killed":  # what a SIGKILL leaves: the lock dropped, the note not rewritten
        CopyLock.release = lambda self, pending=None, store=None: os.close(self._fd)  # type: ignore[method-assign]
    try:
        first = RunSync(builder.run_dir, _client(platform), DEST,
                        _options(request_lifetime=30.0, max_request_bytes=6_000), clock=lambda: clock.now, sleep=stop)
        with pytest.raises(_Stop):
            first.run()
    finally:
        CopyLock.release = release  # type: ignore[method-assign]
    assert held and clock.delayed, "the first copy's append is still on its way"
    second = RunSync(tmp_path / "two" / "r", _client(platform), DEST, _options(request_lifetime=30.0, max_request_bytes=6_000),
                     clock=lambda: clock.now, sleep=clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert second.state == "synced", second.error
    assert any("another copy" in warning for warning in second.warnings), second.warnings
    assert clock.slept >= 30.0 + 60
    assert _rows(platform) == builder.ids
    # And the first copy, whose state still announces that request: the count, grown by the
    # other copy's rows too, is taken once the request is waited out (a mismatch before).
    again = RunSync(builder.run_dir, _client(platform), DEST, _options(request_lifetime=30.0, max_request_bytes=6_000),
                    clock=lambda: clock.now, sleep=clock.sleep).run()
    assert (again.state, again.pushed_now) == ("synced", 0), again.error
    assert _rows(platform) == builder.ids


def test_a_request_another_copy_left_long_ago_costs_no_wait(tmp_path: Path) -> None:
    platform = FakePlatform()
    builder = build_run(tmp_path / "one" / "r", "long-ago", 2)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    _holding(builder.run_dir, "long-ago").release(InFlight(kind="samples", sent_at=time.time() - 3600))
    started = time.monotonic()
    report = RunSync(tmp_path / "two" / "r", _client(platform), DEST, _options(request_lifetime=30.0)).run()
    assert report.state == "synced" and report.warnings == [], (report.error, report.warnings)
    assert time.monotonic() - started < 10


def test_a_pass_after_its_own_asks_the_platform_nothing_more(tmp_path: Path) -> None:
    """The holder note costs nothing when no copy came between two passes of one folder."""
    platform = FakePlatform()
    builder = RunBuilder(tmp_path / "r", "alone")
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    assert _pass(builder.run_dir, platform).state == "crashed"
    builder.open_segment()
    builder.add(2)
    builder.seal()
    before = len(platform.requests)
    assert _pass(builder.run_dir, platform).state == "synced"
    reads = [path for method, path in platform.requests[before:] if method == "GET"]
    assert not any(path.endswith("/samples") for path in reads), reads  # no reconciling: trusted


def test_a_copy_being_pushed_elsewhere_is_waited_for_then_skipped_in_one_line(tmp_path: Path) -> None:
    platform = FakePlatform()
    builder = build_run(tmp_path / "one" / "r", "busy", 3)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    with _holding(builder.run_dir, "busy"):
        started = time.monotonic()
        (report,) = sync_paths([tmp_path / "two"], _client(platform), DEST, _options(copy_wait=0.3))
        waited = time.monotonic() - started
    assert report.state == "skipped", report.error
    assert 0.3 <= waited < 5
    assert report.error is not None and "\n" not in report.error
    assert "copy of this run" in report.error and str(builder.run_dir) in report.error and "0.3 s" in report.error
    assert platform.evaluations == {}, "nothing was sent while the other copy held the run"
    (report,) = sync_paths([tmp_path / "two"], _client(platform), DEST, _options(copy_wait=0.3))
    assert (report.state, report.pushed_now) == ("synced", 3), report.error
    assert _rows(platform) == builder.ids
    folder = cache_root() / COPY_LOCKS_DIRNAME
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files), files


def test_wait_waits_for_the_copy_then_pushes_only_what_it_left(tmp_path: Path) -> None:
    platform = FakePlatform()
    builder = build_run(tmp_path / "one" / "r", "waited", 4)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    assert _pass(builder.run_dir, platform).state == "synced"
    reports: list = []
    with _holding(builder.run_dir, "waited"):
        worker = threading.Thread(target=lambda: reports.extend(sync_paths(
            [tmp_path / "two"], _client(platform), DEST, _options(copy_wait=0.0), wait=True)))
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive() and not reports, "--wait waits for the copy, whatever --copy-wait says"
    worker.join(10)
    (report,) = reports
    assert (report.state, report.pushed_now) == ("synced", 0), report.error
    assert _rows(platform) == builder.ids


def test_the_follower_skips_a_run_a_copy_holds_and_syncs_it_once_free(tmp_path: Path) -> None:
    """Without waiting (the other runs it follows must not wait with it), and without its
    spool changing in between."""
    platform = FakePlatform()
    builder = build_run(tmp_path / "one" / "r", "followed", 3)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    seen: list = []
    held = _holding(builder.run_dir, "followed")
    follower = Follower([tmp_path / "two"], _client(platform), DEST, _options(),
                        FollowOptions(poll_interval=0.02, exit_when_idle=True), on_report=seen.append)
    worker = threading.Thread(target=follower.run)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not any(r.state == "skipped" for r in seen) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.state for r in seen] == ["skipped"], [(r.state, r.error) for r in seen]
        assert "copy of this run" in seen[0].error and "tried again every 1 s" in seen[0].error
        assert platform.evaluations == {}
    finally:
        held.release()
    worker.join(10)
    assert not worker.is_alive()
    assert [r.state for r in seen] == ["skipped", "synced"], [(r.state, r.error) for r in seen]
    assert _rows(platform) == builder.ids


def test_a_holder_killed_with_sigkill_leaves_the_lock_free(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from prime_runs_spool.sync.copies import CopyLock\n"
        f"CopyLock('dest-copies', 'killed', None, Path({str(run_dir / 'state.json')!r}), 'r').hold(0)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(CopyBusyError):
            CopyLock("dest-copies", "killed", None, tmp_path / "other.json", "other").hold(0.1)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        with CopyLock("dest-copies", "killed", None, tmp_path / "other.json", "other").hold(0) as lock:
            assert lock.foreign, "the killed holder synced another state"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_command_reports_a_run_a_copy_holds_skipped_and_exits_0(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "one" / "r", "cli-busy", 2)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    db = (tmp_path / "local.db").resolve()
    with _holding(builder.run_dir, "cli-busy", local_destination(db, None)):
        result = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "--to", "samples", "--copy-wait", "0.2",
                                       str(tmp_path / "two")], capture_output=True, text=True, timeout=60,
                                env=child_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split()[0] == "skipped", result.stdout
    assert "copy of this run" in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_a_cache_folder_that_cannot_be_made_is_the_run_s_error_in_one_line(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    builder = build_run(tmp_path / "r", "no-cache", 1)
    platform = FakePlatform()
    report = _pass(builder.run_dir, platform)
    assert report.state == "error" and report.error is not None and "\n" not in report.error
    assert "copy lock" in report.error and "XDG_CACHE_HOME" in report.error
    assert platform.evaluations == {}
