"""A forked child never touches its parent's run (docs/integration.md, "Forked processes").

Evals fork: ``multiprocessing`` pools with the ``fork`` start method, libraries that fork
workers. The child inherits every open :class:`~prime_runs_spool.runner.run.Run`: its
writer, open segment, sequence counter and exit hook. Left alone, a child that logged
interleaved sequence numbers with its parent's, and one that merely exited sealed the
parent's run ``crashed`` under it.

So, in the child (``os.register_at_fork``), every inherited run is marked forked: logging,
``finish`` and ``abort`` then raise :class:`RunForkedError`, or, on the way out (``abort``,
a ``with`` block's exit, the exit hook), do nothing. The child's exit hook forgets them,
and the segment writer disowns its own side (spool/guards.py): nothing written, sealed,
closed or unlocked. The chosen behaviour is an error rather than a segment of the child's
own: a run's segments follow one another, one writer at a time, and a child's segment
would interleave with its parent's under that rule.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

from prime_runs_spool.errors import RunForkedError, RunNotCopyableError

#: The owner of every run of this process, open or not (weakly): those a forked child must disown.
_owners: weakref.WeakSet[Ownership] = weakref.WeakSet()


class Ownership:
    """Which process a run belongs to: the one that opened it. ``after_fork`` holds what
    the run's parts replace in a forked child (the locks a parent thread may have held)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        #: Set in a forked child by the fork hook.
        self.forked = False
        #: Called in a forked child, once the run is marked forked.
        self.after_fork: list[Callable[[], None]] = []
        _owners.add(self)

    def check(self, run_id: str) -> None:
        """Raise :class:`RunForkedError` in a forked child."""
        if self.forked:
            raise RunForkedError(
                f"run {run_id} belongs to process {self.pid}, which opened it; this process "
                f"({os.getpid()}) is a fork of it and cannot log to it, finish it or abort it: "
                "return the episodes to that process (e.g. as the results of the pool's tasks) "
                "and log them there"
            )

    def not_copyable(self, run_id: str) -> RunNotCopyableError:
        """Why a run is not pickled or copied: a spawned process or a pool's worker gets no
        run, a copy here would count apart from the run it writes."""
        return RunNotCopyableError(
            f"run {run_id} cannot be sent to another process or copied (pickled as a pool task's "
            f"argument, say): only process {self.pid}, which opened it, logs to it; return the "
            "episodes to that process (e.g. as the results of the pool's tasks) and log them there"
        )


def _disown_runs_after_fork() -> None:
    """In the child: mark every inherited run forked (runner/ending.py's own fork hook
    forgets it in the exit hook).

    The locks a parent thread may have held at the fork are replaced, never taken: that
    thread does not exist here, and anything waiting for it would wait forever.
    """
    for ownership in list(_owners):
        if ownership.pid != os.getpid():
            ownership.forked = True
            for reset in ownership.after_fork:
                reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_runs_after_fork)
