"""A sync is never silent and never writes before its configuration is known good: the real
``prime-runs sync`` in a subprocess whose stdout and stderr are pipes (as in CI) or a
terminal, against a closed port, a host name that does not resolve, and the local platform
refusing the key."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import shutil
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_runs_spool.sync.retry import Backoff
from support.env import CLI, child_env
from support.ports import closed_port, closed_url
from support.runs import build_run
from support.sync_e2e import TOKEN, server, sync_cmd  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
RETRY_LINE = re.compile(r"^prime-runs: (.+) failed: (.+); try (\d+) in (\d+\.\d) s$")


def run_piped(base_url: str, *args: str, key: str | None = TOKEN, **env: str) -> tuple[int, str, list[tuple[float, str]], float]:
    """The sync with pipes for stdout and stderr: exit status, stdout, each stderr line with
    the second it arrived at, and the whole run's seconds."""
    extra = {"PRIME_API_KEY": key} if key else {}
    started = time.monotonic()
    proc = subprocess.Popen(sync_cmd(base_url, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(**extra, **env))
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic() - started, line.rstrip("\n"))
                                                          for line in proc.stderr))
    reader.start()
    out = proc.stdout.read()
    status = proc.wait(120)
    reader.join()
    return status, out, lines, time.monotonic() - started


@pytest.mark.slow
def test_a_closed_port_is_retried_visibly_and_given_up_after_retry_for(tmp_path: Path) -> None:
    build_run(tmp_path / "outputs" / "run", "retry-closed", 3)
    port = closed_port()
    status, out, lines, took = run_piped(f"http://127.0.0.1:{port}", str(tmp_path / "outputs"),
                                         "--retry-for", "3s", "--backoff-cap", "1")
    retries = [RETRY_LINE.match(text) for _, text in lines if RETRY_LINE.match(text)]
    assert status == 1, lines
    assert len(retries) >= 2, lines
    assert all(f"connection refused by 127.0.0.1:{port}" in m.group(2) for m in retries)
    assert [int(m.group(3)) for m in retries] == list(range(2, len(retries) + 2))
    first_retry_at = next(at for at, text in lines if RETRY_LINE.match(text))
    assert first_retry_at < took - 1.0, "the retries were told as they happened, not at the end"
    assert took < 3 + 8, f"{took:.1f} s for --retry-for 3s"
    assert "still failing after" in out and "of failures on this platform" in out, out


def test_a_host_name_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    build_run(tmp_path / "outputs" / "run", "retry-dns", 3)
    status, out, lines, _ = run_piped("http://no-such-host.invalid", str(tmp_path / "outputs"), "--retry-for", "2s",
                                      "--backoff-cap", "0.5")
    assert status == 1
    assert any("host name no-such-host.invalid not resolved" in text for _, text in lines if RETRY_LINE.match(text)), \
        lines
    assert "host name no-such-host.invalid not resolved" in out


@pytest.mark.slow
def test_retry_for_bounds_the_whole_wait_not_each_run(tmp_path: Path) -> None:
    for n in range(5):
        build_run(tmp_path / "outputs" / f"run-{n}", f"retry-budget-{n}", 2)
    status, out, lines, took = run_piped(closed_url(), str(tmp_path / "outputs"),
                                         "--jobs", "1", "--max-attempts", "1000", "--backoff-cap", "0.5",
                                         PRIME_RUNS_RETRY_FOR="2")
    assert status == 1, lines
    assert out.count("error ") == 5, out
    assert took < 2 + 6, f"{took:.1f} s for five runs against a platform that is down, --retry-for 2"


