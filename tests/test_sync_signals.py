"""Ctrl-C and SIGTERM end ``prime-runs sync`` at its next safe point: the real command, the
real local platform over loopback, a fault proxy that makes the interrupted request slow,
failed or lost exactly when the signal comes; and the next sync still pushes each episode
exactly once."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fixtures.fault_proxy import NO_FAULT, FaultProxy
from support.env import child_env
from support.runs import RunBuilder, build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, run_sync, server, sync_cmd  # noqa: F401

#: What the interrupted request meets, in turn: an answer slower than the grace (left
#: announced), one within it (settled), a 503 (the signal lands in the backoff), a lost
#: answer (settled by a read, or left in doubt).
STEP_FAULTS = ("delay_after", "delay_after_short", "status_503", "drop_after")
#: "About a second": the grace (1 s) plus an interpreter's exit, on a loaded machine.
PROMPT = 3.0


class StepProxy(FaultProxy):
    """Forwards every request untouched but the one numbered ``step`` (0 first), which meets
    ``fault``; once ``signalled`` is set, if given (:func:`interrupt_at` sets it): so the
    signal comes while that request is out, however late the test sees it arrive. Met at
    once, a lost answer was settled by a read and the sync had ended (exit 0) before a
    loaded test sent the signal."""

    step = -1
    fault = NO_FAULT
    signalled: threading.Event | None = None

    async def _act(self, fault: str, request: object, writer: asyncio.StreamWriter, decision: object) -> None:
        signalled = self.signalled
        if signalled is not None and decision.index == self.step:  # type: ignore[attr-defined]
            for _ in range(30_000):  # at most 30 s: a test that never signals fails, not hangs
                if signalled.is_set():
                    break
                await asyncio.sleep(0.001)
        await super()._act(fault, request, writer, decision)  # type: ignore[arg-type]

    def _decide(self, request: object) -> str:
        if len(self.log) != self.step:
            return NO_FAULT
        if self.fault == "delay_after_short":
            self.delay = 0.3
            return "delay_after"
        self.delay = 4.0
        return self.fault


def start_sync(base_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(sync_cmd(base_url, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN))


def interrupt_at(proc: subprocess.Popen[str], proxy: StepProxy, step: int, patience: float = 60.0) -> float | None:
    """SIGINT ``proc`` once request number ``step`` reached the proxy; the seconds it then
    took to exit, or None when it ended before making that many requests."""
    deadline = time.monotonic() + patience
    while len(proxy.log) <= step:
        if proc.poll() is not None:
            return None
        assert time.monotonic() < deadline, "the sync made no request in time"
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    asked = time.monotonic()
    if proxy.signalled is not None:
        proxy.signalled.set()
    proc.wait(30)
    return time.monotonic() - asked


@pytest.mark.slow
def test_a_sigint_at_every_request_stops_within_a_second_and_the_next_sync_is_exactly_once(
        tmp_path: Path, server, api) -> None:
    slowest = 0.0
    step = 0
    while True:
        outputs = tmp_path / f"step-{step}"
        builder = build_run(outputs / "run", f"sigint-step-{step}", 12, size=600)
        with StepProxy(server.base_url) as proxy:
            proxy.step, proxy.fault = step, STEP_FAULTS[step % len(STEP_FAULTS)]
            proxy.signalled = threading.Event()
            proc = start_sync(proxy.base_url, str(outputs), "--max-request-bytes", "4096", "--jobs", "1")
            took = interrupt_at(proc, proxy, step)
            out, err = proc.communicate()
        if took is None:  # the whole sync needs fewer requests: every step was interrupted once
            assert proc.returncode == 0, err
            assert_exactly_once(api, builder)
            break
        assert proc.returncode == 130, f"step {step} ({proxy.fault}): exit {proc.returncode}\n{err}"
        assert took < PROMPT, f"step {step} ({proxy.fault}): {took:.2f} s from SIGINT to exit"
        assert err.strip().splitlines()[-1].startswith("prime-runs: interrupted: "), err
        assert "Traceback" not in err
        slowest = max(slowest, took)
        final = run_sync(server.base_url, str(outputs))
        assert final.returncode == 0, f"step {step}: {final.stderr}{final.stdout}"
        assert_exactly_once(api, builder)
        step += 1
    assert step >= 6, f"only {step} requests: the run was meant to take several batches"
    print(f"slowest exit after SIGINT: {slowest:.2f} s over {step} steps")


@pytest.mark.slow
def test_a_second_sigint_exits_at_once_and_the_next_sync_is_exactly_once(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "outputs" / "run", "sigint-twice", 12, size=600)
    with StepProxy(server.base_url) as proxy:
        proxy.step, proxy.fault = 3, "delay_after"  # an answer that takes 4 s
        proc = start_sync(proxy.base_url, str(tmp_path / "outputs"), "--max-request-bytes", "4096")
        while len(proxy.log) <= 3:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        asked = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - asked
    assert proc.returncode == 130, err
    assert took < 0.9, f"{took:.2f} s after the second SIGINT"
    # not "run prime-runs sync again": pasted, that goes to the default platform, not this one
    assert "stopped at once (second signal); every state is consistent, run the same prime-runs sync again" in err
    final = run_sync(server.base_url, str(tmp_path / "outputs"))
    assert final.returncode == 0, final.stderr
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_sigterm_during_backoff_against_a_platform_that_is_down_stops_within_a_second(tmp_path: Path) -> None:
    build_run(tmp_path / "outputs" / "run", "sigterm-down", 3)
    proc = subprocess.Popen(sync_cmd("http://127.0.0.1:9", str(tmp_path / "outputs")) + ["--backoff-cap", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN, PRIME_RUNS_RETRY_FOR="10m"))
    time.sleep(3.0)  # into the backoff
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - asked < PROMPT
    assert out.startswith("interrupted "), out  # the run's line says it
    assert err.strip().splitlines()[-1].startswith("prime-runs: interrupted: 0 runs done, 1 left")


@pytest.mark.slow
def test_sigint_of_a_sync_over_a_store_url_ends_it_with_exit_130(tmp_path: Path) -> None:
    """Over a store URL (here file://) the runs' passes end at their next wait, each lease
    released, and the command exits 130 with its one line."""
    build_run(tmp_path / "bucket" / "run", "sigint-store", 3)
    proc = subprocess.Popen(sync_cmd("http://127.0.0.1:9", f"file://{tmp_path / 'bucket'}") + ["--backoff-cap", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN))
    time.sleep(3.0)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    asked = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - asked < PROMPT
    assert err.strip().splitlines()[-1].startswith("prime-runs: interrupted: "), err


@pytest.mark.slow
def test_a_stopped_follower_says_what_it_left_unfinished(tmp_path: Path, server) -> None:
    """``--follow`` stopped by SIGINT exits 0 (its documented end), but it did so without a
    word, though one run was never pushed (the platform down) while another was synced."""
    build_run(tmp_path / "down" / "run", "follow-stop-down", 3)
    build_run(tmp_path / "up" / "run", "follow-stop-up", 3)
    cases = (("down", "http://127.0.0.1:9", "stderr", "; try 2 in ", 0), ("up", server.base_url, "stdout", "synced ", 1))
    for place, base_url, stream, sign, finished in cases:
        proc = subprocess.Popen(sync_cmd(base_url, str(tmp_path / place), "--follow"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env(PRIME_API_KEY=TOKEN))
        before = []  # what the stream said until the sign: a retry told, or the run synced
        for line in getattr(proc, stream):
            before.append(line)
            if sign in line:
                break
        assert proc.poll() is None, before
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        err = "".join(before) + err if stream == "stderr" else err
        assert proc.returncode == 0, err
        assert err.strip().splitlines()[-1] == (
            f"prime-runs: stopped following: {finished} run{'' if finished == 1 else 's'} finished, "
            f"{1 - finished} not yet; the state is saved, carry on with (or add --follow): "
            f"prime-runs sync {tmp_path / place} --base-url {base_url}"), err


class SlowThirdPush(FaultProxy):
    """Forwards every request untouched but the third samples push, whose answer comes
    4 s after the platform committed it: longer than the stop's grace."""

    pushes: list[int]

    def _decide(self, request: object) -> str:
        if getattr(request, "method", "") != "POST" or not getattr(request, "target", "").endswith("/samples"):
            return NO_FAULT
        self.pushes.append(len(json.loads(getattr(request, "body"))["samples"]))
        if len(self.pushes) != 3:
            return NO_FAULT
        self.delay = 4.0
        return "delay_after"


@pytest.mark.slow
def test_a_sync_stopped_while_a_request_is_out_says_what_it_pushed_before(tmp_path: Path, server, api) -> None:
    """The grace ends with a push still on the wire: the pass is not waited for, yet the
    run's report and the last line still count the pushes answered before it, not 0."""
    builder = build_run(tmp_path / "outputs" / "run", "sigint-in-flight", 12, size=600)
    with SlowThirdPush(server.base_url) as proxy:
        proxy.pushes = []
        proc = start_sync(proxy.base_url, str(tmp_path / "outputs"), "--max-request-bytes", "4096", "--json")
        while len(proxy.pushes) < 3:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    answered = sum(proxy.pushes[:2])
    assert proc.returncode == 130, err
    [report] = json.loads(out)["runs"]
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("interrupted", answered, answered)
    assert f", {answered} pushed by this sync;" in err.strip().splitlines()[-1], err
    final = run_sync(server.base_url, str(tmp_path / "outputs"))
    assert final.returncode == 0, final.stderr
    assert_exactly_once(api, builder)


class HeldEvaluationsRequest(FaultProxy):
    """Forwards every request, and holds the answer of the ``held``-th ``method`` request to
    the evaluations (counted in ``seen``) for ``delay`` seconds, once."""

    method = ""
    held = 0
    seen = 0

    def _decide(self, request: object) -> str:
        if getattr(request, "method", "") != self.method or "/evaluations" not in getattr(request, "target", ""):
            return NO_FAULT
        self.seen += 1
        return "delay_after" if self.seen == self.held else NO_FAULT


class HeldListing(HeldEvaluationsRequest):
    """Holds the answer of the pass's first listing of evaluations (the key check's comes
    first): the pass is reading the platform, nothing announced."""

    method, held = "GET", 2


def _stopped_twice(proxy: HeldEvaluationsRequest, what: str, *args: str, second: signal.Signals = signal.SIGINT,
                   **env: str) -> str:
    """``prime-runs sync WHAT ARGS`` through ``proxy``, stopped by a SIGINT once the request
    it holds is out, then by ``second``: its error output, after it exited 130 at once."""
    proc = subprocess.Popen(sync_cmd(proxy.base_url, what, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(PRIME_API_KEY=TOKEN, **env))
    deadline = time.monotonic() + 60
    while proxy.seen < proxy.held:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    time.sleep(0.2)  # the request is on its way
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)  # the first is handled: the pass waits for the answer
    proc.send_signal(second)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopped at once (second signal)" in err, err
    return err


@pytest.mark.slow
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_sync_stopped_at_once_before_it_sent_anything_costs_the_next_sync_no_wait(
        tmp_path: Path, server, api, second: signal.Signals) -> None:
    """Stopped by a second signal while its pass read the platform (nothing announced, no
    state written), a sync left its copy lock's note "under way" with no state to read, and
    the next sync of the folder waited a whole request lifetime (600 s by default): "the last
    sync of this run, stopped mid-pass, ended with a request that may still land"."""
    builder = build_run(tmp_path / "outputs" / "run", f"stopped-early-{second.name}", 3)
    with HeldListing(server.base_url, delay=30.0) as proxy:
        _stopped_twice(proxy, str(tmp_path / "outputs"), second=second)
        assert not list((tmp_path / "outputs" / "run" / "spool" / "sync").glob("*.json")), "nothing was written"
        final = subprocess.run(sync_cmd(proxy.base_url, str(tmp_path / "outputs")) + ["--request-lifetime", "600"],
                               capture_output=True, text=True, timeout=20, env=child_env(PRIME_API_KEY=TOKEN))
    assert final.returncode == 0, final.stderr
    assert "waiting" not in final.stderr and "in doubt" not in final.stdout, final.stderr + final.stdout
    assert_exactly_once(api, builder)


class HeldCreate(HeldEvaluationsRequest):
    """Holds the answer of the evaluation's creation (announced in the state, in doubt until
    answered)."""

    method, held = "POST", 1


def _leased_run(tmp_path: Path, where: str, name: str) -> tuple[str, Path, RunBuilder]:
    """A run synced through a lease in a file:// store: the store's URL (``where`` "store"),
    or a folder ``prime-runs mirror`` copied there ("mirrored"); what to sync, and the lease."""
    from support.store_runs import mirror_once

    bucket, lease = tmp_path / "bucket", tmp_path / "bucket" / "run" / "spool" / "sync.lease.json"
    if where == "store":
        return f"file://{bucket}", lease, build_run(bucket / "run", name, 3)
    builder = build_run(tmp_path / "outputs" / "run", name, 3)
    bucket.mkdir()
    mirrored = mirror_once(tmp_path / "outputs", f"file://{bucket}")
    assert mirrored.returncode == 0, mirrored.stdout + mirrored.stderr
    return str(tmp_path / "outputs"), lease, builder


#: A lease of seconds, on every machine: one left to expire is free again within a test, and
#: held still while the next sync starts on a loaded machine.
SHORT_LEASE = {"PRIME_RUNS_LEASE_TTL": "10", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}


def _sync(proxy: FaultProxy, what: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sync_cmd(proxy.base_url, what, "--json", *args), capture_output=True, text=True,
                          timeout=60, env=child_env(PRIME_API_KEY=TOKEN, **SHORT_LEASE))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["store", "mirrored"])
