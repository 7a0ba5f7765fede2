"""A run's calls from a signal handler that interrupted the thread's own ``log_episodes``.

The handler runs on the thread it interrupted, which may hold the run's lock (not
reentrant) or be the one writing the very group a new append would join: a handler's
``log_episodes`` or ``finish`` there waited for itself forever. It is refused with one line
saying what to do instead; ``abort`` (which never raises) seals the run once the
interrupted append is done. Each case runs in a child whose disk write raises the signal
from inside the writer's own flush, so the handler lands in the worst place every time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prime_runs_spool import read_run
from support.env import child_env

_CHILD = textwrap.dedent('''
    import os, signal, sys
    from prime_runs_spool import open_run
    from prime_runs_spool.spool import durable_file

    run = open_run(sys.argv[1], name="handled")
    run.log_episodes([{"id": "first", "ok": True, "traces": []}])
    real = durable_file._pwritev
    def write_then_signal(*args):  # the signal arrives while this thread writes its own group
        written = real(*args)
        os.kill(os.getpid(), signal.SIGUSR1)
        return written
    durable_file._pwritev = write_then_signal
    HANDLER
    signal.signal(signal.SIGUSR1, handler)
    logged = []
    try:
        for i in range(3):
            run.log_episodes([{"id": f"e{i}", "ok": True, "traces": []}])
            logged.append(f"e{i}")
    except Exception as exc:
        print("main:", type(exc).__name__)
    durable_file._pwritev = real
    AFTER
    print("logged:", " ".join(logged))
''')

_LOG_IN_HANDLER = '''
pending = []
def handler(signum, frame):
    try:
        run.log_episodes([{"id": "from-handler", "ok": True, "traces": []}])
    except RuntimeError as exc:
        pending.append("from-handler")
        print("handler:", exc)
'''

_ABORT_IN_HANDLER = '''
def handler(signum, frame):
    run.abort("preempted by the scheduler")
'''


def _child(tmp_path: Path, handler: str, after: str) -> subprocess.CompletedProcess[str]:
    script = _CHILD.replace("HANDLER", handler).replace("AFTER", after)
    try:
        return subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True,
                              env=child_env(), timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung: a call from the handler waited for the append it interrupted")


@pytest.mark.slow
def test_log_episodes_from_a_handler_inside_the_flush_is_refused_not_a_hang(tmp_path: Path) -> None:
    result = _child(tmp_path, _LOG_IN_HANDLER,
                    "run.log_episodes([{'id': e, 'ok': True, 'traces': []} for e in pending]); run.finish()")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith("handler:")]
    assert said and "log_episodes was called on a thread inside the run's own log_episodes or seal" in said[0]
    assert "nothing of this call was done" in said[0] and "set a flag or raise" in said[0]
    assert "logged: e0 e1 e2" in result.stdout
    spool = read_run(tmp_path / "run")
    assert spool.status == "completed" and spool.episodes_count == 5  # first, e0-e2, from-handler


@pytest.mark.slow
def test_abort_from_a_handler_inside_the_flush_seals_once_the_append_is_done(tmp_path: Path) -> None:
    result = _child(tmp_path, _ABORT_IN_HANDLER, "")
    assert result.returncode == 0, result.stderr
    assert "main: RunClosedError" in result.stdout and "logged: e0\n" in result.stdout, result.stdout
    spool = read_run(tmp_path / "run")
    assert spool.status == "failed" and spool.episodes_count == 2  # first, and e0 whose call returned
