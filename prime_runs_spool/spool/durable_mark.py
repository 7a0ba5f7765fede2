"""The durable mark: how many bytes of a segment its live writer has fsync'd.

docs/spool-format.md, section 5, is the contract; this module owns the mark's bytes (twenty
decimal digits and a line feed, overwritten in place) and when they are written.

Why not after every sync, as the first writers did: a ``pwrite`` that follows an fdatasync
changes the mark's mtime, which puts its inode in the journal transaction the segment's
next fdatasync has to commit. Measured on ext4 (docs/benchmarks.md, "The durable mark at
most every 10 ms"), that cost a lone appender about 30 µs of CPU per 25 KB episode (425
against 396 µs), the biggest cost of the spool's own beyond the work no spool can skip. So the
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

from prime_runs_spool.files import FILE_MODE
from prime_runs_spool.spool.layout import durable_mark_path_of

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
    ``open`` forever (no reader), a symbolic link had it truncate and overwrite the file it
    points to, and the mark of a writer whose segment and lock were deleted under it (the run
    then reopened at the same index) was shared with that writer, whose close still wrote
    what it owed there: the new segment's mark ran ahead of its disk.
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

    Read it only after ``writer_state.writer_alive`` said yes: a dead writer's mark means nothing.
    A segment in an object store (``store.source.StoreSegment``) answers for itself: no mark
    travels with a copy, and the mirror copies only durable bytes, so all of it.
    """
    own = getattr(segment, "durable_bytes", None)
    if own is not None:
        return int(own())
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

    __slots__ = ("_fd", "_lock", "_durable", "_due", "_owed", "_restorable", "interval", "__weakref__")

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        #: :data:`MARK_INTERVAL`, as it was when the writer opened (benchmarks/durable_mark.py
        #: sets 0 on one writer to measure the mark written after every sync).
        self.interval = MARK_INTERVAL
        self._lock = threading.Lock()
        self._durable = 0
        self._due = 0.0  # monotonic time from which a sync's count is written at once
        #: When a count newer than the file's waits for the publisher thread: the due time of
        #: the job queued for it (None: nothing owed). A job that finds another due time here
        #: is stale (a sync after it came wrote the mark; what is owed now has its own job).
        self._owed: float | None = None
        self._restorable = True  # False once putting the file back failed: tried once, not every check

    def synced(self, durable: int, now: float) -> None:
        """``durable`` bytes are fsync'd as of ``now`` (``time.monotonic()``): write the mark,
        or leave it owed until the interval since the last write ends."""
        # Stored before the lock: one flush runs at a time, so it only grows, and whoever
        # writes the mark reads it after clearing _owed (see _write).
        self._durable = durable
        owed = self._owed
        if owed is not None and now < owed:
            # A write is queued for later and has not started (it clears _owed first): it
            # will read this count. Most syncs of a busy writer end here, without the lock;
            # one that finds the queued write late takes the lock and writes the mark itself.
            return
        lock = self._lock
        if not lock.acquire(False):  # not ``with``: about half the cost, once per sync
            # The publisher thread is writing the mark (close never overlaps a flush). An
            # append never waits for it: its pwrite can be slow (a journal commit, a network
            # filesystem). It writes this count if it read it; else it is owed from here.
            if self._owed is None:
                due = self._owed = now + self.interval
                self._later(due)
            return
        try:
            if now >= self._due:
                self._write(now)
                return
            if self._owed is not None:
                return  # the publisher thread already has this mark in its queue
            due = self._owed = self._due
        finally:
            lock.release()
        self._later(due)

    def _later(self, due: float) -> None:
        """Have the publisher thread write what is owed at ``due``; when no thread can be
        had, write it now: a sync never fails for the mark's sake."""
        if not _publish_later(self, due):
            self.publish_owed(None)

    def publish_owed(self, due: float | None) -> None:
        """Write what is owed: by the publisher thread, once ``due`` came, if its job is still
        the one for what is owed (else it is stale, and writing early would write the mark
        twice in an interval); ``None``: whatever is owed, now."""
        with self._lock:
            owed = self._owed
            if owed is not None and (due is None or due == owed):
                self._write(time.monotonic())

    def close(self) -> None:
        """Write what is owed and close the file: a closed writer's mark says what it synced."""
        with self._lock:
            if self._owed is not None:
                self._write(time.monotonic())
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def restore(self, path: Path) -> bool:
        """Put the mark file back at ``path`` if someone deleted or replaced it (its link count
        is 0), saying what is durable; True if it did. A reader finds no mark there then (0),
        or another file's: a follower would ship nothing more until the writer ended. Called
        by the writer's file checks, now and then (an ``fstat``)."""
        fd = self._fd
        if fd is None or not self._restorable or os.fstat(fd).st_nlink:
            return False
        self._restorable = False
        fresh = open_mark(path)  # raises OSError: the writer logs it, once
        self._restorable = True
        with self._lock:
            fd = self._fd
            if fd is not None:  # not closed meanwhile
                self._fd = fresh
                self._write(time.monotonic())
        os.close(fresh if fd is None else fd)
        return fd is not None

    def disown(self) -> None:
        """In a forked child: close this process's copy of the file, never writing it (the
        parent's writer owns the mark). The lock may have been held by a thread that was not
        forked, so it is not taken."""
        fd, self._fd = self._fd, None
        self._lock = threading.Lock()
        self._owed = None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _write(self, now: float) -> None:
        """Write the newest count (``_lock`` held). ``_owed`` is cleared *before* the count is
        read: a flush that stores a newer one while this write is under way and finds the
        lock taken then finds nothing owed, and owes it (see :meth:`synced`)."""
        self._owed = None
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


def _publish_later(mark: MarkPublisher, due: float) -> bool:
    """Queue ``mark``'s owed write for ``due``; False when there is no thread to do it."""
    jobs = _queue
    if jobs is None or _queue_pid != os.getpid():  # first use, or a forked child's first
        jobs = _start_thread()
        if jobs is None:
            return False
    jobs.put((due, weakref.ref(mark)))
    return True


def _start_thread() -> queue.SimpleQueue[tuple[float, weakref.ref[MarkPublisher]]] | None:
    """The publisher thread's queue, the thread started if need be; None if it cannot be:
    Python 3.12 starts no thread once the interpreter is shutting down (an atexit seal,
    runner/ending.py), and no Python does past the process's thread limit."""
    global _queue, _queue_pid
    with _start_lock:
        if _queue is None or _queue_pid != os.getpid():
            jobs: queue.SimpleQueue[tuple[float, weakref.ref[MarkPublisher]]] = queue.SimpleQueue()
            try:
                threading.Thread(target=_publish_loop, args=(jobs,), name="spool-durable-marks",
                                 daemon=True).start()
            except Exception:  # RuntimeError: can't start new thread
                return None
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
        mark = None
        try:
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            mark = ref()
            if mark is not None:
                mark.publish_owed(due)
        except BaseException:  # noqa: BLE001 - a MemoryError in one write: the thread ending
            pass  # would leave every later owed mark of the process stale, and print a traceback
        del mark
