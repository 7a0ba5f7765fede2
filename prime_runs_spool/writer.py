"""The segment writer: durable, group-committed appends to one segment file.

docs/spool-format.md, section 5, is the contract. An append returns only once its line is
written and fdatasync'ed. Concurrent appenders share that cost (group commit): each one
serializes and checksums its record *outside* any lock (``framing.prepare``), then, under a
short mutex, takes its sequence numbers and adds its line's parts to the open *batch*. The
first member of a batch is its *leader*: it waits for the previous batch's flush to end
(the flush lock), closes its batch, writes all of it with ``os.writev`` and syncs once, then
wakes exactly that batch's members. While one batch is being synced the next one fills up,
so the group size follows the load. Waking only a batch's own members (rather than every
waiter) is what lets 64 threads get near the disk's grouped ceiling (docs/benchmarks.md).
An async caller whose record opens a batch leads it from a short-lived thread, so the
event loop never waits on a disk.

A failed write or sync breaks the writer for good: after a failed fsync the kernel may have
dropped the dirty pages, so a retry could report lost data as durable. The caller starts a
new segment (a new ``SegmentWriter``) instead.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Union

import filelock

from prime_runs_spool._version import __version__
from prime_runs_spool.errors import SpoolWriteError, WriterClosedError
from prime_runs_spool.framing import FORMAT_VERSION, Payload, frame, prepare
from prime_runs_spool.layout import FILE_MODE, ensure_spool_dir, list_segments, lock_path, segment_path

# The two system calls a durable append depends on, looked up through the module so tests
# can inject disk faults and simulate power loss (tests/test_writer.py, test_power_loss.py).
_writev = os.writev
_fdatasync = getattr(os, "fdatasync", os.fsync)

#: Parts handed to one writev call; Linux refuses more than IOV_MAX (1024).
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024

SEAL_STATUSES = ("completed", "failed", "crashed")

#: What ``append_many`` takes: ``(record_type, record)`` or ``(record_type, record, meta)``.
Item = Union[tuple[str, Any], tuple[str, Any, Union[Mapping[str, Any], None]]]

_Prepared = tuple[Payload, str, Union[Mapping[str, Any], None]]


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _fsync_dir(folder: Path) -> None:
    """Make a new file's *name* durable, not just its content."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Batch:
    """Lines that will reach the disk in one writev and one fdatasync."""

    __slots__ = ("parts", "done", "error", "futures")

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.done = threading.Event()
        self.error: SpoolWriteError | None = None
        self.futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []


