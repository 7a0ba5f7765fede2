"""A stop event set by a signal handler while the main thread holds the event's lock (inside
``Event.wait``, just before it blocks or just after it wakes): a plain ``threading.Event``
deadlocks the process there; a ``--follow`` given Ctrl-C hung so with one thread on a futex."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.env import child_env

#: The handler runs in the main thread while it holds the event's lock, as it can inside wait.
SCRIPT = """
import os, signal, threading
from prime_runs_spool.signal_event import SignalEvent
event = {factory}()
signal.signal(signal.SIGINT, lambda *_: event.set())
with event._cond:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # bytecodes: the handler runs here, the lock held
        pass
assert event.wait(5)
print("set")
"""


def _run(factory: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run([sys.executable, "-c", SCRIPT.format(factory=factory)], capture_output=True,
                              text=True, timeout=10, env=child_env())
    except subprocess.TimeoutExpired:
        return None


def test_a_signal_event_is_set_by_a_handler_that_interrupts_its_holder() -> None:
    done = _run("SignalEvent")
    assert done is not None and done.returncode == 0 and done.stdout.strip() == "set", done


@pytest.mark.slow
def test_a_plain_event_deadlocks_there_which_is_why() -> None:
    """The control: the same script with ``threading.Event`` never ends."""
    assert _run("threading.Event") is None


def test_every_stop_a_signal_sets_is_a_signal_event() -> None:
    from prime_runs_spool.signal_event import SignalEvent
    from prime_runs_spool.sync.follow import Follower
    from prime_runs_spool.sync.interrupt import Interrupt

    assert isinstance(Interrupt().event, SignalEvent)
    stop_factory = Follower.__dataclass_fields__["stop"].default_factory
    assert isinstance(stop_factory(), SignalEvent)
