"""Copies of one spool folder (``cp -r``, one CI artifact unpacked twice) synced on one machine:
the copy lock and the holder note (sync/copies.py, docs/sync.md "Concurrency").

One test races two syncs of two copies through a gate before a real platform; the others pin
the rest against the in-memory platform: a state this process wrote is not trusted once another
copy pushed, a held lock is waited for only as long as allowed and then reported
``skipped`` in one line, ``--wait`` and the follower, and the kernel dropping the lock of a
process killed while holding it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.errors import CopyBusyError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.copies import COPY_LOCKS_DIRNAME, run_key_digest, CopyLock
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.follow import FollowOptions, Follower
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import local_destination, remote_destination, sync_state_path, Destination, InFlight
from prime_runs_spool.sync.user_cache import cache_root

from support.env import CLI, child_env
from support.fake_platform import FakePlatform
from support.runs import RunBuilder, build_run
from test_sync_engine import FakeTime
from support import platform_process
from support.sync_e2e import evaluations_of, sample_ids

DEST = Destination(key="dest-copies", base_url="http://fake")


def _client(platform: FakePlatform) -> PlatformClient:
    return PlatformClient(Settings("http://fake", Secret("key"), None, "http://app"), transport=platform.transport())


def _options(**extra) -> SyncOptions:
    return SyncOptions(**{"request_lifetime": 0.2, "backoff": Backoff(base=0.01, cap=0.05, max_attempts=3), **extra})


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


def _stop(seconds: float) -> None:
    """A pass's sleep that stops it at its first wait (sleeping no time is the pass asking
    whether to stop, Protocol.checkpoint)."""
    if seconds > 0:
        raise _Stop


@contextlib.contextmanager
def _killed():
    """What a SIGKILL leaves of a pass: its copy lock dropped, the lock's note not rewritten."""
    release = CopyLock.release
    CopyLock.release = lambda self, pending=None, store=None: os.close(self._fd)  # type: ignore[method-assign]
    try:
        yield
    finally:
        CopyLock.release = release  # type: ignore[method-assign]


