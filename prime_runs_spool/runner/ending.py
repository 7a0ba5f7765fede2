"""How a run ends: sealed ``completed`` by ``finish``, ``failed``/``cancelled`` by ``abort``,
or by the exit hook for a run the process left open: as ``abort`` would have sealed it for the
uncaught exception that ended the process, else ``crashed``.

Every way out goes through one :class:`Ending` per run, serialized, so a second caller waits
for the first seal and then does nothing. After the seal, the online shipper is drained.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prime_runs_spool.plural import episodes as plural_episodes
from prime_runs_spool.runner.error_line import describe_error
from prime_runs_spool.runner.run_state import CLOSING, OPEN, RunState
from prime_runs_spool.errors import RecordNotSerializableError, RecordTooLargeError
from prime_runs_spool.spool.format import CANCELLED, COMPLETED, CRASHED, FAILED, prepare

if TYPE_CHECKING:
    from prime_runs_spool.runner.forks import Ownership
    from prime_runs_spool.runner.listeners import Listeners
    from prime_runs_spool.runner.shipping import Shipping
    from prime_runs_spool.spool.writer import SegmentWriter

_log = logging.getLogger("prime_runs_spool")

#: Exceptions that mean the process was stopped rather than the run failing on its own.
INTERRUPTS: tuple[type[BaseException], ...] = (KeyboardInterrupt, asyncio.CancelledError, SystemExit)
#: What a cancelled run's seal records, as prime-runs 0.1.4 does (the interrupt has no message worth keeping).
INTERRUPTED_ERROR = "interrupted"
#: What the exit hook records for a run the process left open.
EXITED_OPEN_ERROR = "the process exited without finishing the run"

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
    the run's lock (:class:`RunState`, shared with the run, which admits episodes by them);
    the run's writer, shipper, listeners and owner are handed to it, the run itself only as
    what the listeners are told about."""

    def __init__(self, run_id: str, state: RunState, writer: SegmentWriter | None, shipping: Shipping,
                 listeners: Listeners[Any], ownership: Ownership, subject: object,
                 scrub: Callable[[str], str] = str) -> None:
        self._run_id = run_id
        self._state = state
        self._writer = writer
        self._shipping = shipping
        self._listeners = listeners
        self._ownership = ownership
        self._subject = subject
        #: Serializes finish/abort/the exit hook, so a second caller waits for the first seal.
        self._closing = threading.Lock()
        #: The summary sealed with the run (None until then, and for a run not finished).
        self._final_summary: dict[str, Any] | None = None
        #: Clears an error line of what masking took out of the run's config (Run.abort's own).
        self._scrub = scrub
        #: The uncaught exception already on record when the run was opened: not what ended it.
        self._uncaught_before = _uncaught()

    def reset_after_fork(self) -> None:
        """In a forked child (runner/forks.py): a fresh lock, never one a lost thread held."""
        self._closing = threading.Lock()

    def finish(self, summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Run.finish: refuse new appends, wait for those admitted, then seal ``completed``.

        Refusing first is what lets it return while other threads keep logging: waiting for
        "nothing in flight" while still admitting once starved it for good.
        """
        state = self._state
        if getattr(state.inside, "sealing", False):  # a signal handler's, during this thread's own seal
            raise state.reentered(self._run_id, "finish")
        with self._closing, _sealing(state):
            with state.cond:
                if state.status not in (OPEN, CLOSING):  # CLOSING: a finish interrupted while waiting
                    return self._final_summary
                if state.inflight_async and _on_running_loop():
                    raise RuntimeError(
                        "finish() would block the event loop while log_episodes_async calls are "
                        "in flight; await them first, or call finish via asyncio.to_thread"
                    )
                given = None if summary is None else _checked_summary(summary)
                state.status = CLOSING  # from here on, _admit refuses with RunClosedError
                while state.inflight:
                    state.cond.wait()
                final = given if given is not None else state.summary.result()
                episodes, traces = state.summary.counts
            try:
                self._seal(COMPLETED, summary=final, error=None)
            finally:
                self._shipping.drain()
            if episodes and not traces:  # not verifiers' shape: sync would push nothing, saying nothing
                _log.warning("run %s: none of its %s holds a trace (its 'traces' list): the platform "
                             "gets no sample of them; an episode's rows are its traces (docs/projection.md)",
                             self._run_id, plural_episodes(episodes))
            return final

    def close_without_finishing(self, status: str, error: str) -> None:
        """Seal with ``status`` and no summary: sync computes one from the episodes.

        Does not wait for appends in flight: an async append on a cancelled loop may never
        settle. An append that loses the race with the seal raises :class:`RunClosedError`.
        Does nothing in a forked child: the run is its parent's (runner/forks.py).
        """
        if self._ownership.forked or getattr(self._state.inside, "sealing", False):  # or a handler's, mid-seal
            return
        state = self._state
        with self._closing, _sealing(state):
            with state.cond:
                if state.status not in (OPEN, CLOSING):  # CLOSING: not sealed yet
                    return
            try:
                self._seal(status, summary=None, error=error)
            except Exception as exc:  # the eval is already failing: report, don't mask its error
                _log.warning("run %s could not be sealed %s: %s", self._run_id, status, describe_error(exc))
            finally:
                self._shipping.drain()

    def _seal(self, status: str, *, summary: dict[str, Any] | None, error: str | None) -> None:
        state = self._state
        with state.cond:
            # Closed before the seal is written, so later logs raise RunClosedError rather
            # than a writer error.
            state.status = CLOSING
        try:
            if self._writer is not None:
                self._writer.seal(status, summary=summary, error=error)
        except BaseException:
            with state.cond:
                state.status = CRASHED  # left unsealed: what every reader will call it
            raise
        finally:
            forget(self)
        with state.cond:
            state.status = status
            self._final_summary = summary
            listeners = self._listeners.snapshot() if self._writer is not None else ()
        self._listeners.notify(self._subject, listeners)


def _checked_summary(summary: Any) -> dict[str, Any]:
    """``finish``'s own summary, refused before anything changes when the seal could not
    hold it: refused at the seal, it left the run unsealable in this process (crashed, its
    segment still locked, ``finish`` and ``abort`` doing nothing)."""
    again = ("; the run is still open: finish it again with a summary JSON can hold, or with "
             "none to have it computed from the episodes")
    if not isinstance(summary, Mapping):
        raise TypeError(f"finish(summary=...) takes a mapping (avg_reward, avg_metrics, avg_error), "
                        f"not {type(summary).__name__}{again}")
    given = dict(summary)
    try:
        prepare({"summary": given}, "finish's summary")
    except RecordNotSerializableError as exc:
        raise RecordNotSerializableError(exc.what, exc.field_path, exc.reason + again) from None
    except RecordTooLargeError as exc:
        raise RecordTooLargeError(f"{exc}{again}") from None
    return given


@contextlib.contextmanager
def _sealing(state: RunState) -> Iterator[None]:
    """Marks this thread as sealing the run: a signal handler that interrupts the seal and
    seals again would wait for the lock this thread holds, forever (``Run.abort`` then does
    nothing: the run is being sealed; ``finish`` raises)."""
    state.inside.sealing = True
    try:
        yield
    finally:
        state.inside.sealing = False


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

_open_runs: set[Ending] = set()
_open_runs_lock = threading.Lock()


def remember(ending: Ending) -> None:
    """A run with a spool was opened: seal it at exit unless it ends first."""
    with _open_runs_lock:
        _open_runs.add(ending)


def forget(ending: Ending) -> None:
    with _open_runs_lock:
        _open_runs.discard(ending)


def forget_all_after_fork() -> None:
    """In a forked child: the open runs are the parent's, so the child's exit seals none
    (runner/forks.py disowns the runs themselves)."""
    global _open_runs_lock
    _open_runs_lock = threading.Lock()  # a parent thread may have held it at the fork
    _open_runs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_all_after_fork)


def _uncaught() -> BaseException | None:
    """The uncaught exception that is ending the process, if one is: the interpreter records
    it (``sys.last_value``) before the exit hooks run, whatever ``sys.excepthook`` a library
    put in place. An interactive session records every error it shows there, none of them
    the process's end, so none is read there."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return None
    error = getattr(sys, "last_value", None)
    return error if isinstance(error, BaseException) else None


def out_of_descriptors(error: OSError) -> OSError:
    """``error`` as ``open_run`` raises it: when the process ran out of file descriptors
    (EMFILE), a line saying how many runs it holds open, each keeping its segment's files
    until it ends, and what to do; it was the bare ``Too many open files: '.../seg-000001.durable'``
    of a long-lived process that opened runs and never finished them. Any other as it is."""
    if error.errno != errno.EMFILE:
        return error
    with _open_runs_lock:
        held = len(_open_runs)
    return OSError(errno.EMFILE, f"open_run: this process has no file descriptor left (Too many open files) and "
                                 f"holds {held} run{'s' * (held != 1)} open, each keeping its segment's files until "
                                 f"it ends: finish or abort each run when its eval is done (with open_run(...) as "
                                 f"run:), or raise the limit (ulimit -n)")


def _seal_open_runs() -> None:
    """Seal each run the process left open. Ended by an uncaught exception, it is sealed as
    ``abort`` would have sealed it (``failed`` with the exception's line, ``cancelled`` for an
    interrupt): what happened, as a ``with`` block records it. Else ``crashed``: the process
    exited (``sys.exit`` included) with the run open, nobody saying why."""
    error = _uncaught()
    with _open_runs_lock:
        endings = list(_open_runs)
    for ending in endings:
        if error is not None and error is not ending._uncaught_before:
            ending.close_without_finishing(seal_status_for(error), ending._scrub(seal_error_for(error)))
        else:
            ending.close_without_finishing(CRASHED, EXITED_OPEN_ERROR)


atexit.register(_seal_open_runs)
