"""The writer's system calls, seen the way a test hooks them.

A flush is one ``pwritev`` with ``RWF_DSYNC`` where the kernel has it, else a write at the
file position and an ``fdatasync`` (docs/spool-format.md, section 5). Tests that delay,
gate or fail the *sync*, or record what it made durable, hook ``durable_file._fdatasync``.
``split_synced_writes`` plays each flagged call as what it means: the same positional
write without the flag, then ``durable_file._fdatasync``, looked up when it is called so the
test's own hook runs, whenever it was installed. ``use_position_writes`` makes writers
created afterwards take the path without the flag, so a test can cover both.
``rewrite_writes`` changes what either kind of write is given (short, failing, counted).
``fsynced_files`` records which files were fsync'd.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

from prime_runs_spool.spool import durable_file


class SplitSyncs:
    """Installed by :func:`split_synced_writes`; ``lines_end(fd)`` says where the lines of
    the last write on ``fd`` end (the padding written after them not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, before_write: Callable[[int], None] | None) -> None:
        self._ends: dict[int, int] = {}
        real = os.pwritev

        def pwritev(fd: int, parts: Any, offset: int, flags: int = 0) -> int:
            if before_write is not None:
                before_write(fd)
            written = real(fd, parts, offset)
            lines = sum(len(part) for part in parts if part is not durable_file._PADDING)
            self._ends[fd] = offset + min(written, lines)
            if flags:
                durable_file._fdatasync(fd)
            return written

        monkeypatch.setattr(durable_file, "_pwritev", pwritev)

    def lines_end(self, fd: int) -> int:
        """Where the lines end: the last positional write's end, or the file position (the
        path without the flag writes there)."""
        return max(self._ends.get(fd, 0), os.lseek(fd, 0, os.SEEK_CUR))


def split_synced_writes(monkeypatch: pytest.MonkeyPatch,
                        before_write: Callable[[int], None] | None = None) -> SplitSyncs:
    """Play every ``RWF_DSYNC`` write as a write, then ``durable_file._fdatasync`` (see the module
    docstring); ``before_write(fd)`` runs ahead of each positional write (it may raise)."""
    return SplitSyncs(monkeypatch, before_write)


def use_position_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers created from now on write at the file position, then fdatasync."""
    monkeypatch.setattr(durable_file, "_RWF_DSYNC", 0)


#: Parametrize a test over both ways a flush reaches the disk.
BOTH_PATHS = pytest.mark.parametrize("path", ["one call", "position writes"])


def choose_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Set up ``path`` (a :data:`BOTH_PATHS` value) for writers created afterwards."""
    if path == "position writes":
        use_position_writes(monkeypatch)


def rewrite_writes(monkeypatch: pytest.MonkeyPatch, rewrite: Callable[[int, list[Any]], list[Any]]) -> None:
    """Both writes a flush may make (a ``writev`` at the file position, a ``pwritev`` at an
    offset) write ``rewrite(n, parts)`` in place of ``parts``, ``n`` counting the writes of
    either kind from 1. ``rewrite`` may raise (a failing disk); an empty list writes nothing
    and returns 0 (a write that made no progress)."""
    real_writev, real_pwritev = durable_file._writev, durable_file._pwritev
    calls = 0

    def writev(fd: int, parts: Any) -> int:
        nonlocal calls
        calls += 1
        parts = rewrite(calls, parts)
        return real_writev(fd, parts) if parts else 0

    def pwritev(fd: int, parts: Any, offset: int, flags: int = 0) -> int:
        nonlocal calls
        calls += 1
        parts = rewrite(calls, parts)
        return real_pwritev(fd, parts, offset, flags) if parts else 0

    monkeypatch.setattr(durable_file, "_writev", writev)
    monkeypatch.setattr(durable_file, "_pwritev", pwritev)


def fsynced_files(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every file ``os.fsync`` is called on from now on, as ``(device, inode)``, in order
    (each is still synced): what a test compares with a segment's identity."""
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        synced.append((info.st_dev, info.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
