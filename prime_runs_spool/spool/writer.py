"""The segment writer: durable, group-committed appends to one segment file.

docs/spool-format.md, section 5, is the contract. An append returns only once its line is
written and fdatasync'ed. Concurrent appenders share that cost (group commit): each one
serializes and checksums its record, and builds the part of its line that does not depend
on the sequence number, *outside* any lock (``format.prepare``, ``format.framing_rest``);
under a short mutex it takes its sequence numbers and frames the line's tail
(``format.frame_line``).

At most one flush runs at a time. An appender that finds nobody flushing writes and syncs
its own lines inline (one ``pwritev`` carrying ``RWF_DSYNC``, which returns once they are
durable; where the kernel lacks it, one ``writev`` and one ``fdatasync``; no other thread,
no hand-off).
One that finds a flush in progress adds its lines to the open *batch* and sleeps on its
own lock. When a flush ends, its leader wakes one member of the open batch to flush it;
that new leader closes the batch only when it starts writing, so it takes everything
queued by then (the busier the writer, the bigger the groups). A flushed batch's members
are woken as a chain, each waking the next, so the GIL queue stays short and the next
flush is not stuck behind dozens of woken threads (docs/benchmarks.md has the figures).
An async caller never writes or syncs on its event loop: when nobody is flushing, it
hands the flush to the writer's helper thread (one per writer, started on first use) and
leaves the batch open, so the tasks the loop runs before it next waits join that group;
each flushed batch settles a loop's futures with one call into that loop. The batch and
the waking of its members live in ``spool/commit.py``; this module keeps the segment, its
locks and the flush.

Opening is atomic against another opener: ``create`` holds the run lock while it checks
that the run still has the segments its caller scanned and creates the next one. After
every sync the writer checks that its segment file still has a name (a deleted run
directory raises :class:`SegmentGoneError`), and now and then that its lock file does (a
deleted lock file is put back): docs/spool-format.md, section 5.

A failed write or sync breaks the writer for good: after a failed fsync the kernel may have
dropped the dirty pages, so a retry could report lost data as durable. The caller starts a
new segment (a new ``SegmentWriter``) instead.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import queue
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Union

import filelock

from prime_runs_spool._version import __version__
from prime_runs_spool.errors import RunInUseError, SegmentGoneError, SpoolWriteError, WriterClosedError
from prime_runs_spool.spool.commit import Batch, helper_loop, settle_batch
from prime_runs_spool.spool.durable_mark import MarkPublisher, open_mark
from prime_runs_spool.spool.format import (
    EPISODE,
    FORMAT_VERSION,
    HEADER,
    LINE_ROOM,
    PADDING_BYTES,
    SEAL,
    SEAL_STATUSES,
    WRITER_RECORD_TYPES,
    Payload,
    check_line_fits,
    frame_line,
    framing_rest,
    prepare,
)
from prime_runs_spool.spool.layout import (
    FILE_MODE,
    durable_mark_path,
    ensure_spool_dir,
    list_segments,
    lock_path,
    lock_replacement_path_of,
    run_lock_path,
    segment_path,
)
from prime_runs_spool.spool.process import identity

# The system calls a durable append depends on, looked up through the module so tests can
# inject disk faults and simulate power loss (tests/support/disk.py, test_power_loss.py).
#: Where the kernel has it, a flush is one positional ``pwritev`` with ``RWF_DSYNC`` (Linux
#: 4.7+): it returns once its bytes, and the file size they need, are durable, as a write
#: followed by ``fdatasync`` would, in one system call (see SegmentWriter._write_synced).
_pwritev = getattr(os, "pwritev", None)
#: 0 where the flag is missing: the writer then writes at the file position and fdatasyncs.
_RWF_DSYNC = getattr(os, "RWF_DSYNC", 0) if _pwritev is not None else 0
_writev = os.writev
_pwrite = os.pwrite
#: What a filesystem (or an old kernel) answers to a write flag it does not support.
_FLAG_REFUSED = frozenset(code for code in (getattr(errno, name, None) for name in (
    "EOPNOTSUPP", "ENOTSUP", "EINVAL", "ENOSYS")) if code is not None)
#: The NUL bytes one padding write puts ahead of the lines (see SegmentWriter._pad).
_PADDING = bytes(PADDING_BYTES)
#: A flush larger than this is not padded: for records that large the bytes, not the journal,
#: are the cost (see SegmentWriter._pad).
_LARGEST_PADDED_FLUSH = PADDING_BYTES // 8
_fdatasync = getattr(os, "fdatasync", os.fsync)

#: Parts handed to one writev call; Linux refuses more than IOV_MAX (1024).
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024


#: What ``append_many`` takes: ``(record_type, record)`` or ``(record_type, record, meta)``.
Item = Union[tuple[str, Any], tuple[str, Any, Union[Mapping[str, Any], None]]]

#: A record ready to be numbered: its payload and the line's tail after the sequence number.
_Line = tuple[Payload, bytes]

#: What ``append_many_async`` calls once its records' fate is known: None, or the error.
Settled = Callable[[Union[BaseException, None]], None]

_allocate_lock = threading.Lock
_monotonic = time.monotonic

_log = logging.getLogger("prime_runs_spool")

#: How long an opener waits for another one to finish opening the same run.
RUN_LOCK_TIMEOUT = 30.0
#: Seconds between checks that our lock file is still there (one fstat; see _check_files).
LOCK_CHECK_INTERVAL = 0.1


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _fsync_dir(folder: Path) -> None:
    """Make a new file's *name* durable, not just its content."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """Appends records to one new segment of a run; see the module docstring.

    Thread-safe. Create with :meth:`create`; finish with :meth:`seal` (or :meth:`close`,
    which leaves the segment unsealed, as a crash would).
    """

    def __init__(self, run_dir: Path, run_id: str, index: int, fd: int, lock: filelock.BaseFileLock,
                 mark: MarkPublisher | None = None, prior_episodes: int | None = None) -> None:
        self._run_dir = run_dir
        self._run_id = run_id
        self._index = index
        self._path = segment_path(run_dir, index)
        self._fd: int | None = fd
        self._lock = lock
        #: A second descriptor on the lock file we hold: its link count says, with one
        #: fstat, whether the file was deleted or replaced (docs/spool-format.md, section 5).
        self._lock_watch: int | None = _open_watch(lock_path(run_dir, index))
        self._next_lock_check = time.monotonic() + LOCK_CHECK_INTERVAL
        #: Descriptors of lock files this writer put back after someone deleted its own.
        self._replacement_locks: list[int] = []
        #: Episodes in the run's earlier segments, as the opener counted them (None: not told).
        self._prior_episodes = prior_episodes
        #: The durable mark (docs/spool-format.md, section 5): how many bytes of the segment
        #: are fsync'd, for readers that must not ship what a power cut could still take back.
        self._mark = mark
        self._durable = 0
        #: The flag that makes one pwritev durable (see _write_synced); 0: write at the file
        #: position, then fdatasync. Chosen here, dropped if the filesystem refuses it.
        self._dsync = _RWF_DSYNC
        #: Where the segment's NUL padding ends (see _pad); -1 once the writer pads no more.
        self._padded = 0
        self._segment_id = str(uuid.uuid4())
        self._mutex = threading.Lock()
        # Everything below is guarded by self._mutex.
        #: True from the moment a caller takes the job of flushing until the chain of
        #: flushes ends with nothing queued: at most one flush runs at a time, so lines
        #: reach the file in sequence order.
        self._flushing = False
        #: Lines queued behind the flush in progress; whoever leads it closes it.
        self._open: Batch | None = None
        self._next_seq = 0
        self._episodes = 0
        self._closing = False
        self._failure: OSError | None = None
        #: close() waits on this for the flush chain to end; notified only when _closers > 0.
        self._idle = threading.Condition(self._mutex)
        self._closers = 0
        #: Flushes for the helper thread, which leads groups of async callers; see _start_helper.
        self._jobs: queue.SimpleQueue[Any] | None = None
        #: The process that opened the segment; set in a forked child (see _disown_after_fork).
        self._owner_pid = os.getpid()
        self._forked = False

    # -- creation -------------------------------------------------------------------------

    @classmethod
    def create(cls, run_dir: str | os.PathLike[str], run_id: str, *, expected_last: int | None = None,
               prior_episodes: int | None = None) -> SegmentWriter:
        """Open a new segment of ``run_dir``'s spool: the next free index, locked, with its header durable.

        Holds the run lock throughout (docs/spool-format.md, section 1). ``expected_last``
        is the highest segment index the caller saw when it scanned the run (0: none): if
        the run has another by now, another process opened it meanwhile and this raises
        :class:`RunInUseError` rather than start a second writer. ``prior_episodes``, the
        episodes the caller counted in those segments, goes into the header and the seal,
        so a reader can tell when an earlier segment lost lines.

        The segment lock is taken *before* the file is created, so a reader never sees a
        segment whose writer is alive but unlocked (it would call the run crashed). The file
        itself is created with ``O_CREAT|O_EXCL``: two writers never share a segment.
        """
        run_dir = Path(run_dir)
        ensure_spool_dir(run_dir)
        run_lock = filelock.UnixFileLock(run_lock_path(run_dir), mode=FILE_MODE, thread_local=False)
        try:
            run_lock.acquire(timeout=RUN_LOCK_TIMEOUT)
        except filelock.Timeout:
            raise RunInUseError(
                f"{run_dir}: another process has been opening this run for {RUN_LOCK_TIMEOUT:.0f} s "
                "(it holds the run lock); wait for it, or check that it is not stuck") from None
        try:
            return cls._create_locked(run_dir, run_id, expected_last, prior_episodes)
        finally:
            run_lock.release()

    @classmethod
    def _create_locked(cls, run_dir: Path, run_id: str, expected_last: int | None,
                       prior_episodes: int | None) -> SegmentWriter:
        folder = ensure_spool_dir(run_dir)
        segments = list_segments(run_dir)
        last = segments[-1][0] if segments else 0
        if expected_last is not None and last != expected_last:
            raise RunInUseError(
                f"{run_dir}: another process opened this run at the same time (it now has segment "
                f"{last}, not {expected_last}); two writers would record episodes twice, so this one stops")
        if segments:
            _fsync_file(segments[-1][1])  # what the opener counted there must outlive a power cut
        index = last + 1
        while True:
            lock = filelock.UnixFileLock(lock_path(run_dir, index), mode=FILE_MODE, thread_local=False)
            try:
                lock.acquire(blocking=False)
            except filelock.Timeout:
                index += 1
                continue
            try:
                fd = os.open(
                    segment_path(run_dir, index),
                    # Not O_APPEND: lines go at the file position, and the padding ahead of
                    # them with pwrite (see _pad), which O_APPEND would put at the end.
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                    FILE_MODE,
                )
            except FileExistsError:
                lock.release()
                index = max(index + 1, cls._next_free_index(run_dir))
                continue
            except BaseException:
                lock.release()
                raise
            break
        try:
            mark_fd = open_mark(durable_mark_path(run_dir, index))
        except BaseException:
            os.close(fd)
            lock.release()
            raise
        writer = cls(run_dir, run_id, index, fd, lock, MarkPublisher(mark_fd), prior_episodes)
        _live_writers.add(writer)
        try:
            header = {
                "format_version": FORMAT_VERSION,
                "run_id": run_id,
                "segment_id": writer._segment_id,
                "segment_index": index,
                "created_at": _utc_now(),
                "writer": {"pid": os.getpid(), "hostname": socket.gethostname(), "package_version": __version__,
                           **identity()},
                "prior_episodes": prior_episodes,
            }
            writer._commit([_prepare_item(HEADER, header, None, internal=True)], 0)
            _fsync_dir(folder)
        except BaseException:
            writer._abandon()
            raise
        return writer

    @staticmethod
    def _next_free_index(run_dir: Path) -> int:
        segments = list_segments(run_dir)
        return segments[-1][0] + 1 if segments else 1

    # -- properties -----------------------------------------------------------------------

    @property
    def index(self) -> int:
        return self._index

    @property
    def path(self) -> Path:
        return self._path

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def segment_id(self) -> str:
        return self._segment_id

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record will get."""
        with self._mutex:
            return self._next_seq

    @property
    def episodes(self) -> int:
        """Episode records appended so far (queued or durable)."""
        with self._mutex:
            return self._episodes

    @property
    def durable_bytes(self) -> int:
        """How many of the segment's bytes are fsync'd: where its lines end once no flush is
        in progress. Not the file's size, which counts the padding ahead of them (_pad)."""
        return self._durable

    @property
    def closed(self) -> bool:
        with self._mutex:
            return self._closing or self._failure is not None

    # -- appending ------------------------------------------------------------------------

    def append(self, record_type: str, record: Any, meta: Mapping[str, Any] | None = None) -> int:
        """Append one record; returns its sequence number once the line is durable."""
        return self._commit([_prepare_item(record_type, record, meta)], record_type == EPISODE)

    def append_many(self, items: Iterable[Item]) -> list[int]:
        """Append records as one group (contiguous sequence numbers); returns once all are durable."""
        lines, episodes = self._prepare_items(items)
        if not lines:
            return []
        first = self._commit(lines, episodes)
        return list(range(first, first + len(lines)))

    def append_episodes(self, lines: list[tuple[Payload, bytes]]) -> int:
        """Append episode records as one group; returns the first sequence number once all
        are durable. Each line is given as its prepared payload and its ``framing_rest``
        (``format.episode_rest``): the run builds both, outside this writer's mutex, so
        nothing is serialized here (``append_many`` serializes each meta)."""
        if not lines:
            return self.next_seq
        for payload, rest in lines:  # _checked, without the call
            if len(payload.data) + len(rest) > LINE_ROOM:
                check_line_fits(payload, rest, EPISODE)
        return self._commit(lines, len(lines))

    async def append_async(self, record_type: str, record: Any, meta: Mapping[str, Any] | None = None) -> int:
        """:meth:`append` for asyncio: the event loop never waits on a write or an fsync."""
        return await self._commit_async([_prepare_item(record_type, record, meta)], record_type == EPISODE)

    async def append_many_async(self, items: Iterable[Item], *, on_settled: Settled | None = None) -> list[int]:
        """:meth:`append_many` for asyncio.

        Serializing happens on the loop (orjson: about a millisecond per megabyte); the write
        and the sync happen on a leader thread (a thread caller's, or the writer's helper
        thread when nobody is flushing), which resolves this call's future.

        ``on_settled(error)`` is called exactly once: with ``None`` once the records are
        durable, with the error once they are known not to be (at once when this call fails
        before queueing them). It is called by the thread that settles their group, so it
        is called even when the awaiting task is cancelled (a ``wait_for`` timeout) after the
        records were queued, which does not stop them reaching the disk.
        """
        first, count = await self._append_prepared_async(lambda: self._prepare_items(items), on_settled)
        return list(range(first, first + count))

    async def append_episodes_async(self, lines: list[tuple[Payload, bytes]], *,
                                    on_settled: Settled | None = None) -> int:
        """:meth:`append_episodes` for asyncio; ``on_settled`` as for :meth:`append_many_async`.
        Returns the first sequence number (the next one when ``lines`` is empty)."""
        first, count = await self._append_prepared_async(lambda: (_checked(lines), len(lines)), on_settled)
        return first if count else self.next_seq

    async def _append_prepared_async(self, prepare: Callable[[], tuple[list[_Line], int]],
                                     on_settled: Settled | None) -> tuple[int, int]:
        """Queue the lines ``prepare()`` returns (with how many are episodes) and wait for
        them; returns their first sequence number and how many there were (see
        :meth:`append_many_async` for ``on_settled``)."""
        try:
            prepared, episodes = prepare()
            future, first = self._queue_async(prepared, episodes, on_settled) if prepared else (None, 0)
        except BaseException as exc:
            if on_settled is not None:
                on_settled(exc)
            raise
        if future is None:
            if on_settled is not None:
                on_settled(None)
            return 0, 0
        await future
        return first, len(prepared)

    async def _commit_async(self, prepared: list[_Line], episodes: int) -> int:
        future, first = self._queue_async(prepared, episodes, None)
        await future
        return first

    def _queue_async(self, prepared: list[_Line], episodes: int,
                     on_settled: Settled | None) -> tuple[asyncio.Future[None], int]:
        """Number ``prepared`` and queue it in the open batch (no await: nothing can cancel
        it half way); returns the future its flush settles and the first sequence number."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._mutex:
            first, parts = self._number(prepared, episodes)
            batch = self._open
            if batch is None:
                batch = self._open = Batch()
            batch.parts += parts
            batch.futures.append((loop, future))
            if on_settled is not None:
                batch.callbacks.append(on_settled)
            if self._flushing:
                batch = None
            else:
                # Nobody is flushing: the helper thread leads. The batch stays open until
                # the helper starts writing, so the other tasks this loop runs before it
                # next waits join this group instead of each waiting for a sync of its own.
                self._flushing = True
                batch.leader = True
        if batch is not None:
            self._start_helper(self._lead_open, batch)
        return future, first

    def seal(self, status: str, *, summary: Any = None, error: str | None = None) -> int:
        """Write the seal record (the segment's last line), make it durable, and close.

        Returns the seal's sequence number. Appends that race with the seal either get in
        before it or raise :class:`WriterClosedError`.
        """
        if status not in SEAL_STATUSES:
            raise ValueError(f"seal status must be one of {', '.join(SEAL_STATUSES)}, not {status!r}")
        with self._mutex:
            self._check_open()
            data = {
                "status": status,
                "last_seq": self._next_seq - 1,
                "episodes": self._episodes,
                "run_episodes": None if self._prior_episodes is None else self._prior_episodes + self._episodes,
                "finished_at": _utc_now(),
                "summary": summary,
                "error": error,
            }
            seq, parts = self._number([_prepare_item(SEAL, data, None, internal=True)], 0)
            joined = self._join(parts)
            self._closing = True
        self._wait(joined, parts)
        self.close()
        return seq

    def close(self) -> None:
        """Let queued appends finish, then release the segment without sealing it. Idempotent."""
        with self._mutex:
            self._closing = True
            self._closers += 1
            try:
                while self._flushing:
                    self._idle.wait()
            finally:
                self._closers -= 1
            self._release()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- group commit internals -----------------------------------------------------------
    #
    # A caller that finds nobody flushing takes the job itself (``_flushing``) and writes
    # and syncs its own lines inline: a lone appender costs one synced pwritev (see
    # _write_synced; one writev and one fdatasync where the kernel lacks the flag),
    # with no other thread, lock hand-off or wake-up involved. Callers that arrive while a
    # flush is in progress queue their lines in the open batch and sleep on their own lock.
    # When a flush ends, its leader hands the job to one member of the open batch (waking
    # it first, so the disk idles as little as possible) and then wakes its own members.
    # The new leader closes the batch only when it starts writing, so it takes everything
    # queued by then: the busier the writer, the bigger the groups.

    @staticmethod
    def _prepare_items(items: Iterable[Item]) -> tuple[list[_Line], int]:
        """The items' lines, and how many of them are episodes."""
        prepared: list[_Line] = []
        episodes = 0
        for item in items:
            meta = item[2] if len(item) > 2 else None  # type: ignore[misc]
            prepared.append(_prepare_item(item[0], item[1], meta))
            episodes += item[0] == EPISODE
        return prepared, episodes

    def _check_open(self) -> None:
        if self._forked:
            raise WriterClosedError(
                f"{self._path}: this segment is written by process {self._owner_pid}; "
                f"process {os.getpid()}, a fork of it, cannot append to it, seal it or close it"
            )
        if self._failure is not None:
            raise WriterClosedError(
                f"{self._path}: writer is broken by a disk error ({self._failure}); open a new segment"
            )
        if self._closing:
            raise WriterClosedError(f"{self._path}: writer is sealed or closed")

    def _number(self, prepared: list[_Line], episodes: int) -> tuple[int, list[bytes | memoryview]]:
        """Give lines their sequence numbers and frame them (mutex held).

        Returns the first sequence number and the lines' parts. Only the short tail of each
        line (sequence number and checksum) is built here; the rest was prepared outside.
        """
        if self._forked or self._failure is not None or self._closing:
            self._check_open()  # raises
        first = seq = self._next_seq
        parts: list[bytes | memoryview] = []
        for payload, rest in prepared:
            parts += frame_line(payload, seq, rest)
            seq += 1
        self._next_seq = seq
        self._episodes += episodes
        return first, parts

    def _join(self, parts: list[bytes | memoryview]) -> Any:
        """Lead or queue ``parts`` (mutex held): None if the caller must flush them itself,
        else the ``(batch, lock)`` it waits on."""
        if not self._flushing:
            self._flushing = True
            return None
        batch = self._open
        if batch is None:
            batch = self._open = Batch()
        batch.parts += parts
        waiter = _allocate_lock()
        waiter.acquire()
        batch.waiters.append(waiter)
        return batch, waiter, len(batch.waiters)

    def _wait(self, joined: Any, parts: list[bytes | memoryview]) -> None:
        """Return once the lines ``_join`` took are durable; raise if their group failed."""
        if joined is None:
            error = self._lead(None, parts)
        else:
            batch, waiter, after = joined
            interrupted: BaseException | None = None
            while True:  # released when the batch is settled, or when it is ours to lead
                try:
                    waiter.acquire()
                    break
                except BaseException as exc:  # KeyboardInterrupt: others depend on our part
                    interrupted = interrupted or exc
            if batch.leader is waiter:
                self._lead_open(batch)
            elif after < len(batch.waiters):  # no one joins a settled batch: no mutex needed
                batch.waiters[after].release()  # wake the next member (see settle_batch)
            error = batch.error
            if interrupted is not None:
                raise interrupted
        if error is not None:
            raise error

    def _commit(self, prepared: list[_Line], episodes: int) -> int:
        mutex = self._mutex
        leading = False
        try:
            mutex.acquire()  # not ``with``: about half the cost, on every append
            try:
                first, parts = self._number(prepared, episodes)
                if self._flushing:
                    joined = self._join(parts)
                else:  # nobody flushing: ours to write and sync, inline (the lone appender's path)
                    self._flushing = leading = True
                    joined = None
            finally:
                mutex.release()
            if joined is None:
                error = self._lead(None, parts)
                if error is not None:
                    raise error
                return first
        except BaseException as exc:
            # A KeyboardInterrupt between taking the flushing job and _lead's own handling
            # (at _lead's first line, say) left the job taken forever: every later append
            # queued behind a flush that never came, and hung. Our lines were numbered, not
            # written, so the writer cannot go on (their sequence numbers would be a gap):
            # it fails as after a failed flush, and what is queued fails with it.
            if leading and self._failure is None and not isinstance(exc, SpoolWriteError):
                self._lead_failed(None, exc)  # raises exc again (not an OSError)
            raise
        self._wait(joined, parts)
        return first

    def _lead_open(self, batch: Batch) -> None:
        """Close the open ``batch`` (everything queued until now is in it) and flush it."""
        with self._mutex:
            self._open = None
        self._lead(batch, batch.parts)

    def _lead(self, batch: Batch | None, parts: list[bytes | memoryview]) -> SpoolWriteError | None:
        """Write and sync ``parts`` (the caller holds the flushing job), pass the job on to the
        next batch, then settle ``batch`` (``None`` for a lone appender's own lines).

        Returns the error the group failed with (also set on ``batch``), or None."""
        try:
            # Every part written (looping over short writes and IOV_MAX chunks), then one
            # fdatasync; here, not in a method of its own: one call fewer on every append.
            fd = self._fd
            if fd is None:
                raise OSError(f"{self._path} is closed")
            total = sum(map(len, parts))
            if self._closing:
                # The seal (or what comes before it): no padding may follow a seal, not even
                # after a power cut in the middle of its sync (see _unpad); and none is put
                # after it, though it grows the file (after a flush too large to pad, say).
                if self._padded > self._durable:
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
                if self._durable + total > self._padded >= 0:  # these lines grew the file: pad ahead
                    self._pad(fd, self._durable + total, total)
                _fdatasync(fd)
            now = _monotonic()
            # _check_files, its common case inline (once per flush).
            if os.fstat(fd).st_nlink == 0 or (self._lock_watch is not None and now >= self._next_lock_check):
                self._check_files()
            self._durable += total
            mark = self._mark
            if mark is not None:
                # Not fsync'd: it only means anything while this process lives (readers ignore
                # it otherwise), and a stale mark only makes a reader wait. At most every
                # MARK_INTERVAL (spool/durable_mark.py says why).
                mark.synced(self._durable, now)
        except BaseException as exc:
            return self._lead_failed(batch, exc)
        mutex = self._mutex
        mutex.acquire()  # not ``with``: about half the cost, on every flush
        try:
            queued = self._open
            if queued is None:  # the chain ends
                self._flushing = False
                if self._closers:
                    self._idle.notify_all()
            else:
                successor = queued.leader = queued.waiters[0] if queued.waiters else True
        finally:
            mutex.release()
        if queued is not None:
            if successor is True:  # only async callers queued: a helper thread leads them
                self._start_helper(self._lead_open, queued)
            else:
                successor.release()
        if batch is not None:
            settle_batch(batch)
        return None

    def _lead_failed(self, batch: Batch | None, exc: BaseException) -> SpoolWriteError:
        """:meth:`_lead` once its flush raised ``exc``: the writer is broken for good, and the
        group and everything queued behind it fail with the error (raised again when it
        was not a disk error: what reached the disk is unknown)."""
        if isinstance(exc, OSError):
            failure, unexpected = exc, None
        else:
            failure, unexpected = OSError(f"flush interrupted by {type(exc).__name__}: {exc}"), exc
        error = self._write_error(failure)
        with self._mutex:
            queued = self._open
            self._failure = failure
            self._release()
            # The chain ends. A failure fails what is queued too: it can never be written.
            self._open = None
            self._flushing = False
            if self._closers:
                self._idle.notify_all()
        if queued is not None:
            queued.error = error
            settle_batch(queued)
        if batch is not None:
            batch.error = error
            settle_batch(batch)
        if unexpected is not None:
            raise unexpected
        return error

    def _start_helper(self, target: Any, *args: Any) -> None:
        """Hand a flush to the writer's helper thread (started on first use).

        One long-lived thread rather than one per flush: starting a thread costs more than
        syncing a small group, and the helper hands itself the next group without a wake-up.
        At most one flush runs at a time (``_flushing``), so the queue never holds more
        than one job.
        """
        jobs = self._jobs
        if jobs is None:
            with self._mutex:
                jobs = self._jobs
                if jobs is None:
                    jobs = self._jobs = queue.SimpleQueue()
                    threading.Thread(target=helper_loop, args=(jobs,), name=f"spool-seg-{self._index}",
                                     daemon=True).start()
                    weakref.finalize(self, jobs.put, None)  # dropped without close: let it go
        jobs.put((target, args))

    def _write_synced(self, fd: int, parts: list[bytes | memoryview], total: int) -> None:
        """Write ``parts`` (``total`` bytes) where the lines end and make them durable, with
        one ``pwritev`` carrying ``RWF_DSYNC`` in the common case, the padding (see _pad)
        after them in the same call when they grow the file.

        Why one call: with a write and then an fdatasync, the thread leading a flush drops
        and takes the GIL twice per flush, and the second take waits behind a busy event
        loop for up to the interpreter's switch interval (5 ms) while the disk idles; an
        async writer's groups then alternate between a few lines and dozens
        (docs/benchmarks.md, "One system call a flush").

        The flag syncs only the bytes that call wrote. So when it comes back short, or there
        are more parts than one call takes, the rest is written without it, the padding
        after them, and one ``fdatasync`` covers the lot. A filesystem that refuses the flag
        gets the same, and the writer writes at the file position from then on."""
        start = self._durable
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
        durable cost the disk about half (docs/benchmarks.md). The padding is not data:
        readers take NUL bytes after a segment's last line for padding (docs/spool-format.md,
        sections 4 and 5), and the writer cuts it off before its seal and when it closes.

        Best effort: the padding is never needed, so a failure to write it (a full disk)
        only stops this writer padding. A flush larger than an eighth of the padding is
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
        os.ftruncate(fd, self._durable)
        self._padded = -1
        if sync:
            _fdatasync(fd)

    def _write_rest(self, fd: int, parts: list[bytes | memoryview], written: int | None,
                    offset: int | None = None) -> None:
        """Write what a first write of all ``parts`` left unwritten (``written`` bytes of
        them), or all of them (``None``), without a sync, looping over short writes and
        IOV_MAX chunks: at the file position (``writev``), or, given the ``offset`` where
        ``parts`` begin, at their place in the file (``pwritev``)."""
        start = 0
        if written is not None:
            if written <= 0 and offset is None:
                raise OSError(f"writev wrote {written} bytes to {self._path}")
            start = self._skip_written(parts, 0, len(parts), written)
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
            start = self._skip_written(parts, start, start + len(chunk), written)

    @staticmethod
    def _skip_written(parts: list[bytes | memoryview], start: int, end: int, written: int) -> int:
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

    def _check_files(self) -> None:
        """Raise :class:`SegmentGoneError` if our segment file lost its name (deleted, its run
        directory deleted, or replaced by another file: its link count is 0), and put our
        lock file and durable mark back if someone deleted or replaced them. One ``fstat``
        per flush (about 2 µs against a sync's hundreds), the lock's and the mark's at most
        every LOCK_CHECK_INTERVAL."""
        fd = self._fd
        if fd is not None and os.fstat(fd).st_nlink == 0:
            raise SegmentGoneError(
                f"{self._path}: the segment file (or its run directory) was deleted or replaced while "
                "this process was writing it; what it appended is unreachable, so the run stops here")
        watch = self._lock_watch
        if watch is None:
            return
        now = time.monotonic()
        if now < self._next_lock_check:
            return
        self._next_lock_check = now + LOCK_CHECK_INTERVAL
        try:
            if os.fstat(watch).st_nlink == 0:
                self._replace_lock()
        except OSError as exc:  # the lock is a guard for readers; never fail an append for it
            _log.warning("%s: could not check the writer lock file: %s", self._path, exc)
        mark = self._mark
        if mark is None:
            return
        try:
            if mark.restore(durable_mark_path(self._run_dir, self._index)):
                _log.warning("%s: its durable mark was deleted or replaced while this process wrote the "
                             "segment; put it back", self._path)
        except OSError as exc:  # a missing mark only makes readers wait; never fail an append for it
            _log.warning("%s: could not put the durable mark back: %s", self._path, exc)

    def _replace_lock(self) -> None:
        """Someone deleted our lock file: readers would take the segment for a crashed one and an
        opener would start a second writer. Put a locked file back in its place, atomically."""
        target = lock_path(self._run_dir, self._index)
        fresh = lock_replacement_path_of(self._path)
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
        self._replacement_locks.append(fd)
        if self._lock_watch is not None:
            os.close(self._lock_watch)
        self._lock_watch = os.dup(fd)
        _log.warning("%s: the writer lock file was deleted while this process held it; put it back "
                     "(a process that opened the run meanwhile may be writing it too)", target)

    def _write_error(self, failure: OSError) -> SpoolWriteError:
        if isinstance(failure, SegmentGoneError):
            return failure
        error = SpoolWriteError(f"{self._path}: append not durable, segment closed: {failure}")
        error.errno = failure.errno
        return error

    def _release(self) -> None:
        """Close the file, free the writer lock and let the helper thread go (mutex held)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            mark, self._mark = self._mark, None
            try:
                if self._failure is None and self._padded > self._durable:
                    self._unpad(fd, sync=False)  # after a disk error what is in the file is unknown: left
            except OSError as exc:
                _log.warning("%s: cannot cut the padding off the segment's end (%s)", self._path, exc)
            finally:  # a KeyboardInterrupt in the cut must not keep the file, the mark or the lock
                self._close_files(fd, mark)

    def _close_files(self, fd: int, mark: MarkPublisher | None) -> None:
        """The rest of :meth:`_release`: close the segment and its mark, free the writer lock."""
        os.close(fd)
        try:
            if mark is not None:
                # Publishes what it still owes first, so it may wait for the publisher
                # thread's write: a KeyboardInterrupt there must not keep the lock held.
                mark.close()
        finally:
            for replacement in self._replacement_locks:
                os.close(replacement)
            self._replacement_locks = []
            if self._lock_watch is not None:
                os.close(self._lock_watch)
                self._lock_watch = None
            self._lock.release()

    def _disown_after_fork(self) -> None:
        """In a forked child: let go of the parent's segment without touching it.

        The child got copies of the file descriptors and of every lock's state, possibly
        mid-flush in a parent thread that does not exist here. It closes its copies of the
        segment and mark descriptors (the parent's stay open), never writes, seals or
        releases the writer lock (its release would unlock the parent's: flock belongs to
        the open file, which the two share), and gets fresh locks so that nothing here waits
        for a thread that was left behind. Every later call raises WriterClosedError.
        """
        self._mutex = threading.Lock()
        self._idle = threading.Condition(self._mutex)
        self._forked = True
        self._closing = True
        self._flushing = False
        self._open = None
        self._jobs = None  # the helper thread was not forked
        # Its copies of the lock watch and of any replacement lock go too: closing a copy
        # never drops a flock the parent's descriptor holds.
        if self._mark is not None:
            self._mark.disown()
        for fd in (self._fd, self._lock_watch, *self._replacement_locks):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._mark = self._lock_watch = None  # so _release never reaches the lock
        self._replacement_locks = []

    def _abandon(self) -> None:
        with self._mutex:
            self._closing = True
            self._release()


#: Every writer of this process, so a forked child can disown the ones it inherited.
_live_writers: weakref.WeakSet[SegmentWriter] = weakref.WeakSet()


def _disown_inherited_writers() -> None:
    for writer in list(_live_writers):
        if writer._owner_pid != os.getpid():
            writer._disown_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_inherited_writers)


def _open_watch(path: Path) -> int | None:
    """A read-only descriptor on the lock file just taken (the same inode the flock is on;
    closing it never drops that lock, which belongs to the other descriptor)."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _fsync_file(path: Path) -> None:
    """Make an earlier segment's bytes durable (a dead writer's last lines may not be)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _checked(lines: list[_Line]) -> list[_Line]:
    """``lines`` (episodes given with their ``format.episode_rest``), once each is known to fit a line."""
    for payload, rest in lines:
        if len(payload.data) + len(rest) > LINE_ROOM:  # check_line_fits's bound, without the call
            check_line_fits(payload, rest, EPISODE)
    return lines


def _prepare_item(record_type: str, record: Any, meta: Mapping[str, Any] | None, internal: bool = False) -> _Line:
    """Serialize and checksum a record and build its line's fixed tail, outside any lock."""
    if not internal and record_type in WRITER_RECORD_TYPES:
        raise ValueError(f"{record_type!r} records are written by the writer itself")
    rest = framing_rest(record_type, meta)
    # A caller that must see serialization errors before it commits to anything (the run
    # numbers episodes first) hands over a Payload it prepared itself.
    payload = record if isinstance(record, Payload) else prepare(record, record_type)
    check_line_fits(payload, rest, record_type)
    return payload, rest