def test_on_a_terminal_the_retries_are_on_the_progress_line(tmp_path: Path) -> None:
    build_run(tmp_path / "outputs" / "run", "retry-tty", 2)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    proc = subprocess.Popen(sync_cmd(closed_url(), str(tmp_path / "outputs"),
                                     "--retry-for", "2s", "--backoff-cap", "0.5"),
                            stdout=subprocess.PIPE, stderr=slave, env=child_env(PRIME_API_KEY=TOKEN))
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(60)
    os.close(master)
    text = seen.decode(errors="replace")
    assert re.search(r"\r[^\r\n]*try 2 in \d+\.\d s, [^\r\n]*failed: GET [^\r\n]*connection refused", text), text
    assert "\nprime-runs: " not in text.split("\r")[0], "the retries are not lines of their own on a terminal"


# -- configuration errors: once, exit 2, nothing written ---------------------------------


def tree(root: Path, *, locks: bool = True) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*")
                  if locks or p.suffix != ".lock")


@pytest.fixture()
def unspooled(tmp_path: Path) -> Path:
    """Eval outputs without a spool (verifiers 0.4.0's), and a spool beside them."""
    outputs = tmp_path / "outputs"
    shutil.copytree(REPO / "fixtures" / "eval_outputs" / "vf040-completed", outputs / "vf040-completed")
    build_run(outputs / "spooled", "config-errors", 2)
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no key", "refused key", "bad url", "unknown --to"])
def test_a_configuration_error_is_told_once_exit_2_before_anything_is_written(unspooled: Path, server,
                                                                           case: str) -> None:
    before = tree(unspooled)
    base, key, extra = server.base_url, TOKEN, []
    if case == "no key":
        key = None
    elif case == "refused key":
        key = "not-the-token"
    elif case == "bad url":
        base = "ftp://example.invalid"
    else:
        extra = ["--to", "elsewhere"]
    status, out, lines, _ = run_piped(base, str(unspooled), *extra, key=key, HOME=str(unspooled.parent))
    errors = [text for _, text in lines if text.strip()]
    assert status == 2, lines
    assert len(errors) == 1 or case == "unknown --to", errors  # click's usage block for the option
    assert "Traceback" not in "\n".join(errors)
    if case == "refused key":
        assert "refused the API key" in errors[0] and "not-the-token" not in errors[0]
        assert f"the platform at {server.base_url} refused" in errors[0], errors  # a wrong --base-url shows
    assert tree(unspooled) == before, "a configuration error wrote into the paths"
    assert not (unspooled.parent / ".prime").exists()


