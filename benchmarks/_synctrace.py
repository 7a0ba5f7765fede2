"""``python -m commands`` with timestamps of a sync's steps, for benchmarks/sync_timeline.py.

Not a benchmark itself: run as the child's main script, it wraps the few calls that mark a
sync's steps (every platform request, every state write, the pass), runs the command, and
writes the events, ``(wall time, process CPU, thread, event, detail)``, as JSON to the file
named by ``$PRIME_RUNS_TRACE`` at exit. Wrapping adds a few microseconds per request.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time

EVENTS: list[tuple[float, float, str, str, str]] = []


def event(name: str, detail: str = "") -> None:
    EVENTS.append((time.time(), time.process_time(), threading.current_thread().name, name, detail))


def _dump() -> None:
    event("exit")
    with open(os.environ["PRIME_RUNS_TRACE"], "w") as out:
        json.dump(EVENTS, out)


def _wrap(owner: type, name: str, label) -> None:  # noqa: ANN001  (label: args -> str)
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        what = label(*args, **kwargs)
        event(f"{what} start")
        try:
            return inner(*args, **kwargs)
        finally:
            event(f"{what} end")

    setattr(owner, name, wrapped)


def main() -> None:
    event("start")
    atexit.register(_dump)
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.sync.engine import RunSync
    from prime_runs_spool.sync.protocol import Protocol

    _wrap(PlatformClient, "_request",
          lambda self, method, path, **_: "samples" if path.endswith("/samples") and method == "POST" else "request")
    _wrap(Protocol, "_write", lambda self: "state write")
    _wrap(RunSync, "run", lambda self: "pass")
    event("imported")
    sys.argv = ["prime-runs", *sys.argv[1:]]
    runpy.run_module("commands", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
