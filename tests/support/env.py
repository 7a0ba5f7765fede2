"""Where this checkout is, and how a child process runs its code.

Subprocesses must import *this* checkout's code, not whatever an editable install points
at, so every child gets ``PYTHONPATH`` set to the repository root.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that runs this checkout's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PRIME_API_KEY", None)
    env.update(extra)
    return env


#: argv prefix that runs the ``prime-runs`` command line from this checkout.
CLI = [sys.executable, "-m", "commands"]

#: A real verifiers 0.4.0 output folder of a completed eval (fixtures/eval_outputs).
VF040 = REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed"
