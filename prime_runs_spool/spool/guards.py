"""What keeps a live writer's segment its own: the watch on its lock file, and what a forked
child does with the writers it inherited (docs/spool-format.md, section 5).

Out of the writer because neither is about writing: the lock watch puts back a lock file
(or a durable mark) that someone deleted, so readers do not take a live segment for a
crashed one and an opener does not start a second writer; the fork guard makes every writer
a child inherited refuse to write, so two processes never append to one segment.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import time
import weakref
from pathlib import Path
from typing import Protocol

import filelock

from prime_runs_spool.files import FILE_MODE
from prime_runs_spool.spool.durable_mark import MarkPublisher
from prime_runs_spool.spool.layout import durable_mark_path, lock_path, lock_replacement_path_of

_log = logging.getLogger("prime_runs_spool")

#: Seconds between checks that the lock file (and the durable mark) is still there: one
#: fstat each (see SegmentGuard.check).
LOCK_CHECK_INTERVAL = 0.1


class SegmentGuard:
    """The writer lock of one segment, held while it is written, and the watch on its file.

    A second descriptor on the lock file says, with one fstat, whether the file was deleted
    or replaced; the guard then puts a locked file back, and the durable mark too.
    """

    def __init__(self, run_dir: Path, index: int, segment: Path, lock: filelock.BaseFileLock,
                 mark: MarkPublisher | None) -> None:
        self._run_dir = run_dir
        self._index = index
        self._segment = segment
        self.lock = lock
        self._mark = mark
        #: Where the durable mark is put back (a path made once: a check is due every
        #: LOCK_CHECK_INTERVAL, and building it costs more than the check's fstat calls).
        self._mark_path = durable_mark_path(run_dir, index)
        #: Read-only, on the inode the flock is on (closing it never drops that lock).
        self._watch: int | None = _open_watch(lock_path(run_dir, index))
        #: When :meth:`check` is next due (never, without a watch).
        self.next_check = time.monotonic() + LOCK_CHECK_INTERVAL if self._watch is not None else math.inf
        #: Descriptors of lock files put back after someone deleted ours.
        self._replacements: list[int] = []

    def check(self, now: float) -> None:
        """Put the lock file and the durable mark back if someone deleted or replaced them.
        Never raises for either: they guard readers, and an append must not fail for them."""
        watch = self._watch
        if watch is None:
            return
        self.next_check = now + LOCK_CHECK_INTERVAL
        try:
            if os.fstat(watch).st_nlink == 0:
                self._replace_lock()
        except OSError as exc:
            _log.warning("%s: could not check the writer lock file: %s", self._segment, exc)
        mark = self._mark
        if mark is None:
            return
        try:
            if mark.restore(self._mark_path):
                _log.warning("%s: its durable mark was deleted or replaced while this process wrote the "
                             "segment; put it back", self._segment)
        except OSError as exc:  # a missing mark only makes readers wait
            _log.warning("%s: could not put the durable mark back: %s", self._segment, exc)

    def _replace_lock(self) -> None:
        """Someone deleted our lock file: readers would take the segment for a crashed one and an
        opener would start a second writer. Put a locked file back in its place, atomically."""
        target = lock_path(self._run_dir, self._index)
        fresh = lock_replacement_path_of(self._segment)
        try:
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
        except OSError as exc:
            _log.warning("%s: the writer lock file was deleted and cannot be put back: %s", target, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(fresh, target)
        except OSError as exc:
            os.close(fd)
            _log.warning("%s: the writer lock file was deleted and cannot be put back: %s", target, exc)
            return
        self._replacements.append(fd)
        if self._watch is not None:
            os.close(self._watch)
        self._watch = os.dup(fd)
        _log.warning("%s: the writer lock file was deleted while this process held it; put it back "
                     "(a process that opened the run meanwhile may be writing it too)", target)

    def release(self) -> None:
        """Close the watch and any lock put back, and free the writer lock."""
        for replacement in self._replacements:
            os.close(replacement)
        self._replacements = []
        if self._watch is not None:
            os.close(self._watch)
            self._watch = None
        self.lock.release()

    def disown_after_fork(self) -> None:
        """In a forked child: close this process's copies of the watch and of any lock put back
        (closing a copy never drops a flock the parent's descriptor holds), and never release
        the writer lock: its release would unlock the parent's (flock belongs to the open file,
        which the two share)."""
        for fd in (self._watch, *self._replacements):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._watch = None
        self._replacements = []
        self._mark = None
        self.next_check = math.inf


def _open_watch(path: Path) -> int | None:
    """A read-only descriptor on the lock file just taken (the same inode the flock is on;
    closing it never drops that lock, which belongs to the other descriptor)."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


# -- forks ------------------------------------------------------------------------------


class Inherited(Protocol):
    """What the fork guard asks of a writer's part: the process it belongs to, and how it
    lets go of what a forked child inherited from it."""

    owner_pid: int

    def disown_after_fork(self) -> None: ...


#: Every writer of this process (by its group commit), so a forked child can disown the ones
#: it inherited.
_live: weakref.WeakSet[Inherited] = weakref.WeakSet()


def disown_in_forks(part: Inherited) -> None:
    """Have a forked child call ``part.disown_after_fork()`` as soon as it starts."""
    _live.add(part)


def _disown_inherited() -> None:
    for part in list(_live):
        if part.owner_pid != os.getpid():
            part.disown_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_inherited)
