"""A samples request's announcement is written while its body goes out, and is durable
before the body's last byte: the platform, which acts only on a whole request, never acts on
one its state file does not announce (sync/protocol.py, ``Protocol.send_once``).

Real parts: the local platform over real HTTP, the sync's own client and state files; the
state writes are watched (and slowed or failed) where the protocol makes them, the bytes
where the client writes them to the socket.
"""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api import deadline
from prime_runs_spool.sync import protocol as protocol_module
from prime_runs_spool.sync.many import sync_run
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Destination
from support.env import CLI, child_env
from support.local_client import local_settings
from support.runs import build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, evaluations_of, run_sync, sample_ids, server, sync_cmd  # noqa: F401
from prime_runs_spool.platform_api.client import PlatformClient

DEST = Destination(key="alongside-dest", base_url="http://local")
#: Episodes of about 20 KB, cut into requests of about 600 KB: several requests, each
#: body in several pieces (platform_api/client.py, SEND_CHUNK).
EPISODES, SIZE, REQUEST_BYTES = 40, 20_000, 600_000


def _watch(monkeypatch, events: list, *, slow: float = 0.0, fail_at: int | None = None) -> None:
    """Log each state write's end (``("written", kind)``) and each write to a socket
    (``("request",)`` for a request's head, ``("body",)`` for its body's pieces). A samples
    announcement takes ``slow`` seconds; the ``fail_at``-th (1-based) fails as a full disk."""
    real_save = protocol_module.save_state
    samples = []

    def save(path, state, *writer):  # noqa: ANN001, ANN202
        kind = state.in_flight.kind if state.in_flight else None
        if kind == "samples":
            samples.append(path)
            time.sleep(slow)
            if len(samples) == fail_at:
                events.append(("failed", kind))
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(path, state, *writer)
        events.append(("written", kind))

    real_write = deadline._Stream.write

    def write(self, buffer, timeout=None):  # noqa: ANN001, ANN202
        head = bytes(buffer[:5])
        if head in (b"POST ", b"GET /", b"PUT /"):
            events.append(("request",))
        elif len(buffer):  # not the empty write that ends a body of a declared length
            events.append(("body",))
        real_write(self, buffer, timeout)

    monkeypatch.setattr(protocol_module, "save_state", save)
    monkeypatch.setattr(deadline._Stream, "write", write)


def _samples_on(platform: EmbeddedPlatform, evaluation_id: str) -> list[str]:
    """The sample ids the platform holds, read without the client under test."""
    answer = httpx.get(f"{platform.base_url}/api/v1/evaluations/{evaluation_id}/samples",
                       params={"limit": 1000}).json()
    return [s["sample_id"] for s in answer["samples"]]


def _sync(platform: EmbeddedPlatform, run_dir: Path):  # noqa: ANN202
    # A short request lifetime: a pass that ends with a request announced (the one whose
    # announcement failed) has the next pass wait that out first (sync/copies.py).
    options = SyncOptions(max_request_bytes=REQUEST_BYTES, request_lifetime=2.0)
    with PlatformClient(local_settings(platform)) as client:
        return sync_run(run_dir, client, DEST, options)


@pytest.mark.slow
def test_a_samples_announcement_is_written_while_the_body_goes_out_and_before_its_last_byte(
        tmp_path: Path, monkeypatch) -> None:
    events: list = []
    _watch(monkeypatch, events, slow=0.2)
    builder = build_run(tmp_path / "run", "alongside", EPISODES, size=SIZE)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        report = _sync(platform, builder.run_dir)
        assert report.state == "synced", report.error
        held = _samples_on(platform, report.evaluation_id)
    assert len(held) == len(set(held)) == EPISODES  # each row once
    writes = [i for i, event in enumerate(events) if event == ("written", "samples")]
    assert len(writes) >= 3
    for at in writes:
        head = max(i for i in range(at) if events[i] == ("request",))
        later = [i for i in range(at + 1, len(events)) if events[i] == ("request",)]
        tail = events[at + 1:later[0] if later else len(events)]
        # Pieces of its body were on the wire while the announcement was written ...
        assert ("body",) in events[head + 1:at], events[head:at + 1]
        # ... and the last one left only once it was written (durable).
        assert ("body",) in tail, events[head:at + 2]


@pytest.mark.slow
def test_an_announcement_that_cannot_be_written_leaves_its_request_unfinished_and_never_acted_on(
        tmp_path: Path, monkeypatch) -> None:
    events: list = []
    _watch(monkeypatch, events, slow=0.1, fail_at=2)
    builder = build_run(tmp_path / "run", "alongside-full", EPISODES, size=SIZE)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        report = _sync(platform, builder.run_dir)
        assert report.state == "error" and "No space left on device" in str(report.error), report
        first = events.index(("written", "samples"))
        failed = events.index(("failed", "samples"))
        head = max(i for i in range(failed) if events[i] == ("request",))
        assert head > first and ("body",) in events[head + 1:failed]  # its body had begun to go out
        held = _samples_on(platform, report.evaluation_id)
        assert 0 < len(held) < EPISODES  # the first request's rows, none of the second's
        assert report.pushed_now == len(held)

        monkeypatch.undo()  # room again: the next sync carries on
        again = _sync(platform, builder.run_dir)
        assert again.state == "synced", again.error
        held = _samples_on(platform, again.evaluation_id)
    assert again.evaluation_id == report.evaluation_id
    assert len(held) == len(set(held)) == EPISODES  # each row once


#: ``prime-runs sync`` whose second samples announcement stalls, once begun, until the
#: process is killed: the file named by $STALLED says it began.
_STALLING = """
import os, runpy, sys, time
from pathlib import Path
from prime_runs_spool.sync import protocol

real, announced = protocol.save_state, []

def save(path, state, *writer):
    if state.in_flight is not None and state.in_flight.kind == "samples":
        announced.append(path)
        if len(announced) == 2:
            Path(os.environ["STALLED"]).touch()
            time.sleep(120)
    real(path, state, *writer)

protocol.save_state = save
sys.argv = ["prime-runs", *sys.argv[1:]]
runpy.run_module("commands", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_sync_killed_while_an_announcement_is_written_and_its_body_goes_out_is_finished_exactly_once(
        tmp_path: Path, server, api) -> None:  # noqa: F811
    builder = build_run(tmp_path / "outputs" / "run", "alongside-kill", EPISODES, size=SIZE)
    stalled, wrapper = tmp_path / "stalled", tmp_path / "stalling_sync.py"
    wrapper.write_text(_STALLING)
    command = sync_cmd(server.base_url, str(builder.run_dir), "--max-request-bytes", str(REQUEST_BYTES))
    proc = subprocess.Popen([sys.executable, str(wrapper), *command[len(CLI):]], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=child_env(PRIME_API_KEY=TOKEN, STALLED=str(stalled)))
    try:
        deadline = time.monotonic() + 60
        while not stalled.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the sync never reached its second request"
            time.sleep(0.02)
        time.sleep(0.3)  # the body goes out meanwhile, all but its last piece
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (evaluation,) = evaluations_of(api, builder.run_id)
    held = sample_ids(api, evaluation["evaluation_id"])
    assert held == builder.ids[:len(held)] and 0 < len(held) < EPISODES  # the first request's rows only
    done = run_sync(server.base_url, str(builder.run_dir), "--max-request-bytes", str(REQUEST_BYTES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert_exactly_once(api, builder)
