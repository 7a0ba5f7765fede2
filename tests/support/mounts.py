"""A tmpfs mounted for one test: a small disk to fill, or a read-only file system.

Mounting needs root (CI runs as root); elsewhere the test that asks is skipped, saying why.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs with ``options`` (``size=16m``, ``ro,size=1m``) on ``mount_point``, made if
    missing; unmounted (lazily: a child may still hold it) when the block ends."""
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
