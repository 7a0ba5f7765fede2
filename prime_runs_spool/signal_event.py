"""An event a signal handler may set.

``threading.Event.set`` takes the event's lock. A signal handler runs in the main thread
between two bytecodes, possibly while that same thread holds the lock inside
``Event.wait`` (just before it blocks, or just after it wakes): the plain lock is not
reentrant, so the handler waited on its own thread for ever (a ``--follow`` given Ctrl-C
while it waited hung with one thread on a futex). Here the event's lock is reentrant, so
the handler's ``set`` goes through; the wait it interrupted sees the flag at its next look.
"""

from __future__ import annotations

import threading


class SignalEvent(threading.Event):
    """A :class:`threading.Event` whose ``set`` is safe in a signal handler."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())
