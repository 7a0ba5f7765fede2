"""A request held up between its announcement and its last byte (a process paused
there: SIGSTOP, a swapped-out machine) for over half its lifetime is left unfinished and
announced afresh, never finished late (sync/protocol.py, ``Protocol._in_time``).

Why: every fence of a request (this sync's, or another syncer's that took the run's lease
over while this one was paused) ends a lifetime after the send time its announcement gives;
the platform counts its own deadline from the request's arrival. A paused syncer whose
request went out only once it woke had it committed after another syncer had fenced it,
found it not landed and sent it itself (tests/test_sync_store.py, syncers paused past their
lease: rows twice, a second evaluation carrying the run's id, a second finalize).

Real parts: the local platform over real HTTP, the sync's own client and state files; the
pause is a sleep before the gate the request's body passes.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api import deadline
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync import protocol as protocol_module
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.many import sync_run
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Destination
from support.local_client import local_settings
from support.runs import build_run

DEST = Destination(key="late-dest", base_url="http://local")
LIFETIME = 1.0


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


#: Each request announced and sent once: the head that names it, and which announcement of
#: its kind is held.
HELD_REQUESTS = {"samples": (b"/samples", 2), "create": (b"/evaluations/ HTTP", 1), "finalize": (b"/finalize HTTP", 1)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(HELD_REQUESTS))
@pytest.mark.parametrize("held", ["paused", "suspended"])
def test_a_request_held_past_half_its_lifetime_before_its_last_byte_is_announced_and_sent_afresh(
        held: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held 0.6 of a 1 s lifetime between its announcement and the gate its body passes
    (a small request's head leaves with its body, after the gate): by a pause (SIGSTOP, a
    swapped-out machine), or by a suspend of the whole machine, which Linux's monotonic
    clock does not count while the wall clock every fence counts on does. Either way no
    byte of it goes out: the same request is announced again and sent. A batch of rows, the
    evaluation's creation and the finalize alike: each is one a taker may have sent
    meanwhile (tests/test_sync_store.py)."""
    clock = _SuspendAwareTime()
    events: list = []
    real_save, real_write, real_in_time = protocol_module.save_state, deadline._Stream.write, Protocol._in_time
    head, nth = HELD_REQUESTS[kind]

    def save(path, state, *writer):  # noqa: ANN001, ANN202
        real_save(path, state, *writer)
        if state.in_flight is not None and state.in_flight.kind == kind:
            events.append(("announced", repr(dataclasses.replace(state.in_flight, sent_at=0.0))))

    def in_time(self, durable, sent_at, started):  # noqa: ANN001, ANN202
        gate, announced = real_in_time(self, durable, sent_at, started), self.state.in_flight

        def held_first() -> None:
            if (announced.kind == kind and len([e for e in events if e[0] == "announced"]) == nth
                    and ("held",) not in events):
                time.sleep(LIFETIME * 0.6)  # held after announcing, before sending
                if held == "suspended":
                    clock.asleep += LIFETIME * 0.6  # ... which CLOCK_MONOTONIC does not count
                events.append(("held",))
            gate()
        return held_first

    def write(self, buffer, timeout=None):  # noqa: ANN001, ANN202
        if bytes(buffer[:5]) == b"POST " and head in bytes(buffer[:200]):
            events.append(("request",))
        elif len(buffer):
            events.append(("body",))
        real_write(self, buffer, timeout)

    monkeypatch.setattr(Protocol, "_in_time", in_time)
    monkeypatch.setattr(protocol_module, "time", clock)
    monkeypatch.setattr(protocol_module, "save_state", save)
    monkeypatch.setattr(deadline._Stream, "write", write)
    builder = build_run(tmp_path / "run", f"late-{held}-{kind}", 12, size=2_000)
    options = SyncOptions(max_request_bytes=9_000, request_lifetime=LIFETIME)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            report = sync_run(builder.run_dir, client, DEST, options)
        assert report.state == "synced", report.error
        api = f"{platform.base_url}/api/v1/evaluations/"
        evaluations = [e for e in httpx.get(api, params={"limit": 100}).json()["evaluations"]
                       if e["metadata"].get("local_run_id") == builder.run_id]
        rows = httpx.get(f"{api}{report.evaluation_id}/samples", params={"limit": 1000}).json()["samples"]
    assert [e["finalize_count"] for e in evaluations] == [1]  # one evaluation, finalized once
    assert [row["sample_id"] for row in rows] == builder.ids  # each once, in order
    at = events.index(("held",))
    held_up = [e for e in events[:at] if e[0] == "announced"][-1]
    after = [e for e in events[at + 1:] if e[0] == "announced"]
    # Nothing of it went out after the hold: the same request was announced again (a fresh
    # send time), and only then sent.
    assert events[at + 1] == held_up and events[at + 2] == ("request",), ("finished after the hold", events)
    assert after and after[0] == held_up
