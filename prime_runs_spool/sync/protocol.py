"""The exactly-once core of a sync (docs/sync.md): announce, send once, settle, fence.

Invariant, true at every instant a process could die: the platform holds exactly the first
``state.samples_pushed`` rows of the run's row stream on ``state.evaluation_id``, plus at
most the one request that ``state.in_flight`` announces. Every non-idempotent request is
announced in the state file (with its send time) before it is sent, and settled after:

- its answer arrived: the state moves past it;
- it certainly was not processed (connection refused, 429): it is sent again;
- the platform answered an error (500, 503): one read tells whether it acted;
- it is in doubt (timeout, reset, 502, 504, a sync killed mid-request): a read tells if it
  landed; if not, sync waits until it can no longer land (its send time plus the request
  lifetime) and reads again before sending anything.

So nothing is ever sent twice, and nothing is skipped. This module knows no request in
particular: the evaluation (sync/evaluation.py), the samples (sync/reconcile.py, the
engine's push loop) and the finalize call all go through it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import FailureKind, PlatformError, SyncError
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Cursor, InFlight, SyncState, save_state

#: What :meth:`Protocol.send_once` returns for a request that landed but lost its answer.
LANDED = object()


class Protocol:
    """The state file of one run and destination, and the rules for every request it announces."""

    def __init__(self, path: Path, options: SyncOptions, *, clock: Callable[[], float],
                 sleep: Callable[[float], None], on_save: Callable[[], None],
                 monotonic: Callable[[], float] | None = None) -> None:
        #: The state file this sync reads and announces every step in.
        self.path = path
        self.options = options
        #: Wall-clock seconds: only what is written to the state (``in_flight.sent_at``).
        self.clock = clock
        #: This process's monotonic clock: what every wait is measured on (an injected
        #: ``clock`` drives both, so tests can run the protocol on a fake time).
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        self.sleep = sleep
        #: ``(wall, monotonic)`` when the state was read: an announced request from an
        #: earlier process is fenced from here, never by the wall clock alone.
        self._loaded = (clock(), self.monotonic())
        #: ``(sent_at, monotonic)`` of the last request this process sent.
        self._sent: tuple[float, float] | None = None
        #: Set when a request was settled as "did not land" after its fence, so the next
        #: batch resends rows a late commit could duplicate: that batch is checked.
        self.check_next_batch = False
        #: Called after every save, so the report follows the state.
        self.on_save = on_save
        #: The run's sync state: loaded (or started) by the engine before any request.
        self.state: SyncState | None = None

    def save(self) -> None:
        save_state(self.path, self.state)
        self.on_save()

    def loaded(self) -> None:
        """Note that the state was just read: the moment fences of its requests start from."""
        self._loaded = (self.clock(), self.monotonic())

    def acknowledge(self, end: Cursor, rows: int, episodes: int, seal: dict[str, Any] | None = None,
                    last_sample_id: Any = None) -> None:
        """A samples request landed: move the state past it."""
        pending = self.state.in_flight
        if pending is not None and pending.released:
            self.state.released.extend(i for i in pending.released if i not in self.state.released)
        self.state.advance(end, rows, episodes, seal, last_sample_id)
        self.state.in_flight = None
        self.save()

    def fence(self, sent_at: float) -> None:
        """Wait until a request sent at ``sent_at`` (wall clock) can no longer be processed.

        Measured on this process's monotonic clock and never longer than one lifetime: a
        request this process sent is fenced from its own send; one read from the state from
        the moment the state was read, for what is left of its lifetime by the wall clock
        (a ``sent_at`` in the future counts as just sent). docs/sync.md, "Clocks", says what
        a wall clock stepped forward can do.
        """
        lifetime = self.options.request_lifetime
        if self._sent is not None and self._sent[0] == sent_at:
            deadline = self._sent[1] + lifetime
        else:
            wall, mono = self._loaded
            deadline = mono + min(lifetime, max(0.0, sent_at + lifetime - wall))
        while (remaining := deadline - self.monotonic()) > 0:
            self.sleep(min(remaining, 5.0))

    def retry(self, what: str, call: Callable[[], Any]) -> Any:
        """Run an idempotent call, retrying every failure that is not fatal."""
        attempt = 0
        while True:
            try:
                return call()
            except PlatformError as exc:
                attempt += 1
                if exc.kind is FailureKind.FATAL or attempt >= self.options.backoff.max_attempts:
                    raise _give_up(what, exc, attempt) from None
                self.sleep(self.options.backoff.delay(attempt, exc.retry_after))

    def settled(self, sent_at: float, landed: Callable[[], bool], *, in_doubt: bool = True) -> bool:
        """Did a request sent at ``sent_at`` land? Reads once; when it did not and the request
        may still be in flight, waits until it can no longer land and reads again."""
        if landed():
            return True
        if not in_doubt:
            return False
        self.fence(sent_at)
        if landed():
            return True
        self.check_next_batch = True  # a late commit would meet the resend: look after it
        return False

    def send_once(self, what: str, in_flight: InFlight, send: Callable[[], Any],
                  landed: Callable[[], bool]) -> Any:
        """Send a request that must not be processed twice: announce it in the state, send it,
        and after a failure resend only once ``landed`` says it did not (and cannot) land.
        Returns the answer, or :data:`LANDED` when it landed but its answer was lost."""
        attempt = 0
        while True:
            sent_at = self.clock()
            self.state.in_flight = dataclasses.replace(in_flight, sent_at=sent_at)
            self.save()
            self._sent = (sent_at, self.monotonic())
            try:
                return send()
            except PlatformError as exc:
                if exc.kind is FailureKind.FATAL:
                    raise _give_up(what, exc, attempt + 1) from None
                if exc.kind is not FailureKind.NOT_SENT and self.settled(
                        sent_at, landed, in_doubt=exc.kind is FailureKind.IN_DOUBT):
                    return LANDED
                attempt += 1
                if attempt >= self.options.backoff.max_attempts:
                    raise _give_up(what, exc, attempt) from None
                self.sleep(self.options.backoff.delay(attempt, exc.retry_after))


def _give_up(what: str, exc: PlatformError, attempt: int) -> SyncError:
    if exc.kind is FailureKind.FATAL:
        return SyncError(f"{what}: {exc}")
    return SyncError(f"{what}: still failing after {attempt} attempts ({exc}); "
                     "the state is saved, run prime-runs sync again later")
