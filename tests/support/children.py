"""Child processes a test starts (a following sync, a writer) and must not leave behind."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``proc`` for the block; afterwards, if it still runs (a step failed, a wait timed
    out), killed and waited for: a failing test never leaves a syncer behind holding a
    lease, a port or the machine's two cores."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def interrupted(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str, float]:
    """Send ``proc`` a SIGINT (Ctrl-C) and wait for it to end: its output and error output,
    and the seconds it took to stop once told."""
    proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    out, err = proc.communicate(timeout=timeout)
    return out, err, time.monotonic() - began


def all_succeed(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[tuple[str, str]]:
    """What each of ``procs`` (started together, their output piped) printed, stdout then
    stderr, once all have ended; each must have exited 0 (all the output shown if not)."""
    outs = [proc.communicate(timeout=timeout) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs), outs
    return outs
