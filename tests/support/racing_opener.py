"""A process for tests/test_writer_guards.py: opens a run as soon as a start file appears.

Several of these wait on the same start file, so they call ``open_run`` on the same run
directory within a millisecond of each other. Each logs the same five episodes, holds the
run open a moment (so a late opener finds it live), and prints ``ok`` or ``in-use``.
"""

from __future__ import annotations

import os
import sys
import time

from prime_runs_spool import open_run
from prime_runs_spool.errors import RunInUseError


def main() -> None:
    run_dir, go = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    try:
        run = open_run(run_dir, name="race", environments=["gsm8k"])
    except RunInUseError:
        print("in-use", flush=True)
        return
    run.log_episodes([{"id": f"e{i}", "run": {"type": "eval", "id": run.id}, "ok": True, "traces": []}
                      for i in range(5)])
    time.sleep(0.3)
    run.finish()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
