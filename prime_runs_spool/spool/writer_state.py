"""What a reader learns about a segment's writer, and what it does for a dead one
(docs/spool-format.md, section 5).

Whether a writer still holds a segment decides how a reader treats its last bytes (a live
writer's may not be durable yet; a dead writer's are fsync'd before they are shipped) and
whether a run has two writers. Kept apart from the reader: the viewer, status and sync ask
these questions without reading any records.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Any

from prime_runs_spool.spool.header import read_header
from prime_runs_spool.spool.layout import list_segments, lock_path_of
from prime_runs_spool.spool.process import process_alive


#: Segments this process made durable, by identity and size: a dead writer's file does not
#: change, so a follower reading it pass after pass syncs it once.
_SYNCED: dict[str, tuple[int, int, int, int]] = {}
_SYNCED_MAX = 4096


def make_durable(path: Path, fd: int | None = None) -> os.stat_result | None:
    """fsync a segment whose writer is gone before its bytes are shipped (docs/spool-format.md,
    section 5, "Reading a dead writer's segment"). A killed writer's last lines can be in
    the page cache only, never fsync'd; a power cut would take them back after a reader
    shipped them. An fsync on a read-only descriptor makes them durable (the kernel writes a
    file's dirty pages whoever asks), so what is read after it cannot be taken back. A
    filesystem that cannot sync (read-only, or no fsync) holds nothing dirty from here; an
    I/O error is raised: the bytes may not be on disk, and must not be shipped as if they were.
    A segment in an object store is never in a page cache here: nothing to do. ``fd``: a
    descriptor of the segment the caller opened to read it (the reader's own), used and left
    open, rather than one opened for the fsync alone; its ``fstat`` is returned, which the
    reader takes the segment's size from (one system call fewer a segment read)."""
    if getattr(path, "open_bytes", None) is not None:
        return None
    if fd is not None:
        return _sync_once(path, fd)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        return _sync_once(path, fd)
    finally:
        os.close(fd)


def _sync_once(path: Path, fd: int) -> os.stat_result:
    """fsync the segment open at ``fd``, unless this process did so since it last changed;
    the segment's ``fstat``, taken first."""
    st = os.fstat(fd)
    key, identity = os.fspath(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if _SYNCED.get(key) == identity:
        return st
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    if len(_SYNCED) >= _SYNCED_MAX:
        _SYNCED.clear()
    _SYNCED[key] = identity
    return st


def writer_alive(segment: Path) -> bool:
    """Whether a live process holds the segment's writer lock.

    Probes with a *shared*, non-blocking flock on a read-only descriptor and drops it at
    once, by closing the descriptor (its own open file, the lock's only holder: no
    ``LOCK_UN`` first, a system call every probe): it conflicts with a writer's exclusive
    lock only, never with another reader, needs no write permission, and never creates a
    file. A segment in an object store answers for itself (no writer lock travels with a
    copied spool: never alive).
    """
    own = getattr(segment, "writer_alive", None)
    if own is not None:
        return bool(own())
    try:  # non-blocking: a FIFO in a lock's place held every reader at open forever
        fd = os.open(lock_path_of(segment), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return process_alive(_header_writer(segment))  # the lock file is gone: section 5
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # no writer locks that: as if it were gone
            return process_alive(_header_writer(segment))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except PermissionError:  # some filesystems report contention as EACCES
            return True
        return False  # the close drops the shared lock
    finally:
        os.close(fd)


def run_writer_alive(run_dir: Path) -> bool:
    """Whether any process still holds a writer lock on one of the run's segments."""
    return any(writer_alive(path) for _, path in list_segments(run_dir))


def held_by_this_process(segment: Path) -> bool:
    """Whether the live writer of ``segment`` is this very process: a run it opened and has
    not finished yet, opened again (a notebook's cell run twice), which no waiting ends."""
    writer = _header_writer(segment)
    return isinstance(writer, dict) and writer.get("pid") == os.getpid() and process_alive(writer)


def lock_deleted_under_writer(segment: Path) -> bool:
    """Whether the segment's lock file is missing while the process its header names is
    alive on this machine (docs/spool-format.md, section 5): someone deleted the lock of a
    live writer, which must still count as live. A header without the process's boot id
    and start time (an older writer, another machine) never counts, nor a segment in an
    object store, which answers for its writer itself (:func:`writer_alive`) and has no lock
    file to lose (``prime-runs status`` and ``verify`` of a bucket holding a live run ended
    in an internal error asking it for one)."""
    if getattr(segment, "writer_alive", None) is not None:
        return False
    if os.path.exists(lock_path_of(segment)):
        return False
    return process_alive(_header_writer(segment))


#: A segment's header never changes once written: its ``writer`` is kept per path and file
#: identity, so a follower polling lock-less copies (CI artifacts) pays a ``stat``, not a read.
_WRITERS: dict[str, tuple[tuple[int, int], Any]] = {}
_WRITERS_MAX = 4096


def _header_writer(segment: Path) -> Any:
    """The ``writer`` of a segment's header, or None when it has no intact header yet."""
    try:
        stat = os.stat(segment)
    except OSError:
        return None
    key, identity = os.fspath(segment), (stat.st_dev, stat.st_ino)
    cached = _WRITERS.get(key)
    if cached is not None and cached[0] == identity:
        return cached[1]
    try:
        header = read_header(segment)
    except OSError:
        return None
    if header is None:
        return None  # not cached: the header may not be durable yet
    if len(_WRITERS) >= _WRITERS_MAX:
        _WRITERS.clear()
    _WRITERS[key] = (identity, header.get("writer"))
    return header.get("writer")
