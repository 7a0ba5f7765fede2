"""The segment writer: a run's new segment, its records numbered and appended durably.

docs/spool-format.md, section 5, is the contract. An append returns only once its line is
written and fdatasync'ed. Each appender serializes and checksums its record, and builds the
part of its line that does not depend on the sequence number, *outside* any lock
(``format.prepare``, ``format.framing_rest``); under group commit's short mutex the writer
gives it its sequence numbers and frames the line's tail (``format.frame_line``).

The writer is the public append API, the segment's creation and its numbering. The rest has
a module of its own, each owning its state: group commit, who flushes and who waits
(``spool/commit.py``); the file, its padding and the one synced write a flush takes
(``spool/durable_file.py``); the watch on the lock file and the fork guard
(``spool/guards.py``).

Opening is atomic against another opener: ``create`` holds the run lock while it checks
that the run still has the segments its caller scanned and creates the next one. After
every sync the file checks that it still has a name (a deleted run directory raises
:class:`SegmentGoneError`), and now and then the guard that its lock file does (a deleted
lock file is put back): docs/spool-format.md, section 5.

A failed write or sync breaks the writer for good: after a failed fsync the kernel may have
dropped the dirty pages, so a retry could report lost data as durable. The caller starts a
new segment (a new ``SegmentWriter``) instead.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Union

import filelock

from prime_runs_spool._version import __version__
from prime_runs_spool.errors import RunInUseError
from prime_runs_spool.spool.commit import GroupCommit, Settled
from prime_runs_spool.spool.durable_file import DurableFile, Parts
from prime_runs_spool.spool.durable_mark import MarkPublisher, open_mark
from prime_runs_spool.spool.format import (
    EPISODE,
    FORMAT_VERSION,
    HEADER,
    LINE_ROOM,
    SEAL,
    SEAL_STATUSES,
    WRITER_RECORD_TYPES,
    Payload,
    check_line_fits,
    frame_line,
    framing_rest,
    prepare,
)
from prime_runs_spool.files import FILE_MODE, fsync_folder
from prime_runs_spool.spool.guards import SegmentGuard, disown_in_forks
from prime_runs_spool.spool.layout import (durable_mark_path, ensure_spool_dir, list_segments, lock_path, run_lock_path,
                                           segment_path)
from prime_runs_spool.spool.process import identity

#: What ``append_many`` takes: ``(record_type, record)`` or ``(record_type, record, meta)``.
Item = Union[tuple[str, Any], tuple[str, Any, Union[Mapping[str, Any], None]]]

#: A record ready to be numbered: its payload and the line's tail after the sequence number.
_Line = tuple[Payload, bytes]

#: How long an opener waits for another one to finish opening the same run.
RUN_LOCK_TIMEOUT = 30.0


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class SegmentWriter:
    """Appends records to one new segment of a run; see the module docstring.

    Thread-safe. Create with :meth:`create`; finish with :meth:`seal` (or :meth:`close`,
    which leaves the segment unsealed, as a crash would).
    """

    def __init__(self, run_dir: Path, run_id: str, index: int, file: DurableFile,
                 prior_episodes: int | None = None) -> None:
        self._run_dir = run_dir
        self._run_id = run_id
        self._index = index
        self._path = segment_path(run_dir, index)
        #: Episodes in the run's earlier segments, as the opener counted them (None: not told).
        self._prior_episodes = prior_episodes
        self._segment_id = str(uuid.uuid4())
        self._file = file
        self._group = GroupCommit(file, self._path, f"spool-seg-{index}")
        disown_in_forks(self._group)
        # Written only by _number, which group commit calls under its mutex.
        self._next_seq = 0
        self._episodes = 0

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
                    # Not O_APPEND: lines go at their place in the file, and the padding
                    # ahead of them (spool/durable_file.py), which O_APPEND would put at the end.
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
        mark = MarkPublisher(mark_fd)
        path = segment_path(run_dir, index)
        file = DurableFile(fd, path, mark, SegmentGuard(run_dir, index, path, lock, mark))
        writer = cls(run_dir, run_id, index, file, prior_episodes)
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
            writer._group.commit(writer._number, [_prepare_item(HEADER, header, None, internal=True)], 0)
            fsync_folder(folder)  # the new segment's name durable, not just its content
        except BaseException:
            writer._group.abandon()
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
        return self._next_seq  # one attribute read: atomic, so no lock

    @property
    def episodes(self) -> int:
        """Episode records appended so far (queued or durable)."""
        return self._episodes

    @property
    def durable_bytes(self) -> int:
        """How many of the segment's bytes are fsync'd: where its lines end once no flush is
        in progress. Not the file's size, which counts the padding ahead of them."""
        return self._file.durable

    @property
    def closed(self) -> bool:
        return self._group.closed

    # -- appending ------------------------------------------------------------------------

    def append(self, record_type: str, record: Any, meta: Mapping[str, Any] | None = None) -> int:
        """Append one record; returns its sequence number once the line is durable."""
        return self._group.commit(self._number, [_prepare_item(record_type, record, meta)], record_type == EPISODE)

    def append_many(self, items: Iterable[Item]) -> list[int]:
        """Append records as one group (contiguous sequence numbers); returns once all are durable."""
        lines, episodes = self._prepare_items(items)
        if not lines:
            return []
        first = self._group.commit(self._number, lines, episodes)
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
        return self._group.commit(self._number, lines, len(lines))

    async def append_async(self, record_type: str, record: Any, meta: Mapping[str, Any] | None = None) -> int:
        """:meth:`append` for asyncio: the event loop never waits on a write or an fsync."""
        future, first = self._group.queue_async(
            self._number, [_prepare_item(record_type, record, meta)], record_type == EPISODE, None)
        await future
        return first

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

    def queue_episodes(self, lines: list[tuple[Payload, bytes]], on_settled: Settled) -> Awaitable[None]:
        """:meth:`append_episodes_async` without its coroutine: number and queue ``lines`` (at
        least one), and return what to await for them to be durable, for a caller that is a
        coroutine already (``Run.log_episodes_async``): each coroutine an append goes through
        is one more frame made, resumed and ended when its future is settled, about 2k
        instructions (docs/benchmarks.md, "64 asyncio tasks"). ``on_settled`` as for
        :meth:`append_many_async`: called with the error at once if they cannot be queued."""
        try:
            return self._group.queue_async(self._number, _checked(lines), len(lines), on_settled)[0]
        except BaseException as exc:
            on_settled(exc)
            raise

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
            future, first = (self._group.queue_async(self._number, prepared, episodes, on_settled)
                             if prepared else (None, 0))
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

    def seal(self, status: str, *, summary: Any = None, error: str | None = None) -> int:
        """Write the seal record (the segment's last line), make it durable, and close.

        Returns the seal's sequence number. Appends that race with the seal either get in
        before it or raise :class:`WriterClosedError`.
        """
        if status not in SEAL_STATUSES:
            raise ValueError(f"seal status must be one of {', '.join(SEAL_STATUSES)}, not {status!r}")
        record = {"status": status, "summary": summary, "error": error}
        seq = self._group.commit(self._number_seal, record, 0, last=True)
        self.close()
        return seq

    def close(self) -> None:
        """Let queued appends finish, then release the segment without sealing it. Idempotent."""
        self._group.close()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- numbering ------------------------------------------------------------------------

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

    def _number(self, prepared: list[_Line], episodes: int) -> tuple[int, Parts]:
        """Give lines their sequence numbers and frame them (group commit's mutex held).

        Returns the first sequence number and the lines' parts. Only the short tail of each
        line (sequence number and checksum) is built here; the rest was prepared outside.
        """
        first = seq = self._next_seq
        parts: Parts = []
        for payload, rest in prepared:
            parts += frame_line(payload, seq, rest)
            seq += 1
        self._next_seq = seq
        self._episodes += episodes
        return first, parts

    def _number_seal(self, record: dict[str, Any], _episodes: int) -> tuple[int, Parts]:
        """Number the seal (group commit's mutex held), which counts what came before it."""
        prior = self._prior_episodes
        data = {
            "status": record["status"],
            "last_seq": self._next_seq - 1,
            "episodes": self._episodes,
            "run_episodes": None if prior is None else prior + self._episodes,
            "finished_at": _utc_now(),
            "summary": record["summary"],
            "error": record["error"],
        }
        return self._number([_prepare_item(SEAL, data, None, internal=True)], 0)


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