def test_a_second_signal_gives_up_a_lease_nothing_in_doubt_needs(tmp_path: Path, server, api, where: str) -> None:
    """Stopped at once by a second signal while its pass read the platform (nothing
    announced), a sync of a store URL, or of a folder mirrored into one, kept the run's lease
    until it expired (a lease lifetime plus the clock skew, about 65 s): the next sync said
    ``skipped`` (or waited, ``--wait``). It gives the lease up on its way out."""
    what, lease, builder = _leased_run(tmp_path, where, f"second-signal-free-{where}")
    with HeldListing(server.base_url, delay=30.0) as proxy:
        _stopped_twice(proxy, what, "--request-lifetime", "600")  # its lease the default 60 s
        assert json.loads(lease.read_bytes())["released"] is True
        final = _sync(proxy, what)
    assert final.returncode == 0, final.stderr
    assert [run["state"] for run in json.loads(final.stdout)["runs"]] == ["synced"], final.stdout
    assert "waiting" not in final.stderr, final.stderr
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_second_signal_with_a_request_in_doubt_leaves_the_lease_to_expire_and_says_so(
        tmp_path: Path, server, api) -> None:
    """Stopped at once while the evaluation's creation was on its way (announced, not
    answered): the lease must keep other syncers off while that request may still land, so
    it is left to expire, and the line says so and for how long; the next sync skips the
    run until then, and once it has expired finds the evaluation created, each row once."""
    what, lease, builder = _leased_run(tmp_path, "store", "second-signal-in-doubt")
    with HeldCreate(server.base_url, delay=30.0) as proxy:
        err = _stopped_twice(proxy, what, "--request-lifetime", "600", **SHORT_LEASE)
        (line,) = [line for line in err.splitlines() if "left to expire" in line]
        assert "sync.lease.json: a request announced under it may still land" in line, line
        assert re.search(r"in about ([6-9]|10) s; until then a sync of the run skips it", line), line
        assert json.loads(lease.read_bytes())["released"] is False
        skipped = _sync(proxy, what)
        assert [run["state"] for run in json.loads(skipped.stdout)["runs"]] == ["skipped"], skipped.stdout
        final = _sync(proxy, what, "--wait")
    assert final.returncode == 0, final.stderr
    assert_exactly_once(api, builder)


