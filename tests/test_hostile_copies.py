"""Hostile review of the copy lock (sync/copies.py, docs/sync.md "Concurrency"), kept as
regression tests: copies of one spool synced at once with real processes against the
platform process, a holder SIGKILLed mid-push, a tampered lock file, odd waits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from support import platform_process
from support.env import CLI, child_env
from support.fake_platform import FakePlatform
from support.runs import build_run
from support.sync_e2e import evaluations_of, sample_ids
from test_hostile_round3 import samples_gate  # noqa: F401 (a fixture)
from test_sync_copies import DEST, _client, _first_append_lands_late, _options, _rows, _Stop, _Time
from prime_runs_spool.errors import CopyBusyError
from prime_runs_spool.sync.copies import CopyLock, run_key_digest
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.state import sync_state_path
from prime_runs_spool.sync.state import remote_destination
from prime_runs_spool.sync.user_cache import cache_root

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


# -- a request in doubt handed on from copy to copy ------------------------------------------


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

    def stop(seconds: float) -> None:
        if seconds > 0:  # a first wait; sleeping no time is the pass asking whether to stop (Protocol.checkpoint)
            raise _Stop

    def sync(copy: str, sleep):
        return RunSync(tmp_path / copy / "r", _client(platform), DEST,
                       _options(request_lifetime=30.0, max_request_bytes=6_000), clock=lambda: clock.now, sleep=sleep)

    with pytest.raises(_Stop):
        sync("one", stop).run()
    assert held and clock.delayed, "copy one's append is still on its way"
    with pytest.raises(_Stop):
        sync("two", stop).run()  # stopped where it waits for copy one's request
    assert clock.delayed and _rows(platform) == [], "copy two sent nothing"
    report = sync("three" if third == "another copy" else "two", clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert report.state == "synced", report.error
    assert _rows(platform) == builder.ids


# -- a lock file tampered with ----------------------------------------------------------------


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


# -- where the locks are ------------------------------------------------------------------------


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


# -- one destination spelled two ways ------------------------------------------------------------


def test_two_spellings_of_one_platform_are_one_destination() -> None:
    one = remote_destination("https://api.example.com/x", "team")
    assert remote_destination("HTTPS://API.Example.com:443/x", "team").key == one.key
    assert remote_destination("https://api.example.com:8443/x", "team").key != one.key
    assert remote_destination("https://api.example.com/x", None).key != one.key
    assert remote_destination("http://[::1]:80", None).key == remote_destination("http://[::1]", None).key


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


# -- which store ---------------------------------------------------------------------------------

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


# -- what held up, kept ----------------------------------------------------------------------------

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


# -- a copy behind the platform --------------------------------------------------------------------

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


# -- a folder whose state went with its last pass ---------------------------------------------------

def test_a_sync_killed_mid_append_then_its_state_deleted_waits_the_append_out(tmp_path: Path) -> None:
    """The copy lock's note names the folder's own state, "under way": the pass died. With
    that state gone (the artifact unpacked again over the folder, the state removed to "start
    clean"), the next pass found nothing announced, read the count and appended at once, and
    the killed pass's late append doubled its rows. What it announced is gone: a lifetime."""
    platform = FakePlatform()
    clock = _Time(platform)
    builder = build_run(tmp_path / "one" / "r", "state-gone", 6)
    held = _first_append_lands_late(platform, clock)

    def stop(seconds: float) -> None:
        if seconds > 0:  # a first wait; sleeping no time is the pass asking whether to stop (Protocol.checkpoint)
            raise _Stop

    def sync(sleep):
        return RunSync(builder.run_dir, _client(platform), DEST,
                       _options(request_lifetime=30.0, max_request_bytes=6_000), clock=lambda: clock.now, sleep=sleep)

    release = CopyLock.release
    CopyLock.release = lambda self, pending=None, store=None: os.close(self._fd)  # type: ignore[method-assign]
    try:  # what a SIGKILL leaves: the lock dropped, the note still "under way"
        with pytest.raises(_Stop):
            sync(stop).run()
    finally:
        CopyLock.release = release  # type: ignore[method-assign]
    assert held and clock.delayed
    sync_state_path(builder.run_dir, DEST.key).unlink()
    report = sync(clock.sleep).run()
    clock.sleep(60)  # whatever was still on its way lands now
    assert report.state == "synced", report.error
    assert _rows(platform) == builder.ids
