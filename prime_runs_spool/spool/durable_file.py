"""A segment's file as its writer writes it: bytes made durable in one system call a flush,
written into NUL padding ahead of the lines (docs/spool-format.md, section 5).

Out of the writer so that one place knows what reaching the disk takes: the descriptor,
where the durable lines end, the padding after them, the positional write flagged
``RWF_DSYNC`` and its fallbacks (a short write, more parts than one call takes, a kernel
or filesystem without the flag), the check that the file still has a name, and the
durable mark published after each flush. Who flushes when, and who waits, is group commit's
(``spool/commit.py``); the lock file's watch is the guard's (``spool/guards.py``), which
this file calls after its syncs and releases when it closes.

A failed write or sync breaks the file for good: after a failed fsync the kernel may have
dropped the dirty pages, so a retry could report lost data as durable.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import NoReturn

from prime_runs_spool.errors import SegmentGoneError
from prime_runs_spool.spool.durable_mark import MarkPublisher
from prime_runs_spool.spool.format import PADDING_BYTES
from prime_runs_spool.spool.guards import SegmentGuard

# The system calls a durable append depends on, looked up through the module so tests can
# inject disk faults and simulate power loss (tests/support/disk.py, test_power_loss.py).
#: Where the kernel has it, a flush is one positional ``pwritev`` with ``RWF_DSYNC`` (Linux
#: 4.7+): it returns once its bytes, and the file size they need, are durable, as a write
#: followed by ``fdatasync`` would, in one system call (see DurableFile._write_synced).
_pwritev = getattr(os, "pwritev", None)
#: 0 where the flag is missing: the file is then written at its position and fdatasync'ed.
_RWF_DSYNC = getattr(os, "RWF_DSYNC", 0) if _pwritev is not None else 0
_writev = os.writev
_pwrite = os.pwrite
_fdatasync = getattr(os, "fdatasync", os.fsync)
#: What a filesystem (or an old kernel) answers to a write flag it does not support.
_FLAG_REFUSED = frozenset(code for code in (getattr(errno, name, None) for name in (
    "EOPNOTSUPP", "ENOTSUP", "EINVAL", "ENOSYS")) if code is not None)
#: The NUL bytes one padding write puts ahead of the lines (see DurableFile._pad).
_PADDING = bytes(PADDING_BYTES)
#: A flush larger than this is not padded: for records that large the bytes, not the journal,
#: are the cost (see DurableFile._pad).
_LARGEST_PADDED_FLUSH = PADDING_BYTES // 8
#: Parts handed to one writev call; Linux refuses more than IOV_MAX (1024).
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024

_monotonic = time.monotonic

_log = logging.getLogger("prime_runs_spool")

#: What a flush writes: the lines' bytes, in order (``format.frame_line``'s parts).
Parts = list[bytes | memoryview]


#: What the kernel adds to the path of ``/proc/self/fd/N`` once file N lost its name.
_DELETED = b" (deleted)"
_readlink = os.readlink


def _proc_link(fd: int, path: Path) -> bytes | None:
    """``/proc/self/fd/N`` for ``fd`` where the kernel has it and it shows ``path`` as it is
    now, named; None otherwise (no procfs, another system): check_names asks ``fstat`` then."""
    link = b"/proc/self/fd/%d" % fd
    try:
        shown = os.readlink(link)
        named = os.stat(path)
        opened = os.fstat(fd)
    except OSError:
        return None
    if shown.endswith(_DELETED) or (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
        return None
    return link


class DurableFile:
    """A new segment's descriptor (opened without ``O_APPEND``), written by one flush at a time.

    Not thread-safe on its own: group commit runs at most one :meth:`write` at a time, and
    :meth:`close` once no write runs. ``durable`` may be read from any thread.
    """

    def __init__(self, fd: int, path: Path, mark: MarkPublisher | None, guard: SegmentGuard | None) -> None:
        self._fd: int | None = fd
        self._path = path
        #: The durable mark (docs/spool-format.md, section 5): how many bytes of the segment
        #: are fsync'd, for readers that must not ship what a power cut could still take back.
        self.mark = mark
        #: Checked after each sync, released on close (see spool/guards.py).
        self.guard = guard
        #: Where the durable lines end. Not the file's size, which counts the padding.
        self.durable = 0
        #: The flag that makes one pwritev durable (see _write_synced); 0: write at the file
        #: position, then fdatasync. Chosen here, dropped if the filesystem refuses it.
        self._dsync = _RWF_DSYNC
        #: The descriptor's link in ``/proc/self/fd``, whose path says whether the file lost its
        #: name (see check_names); None where there is none: the link count says so then.
        self._link = _proc_link(fd, path)
        #: Where the segment's NUL padding ends (see _pad); -1 once the file is padded no more.
        self._padded = 0

    def write(self, parts: Parts, total: int, last: bool) -> None:
        """Write ``parts`` (``total`` bytes) after the durable lines and make them durable;
        then check the files' names, advance ``durable`` and publish it.

        ``last``: the writer is sealing or closing, so no padding may follow these lines,
        not even after a power cut in the middle of their sync (see _unpad); and none is
        put after them, though they grow the file (after a flush too large to pad, say).
        """
        fd = self._fd
        if fd is None:
            raise OSError(f"{self._path} is closed")
        if last:
            if self._padded > self.durable:
                self._unpad(fd, sync=True)
            self._padded = -1
        if self._dsync:  # the common case: one pwritev writes and syncs it all
            self._write_synced(fd, parts, total)
        else:
            if len(parts) <= _IOV_MAX:
                written = _writev(fd, parts)
                if written != total:
                    self._write_rest(fd, parts, written)
            else:
                self._write_rest(fd, parts, None)
            if self.durable + total > self._padded >= 0:  # these lines grew the file: pad ahead
                self._pad(fd, self.durable + total, total)
            _fdatasync(fd)
        now = _monotonic()
        # check_names(now), without the calls: on every flush
        link = self._link
        if _readlink(link).endswith(_DELETED) if link is not None else os.fstat(fd).st_nlink == 0:
            self._gone()
        guard = self.guard
        if guard is not None and now >= guard.next_check:
            guard.check(now)
        self.durable += total
        mark = self.mark
        if mark is not None:
            # Not fsync'd: it only means anything while this process lives (readers ignore
            # it otherwise), and a stale mark only makes a reader wait. At most every
            # MARK_INTERVAL (spool/durable_mark.py says why).
            mark.synced(self.durable, now)

    def check_names(self, now: float | None = None) -> None:
        """Raise :class:`SegmentGoneError` if the segment file lost its name (deleted, its run
        directory deleted, or replaced by another file), then let the guard look at the lock
        file and the mark when it is due. Asked after every flush (one system call against a
        sync's hundreds of microseconds); the guard's at most every LOCK_CHECK_INTERVAL.

        Where the kernel has ``/proc/self/fd``, the descriptor's link there says so: the
        kernel adds `` (deleted)`` to the path of a file that lost the name it was opened by
        (its link count 0, or the name taken by another file). Elsewhere ``fstat`` says so
        by the link count 0. The link costs about 1.9k instructions in Python against
        ``fstat``'s 6.2k, which builds a whole ``stat_result`` for one field."""
        fd = self._fd
        if fd is None:
            return
        link = self._link
        if _readlink(link).endswith(_DELETED) if link is not None else os.fstat(fd).st_nlink == 0:
            self._gone()
        guard = self.guard
        if guard is not None:
            if now is None:
                now = _monotonic()
            if now >= guard.next_check:
                guard.check(now)

    def _gone(self) -> NoReturn:
        raise SegmentGoneError(
            f"{self._path}: the segment file (or its run directory) was deleted or replaced while "
            "this process was writing it; what it appended is unreachable, so the run stops here")

    def close(self, cut: bool) -> None:
        """Cut the padding off (``cut``: not after a disk error, when what the file holds is
        unknown), close the file and the mark, and release the guard. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        mark, self.mark = self.mark, None
        try:
            if cut and self._padded > self.durable:
                self._unpad(fd, sync=False)
        except OSError as exc:
            _log.warning("%s: cannot cut the padding off the segment's end (%s)", self._path, exc)
        finally:  # a KeyboardInterrupt in the cut must not keep the file, the mark or the lock
            os.close(fd)
            try:
                if mark is not None:
                    # Publishes what it still owes first, so it may wait for the publisher
                    # thread's write: a KeyboardInterrupt there must not keep the lock held.
                    mark.close()
            finally:
                guard, self.guard = self.guard, None
                if guard is not None:
                    guard.release()

    def disown_after_fork(self) -> None:
        """In a forked child: close this process's copies of the descriptors, write nothing,
        and never release the guard's lock (see SegmentGuard.disown_after_fork)."""
        if self.mark is not None:
            self.mark.disown()
        if self.guard is not None:
            self.guard.disown_after_fork()
        fd = self._fd
        self._fd = self.mark = self.guard = None  # so close() never reaches the lock
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _write_synced(self, fd: int, parts: Parts, total: int) -> None:
        """Write ``parts`` (``total`` bytes) where the lines end and make them durable, with
        one ``pwritev`` carrying ``RWF_DSYNC`` in the common case, the padding (see _pad)
        after them in the same call when they grow the file.

        Why one call: with a write and then an fdatasync, the thread leading a flush drops
        and takes the GIL twice per flush, and the second take waits behind a busy event
        loop for up to the interpreter's switch interval (5 ms) while the disk idles; an
        async writer's groups then alternate between a few lines and dozens. With the one
        call, 64 asyncio tasks appended 1.07-1.21 times as fast as 64 threads, against
        0.84-0.90 with two (Dec 3, benchmarks/log_episodes.py; docs/benchmarks.md, "64
        asyncio tasks", has today's figure).

        The flag syncs only the bytes that call wrote. So when it comes back short, or there
        are more parts than one call takes, the rest is written without it, the padding
        after them, and one ``fdatasync`` covers the lot. A filesystem that refuses the flag
        gets the same, and the file is written at its position from then on."""
        start = self.durable
        end = start + total
        pad = end > self._padded >= 0
        if pad and total > _LARGEST_PADDED_FLUSH:
            self._padded = end  # too large to pay for padding (see _pad); pad again later
            pad = False
        iov = parts
        if pad:
            iov = parts.copy()
            iov.append(_PADDING)
        written = 0
        if len(iov) <= _IOV_MAX:
            try:
                written = _pwritev(fd, iov, start, self._dsync)  # type: ignore[misc]
            except OSError as exc:
                if exc.errno not in _FLAG_REFUSED:
                    raise
                self._refused_flag(exc)
            else:
                if written == total + (PADDING_BYTES if pad else 0):
                    if pad:
                        self._padded = end + PADDING_BYTES
                    return
                if written <= 0:
                    raise OSError(f"pwritev wrote {written} bytes to {self._path}")
        if written > total:  # the lines whole, the padding in part
            self._padded = start + written
            pad = False
        self._write_rest(fd, parts, min(written, total), start)
        if pad:
            self._pad(fd, end, total)
        if not self._dsync:
            os.lseek(fd, end, os.SEEK_SET)  # where the file position path goes on from
        _fdatasync(fd)

    def _refused_flag(self, exc: OSError) -> None:
        """The filesystem refused ``RWF_DSYNC`` (``exc``; tmpfs and overlays on old kernels):
        this flush and every later one write, then fdatasync."""
        _log.info("%s: the filesystem refuses synced writes (%s); writing, then fdatasync", self._path, exc)
        self._dsync = 0

    def _pad(self, fd: int, end: int, total: int) -> None:
        """Write ``PADDING_BYTES`` of NUL bytes after the lines that end at ``end`` (a flush of
        ``total`` bytes that grew the file), before the flush's fdatasync.

        Why: on ext4 (and XFS) an fdatasync that must also make a new file size durable
        commits the filesystem's journal; one whose bytes all land inside the file, on
        blocks already written, does not. Lines written into padding that is already
        durable are synced 1.36 times as fast (docs/benchmarks.md, "Writing 25 KB into NUL
        padding"). The padding is not data:
        readers take NUL bytes after a segment's last line for padding (docs/spool-format.md,
        sections 4 and 5), and it is cut off before the seal and when the file closes.

        Best effort: the padding is never needed, so a failure to write it (a full disk)
        only stops this file being padded. A flush larger than an eighth of the padding is
        left unpadded: for records that large the bytes, not the journal, are the cost."""
        if total > _LARGEST_PADDED_FLUSH:
            self._padded = end  # pad again once smaller lines grow the file
            return
        try:
            written = _pwrite(fd, _PADDING, end)
        except OSError as exc:
            _log.warning("%s: cannot pad the segment ahead of its lines (%s); appending without padding",
                         self._path, exc)
            self._padded = -1
            return
        self._padded = end + written

    def _unpad(self, fd: int, *, sync: bool) -> None:
        """Cut the padding off the segment's end, where its lines end.

        ``sync``: before a flush writes there (the one that carries the seal), make the cut
        durable first. An fdatasync writes the data, then commits the file's new size: a
        power cut in between brings back the bytes written in place over the padding with
        the size of the last completed sync, so a seal written into a cut not yet synced
        could come back followed by the old padding, which reads as corruption. One more
        sync per segment. At close nothing is written after the cut: it is not synced, and
        a power cut that undoes it leaves padding after the last line, which is no data."""
        os.ftruncate(fd, self.durable)
        self._padded = -1
        if sync:
            _fdatasync(fd)

    def _write_rest(self, fd: int, parts: Parts, written: int | None, offset: int | None = None) -> None:
        """Write what a first write of all ``parts`` left unwritten (``written`` bytes of
        them), or all of them (``None``), without a sync, looping over short writes and
        IOV_MAX chunks: at the file position (``writev``), or, given the ``offset`` where
        ``parts`` begin, at their place in the file (``pwritev``)."""
        start = 0
        if written is not None:
            if written <= 0 and offset is None:
                raise OSError(f"writev wrote {written} bytes to {self._path}")
            start = _skip_written(parts, 0, len(parts), written)
            if offset is not None:
                offset += written
        while start < len(parts):
            chunk = parts[start : start + _IOV_MAX]
            if offset is None:
                written = _writev(fd, chunk)
            else:
                written = _pwritev(fd, chunk, offset)  # type: ignore[misc]
                offset += written
            if written <= 0:
                raise OSError(f"write wrote {written} bytes to {self._path}")
            start = _skip_written(parts, start, start + len(chunk), written)


def _skip_written(parts: Parts, start: int, end: int, written: int) -> int:
    """Skip the parts written whole; keep the unwritten rest of a partly written one.
    Returns the index of the first part not written whole."""
    while start < end:
        part = parts[start]
        size = len(part)
        if written < size:
            parts[start] = memoryview(part)[written:]
            break
        written -= size
        start += 1
    return start