class SegmentWriter:
    """Appends records to one new segment of a run; see the module docstring.

    Thread-safe. Create with :meth:`create`; finish with :meth:`seal` (or :meth:`close`,
    which leaves the segment unsealed, as a crash would).
    """

    def __init__(self, run_dir: Path, run_id: str, index: int, fd: int, lock: filelock.BaseFileLock) -> None:
        self._run_dir = run_dir
        self._run_id = run_id
        self._index = index
        self._path = segment_path(run_dir, index)
        self._fd: int | None = fd
        self._lock = lock
        self._segment_id = str(uuid.uuid4())
        self._mutex = threading.Lock()
        # Serializes flushes, so batches reach the file in sequence order.
        self._flush_lock = threading.Lock()
        # Everything below is guarded by self._mutex.
        self._open: _Batch | None = None
        self._next_seq = 0
        self._episodes = 0
        self._closing = False
        self._failure: OSError | None = None

    # -- creation -------------------------------------------------------------------------

    @classmethod
    def create(cls, run_dir: str | os.PathLike[str], run_id: str) -> SegmentWriter:
        """Open a new segment of ``run_dir``'s spool: the next free index, locked, with its header durable.

        The lock is taken *before* the segment file is created, so a reader never sees a
        segment whose writer is alive but unlocked (it would call the run crashed). The file
        itself is created with ``O_CREAT|O_EXCL``: two writers never share a segment.
        """
        run_dir = Path(run_dir)
        folder = ensure_spool_dir(run_dir)
        index = cls._next_free_index(run_dir)
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
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0),
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
        writer = cls(run_dir, run_id, index, fd, lock)
        try:
            header = {
                "format_version": FORMAT_VERSION,
                "run_id": run_id,
                "segment_id": writer._segment_id,
                "segment_index": index,
                "created_at": _utc_now(),
                "writer": {"pid": os.getpid(), "hostname": socket.gethostname(), "package_version": __version__},
            }
            writer._commit([(prepare(header, "header"), "header", None)])
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
    def closed(self) -> bool:
        with self._mutex:
            return self._closing or self._failure is not None

    # -- appending ------------------------------------------------------------------------

    def append(self, record_type: str, record: Any, meta: Mapping[str, Any] | None = None) -> int:
        """Append one record; returns its sequence number once the line is durable."""
        return self.append_many([(record_type, record, meta)])[0]

    def append_many(self, items: Iterable[Item]) -> list[int]:
        """Append records as one group (contiguous sequence numbers); returns once all are durable."""
        return self._commit(self._prepare_items(items))

    async def append_async(self, record_type: str, record: Any, meta: Mapping[str, Any] | None = None) -> int:
        """:meth:`append` for asyncio: the event loop never waits on a write or an fsync."""
        return (await self.append_many_async([(record_type, record, meta)]))[0]

    async def append_many_async(self, items: Iterable[Item]) -> list[int]:
        """:meth:`append_many` for asyncio.

        Serializing happens on the loop (orjson: about a millisecond per megabyte); the write
        and the sync happen on a leader thread, which resolves this call's future.
        """
        prepared = self._prepare_items(items)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._mutex:
            batch, first, last, leads = self._enqueue(prepared)
            batch.futures.append((loop, future))
        if leads:
            threading.Thread(target=self._lead, args=(batch,), name=f"spool-seg-{self._index}").start()
        await future
        return list(range(first, last + 1))

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
                "finished_at": _utc_now(),
                "summary": summary,
                "error": error,
            }
            payload = prepare(data, "seal")
            batch, _, last, leads = self._enqueue([(payload, "seal", None)])
            self._closing = True
        self._finish(batch, leads)
        self.close()
        return last

    def close(self) -> None:
        """Let queued appends finish, then release the segment without sealing it. Idempotent."""
        with self._mutex:
            self._closing = True
            pending = self._open
        if pending is not None:
            pending.done.wait()
        with self._flush_lock, self._mutex:
            self._release()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- group commit internals -----------------------------------------------------------

    @staticmethod
    def _prepare_items(items: Iterable[Item]) -> list[_Prepared]:
        prepared: list[_Prepared] = []
        for item in items:
            record_type, record = item[0], item[1]
            meta = item[2] if len(item) > 2 else None  # type: ignore[misc]
            if record_type in ("header", "seal"):
                raise ValueError(f"{record_type!r} records are written by the writer itself")
            # A caller that must see serialization errors before it commits to anything
            # (the run numbers episodes first) hands over a Payload it prepared itself.
            payload = record if isinstance(record, Payload) else prepare(record, record_type)
            prepared.append((payload, record_type, meta))
        return prepared

    def _check_open(self) -> None:
        if self._failure is not None:
            raise WriterClosedError(
                f"{self._path}: writer is broken by a disk error ({self._failure}); open a new segment"
            )
        if self._closing:
            raise WriterClosedError(f"{self._path}: writer is sealed or closed")

    def _enqueue(self, prepared: list[_Prepared]) -> tuple[_Batch, int, int, bool]:
        """Number lines and add them to the open batch (mutex held); framing fails before any change.

        Returns the batch, the first and last sequence numbers, and whether the caller leads.
        """
        self._check_open()
        parts: list[bytes | memoryview] = []
        seq = self._next_seq
        episodes = 0
        for payload, record_type, meta in prepared:
            parts.extend(frame(payload, seq, record_type, meta))
            episodes += record_type == "episode"
            seq += 1
        first = self._next_seq
        batch = self._open
        leads = batch is None
        if batch is None:
            batch = self._open = _Batch()
        batch.parts.extend(parts)
        self._next_seq = seq
        self._episodes += episodes
        return batch, first, seq - 1, leads

    def _commit(self, prepared: list[_Prepared]) -> list[int]:
        if not prepared:
            return []
        with self._mutex:
            batch, first, last, leads = self._enqueue(prepared)
        self._finish(batch, leads)
        return list(range(first, last + 1))

    def _finish(self, batch: _Batch, leads: bool) -> None:
        """Lead or wait for ``batch``; return once it is durable, raise if it failed."""
        if leads:
            self._lead(batch)
        else:
            batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def _lead(self, batch: _Batch) -> None:
        """Flush ``batch`` once the previous flush is over, then wake its members."""
        with self._flush_lock:
            with self._mutex:
                if self._open is batch:
                    self._open = None  # later appends open the next batch
                failure = self._failure
            if failure is None:
                try:
                    self._flush(batch.parts)
                except OSError as exc:
                    failure = exc
                    with self._mutex:
                        self._failure = exc
                        self._release()
            if failure is not None:
                batch.error = self._write_error(failure)
        batch.done.set()
        for loop, future in batch.futures:
            try:
                loop.call_soon_threadsafe(_settle, future, batch.error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def _flush(self, parts: list[bytes | memoryview]) -> None:
        """Write every part (looping over short writes and IOV_MAX chunks), then fdatasync once."""
        fd = self._fd
        if fd is None:
            raise OSError(f"{self._path} is closed")
        start = 0
        while start < len(parts):
            chunk = parts[start : start + _IOV_MAX]
            written = _writev(fd, chunk)
            if written <= 0:
                raise OSError(f"writev wrote {written} bytes to {self._path}")
            # Skip the parts written whole; keep the unwritten rest of a partly written one.
            for part in chunk:
                size = len(part)
                if written < size:
                    parts[start] = memoryview(part)[written:]
                    break
                written -= size
                start += 1
        _fdatasync(fd)

    def _write_error(self, failure: OSError) -> SpoolWriteError:
        error = SpoolWriteError(f"{self._path}: append not durable, segment closed: {failure}")
        error.errno = failure.errno
        return error

    def _release(self) -> None:
        """Close the file and free the writer lock (lock held)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._lock.release()

    def _abandon(self) -> None:
        with self._mutex:
            self._closing = True
            self._release()


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
