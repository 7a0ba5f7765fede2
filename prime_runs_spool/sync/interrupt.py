"""A stop asked for by a person (Ctrl-C, SIGINT) or a supervisor (SIGTERM), for a sync that is
not following: the first signal ends every pass at its next safe point, a second one ends
the process at once.

Why stopping anywhere is safe: every request is announced in the run's state file before it
is sent (sync/protocol.py), so the state on disk is true at every instant; the next sync
settles whatever the last announcement left in doubt. The safe points are only where a
stopped sync loses the least: before a request is announced (:meth:`Protocol.checkpoint`)
and in every wait (backoff, fence), which is this object's :meth:`sleep`. A request already
on the wire gets :data:`GRACE` seconds to be answered and settled; after that the process
ends with it announced, as a process killed there would, and the kernel drops the sync
locks with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType

from prime_runs_spool.errors import Stopped
from prime_runs_spool.signal_event import SignalEvent
from prime_runs_spool.sync.options import EXIT_INTERRUPTED

#: Seconds the first signal gives a request already on the wire before the process ends with
#: it announced (the person pressed Ctrl-C: "about a second").
GRACE = 1.0


class Interrupt:
    """The stop flag every pass of one sync shares, and the signal handlers that set it."""

    def __init__(self) -> None:
        self.event = SignalEvent()
        #: Monotonic time of the first signal (None: none yet).
        self.asked_at: float | None = None
        self._previous: dict[int, object] = {}
        self._abortable = False

    def is_set(self) -> bool:
        return self.event.is_set()

    def sleep(self, seconds: float) -> None:
        """Every wait of a pass: woken by the stop, which then ends the pass there."""
        if self.event.wait(max(0.0, seconds)):
            raise Stopped

    def ask(self) -> None:
        """Stop: what the first signal does (tests call it directly too)."""
        if self.asked_at is None:
            self.asked_at = time.monotonic()
        self.event.set()

    def grace_left(self) -> float:
        """Seconds left for passes under way to reach a safe point."""
        if self.asked_at is None:
            return GRACE
        return max(0.0, self.asked_at + GRACE - time.monotonic())

    def install(self, on_second: Callable[[], None] | None = None) -> None:
        """Handle SIGINT and SIGTERM in this (the main) thread: the first asks for the stop,
        the second calls ``on_second`` (if given) and ends the process at once with
        :data:`EXIT_INTERRUPTED`, its buffered output flushed as far as it can be."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not self.event.is_set():
                self.ask()
                if self._abortable:
                    raise Stopped
                return
            if on_second is not None:
                try:
                    on_second()
                except Exception:  # noqa: BLE001 - ending now matters more than the line
                    pass
            os._exit(EXIT_INTERRUPTED)

        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, on_signal)

    @contextlib.contextmanager
    def abortable(self) -> Iterator[None]:
        """A block of the main thread that writes nothing (a request that only reads): the
        first signal raises :class:`Stopped` in it at once, instead of waiting for it to end
        (a request blocks until its timeout)."""
        self._abortable = True
        try:
            if self.event.is_set():
                raise Stopped
            yield
        finally:
            self._abortable = False

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()
