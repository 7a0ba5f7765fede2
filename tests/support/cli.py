"""The command line run as a user runs it, in a child process of this checkout, and what its
error output ends with: for tests of what a command says when given something odd."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.env import CLI, child_env


def run_cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout, env=child_env(**env))


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def local_sync(root: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``prime-runs sync --local`` of ``root`` into the database ``db``, to samples, with a
    one-second request lifetime, reporting JSON."""
    return run_cli("sync", "--local", "--db", str(db), "--to", "samples", "--request-lifetime", "1", "--json",
                   str(root), *args)
