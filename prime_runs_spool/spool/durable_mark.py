"""The durable mark: how many bytes of a segment its live writer has fsync'd.

docs/spool-format.md, section 5, is the contract; this module owns the mark's bytes (twenty
decimal digits and a line feed, overwritten in place) and when they are written.

Why not after every sync, as the first writers did: a ``pwrite`` that follows an fdatasync
changes the mark's mtime, which puts its inode in the journal transaction the segment's
next fdatasync has to commit. Measured on ext4 (docs/benchmarks.md, "The durable mark at
most every 10 ms"), that cost a lone appender about 15-25 µs of kernel time per 25 KB
episode, the biggest cost of the spool's own beyond the work no spool can skip. So the
mark is published at most every :data:`MARK_INTERVAL`: a sync that comes sooner is *owed*,
and one process-wide thread publishes what is owed when the interval ends, so the mark
trails the last sync by at most that interval, and a follower's inotify watch still hears
the write that brings it up to date. ``close`` publishes what is owed at once.

A stale mark only makes a reader wait (it never ships early), so the interval costs a
follower at most 10 ms of latency and costs the writer nothing it promised: an append
still returns only once it is fsync'd.

Not a shared memory map, which would cost even less: a store into a map of a file that
someone truncated is a SIGBUS, which kills the eval, where a ``pwrite`` just writes the
file again; and a store raises no inotify event for a follower.
"""

from __future__ import annotations

import os
import queue
import stat
import threading
import time
import weakref
from pathlib import Path

from prime_runs_spool.spool.layout import FILE_MODE, durable_mark_path_of

#: Seconds between two writes of one segment's mark, at most: a sync within this time of
#: the last write is published when it ends (by the publisher thread), not at once.
MARK_INTERVAL = 0.01

# Looked up through the module, so tests can count the writes (tests/test_durable_mark.py).
_pwrite = os.pwrite


def render(durable: int) -> bytes:
    """The mark's bytes for ``durable`` fsync'd bytes."""
    return b"%020d\n" % durable


def open_mark(path: Path) -> int:
    """Create a new segment's mark file at ``path``; its descriptor, for writing.

    Whatever holds the name is garbage (the segment is new, its writer lock ours): it is
    removed and the file created anew, never opened. Opened, a FIFO there held the writer in
    ``open`` forever (no reader), and a symbolic link had it truncate and overwrite the file
    it points to.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, FILE_MODE)
    except FileExistsError:
        pass
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, flags, FILE_MODE)


def durable_mark(segment: Path) -> int:
    """How many bytes of ``segment`` its live writer has fsync'd (0 when it has not said).

    Read it only after ``reader.writer_alive`` said yes: a dead writer's mark means nothing.
    """
    try:  # non-blocking, and regular files only: a FIFO there held every reader at open forever
        fd = os.open(durable_mark_path_of(segment), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return 0
    try:
        text = os.read(fd, 64) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return 0
    finally:
        os.close(fd)
    try:
        return int(text.strip() or b"0")
    except ValueError:
        return 0


class MarkPublisher:
    """One live writer's durable mark file, written at most every :data:`MARK_INTERVAL`.

    ``synced`` is called by whoever just finished a sync (one flush runs at a time, but the
    publisher thread and ``close`` may write too): every write happens under ``_lock`` and
    writes the newest count then known, so the mark never goes back.
    """

    __slots__ = ("_fd", "_lock", "_durable", "_due", "_owed", "interval", "__weakref__")

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        #: :data:`MARK_INTERVAL`, as it was when the writer opened (benchmarks/durable_mark.py
        #: sets 0 on one writer to measure the mark written after every sync).
        self.interval = MARK_INTERVAL
        self._lock = threading.Lock()
        self._durable = 0
        self._due = 0.0  # monotonic time from which a sync's count is written at once
        self._owed = False  # a count newer than the file's waits for the publisher thread

    def synced(self, durable: int, now: float) -> None:
        """``durable`` bytes are fsync'd as of ``now`` (``time.monotonic()``): write the mark,
        or leave it owed until the interval since the last write ends."""
        lock = self._lock
        lock.acquire()  # not ``with``: about half the cost, once per sync
        try:
            self._durable = durable
            if now >= self._due:
                self._write(now)
                return
            if self._owed:
                return  # the publisher thread already has this mark in its queue
            self._owed = True
            due = self._due
        finally:
            lock.release()
        _publish_later(self, due)

    def publish_owed(self) -> None:
        """Write what is owed (the publisher thread, once the interval ended)."""
        with self._lock:
            if self._owed:
                self._write(time.monotonic())

    def close(self) -> None:
        """Write what is owed and close the file: a closed writer's mark says what it synced."""
        with self._lock:
            if self._owed:
                self._write(time.monotonic())
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def disown(self) -> None:
        """In a forked child: close this process's copy of the file, never writing it (the
        parent's writer owns the mark). The lock may have been held by a thread that was not
        forked, so it is not taken."""
        fd, self._fd = self._fd, None
        self._lock = threading.Lock()
        self._owed = False
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _write(self, now: float) -> None:
        """Write the newest count (``_lock`` held)."""
        self._owed = False
        self._due = now + self.interval
        fd = self._fd
        if fd is None:
            return
        try:
            _pwrite(fd, render(self._durable), 0)
        except OSError:
            pass  # readers then stop at the last mark that was written: later, not wrong


# -- the publisher thread -------------------------------------------------------------------
#
# One daemon thread per process publishes every writer's owed mark, in the order they became
# owed. Each was owed at most MARK_INTERVAL before it is due and is queued in that order, so
# none waits behind another for longer than its own interval: a mark trails the sync that
# made it owed by at most MARK_INTERVAL.

_queue: queue.SimpleQueue[tuple[float, weakref.ref[MarkPublisher]]] | None = None
_queue_pid = 0
_start_lock = threading.Lock()


def _publish_later(mark: MarkPublisher, due: float) -> None:
    jobs = _queue
    if jobs is None or _queue_pid != os.getpid():  # first use, or a forked child's first
        jobs = _start_thread()
    jobs.put((due, weakref.ref(mark)))


def _start_thread() -> queue.SimpleQueue[tuple[float, weakref.ref[MarkPublisher]]]:
    global _queue, _queue_pid
    with _start_lock:
        if _queue is None or _queue_pid != os.getpid():
            jobs: queue.SimpleQueue[tuple[float, weakref.ref[MarkPublisher]]] = queue.SimpleQueue()
            threading.Thread(target=_publish_loop, args=(jobs,), name="spool-durable-marks", daemon=True).start()
            _queue, _queue_pid = jobs, os.getpid()
        return _queue


def _forget_thread() -> None:
    """In a forked child: the publisher thread was not forked, and its lock may be held."""
    global _queue, _start_lock
    _queue = None
    _start_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_thread)


def _publish_loop(jobs: queue.SimpleQueue[tuple[float, weakref.ref[MarkPublisher]]]) -> None:
    while True:
        due, ref = jobs.get()
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        mark = ref()
        if mark is not None:
            mark.publish_owed()
        del mark
