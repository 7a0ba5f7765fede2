"""What a run's appends and its ending share: the run's lock, its status and the appends in
flight, in one object of its own.

Both sides are handed this object (runner/run.py admits episodes by it, runner/ending.py
seals by it), so neither reaches into the other: the lock has one owner, and a forked child
replaces it here (runner/forks.py), never inside the run.
"""

from __future__ import annotations

import threading

from prime_runs_spool.content.summary import SummaryAccumulator

OPEN = "open"
#: Between the decision to seal and the seal on disk: appends are already refused.
CLOSING = "closing"


class RunState:
    """A run's status and appends in flight, guarded by ``lock``; ``cond`` is on the lock,
    for ``finish`` to wait for the appends in flight. The append path takes ``lock`` itself
    (a Condition's ``with`` is Python code)."""

    __slots__ = ("lock", "cond", "status", "inflight", "inflight_async", "summary", "inside")

    def __init__(self, summary: SummaryAccumulator) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        #: ``open``, ``closing``, then the seal's status.
        self.status = OPEN
        #: Appends admitted and not settled yet, and those of them made by ``log_episodes_async``.
        self.inflight = 0
        self.inflight_async = 0
        #: The summary of every durable episode of the run, counted as they settle.
        self.summary = summary
        #: Per thread: ``append`` while its ``log_episodes`` runs, and the seal an ``abort``
        #: called meanwhile left for its end (``deferred``): see :meth:`reentered`.
        self.inside = threading.local()

    def reentered(self, run_id: str, what: str) -> RuntimeError:
        """The error for ``what`` called on a thread inside the run's own ``log_episodes``: a
        signal handler that interrupted it. The run's lock is not reentrant and the thread may
        be the one writing the group it would join: it waited for itself forever (a hang)."""
        return RuntimeError(
            f"run {run_id}: {what} was called on a thread inside the run's own log_episodes or seal (a signal "
            "handler that interrupted it), where it would wait for itself forever; nothing of this call "
            "was done: in a signal handler set a flag or raise (KeyboardInterrupt, SystemExit), and log "
            "or finish from the eval's own code")

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock, never one a parent thread held at the fork."""
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
