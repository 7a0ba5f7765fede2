"""Shared by the live benchmarks: the local platform as a real process, and an evaluation's
row count read over its API. Not a benchmark itself."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


@contextmanager
def platform() -> Iterator[str]:
    """``prime-runs platform serve`` on a free port; yields its base URL.

    Its database goes to a tmpfs (``/dev/shm``) when there is one: the real platform is
    remote, so its storage must not compete with the eval's spool for this disk's fsyncs.
    """
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None, prefix="prime-runs-bench-") as tmp:
        yield from _serve(Path(tmp) / "platform.db")


def _serve(db: Path) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "commands", "platform", "serve", "--db", str(db), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(15)


def find_evaluation(api: httpx.Client, local_run_id: str, environment: str) -> str | None:
    page = api.get("/api/v1/evaluations/", params={"environment_name": environment, "limit": 100}).json()
    for evaluation in page["evaluations"]:
        if (evaluation.get("metadata") or {}).get("local_run_id") == local_run_id:
            return evaluation["evaluation_id"]
    return None
