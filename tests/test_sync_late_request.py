"""A samples request held up between its announcement and its last byte (a process paused
there: SIGSTOP, a swapped-out machine) for over half its lifetime is left unfinished and
announced afresh, never finished late (sync/protocol.py, ``Protocol._in_time``).

Why: every fence of a request (this sync's, or another syncer's that took the run's lease
over while this one was paused) ends a lifetime after the send time its announcement gives;
the platform counts its own deadline from the request's arrival. A paused syncer whose
request went out only once it woke had it committed after another syncer had fenced it,
found it not landed and pushed the same rows (tests/test_sync_store.py, the syncer paused
past its lease: its one evaluation held duplicates).

Real parts: the local platform over real HTTP, the sync's own client and state files; the
pause is a sleep where the client writes the request's head to the socket.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api import deadline
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync import protocol as protocol_module
from prime_runs_spool.sync.many import sync_run
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Destination
from support.local_client import local_settings
from support.runs import build_run

DEST = Destination(key="late-dest", base_url="http://local")
LIFETIME = 1.0


@pytest.mark.slow
def test_a_request_paused_past_half_its_lifetime_before_its_last_byte_is_announced_and_sent_afresh(
        tmp_path: Path, monkeypatch) -> None:
    events: list = []
    real_save, real_write = protocol_module.save_state, deadline._Stream.write

    def save(path, state):  # noqa: ANN001, ANN202
        real_save(path, state)
        if state.in_flight is not None and state.in_flight.kind == "samples":
            events.append(("announced", repr(state.in_flight.end)))

    def write(self, buffer, timeout=None):  # noqa: ANN001, ANN202
        if bytes(buffer[:5]) == b"POST " and b"/samples" in bytes(buffer[:200]):
            if len([e for e in events if e[0] == "announced"]) == 2 and ("paused",) not in events:
                time.sleep(LIFETIME * 0.6)  # paused after announcing, before sending
                events.append(("paused",))
            events.append(("request",))
        elif len(buffer):
            events.append(("body",))
        real_write(self, buffer, timeout)

    monkeypatch.setattr(protocol_module, "save_state", save)
    monkeypatch.setattr(deadline._Stream, "write", write)
    builder = build_run(tmp_path / "run", "late", 12, size=2_000)
    options = SyncOptions(max_request_bytes=9_000, request_lifetime=LIFETIME)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            report = sync_run(builder.run_dir, client, DEST, options)
        assert report.state == "synced", report.error
        held = httpx.get(f"{platform.base_url}/api/v1/evaluations/{report.evaluation_id}/samples",
                         params={"limit": 1000}).json()["samples"]
    assert [row["sample_id"] for row in held] == builder.ids  # each once, in order
    paused = events.index(("paused",))
    held_up = [e for e in events[:paused] if e[0] == "announced"][-1]
    after = [e for e in events[paused + 1:] if e[0] == "announced"]
    # Its head went out after the pause; its body was never finished: the same rows were
    # announced again (a fresh send time) and sent.
    assert events[paused + 1] == ("request",) and after[0] == held_up, events


class _SuspendAwareTime:
    """The ``time`` module as sync/protocol.py sees it, but with ``monotonic`` behaving as
    Linux's CLOCK_MONOTONIC does across a system suspend (a laptop's lid closed, a VM
    suspended to RAM): it does not count the time the machine was asleep
    (clock_gettime(2): "does not count time that the system is suspended"), while the wall
    clock, which every fence of the request counts in, does."""

    def __init__(self) -> None:
        self.asleep = 0.0

    def monotonic(self) -> float:
        return time.monotonic() - self.asleep

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(time, name)


@pytest.mark.slow
def test_a_request_held_past_half_its_lifetime_by_a_suspend_is_not_finished(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate before a samples body's last byte (``Protocol._in_time``) must leave a body
    unfinished once its announced send time is half a lifetime old: every fence of the
    request (another syncer's that took the lease over, reading ``sent_at`` from the state
    or the lease) ends at ``sent_at + lifetime`` on the wall clock, and the platform counts
    its own half from the head's arrival. The gate measures the hold on ``time.monotonic``,
    which on Linux stops while the machine is suspended: a syncer suspended between
    announcing and sending wakes, sends the head, passes the gate and finishes a request
    whose send time is long past, so a taker that fenced it and pushed its rows again gets
    them twice. Played as tests/test_sync_late_request.py plays a SIGSTOP (0.6 of a 1 s
    lifetime before the head), the pause being a suspend that the monotonic clock did not
    count."""
    lifetime = 1.0
    clock = _SuspendAwareTime()
    events: list = []
    real_save, real_write = protocol_module.save_state, deadline._Stream.write

    def save(path, state):  # noqa: ANN001, ANN202
        real_save(path, state)
        if state.in_flight is not None and state.in_flight.kind == "samples":
            events.append(("announced", repr(state.in_flight.end)))

    def write(self, buffer, timeout=None):  # noqa: ANN001, ANN202
        if bytes(buffer[:5]) == b"POST " and b"/samples" in bytes(buffer[:200]):
            if len([e for e in events if e[0] == "announced"]) == 2 and ("suspended",) not in events:
                time.sleep(lifetime * 0.6)  # the machine asleep after announcing, before sending
                clock.asleep += lifetime * 0.6  # ... which CLOCK_MONOTONIC does not count
                events.append(("suspended",))
            events.append(("request",))
        elif len(buffer):
            events.append(("body",))
        real_write(self, buffer, timeout)

    monkeypatch.setattr(protocol_module, "time", clock)
    monkeypatch.setattr(protocol_module, "save_state", save)
    monkeypatch.setattr(deadline._Stream, "write", write)
    builder = build_run(tmp_path / "run", "suspended", 12, size=2_000)
    options = SyncOptions(max_request_bytes=9_000, request_lifetime=lifetime)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            report = sync_run(builder.run_dir, client, Destination(key="suspend-dest", base_url="http://local"),
                              options)
        assert report.state == "synced", report.error
        held = httpx.get(f"{platform.base_url}/api/v1/evaluations/{report.evaluation_id}/samples",
                         params={"limit": 1000}).json()["samples"]
    assert [row["sample_id"] for row in held] == builder.ids
    suspended = events.index(("suspended",))
    held_up = [e for e in events[:suspended] if e[0] == "announced"][-1]
    after = [e for e in events[suspended + 1:] if e[0] == "announced"]
    # Its body must not have been finished: the same rows announced again (a fresh send time).
    assert after and after[0] == held_up, ("the body held past half its lifetime was finished", events)