def test_dry_run_needs_no_key(unspooled: Path) -> None:
    before = tree(unspooled, locks=False)
    status, out, lines, _ = run_piped("http://127.0.0.1:9", str(unspooled), "--dry-run", key=None,
                                      HOME=str(unspooled.parent))
    assert status == 0, lines
    assert "dry_run" in out
    assert tree(unspooled, locks=False) == before  # the run's sync lock, taken, is all


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--follow", "file:// URL", "file:// URL --follow"])
def test_a_refused_key_is_told_once_before_a_follower_or_a_store_sync_writes(tmp_path: Path, server,
                                                                            how: str) -> None:
    """The real local platform refuses the key: one line, exit 2, before the follower takes a
    run's lock or the store sync its lease or state (the folder is byte for byte as before)."""
    build_run(tmp_path / "outputs" / "run", f"refused-{how.replace(' ', '-').replace('/', '')}", 2)
    before = tree(tmp_path / "outputs")
    where = f"file://{tmp_path / 'outputs'}" if "URL" in how else str(tmp_path / "outputs")
    extra = ["--follow", "--exit-when-idle"] if "--follow" in how else []
    status, out, lines, _ = run_piped(server.base_url, where, *extra, key="not-the-token",
                                      HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    errors = [text for _, text in lines if text.strip()]
    assert status == 2, lines
    assert len(errors) == 1 and "refused the API key" in errors[0] and "not-the-token" not in errors[0], errors
    assert server.base_url in errors[0], errors
    assert out == ""
    assert tree(tmp_path / "outputs") == before, "a refused key wrote into the paths"


@pytest.mark.slow
def test_a_sync_with_nothing_to_do_asks_nothing_and_check_key_asks_all_the_same(tmp_path: Path, server) -> None:
    """Every run up to date: a wrong key is not asked about (exit 0, offline-fast, as
    documented); ``--check-key`` asks the platform all the same: a refused key is one line,
    exit 2, nothing written; the right one goes on to the up-to-date lines."""
    outputs = tmp_path / "outputs"
    build_run(outputs / "run", "check-key", 2)
    env = dict(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert run_piped(server.base_url, str(outputs), **env)[0] == 0
    before = tree(outputs)
    status, out, lines, _ = run_piped(server.base_url, str(outputs), key="not-the-token", **env)
    assert status == 0 and out.startswith("up_to_date"), (out, lines)
    status, out, lines, _ = run_piped(server.base_url, str(outputs), "--check-key", key="not-the-token", **env)
    errors = [text for _, text in lines if text.strip()]
    assert status == 2 and out == "", (out, lines)
    assert len(errors) == 1 and "refused the API key" in errors[0] and "not-the-token" not in errors[0], errors
    assert tree(outputs) == before
    status, out, lines, _ = run_piped(server.base_url, str(outputs), "--check-key", **env)
    assert status == 0 and out.startswith("up_to_date"), (out, lines)
    status, out, lines, _ = run_piped(server.base_url, str(outputs), "--check-key", "--dry-run", key="not-the-token",
                                      **env)
    assert status == 2 and "refused the API key" in lines[-1][1], lines
    local = subprocess.run(CLI + ["sync", str(outputs), "--local", "--check-key"], capture_output=True, text=True,
                           env=child_env(**env))
    assert local.returncode == 2 and "--check-key does not combine with --local" in local.stderr, local.stderr


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["gone", "answering 500"])
def test_check_key_that_cannot_ask_says_so_in_one_line(tmp_path: Path, server, platform: str) -> None:
    """``--check-key`` with every run up to date and the platform out of reach (a CI job with
    no network, a closed port) or answering 500: the key is not checked, and one line says
    so and why, the up-to-date lines follow, nothing is written; it ended 0 without a word,
    as if the key had been accepted."""
    from fixtures.fault_proxy import FaultProxy

    outputs = tmp_path / "outputs"
    build_run(outputs / "run", "check-key-offline", 2)
    env = dict(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    rates = {"status_500": 1.0} if platform == "answering 500" else {}
    with FaultProxy(server.base_url) as proxy:
        assert run_piped(proxy.base_url, str(outputs), **env)[0] == 0
        base_url = proxy.base_url
    before = tree(outputs)
    with FaultProxy(server.base_url, rates=rates, port=int(base_url.rsplit(":", 1)[1])) if rates \
            else contextlib.nullcontext():
        status, out, lines, _ = run_piped(base_url, str(outputs), "--check-key", key="not-the-token", **env)
    errors = [text for _, text in lines if text.strip()]
    assert status == 0 and out.startswith("up_to_date"), (out, lines)
    assert len(errors) == 1 and "the API key is not checked (--check-key)" in errors[0], errors
    assert ("cannot connect" if platform == "gone" else "500") in errors[0], errors
    assert tree(outputs) == before


class SilentPlatform:
    """A loopback port that accepts every connection and never answers on it: a platform
    behind a proxy that hangs. ``accepted`` is set by the first connection; ``times`` holds
    the monotonic time of each."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = threading.Event()
        self.held: list[socket.socket] = []
        self.times: list[float] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            self.times.append(time.monotonic())
            self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture()
def silent() -> Iterator[SilentPlatform]:
    platform = SilentPlatform()
    try:
        yield platform
    finally:
        platform.close()


def _follower(tmp_path: Path, base_url: str, *args: str, where: str = "") -> subprocess.Popen[str]:
    """``prime-runs sync OUTPUTS --follow`` (or ``where`` with ``args``) with a long ``--timeout``:
    a request the platform never answers holds its pass 60 s, and only the key check's own
    bound can be shorter."""
    return subprocess.Popen(CLI + ["sync", where or str(tmp_path / "outputs"), *(args or ["--follow"]),
                                   "--base-url", base_url, "--timeout", "60", "--backoff-cap", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "c")))


def _stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.slow
def test_a_platform_that_never_answers_holds_the_key_check_only_briefly(tmp_path: Path, silent) -> None:
    """The platform takes the connection and never answers: the key check gives up after its
    own few seconds (KEY_CHECK_SECONDS), not the 60 s ``--timeout``, and the follower goes on:
    its pass connects for its first request (the platform's second connection) and waits on
    it as any pass does. Two SIGINTs then end it, exit 0, as documented for ``--follow``."""
    build_run(tmp_path / "outputs" / "run", "silent-check", 2)
    follower = _follower(tmp_path, silent.url)
    try:
        deadline = time.monotonic() + 60
        while len(silent.times) < 2 and time.monotonic() < deadline and follower.poll() is None:
            time.sleep(0.05)
        assert len(silent.times) >= 2, "the follower's pass never began"
        held = silent.times[1] - silent.times[0]
        assert held < 20, f"the key check held the follower {held:.1f} s"  # 5 s, and a loaded machine's slack
        follower.send_signal(signal.SIGINT)  # the pass ends when its request does
        time.sleep(1.0)
        follower.send_signal(signal.SIGINT)  # at once
        began = time.monotonic()
    finally:
        out, err = _stop(follower)
    assert follower.returncode == 0, err
    assert time.monotonic() - began < 10
    assert "Traceback" not in err and "refused" not in err, err


@pytest.mark.parametrize("how", ["--follow", "file:// URL", "file:// URL --follow"])
def test_a_signal_during_the_key_check_ends_the_command_before_anything_is_written(tmp_path: Path, silent,
                                                                                   how: str) -> None:
    """SIGINT while the key check waits on a platform that never answers: exit 130 at once,
    with the interrupted line, and nothing written."""
    build_run(tmp_path / "outputs" / "run", f"silent-stop-{len(how)}", 2)
    before = tree(tmp_path / "outputs")
    where = f"file://{tmp_path / 'outputs'}" if "URL" in how else ""
    follower = _follower(tmp_path, silent.url, *(["--follow"] if "--follow" in how else ["--json"]), where=where)
    try:
        assert silent.accepted.wait(30), "the command never connected"
        follower.send_signal(signal.SIGINT)
        began = time.monotonic()
    finally:
        out, err = _stop(follower)
    assert follower.returncode == 130, err
    assert time.monotonic() - began < 5
    assert "prime-runs: interrupted: before any run's pass ended" in err and "Traceback" not in err, err
    assert tree(tmp_path / "outputs") == before


@pytest.mark.slow
def test_a_platform_that_never_answers_is_said_within_seconds_not_after_the_timeout(tmp_path: Path, silent) -> None:
    """A CI sync (stderr a pipe) against a platform that takes the connection and never
    answers: the first word came after the first request's whole ``--timeout`` (120 s by
    default), as its retry line. The key check knows after its own few seconds: it says so,
    once, and the sync goes on."""
    build_run(tmp_path / "outputs" / "run", "silent-said", 2)
    sync = _follower(tmp_path, silent.url, "--json")
    lines: list[str] = []
    said = threading.Event()

    def read() -> None:
        assert sync.stderr is not None
        for line in sync.stderr:
            lines.append(line)
            if "did not answer" in line:
                said.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert said.wait(20), lines  # 5 s, and a loaded machine's slack; the timeout is 60 s
        assert sync.poll() is None, lines
    finally:
        sync.send_signal(signal.SIGINT)
        time.sleep(0.5)
        sync.send_signal(signal.SIGINT)
        _stop(sync)
        reader.join(10)
    [line] = [line for line in lines if "did not answer" in line]
    assert line == (f"prime-runs: the platform at {silent.url} did not answer within 5 s; going on: each request "
                    "waits up to 60 s for its answer (--timeout), and every retry is told\n"), line
    assert TOKEN not in "".join(lines)


def test_a_streak_of_failures_counts_from_its_first_request_sent_not_from_its_failure() -> None:
    """``--retry-for`` bounds the failures on a platform: the wait for an answer that never
    came is part of them. A request sent at 0 that failed at 120 (a whole ``--timeout``)
    spent 120 s of a 20 s ``retry_for``: no retry. Counted from its failure, it was tried
    once more, for another whole timeout."""
    clock = [0.0]
    backoff = Backoff(base=0.1, cap=0.2, retry_for=20.0, monotonic=lambda: clock[0])
    sent = backoff.monotonic()
    clock[0] = 120.0
    assert backoff.next_wait("listing evaluations", "timed out", 1, sent=sent) is None
    # An answer to another run's request at 50 s: the platform was up then, the streak
    # begins no earlier, and each try's answer is bounded by what is left of it.
    backoff = Backoff(base=0.1, cap=0.2, retry_for=20.0, monotonic=lambda: clock[0])
    clock[0] = 50.0
    backoff.answered()
    clock[0] = 60.0
    assert backoff.time_left() is None  # no streak: the transport's timeout alone
    assert backoff.next_wait("listing evaluations", "timed out", 1, sent=0.0) is not None
    assert backoff.time_left() == pytest.approx(10.0)


@pytest.mark.slow
def test_retry_for_bounds_a_platform_that_takes_the_connection_and_never_answers(tmp_path: Path, silent) -> None:
    """A CI sync against a platform that accepts every connection and never answers, with
    ``--timeout 10 --retry-for 12``: the run gives up about 12 s after its first request
    (the key check's own 5 s before it), its retry's wait for an answer cut to what is left
    of the 12 s. It took three whole timeouts (about 35 s): the streak was counted from the
    first failure, and each retry waited the whole ``--timeout``."""
    build_run(tmp_path / "outputs" / "run", "silent-bounded", 2)
    started = time.monotonic()
    ran = subprocess.run(CLI + ["sync", str(tmp_path / "outputs"), "--base-url", silent.url, "--to", "samples",
                                "--json", "--timeout", "10", "--retry-for", "12", "--backoff-cap", "0.2"],
                         capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=TOKEN))
    took = time.monotonic() - started
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert "still failing after" in ran.stdout and "the state is saved" in ran.stdout, ran.stdout
    assert took < 26, f"{took:.1f} s for --retry-for 12 and --timeout 10"  # 5 + 12, and a loaded machine's slack
    assert "Traceback" not in ran.stderr and TOKEN not in ran.stderr + ran.stdout, ran.stderr


@pytest.fixture()
def failing() -> Iterator[str]:
    """A platform that answers every request at once with 500: up, and failing."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Failing(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"detail": "internal error"}'
            self.send_response(500)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_PUT = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.slow  # --retry-for 2
def test_a_platform_that_answers_500_until_retry_for_is_spent_is_reported_as_answering_500(
        tmp_path: Path, failing: str) -> None:
    """The wait before the last retry used to run to the end of ``--retry-for``, and that
    retry then had no time left for its answer: it timed out at once, and the run's error
    said the platform gave no answer (``timed out (ReadTimeout)``) while it had answered
    every request with 500. Now the retries end with the last answer's failure."""
    build_run(tmp_path / "outputs" / "run", "retry-500", 2)
    status, out, lines, _ = run_piped(failing, str(tmp_path / "outputs"), "--retry-for", "2s",
                                      "--max-attempts", "1000", "--to", "samples")
    assert status == 1, lines
    retries = [m for _, text in lines if (m := RETRY_LINE.match(text))]
    assert retries and all("answered 500" in m.group(2) for m in retries), lines
    [error] = [line for line in out.splitlines() if line.strip().startswith("error:")]
    assert "answered 500" in error and "timed out" not in error, error
