"""How a run ends: sealed ``completed`` by ``finish``, ``failed``/``cancelled`` by ``abort``,
or ``crashed`` by the exit hook for a run the process left open.

Every way out goes through one :class:`Ending` per run, serialized, so a second caller waits
for the first seal and then does nothing. After the seal, the online shipper is drained.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prime_runs_spool.spool.format import CANCELLED, COMPLETED, CRASHED, FAILED

if TYPE_CHECKING:
    from prime_runs_spool.runner.run import Run

_log = logging.getLogger("prime_runs_spool")

#: A seal's ``error`` is one line of at most this many characters.
ERROR_MAX_CHARS = 500
#: Exceptions that mean the process was stopped rather than the run failing on its own.
INTERRUPTS: tuple[type[BaseException], ...] = (KeyboardInterrupt, asyncio.CancelledError, SystemExit)
#: What a cancelled run's seal records, as prime-runs 0.1.4 does (the interrupt has no message worth keeping).
INTERRUPTED_ERROR = "interrupted"
#: What the exit hook records for a run the process left open.
EXITED_OPEN_ERROR = "the process exited without finishing the run"

OPEN = "open"
#: Between the decision to seal and the seal on disk: appends are already refused.
CLOSING = "closing"


def describe_error(error: BaseException | str) -> str:
    """``Type: message`` on one line, truncated: what a seal records about a failure."""
    if isinstance(error, BaseException):
        message = str(error)
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    else:
        text = str(error)
    text = " ".join(text.split())
    if len(text) > ERROR_MAX_CHARS:
        text = text[: ERROR_MAX_CHARS - 3] + "..."
    return text


def seal_status_for(error: BaseException | str) -> str:
    """``cancelled`` when the process was stopped on purpose (Ctrl-C, SIGTERM raised as
    ``KeyboardInterrupt``, a cancelled task, ``SystemExit``), ``failed`` otherwise.

    As upstream (prime-runs 0.1.4 via verifiers' ``abort_run``): an interrupt is not a
    crash. ``crashed`` is left for a run nobody closed: the exit hook's, or a killed
    process's unsealed segment.
    """
    return CANCELLED if isinstance(error, INTERRUPTS) else FAILED


def seal_error_for(error: BaseException | str) -> str:
    """The seal's one-line ``error``: ``interrupted`` for a cancellation, else ``Type: message``."""
    return INTERRUPTED_ERROR if seal_status_for(error) == CANCELLED else describe_error(error)


class Ending:
    """Seals one run, once. Works on the run's status, appends in flight and summary under
    the run's own lock (``run._cond``): those belong to the run, which admits episodes by them."""

    def __init__(self, run: Run) -> None:
        self._run = run
        #: Serializes finish/abort/the exit hook, so a second caller waits for the first seal.
        self._closing = threading.Lock()
        #: The summary sealed with the run (None until then, and for a run not finished).
        self._final_summary: dict[str, Any] | None = None

    def reset_after_fork(self) -> None:
        """In a forked child (runner/forks.py): a fresh lock, never one a lost thread held."""
        self._closing = threading.Lock()

    def finish(self, summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Run.finish: refuse new appends, wait for those admitted, then seal ``completed``.

        Refusing first is what lets it return while other threads keep logging: waiting for
        "nothing in flight" while still admitting once starved it for good.
        """
        run = self._run
        with self._closing:
            with run._cond:
                if run._status not in (OPEN, CLOSING):  # CLOSING: a finish interrupted while waiting
                    return self._final_summary
                if run._inflight_async and _on_running_loop():
                    raise RuntimeError(
                        "finish() would block the event loop while log_episodes_async calls are "
                        "in flight; await them first, or call finish via asyncio.to_thread"
                    )
                run._status = CLOSING  # from here on, _admit refuses with RunClosedError
                while run._inflight:
                    run._cond.wait()
                final = dict(summary) if summary is not None else run._summary.result()
            try:
                self._seal(COMPLETED, summary=final, error=None)
            finally:
                run._shipping.drain()
            return final

    def close_without_finishing(self, status: str, error: str) -> None:
        """Seal with ``status`` and no summary: sync computes one from the episodes.

        Does not wait for appends in flight: an async append on a cancelled loop may never
        settle. An append that loses the race with the seal raises :class:`RunClosedError`.
        Does nothing in a forked child: the run is its parent's (runner/forks.py).
        """
        run = self._run
        if run._ownership.forked:
            return
        with self._closing:
            with run._cond:
                if run._status not in (OPEN, CLOSING):  # CLOSING: not sealed yet
                    return
            try:
                self._seal(status, summary=None, error=error)
            except Exception as exc:  # the eval is already failing: report, don't mask its error
                _log.warning("run %s could not be sealed %s: %s", run.id, status, describe_error(exc))
            finally:
                run._shipping.drain()

    def _seal(self, status: str, *, summary: dict[str, Any] | None, error: str | None) -> None:
        run = self._run
        with run._cond:
            # Closed before the seal is written, so later logs raise RunClosedError rather
            # than a writer error.
            run._status = CLOSING
        try:
            if run._writer is not None:
                run._writer.seal(status, summary=summary, error=error)
        except BaseException:
            with run._cond:
                run._status = CRASHED  # left unsealed: what every reader will call it
            raise
        finally:
            forget(run)
        with run._cond:
            run._status = status
            self._final_summary = summary
            listeners = run._listeners.snapshot() if run._writer is not None else []
        run._listeners.notify(run, listeners)


def _on_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# -- the exit hook ------------------------------------------------------------------------
#
# A run the process leaves open on a normal exit is sealed crashed, so a reader does not
# have to guess from a missing seal and a released lock. Strong references on purpose: a
# run dropped without finishing must still be sealed, not garbage-collected unsealed.

_open_runs: set[Run] = set()
_open_runs_lock = threading.Lock()


def remember(run: Run) -> None:
    """A run with a spool was opened: seal it at exit unless it ends first."""
    with _open_runs_lock:
        _open_runs.add(run)


def forget(run: Run) -> None:
    with _open_runs_lock:
        _open_runs.discard(run)


def forget_all_after_fork() -> None:
    """In a forked child: the open runs are the parent's, so the child's exit seals none."""
    global _open_runs_lock
    _open_runs_lock = threading.Lock()  # a parent thread may have held it at the fork
    _open_runs.clear()


def _seal_open_runs() -> None:
    with _open_runs_lock:
        runs = list(_open_runs)
    for run in runs:
        run._ending.close_without_finishing(CRASHED, EXITED_OPEN_ERROR)


atexit.register(_seal_open_runs)