def _timed_pass(run_dir: Path, platform: FakePlatform, clock: _Time, sleep, **options) -> RunSync:
    """A pass of the copy at ``run_dir`` on ``clock``: requests live 30 s, and a six-episode
    run goes in several appends."""
    options = {"request_lifetime": 30.0, "max_request_bytes": 6_000, **options}
    return RunSync(run_dir, _client(platform), DEST, _options(**options), clock=lambda: clock.now, sleep=sleep)


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

    with _killed() if ending == "killed" else contextlib.nullcontext(), pytest.raises(_Stop):
        _timed_pass(builder.run_dir, platform, clock, _stop).run()
    assert held and clock.delayed, "the first copy's append is still on its way"
    second = _timed_pass(tmp_path / "two" / "r", platform, clock, clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert second.state == "synced", second.error
    assert any("another copy" in warning for warning in second.warnings), second.warnings
    assert clock.slept >= 30.0 + 60
    assert _rows(platform) == builder.ids
    # And the first copy, whose state still announces that request: the count, grown by the
    # other copy's rows too, is taken once the request is waited out (a mismatch before).
    again = _timed_pass(builder.run_dir, platform, clock, clock.sleep).run()
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


@pytest.mark.slow
def test_a_copy_the_other_copy_already_pushed_says_so_not_a_bare_pushed_0(tmp_path: Path) -> None:
    """Two copies of one run synced by one command: the second pushes nothing, and its line
    (and its --json report's ``copy_of``) names the copy synced before it."""
    import json

    build_run(tmp_path / "one" / "r", "cli-copies", 3)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    command = CLI + ["sync", "--local", "--db", str(tmp_path / "local.db"), "--to", "samples", "--jobs", "1",
                     str(tmp_path / "one"), str(tmp_path / "two")]
    env = child_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    text = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert text.returncode == 0, text.stdout + text.stderr
    first, second = text.stdout.splitlines()[:2]
    assert first.startswith("synced") and "pushed 3 (total 3)" in first and "copy of" not in first, first
    assert second.startswith("synced") and "pushed 0 (total 3)" in second, second
    assert f"(a copy of {tmp_path / 'one' / 'r'}, synced already)" in second, second

    # a third copy, taken before any sync (no state of its own), reported as JSON by a later
    # sync: the copy named is the last one synced on this machine
    shutil.copytree(tmp_path / "one", tmp_path / "three", ignore=shutil.ignore_patterns("sync"))
    done = subprocess.run(command[:-2] + ["--json", str(tmp_path / "three")], capture_output=True, text=True,
                          timeout=60, env=env)
    (report,) = json.loads(done.stdout)["runs"]
    assert (report["state"], report["pushed_now"], report["copy_of"]) == ("synced", 0, str(tmp_path / "two" / "r"))


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


TOKEN = "copies-token"


class _Proxy:
    """A forwarding proxy before the platform process that can hold ``POST .../samples``
    for ``delay`` seconds (forwarded anyway, as a platform processes a request whose
    client went away) and counts them."""

    def __init__(self, upstream: str, delay: float = 0.0) -> None:
        self.upstream, self.delay, self.samples_posts = upstream, delay, 0
        self.seen = threading.Event()
        proxy = self

        class Forward(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "POST" and self.path.endswith("/samples"):
                    proxy.samples_posts += 1
                    proxy.seen.set()
                    time.sleep(proxy.delay)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                answer = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers,
                                       timeout=30)
                try:
                    self.send_response(answer.status_code)
                    self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                    self.send_header("Content-Length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except OSError:
                    pass  # the client went away (killed): the request was processed all the same

            do_GET = do_POST = do_PUT = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


def _sync(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(CLI + ["sync", "--to", "samples", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(PRIME_API_KEY=TOKEN, **env))


def _stored(server, run_id: str) -> list[list[str]]:
    with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        return [sample_ids(api, e["id"]) for e in evaluations_of(api, run_id)]


@pytest.fixture
def platform(tmp_path: Path):
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", TOKEN) as server:
        yield server


@pytest.mark.parametrize("third", ["another copy", "the interrupted copy again"])
def test_a_request_in_doubt_is_still_waited_out_after_the_copy_waiting_for_it_was_stopped(
        tmp_path: Path, third: str) -> None:
    """Copy one's append is in doubt (it lands 20 s later) and its pass stops. Copy two
    takes over and waits that request out; stopped during the wait (Ctrl-C, a follower
    stopped, a CI step cancelled), its note said nothing was in doubt, so the next pass,
    of a third copy or of copy two again, read the count and appended at once: the late
    commit then doubled the rows."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", "handed-on", 6)
    for copy in ("two", "three"):
        shutil.copytree(tmp_path / "one", tmp_path / copy)
    held = _first_append_lands_late(platform, clock)

    def sync(copy: str, sleep):
        return _timed_pass(tmp_path / copy / "r", platform, clock, sleep)

    with pytest.raises(_Stop):
        sync("one", _stop).run()
    assert held and clock.delayed, "copy one's append is still on its way"
    with pytest.raises(_Stop):
        sync("two", _stop).run()  # stopped where it waits for copy one's request
    assert clock.delayed and _rows(platform) == [], "copy two sent nothing"
    report = sync("three" if third == "another copy" else "two", clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert report.state == "synced", report.error
    assert _rows(platform) == builder.ids


def _lock_file(run_id: str) -> Path:
    folder = cache_root() / "copies"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder / f"{run_key_digest(DEST.key, run_id, None)}.lock"


@pytest.mark.parametrize("note", [
    b"\x00\xffnot a note{",
    b'{"holder": "00", "in_doubt": 1' + b"0" * 400 + b"}",  # float() of it raised OverflowError
    b'{"holder": "00", "in_doubt": NaN}',
    b'{"holder": "00", "others": Infinity}',
    b'{"holder": "zz", "under_way": true}',
    b'{"holder": "2f00", "under_way": true}',  # a path with a NUL in it
    b"[1, 2]",
    b" " * (3 << 20) + b"{}",
], ids=["garbage", "huge-int", "nan", "infinite", "not-hex", "nul", "list", "huge-file"])
def test_a_note_that_makes_no_sense_costs_one_wait_and_pushes_each_episode_once(tmp_path: Path, note: bytes) -> None:
    """What a note cannot tell counts as a request in doubt at an unknown time: waited out
    (one request lifetime), never a crash, never a second copy of a row."""
    platform = FakePlatform()
    builder = build_run(tmp_path / "r", "tampered", 3)
    _lock_file("tampered").write_bytes(note)
    report = RunSync(builder.run_dir, _client(platform), DEST, _options(request_lifetime=0.2)).run()
    assert (report.state, report.pushed_now) == ("synced", 3), report.error
    assert _rows(platform) == builder.ids


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_lock_file_that_is_no_file_is_the_run_s_error_in_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    """A FIFO was opened and locked, then reading the note failed: "<run folder>: Illegal
    seek", naming neither the lock file nor what to do."""
    platform = FakePlatform()
    builder = build_run(tmp_path / "r", "not-a-file", 1)
    lock = _lock_file("not-a-file")
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    else:
        (tmp_path / "elsewhere").write_text("{}")
        lock.symlink_to(tmp_path / "elsewhere")
    report = RunSync(builder.run_dir, _client(platform), DEST, _options()).run()
    assert report.state == "error" and report.error is not None and "\n" not in report.error
    assert "copy lock" in report.error and lock.name in report.error, report.error
    assert platform.evaluations == {}
    assert (tmp_path / "elsewhere").read_text() == "{}" if kind == "symlink" else True


def test_copies_synced_from_two_working_folders_with_a_relative_cache_share_one_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``XDG_CACHE_HOME=.cache`` (a CI config) named a cache under each sync's working
    folder: two jobs on one machine took two locks and both appended every row. The XDG
    specification says to ignore a relative path; the default (``~/.cache``) is used."""
    monkeypatch.setenv("XDG_CACHE_HOME", ".cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for job in ("job-one", "job-two"):
        (tmp_path / job).mkdir()
    monkeypatch.chdir(tmp_path / "job-one")
    with CopyLock(DEST.key, "relative", None, tmp_path / "job-one" / "state.json", "job-one").hold(0):
        monkeypatch.chdir(tmp_path / "job-two")
        with pytest.raises(CopyBusyError):
            CopyLock(DEST.key, "relative", None, tmp_path / "job-two" / "state.json", "job-two").hold(0)
    assert cache_root() == tmp_path / "home" / ".cache" / "prime-runs"
    assert not (tmp_path / "job-one" / ".cache").exists()


def test_two_spellings_of_one_platform_are_one_destination() -> None:
    one = remote_destination("https://api.example.com/x", "team")
    assert remote_destination("HTTPS://API.Example.com:443/x", "team").key == one.key
    assert remote_destination("https://api.example.com:8443/x", "team").key != one.key
    assert remote_destination("https://api.example.com/x", None).key != one.key
    assert remote_destination("http://[::1]:80", None).key == remote_destination("http://[::1]", None).key


@pytest.mark.slow
def test_copies_synced_at_once_through_two_spellings_of_one_platform_store_each_episode_once(
        tmp_path: Path, samples_gate) -> None:
    """``HTTP://host`` in one job and ``http://host`` in the other: two destination keys, so
    two copy locks, and both copies appended every row (the gate holds each append until a
    second has arrived)."""
    upstream, gate = samples_gate
    builder = build_run(tmp_path / "one" / "r", "two-spellings", 4)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", TOKEN) as server:
        upstream.append(server.base_url)
        syncs = [_sync(str(tmp_path / copy), "--base-url", url, "--request-lifetime", "1", "--timeout", "20")
                 for copy, url in (("one", gate), ("two", gate.replace("http://", "HTTP://")))]
        outputs = [proc.communicate(timeout=60) for proc in syncs]
        stored = _stored(server, builder.run_id)
    assert [len(rows) for rows in stored] == [4], outputs
    assert [proc.returncode for proc in syncs] == [0, 0], outputs


@pytest.mark.slow
def test_a_copy_synced_with_another_store_than_the_first_copy_does_not_put_the_run_in_both(
        tmp_path: Path) -> None:
    """Copy one's episodes went to Prime Traces; copy two, synced ``--to samples``, found the
    evaluation (no samples on it, so nothing told it the store) and appended every episode
    to the samples table as well. The holder note says where they went."""
    build_run(tmp_path / "one" / "r", "two-stores", 3)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    db = str(tmp_path / "local.db")

    def sync(copy: str, store: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(CLI + ["sync", "--local", "--db", db, "--to", store, str(tmp_path / copy)],
                              capture_output=True, text=True, timeout=120, env=child_env())

    first = sync("one", "traces")
    assert first.returncode == 0 and first.stdout.split()[0] == "synced", first.stdout + first.stderr
    second = sync("two", "samples")
    assert second.returncode == 1, second.stdout + second.stderr
    assert second.stdout.split()[0] == "error" and "--to traces" in second.stdout, second.stdout
    third = sync("two", "traces")  # (--local takes auto for samples)
    # (its batches cut again from the start are the same keys: the service stores none twice)
    assert third.returncode == 0 and third.stdout.split()[0] == "synced", third.stdout + third.stderr
    assert "(total 3) to traces" in third.stdout, third.stdout


@pytest.mark.slow
def test_five_copies_synced_at_once_every_way_store_each_episode_once(tmp_path: Path, platform) -> None:
    """--jobs 1, --jobs 8, --follow, --wait and a long --copy-wait, all at once, each batch
    slowed down so that they overlap."""
    proxy = _Proxy(platform.base_url, delay=0.05)
    try:
        builder = build_run(tmp_path / "c0" / "r", "five-copies", 30)
        for n in range(1, 5):
            shutil.copytree(tmp_path / "c0", tmp_path / f"c{n}")
        common = ["--base-url", proxy.url, "--request-lifetime", "2", "--timeout", "20", "--max-request-bytes", "6000"]
        ways = [["--jobs", "1"], ["--jobs", "8"], ["--follow", "--exit-when-idle"], ["--wait"], ["--copy-wait", "120"]]
        syncs = [_sync(str(tmp_path / f"c{n}"), *common, *way) for n, way in enumerate(ways)]
        outputs = [proc.communicate(timeout=180) for proc in syncs]
    finally:
        proxy.close()
    assert [sorted(rows) for rows in _stored(platform, builder.run_id)] == [sorted(builder.ids)], outputs
    assert [proc.returncode for proc in syncs] == [0] * 5, outputs


@pytest.mark.slow
def test_a_copy_killed_mid_append_while_another_waits_lets_it_finish_once(tmp_path: Path, platform) -> None:
    """The waiting copy gets the lock as the kernel drops it, finds the note "under way",
    and waits out the append the killed one's state announced (it lands after the kill)."""
    proxy = _Proxy(platform.base_url, delay=1.5)
    try:
        builder = build_run(tmp_path / "c0" / "r", "killed-mid-append", 8)
        shutil.copytree(tmp_path / "c0", tmp_path / "c1")
        common = ["--base-url", proxy.url, "--request-lifetime", "3", "--timeout", "20", "--max-request-bytes", "6000"]
        first = _sync(str(tmp_path / "c0"), *common)
        assert proxy.seen.wait(30), first.communicate()
        second = _sync(str(tmp_path / "c1"), *common, "--copy-wait", "60")
        time.sleep(0.8)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        output = second.communicate(timeout=120)
        time.sleep(2)  # anything still on its way has landed
    finally:
        proxy.close()
    assert [sorted(rows) for rows in _stored(platform, builder.run_id)] == [sorted(builder.ids)], output
    assert second.returncode == 0 and output[0].split()[0] == "synced", output


def test_other_destinations_and_replays_do_not_wait_for_a_copy(tmp_path: Path) -> None:
    with CopyLock(DEST.key, "apart", None, tmp_path / "a.json", "a").hold(0):
        with CopyLock("another-destination", "apart", None, tmp_path / "b.json", "b").hold(0):
            pass
        with CopyLock(DEST.key, "apart", "replay-1", tmp_path / "b.json", "b").hold(0):
            pass
        with pytest.raises(CopyBusyError):
            CopyLock(DEST.key, "apart", None, tmp_path / "b.json", "b").hold(0.05)


def test_a_copy_taken_before_the_run_ended_synced_after_it_is_up_to_date_not_a_mismatch(tmp_path: Path) -> None:
    """A CI artifact taken while the run was live (3 episodes), synced after the whole run
    (5) was: reported a mismatch ("a request landed after its lifetime, or something else
    wrote to it"), exit 1, and the flag written into the finalized evaluation's metadata."""
    from support.runs import RunBuilder

    platform = FakePlatform()
    builder = RunBuilder(tmp_path / "one" / "r", "behind")
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    shutil.copytree(tmp_path / "one", tmp_path / "two")  # the earlier copy
    builder.open_segment()
    builder.add(2)
    builder.seal()
    assert RunSync(builder.run_dir, _client(platform), DEST, _options()).run().state == "synced"
    report = RunSync(tmp_path / "two" / "r", _client(platform), DEST, _options()).run()
    assert (report.state, report.pushed_now, report.error) == ("up_to_date", 0, None)
    assert any("holds 3 of the evaluation's 5" in warning for warning in report.warnings), report.warnings
    (evaluation,) = platform.evaluations.values()
    assert "prime_runs_mismatch" not in (evaluation.get("metadata") or {}), evaluation
    assert _rows(platform) == builder.ids


def test_rows_past_a_copy_that_repeat_its_own_are_still_a_mismatch(tmp_path: Path) -> None:
    """What a late commit leaves (one of our rows again) is no other copy's progress."""
    platform = FakePlatform()
    builder = build_run(tmp_path / "one" / "r", "repeated", 3, status=None)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    assert RunSync(builder.run_dir, _client(platform), DEST, _options()).run().state == "crashed"
    (rows,) = platform.samples.values()
    rows.append(dict(rows[-1]))  # a late commit of the last request
    report = RunSync(tmp_path / "two" / "r", _client(platform), DEST, _options()).run()
    assert report.state == "error" and "holds 4 samples" in (report.error or ""), (report.state, report.error)


@pytest.mark.parametrize("ending", ["stopped", "killed"])
def test_a_request_in_doubt_is_waited_out_after_the_state_that_announced_it_was_deleted(
        tmp_path: Path, ending: str) -> None:
    """A pass with its append in doubt ends: stopped (it notes the request in doubt as it
    lets go of the lock) or killed (its note still says "under way"); its state announces the
    request. With that state deleted before the folder's next pass (the artifact unpacked
    again, the state removed to "start clean"), the next pass found nothing announced (or
    took the note for its own state's to settle), read the count and appended at once: the
    late commit then doubled the rows. What it announced is gone: a lifetime."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", f"{ending}-then-deleted", 6)
    held = _first_append_lands_late(platform, clock)
    with _killed() if ending == "killed" else contextlib.nullcontext(), pytest.raises(_Stop):
        _timed_pass(builder.run_dir, platform, clock, _stop).run()
    assert held and clock.delayed
    sync_state_path(builder.run_dir, DEST.key).unlink()
    report = _timed_pass(builder.run_dir, platform, clock, clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert report.state == "synced", report.error
    assert _rows(platform) == builder.ids


def test_a_pass_killed_before_it_announced_anything_costs_the_next_pass_no_wait(tmp_path: Path) -> None:
    """A pass killed (or stopped at once by a second signal) while it still read the
    platform leaves its note "under way"; with no state of it to read (a first sync: none
    was written), the next pass waited a whole request lifetime for a request never sent."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", "killed-early", 4)
    down = FakePlatform.handle

    def handle(request):
        if request.method == "GET":
            return httpx.Response(503, json={"detail": "down"})
        return down(platform, request)

    def sync(sleep):
        return _timed_pass(builder.run_dir, platform, clock, sleep)

    platform.handle = handle  # type: ignore[method-assign]
    with _killed(), pytest.raises(_Stop):  # what a SIGKILL (or a second signal) leaves: the lock dropped, the note still "under way"
        sync(_stop).run()
    assert not sync_state_path(builder.run_dir, DEST.key).exists()
    platform.handle = lambda request: down(platform, request)  # type: ignore[method-assign]
    report = sync(clock.sleep).run()
    assert report.state == "synced" and report.warnings == [], (report.error, report.warnings)
    assert clock.slept < 1.0, "no request of the killed pass could land"
    assert _rows(platform) == builder.ids


def test_a_pass_killed_before_it_announced_anything_hands_on_what_its_state_announced(tmp_path: Path) -> None:
    """Copy one's append is in doubt and its pass stops; its next pass is killed while it
    waits that append out, before it announced anything of its own. Its note says it sent
    nothing, but the append its state announced may still land: copy two waits it out."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", "handed-on-by-the-dead", 6)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    held = _first_append_lands_late(platform, clock)

    def sync(copy: str, sleep):
        return _timed_pass(tmp_path / copy / "r", platform, clock, sleep)

    with pytest.raises(_Stop):
        sync("one", _stop).run()
    assert held and clock.delayed
    with _killed(), pytest.raises(_Stop):  # killed in its fence: the lock dropped, the note still "under way", nothing announced
        sync("one", _stop).run()
    report = sync("two", clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert report.state == "synced", report.error
    assert _rows(platform) == builder.ids


@pytest.fixture
def samples_gate():
    """A forwarding proxy before a platform that holds every ``POST .../samples`` until a
    second one has arrived (or 10 s passed): two syncs that each read the evaluation's count
    before either append commits, deterministically."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    barrier = threading.Barrier(2, timeout=10)
    upstream: list[str] = []

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "POST" and self.path.endswith("/samples"):
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    pass
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
            answer = httpx.request(self.command, upstream[0] + self.path, content=body, headers=headers, timeout=30)
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = do_PUT = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield upstream, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.slow
def test_two_copies_of_a_spool_synced_at_once_store_each_episode_once(tmp_path: Path, samples_gate) -> None:
    """The sync lock is per folder: two copies of one spool (cp -r, two CI jobs on one
    artifact) synced at once both appended every row, or made two evaluations. The copy lock
    (sync/copies.py) makes the second wait, and it then finds the first's evaluation and rows."""
    from support.sync_e2e import evaluations_of

    upstream, gate = samples_gate
    builder = build_run(tmp_path / "one" / "r", "copied-run", 4)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", "gate-token") as server:
        upstream.append(server.base_url)
        syncs = [subprocess.Popen(CLI + ["sync", str(tmp_path / copy), "--base-url", gate, "--to", "samples",
                                         "--request-lifetime", "1", "--timeout", "20"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=child_env(PRIME_API_KEY="gate-token")) for copy in ("one", "two")]
        outputs = [proc.communicate(timeout=60) for proc in syncs]
        with httpx.Client(base_url=server.api, headers={"Authorization": "Bearer gate-token"}) as api:
            evaluations = evaluations_of(api, builder.run_id)
            totals = [api.get(f"/evaluations/{e['id']}").json()["total_samples"] for e in evaluations]
    assert totals == [4], f"{len(evaluations)} evaluation(s) holding {totals} samples for 4 episodes"
    assert [proc.returncode for proc in syncs] == [0, 0], outputs
    assert sorted(out.split()[0] for out, _ in outputs) == ["synced", "synced"], outputs


@pytest.mark.slow
@pytest.mark.parametrize("held", ["create", "samples", "finalize"])
@pytest.mark.parametrize("then", ["another copy", "this folder, its state deleted"])
def test_a_sync_killed_with_its_request_held_leaves_the_next_sync_a_fence(
        tmp_path: Path, platform, held: str, then: str) -> None:
    """The other way round from a stop that costs a wait it does not need: a stop after a
    request went out must leave one. Killed while the proxy holds its create, its first
    append or its finalize (each committed late, within its lifetime, as the next sync
    starts), the sync is followed by a copy of the folder, or by this folder with its state
    deleted: that sync waits the request out before it reads the platform. A sync that did
    not would send its own while the held one was still to land (the proxy then lands the
    held one first): a second evaluation, rows twice, or a second finalize."""
    from fixtures.fault_proxy import FaultProxy
    from support.sync_e2e import assert_exactly_once

    path = {"create": r"/evaluations/?$", "samples": r"/samples$", "finalize": r"/finalize$"}[held]
    builder = build_run(tmp_path / "one" / "r", f"held-{held}-{then[:7]}", 6)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    with FaultProxy(platform.base_url, methods={"POST"}, hold_first=path) as proxy, \
            httpx.Client(base_url=platform.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        common = ["--base-url", proxy.base_url, "--request-lifetime", "4", "--timeout", "30",
                  "--max-request-bytes", "6000"]
        first = _sync(str(tmp_path / "one"), *common)
        deadline = time.monotonic() + 60
        while not proxy.holding():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGKILL)
        first.communicate()
        if then == "another copy":
            folder = tmp_path / "two"
        else:
            folder = tmp_path / "one"
            shutil.rmtree(folder / "r" / "spool" / "sync")
        second = _sync(str(folder), *common)
        time.sleep(1.0)
        assert proxy.release_held(), "the held request lands late, within its lifetime"
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, out + err
        assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_sync_killed_with_its_samples_held_then_its_state_put_back_from_an_older_copy_waits_it_out(
        tmp_path: Path, platform) -> None:
    """A sync SIGKILLed while the proxy holds its samples request, then the folder's state put
    back from an older copy that announces nothing (a backup, the CI artifact unpacked again:
    the state an earlier sync left, its evaluation made and no row sent), and synced again on
    this machine within the request's lifetime. The state cannot say what the killed pass had
    on its way, so the next sync waits it out as if the state were lost, and the held request,
    landed late, is each row's only copy. Before, the copy lock's note of a pass that died
    mid-pass was read back only for another copy's state: this one trusted the older state,
    read the count before the request landed and sent the rows again, 10 rows for 5."""
    from fixtures.fault_proxy import FaultProxy
    from support.sync_e2e import assert_exactly_once

    builder = build_run(tmp_path / "one" / "r", "held-then-put-back", 5)
    folder = str(tmp_path / "one")
    common = ["--request-lifetime", "8", "--timeout", "30", "--backoff-cap", "0.2"]
    with FaultProxy(platform.base_url, rates={"rate_limit": 1.0}, methods={"POST"}, paths=r"/samples$") as refusing:
        port = int(refusing.base_url.rsplit(":", 1)[1])  # the same address after: one destination
        earlier = _sync(folder, "--base-url", refusing.base_url, "--max-attempts", "1", *common)
        earlier.communicate(timeout=120)
    (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    older = state.read_bytes()  # the evaluation made, nothing announced
    with FaultProxy(platform.base_url, methods={"POST"}, hold_first=r"/samples$", port=port) as proxy, \
            httpx.Client(base_url=platform.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        first = _sync(folder, "--base-url", proxy.base_url, *common)
        deadline = time.monotonic() + 60
        while not proxy.holding():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.01)
        sent = time.monotonic()
        os.kill(first.pid, signal.SIGKILL)
        first.communicate()
        state.write_bytes(older)  # put back, as cp would
        for twin in state.parent.glob(".*.twin"):
            twin.unlink()
        second = _sync(folder, "--base-url", proxy.base_url, *common)
        time.sleep(max(0.0, sent + 4 - time.monotonic()))
        proxy.release_held()  # lands late, within its lifetime (if the next sync's request did not push it first)
        out, err = second.communicate(timeout=120)
        assert_exactly_once(api, builder)
        assert second.returncode == 0, out + err


def test_a_pass_killed_just_after_writing_a_settled_state_costs_the_next_pass_no_wait(tmp_path: Path) -> None:
    """A pass SIGKILLed right after it wrote its state with nothing in flight, after it had
    announced (and settled) an append: here the write that records an episode no request can
    carry, before the next append is announced. Its note says "under way"; its state is the
    one it wrote last, which nothing told from an older copy put back: the next pass waited a
    whole request lifetime. The mark of the last announcement, in the note and in every save
    of the state, tells them apart."""
    from prime_runs_spool.sync import protocol as protocol_module

    platform = FakePlatform()
    clock = _Time(platform)
    builder = RunBuilder(tmp_path / "one" / "r", "killed-after-a-settled-save")
    builder.open_segment()
    builder.add(3)
    builder.add(1, size=20_000)  # no request of 6,000 bytes carries it: noted in the state, written at once
    huge = builder.ids[-1]
    builder.add(2)
    builder.seal()
    save_state = protocol_module.save_state

    def killed_after_the_write(path, state, writer=None):
        save_state(path, state, writer)
        if state.in_flight is None and state.skipped_too_large and state.samples_pushed:
            raise _Stop  # the process dies here: nothing after the write runs

    protocol_module.save_state = killed_after_the_write
    try:
        with _killed(), pytest.raises(_Stop):
            _timed_pass(builder.run_dir, platform, clock, clock.sleep).run()
    finally:
        protocol_module.save_state = save_state
    assert 0 < len(_rows(platform)) < 5
    report = _timed_pass(builder.run_dir, platform, clock, clock.sleep).run()
    assert report.state == "synced", report.error
    assert clock.slept < 1.0, "the state the killed pass wrote last says what it left: nothing"
    assert _rows(platform) == [i for i in builder.ids if i != huge]


def test_a_state_copied_mid_pass_then_put_back_after_a_kill_waits_out_the_later_request(tmp_path: Path) -> None:
    """A copy of the state taken while a pass's first append was out (a backup, a CI
    artifact uploaded mid-sync), put back after that pass was killed with its second append
    in doubt (it lands 20 s later). The copy announces a request the killed pass did send,
    so it was trusted: its append settled by the count, and the rows of the second append,
    not landed yet, sent again: each twice once it landed. Its mark is not the one the note
    says the pass announced last: the next pass waits the second append out."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", "copied-mid-pass", 6)
    state_path = sync_state_path(builder.run_dir, DEST.key)
    appends: list = []
    copied: list[bytes] = []

    def handle(request):
        if request.url.path.endswith("/samples") and request.method == "POST":
            appends.append(request)
            if len(appends) == 1:
                copied.append(state_path.read_bytes())  # it announces this append
            elif len(appends) == 2:
                clock.delayed.append((clock.now + 20.0, request))
                raise httpx.ReadTimeout("no answer yet")
        return FakePlatform.handle(platform, request)

    platform.handle = handle  # type: ignore[method-assign]
    with _killed(), pytest.raises(_Stop):  # killed in its fence of the second append
        _timed_pass(builder.run_dir, platform, clock, _stop).run()
    assert len(appends) == 2 and clock.delayed
    state_path.write_bytes(copied[0])  # put back, as cp would
    for twin in state_path.parent.glob(".*.twin"):
        twin.unlink()
    report = _timed_pass(builder.run_dir, platform, clock, clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert report.state == "synced", report.error
    assert _rows(platform) == builder.ids


class _SnapshotThenHold:
    """A forwarding proxy that copies the run's state file as the first samples request
    arrives (the state then announces it) and holds the second, unanswered, until released."""

    def __init__(self, upstream: str, state_folder: Path) -> None:
        self.snapshot = b""
        self.holding, self.release = threading.Event(), threading.Event()
        seen: list[str] = []
        gate = self

        class Forward(BaseHTTPRequestHandler):
            def do_any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                held = self.command == "POST" and self.path.endswith("/samples") and len(seen) == 1
                if self.command == "POST" and self.path.endswith("/samples") and not seen:
                    (state,) = state_folder.glob("*.json")
                    gate.snapshot = state.read_bytes()
                if self.command == "POST" and self.path.endswith("/samples"):
                    seen.append(self.path)
                if held:
                    gate.holding.set()
                    gate.release.wait(60)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                answer = httpx.request(self.command, upstream + self.path, content=body, headers=headers, timeout=30)
                if held:
                    return  # to a client long gone
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.mark.slow
def test_a_sync_killed_with_its_second_samples_held_then_a_copy_of_its_state_made_mid_pass_put_back_waits_it_out(
        tmp_path: Path, platform) -> None:
    """A copy of the state made during the pass (a backup or an artifact taken while the sync
    ran), when it announced the pass's first samples request; that request landed, the pass
    announced and sent the second, and was SIGKILLed with it held; the copy is put back and the
    run synced again on this machine within the request's lifetime. The copy announces a
    request the killed pass sent, so it was taken for the file that pass last wrote: the first
    request settled by the count, the second's rows sent again, and the held one landed after
    them: 7 rows for 6. The copy lock's note says which request the file announced last."""
    from support.sync_e2e import assert_exactly_once

    builder = build_run(tmp_path / "one" / "r", "copy-made-mid-pass", 6)
    gate = _SnapshotThenHold(platform.base_url, builder.run_dir / "spool" / "sync")
    common = [str(tmp_path / "one"), "--base-url", gate.url, "--request-lifetime", "6", "--timeout", "30",
              "--max-request-bytes", "6000"]
    try:
        first = _sync(*common)
        assert gate.holding.wait(60), first.communicate()
        sent = time.monotonic()
        os.kill(first.pid, signal.SIGKILL)
        first.communicate()
        (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
        assert b'"kind":"samples"' in gate.snapshot, gate.snapshot
        state.write_bytes(gate.snapshot)  # put back, as cp would
        for twin in state.parent.glob(".*.twin"):
            twin.unlink()
        second = _sync(*common)
        time.sleep(max(0.0, sent + 3 - time.monotonic()))
        gate.release.set()  # lands late, within its lifetime
        out, err = second.communicate(timeout=120)
        with httpx.Client(base_url=platform.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
            assert_exactly_once(api, builder)
        assert second.returncode == 0, out + err
    finally:
        gate.release.set()
        gate.server.shutdown()



@pytest.mark.slow
def test_a_traces_sync_killed_with_its_finalize_held_then_its_state_put_back_finalizes_once(tmp_path: Path) -> None:
    """A run whose episodes went to Prime Traces, its finalize refused once (the state then
    kept: every batch committed, no finalize announced), synced again and SIGKILLed while the
    proxy holds that finalize; the older state put back and the run synced again on this
    machine within the request's lifetime. A put-back state of a run in Prime Traces was
    trusted, as if only content-addressed batches could be on their way: the evaluation read
    RUNNING, the pass finalized it, and the held finalize landed too: finalize_count 2 (the
    statistics job run twice). The finalize is no batch: it is waited out."""
    from fixtures.fault_proxy import FaultProxy
    from support.sync_e2e import evaluations_of

    builder = build_run(tmp_path / "one" / "r", "traces-finalize-put-back", 3)

    def sync(url: str, *more: str) -> subprocess.Popen[str]:
        return subprocess.Popen(CLI + ["sync", str(tmp_path / "one"), "--to", "traces", "--base-url", url,
                                       "--request-lifetime", "8", "--timeout", "30", "--backoff-cap", "0.2", *more],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=child_env(PRIME_API_KEY=TOKEN))

    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        with FaultProxy(server.base_url, rates={"rate_limit": 1.0}, methods={"POST"}, paths=r"/finalize$") as refusing:
            port = int(refusing.base_url.rsplit(":", 1)[1])  # the same address after: one destination
            sync(refusing.base_url, "--max-attempts", "1").communicate(timeout=120)
        (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
        older = state.read_bytes()  # every batch committed, nothing announced
        with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/finalize$", port=port) as proxy:
            first = sync(proxy.base_url)
            deadline = time.monotonic() + 60
            while not proxy.holding():
                assert first.poll() is None and time.monotonic() < deadline, first.communicate()
                time.sleep(0.01)
            sent = time.monotonic()
            os.kill(first.pid, signal.SIGKILL)
            first.communicate()
            state.write_bytes(older)  # put back, as cp would
            for twin in state.parent.glob(".*.twin"):
                twin.unlink()
            second = sync(proxy.base_url)
            time.sleep(max(0.0, sent + 3 - time.monotonic()))
            proxy.release_held()  # lands late, within its lifetime (if the next sync's finalize did not push it first)
            out, err = second.communicate(timeout=120)
        assert second.returncode == 0, out + err
        (evaluation,) = evaluations_of(api, builder.run_id)
        found = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
        assert (found["status"], found["finalize_count"]) == ("COMPLETED", 1), found
