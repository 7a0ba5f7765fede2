"""Files and folders no spool would make: a folder name that is not UTF-8, a FIFO or a
device where a regular file belongs. Commands must name them, never hang or crash on them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.runs import build_run

#: A folder name that is not UTF-8: Python decodes it to lone surrogates.
ODD_NAME = os.fsdecode(b"run-\xff\xfe")


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    """Two runs side by side: one in a folder whose name is not UTF-8, one plain."""
    root = tmp_path / "runs"
    build_run(root / ODD_NAME, "odd-name-run", 2)
    build_run(root / "plain", "plain-run", 2)
    return root


def not_a_regular_file(path: Path, kind: str) -> None:
    """Put a FIFO (``kind`` "fifo") or a device at ``path``."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:  # a device: /dev/null, not /dev/zero, so that a regression fails without filling memory
        path.symlink_to("/dev/null")
