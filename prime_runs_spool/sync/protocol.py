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
                 sleep: Callable[[float], None], on_save: Callable[[], None]) -> None:
        #: The state file this sync reads and announces every step in.
        self.path = path
        self.options = options
        self.clock = clock
        self.sleep = sleep
        #: Called after every save, so the report follows the state.
        self.on_save = on_save
        #: The run's sync state: loaded (or started) by the engine before any request.
        self.state: SyncState | None = None

    def save(self) -> None:
        save_state(self.path, self.state)
        self.on_save()

    def acknowledge(self, end: Cursor, rows: int, episodes: int, seal: dict[str, Any] | None = None) -> None:
        """A samples request landed: move the state past it."""
        pending = self.state.in_flight
        if pending is not None and pending.released:
            self.state.released.extend(i for i in pending.released if i not in self.state.released)
        self.state.advance(end, rows, episodes, seal)
        self.state.in_flight = None
        self.save()

    def fence(self, sent_at: float) -> None:
        """Wait until a request sent at ``sent_at`` can no longer be processed."""
        deadline = sent_at + self.options.request_lifetime
        while (remaining := deadline - self.clock()) > 0:
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
        return landed()

    def send_once(self, what: str, in_flight: InFlight, send: Callable[[], Any],
                  landed: Callable[[], bool]) -> Any:
        """Send a request that must not be processed twice: announce it in the state, send it,
        and after a failure resend only once ``landed`` says it did not (and cannot) land.
        Returns the answer, or :data:`LANDED` when it landed but its answer was lost."""
        attempt = 0
        while True:
            sent_at = self.clock()
            self.state.in_flight = in_flight.model_copy(update={"sent_at": sent_at})
            self.save()
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