def _in_background(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    """``cmd`` run as a shell script runs ``cmd &``: a shell without job control starts it
    with SIGINT ignored. The shell (which waits for it and says its exit code) and its pid."""
    script = '"$@" & echo $!; wait $!; echo "exit=$?"'
    shell = subprocess.Popen(["sh", "-c", script, "sh", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    assert shell.stdout is not None
    return shell, int(shell.stdout.readline())


def _importing_the_command_line(pid: int, deadline: float) -> None:
    """Until the process maps orjson: the command line's modules are being imported, well
    before any command's own signal handler is installed."""
    while "orjson" not in Path(f"/proc/{pid}/maps").read_text():
        assert time.monotonic() < deadline, "the command never got to importing its modules"
        time.sleep(0.002)


@pytest.mark.slow
@pytest.mark.parametrize("follow", [False, True])
def test_a_background_sync_a_script_started_stops_on_sigint(tmp_path: Path, follow: bool) -> None:
    """A script's ``prime-runs sync ... &`` has SIGINT ignored by its shell, and Python kept
    that: ``kill -INT`` sent while it started (seconds under load) was lost, and the sync went
    on, retrying a platform that is down. It takes SIGINT back first thing and ends as after
    Ctrl-C (docs/cli.md, "Ctrl-C"): exit 130, one line, no traceback."""
    build_run(tmp_path / "outputs" / "run", "background-sigint", 3)
    cmd = sync_cmd("http://127.0.0.1:9", str(tmp_path / "outputs")) + ["--backoff-cap", "30"]
    shell, pid = _in_background(cmd + (["--follow"] if follow else []),
                                child_env(PRIME_API_KEY=TOKEN, PRIME_RUNS_RETRY_FOR="10m"))
    try:
        _importing_the_command_line(pid, time.monotonic() + 60)
        signal_ignored = int(re.search(r"SigIgn:\s*(\w+)", Path(f"/proc/{pid}/status").read_text()).group(1), 16)
        subprocess.run(["kill", "-INT", str(pid)], check=True)
        out, err = shell.communicate(timeout=30)
    finally:
        shell.kill()
        subprocess.run(["kill", "-KILL", str(pid)], capture_output=True)
    assert not signal_ignored & (1 << (signal.SIGINT - 1)), "SIGINT still ignored as the command line loads"
    assert out.splitlines()[-1] == "exit=130", out + err
    assert err.strip().splitlines()[-1].startswith("prime-runs: interrupted"), err
    assert "Traceback" not in err, err
