"""A run's spool as a stream of encoded sample rows, each with the cursor after it.

The row stream is deterministic: the same spool and the same evaluation id always give the
same rows in the same order (the writer stamped each episode's rollout number, masking
happened before the disk). That is what lets sync count rows instead of remembering them:
"the platform holds our first N rows" pins down exactly where to resume.

Which records a stream reads (the durable ones, the seal, the episodes withheld) is
sync/records.py's, shared with Prime Traces' lines; here they become rows, the rows
become request bodies (at most two large ones alive per process), and a thread reads ahead.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.errors import CorruptSpoolError, SampleTooLargeError, SyncError
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.platform_api.client import SEND_CHUNK
from prime_runs_spool.platform_api.row_size import ENVELOPE_BYTES
from prime_runs_spool.platform_api.v0 import project_episode_encoded
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.writer_state import writer_alive
from prime_runs_spool.sync.records import durable_records, seal_if_last, track_seal, withheld
from prime_runs_spool.sync.state import Cursor


class Row(NamedTuple):  # not a frozen dataclass: one is built per row, and its __init__ costs 4x more
    data: bytes
    sample_id: Any
    #: Where the stream resumes once this row is acknowledged.
    after: Cursor
    #: True when this is the episode's last row.
    closes_episode: bool


@dataclass
class RowStream:
    """Rows of one run from ``cursor`` on. After iteration, ``seal`` holds the seal that ended
    the log (None when the last segment is unsealed) and ``cursor`` the end reached.

    Only the *last* segment's seal ends the log (docs/spool-format.md, section 7): a seal
    is dropped as soon as a record of a later segment is read, and once more at the end if
    a later segment exists that yielded nothing yet (a resumed writer that has written
    only its header). The reader passes no headers on, so the segment index is what tells.
    """

    run_dir: Path
    cursor: Cursor | None
    evaluation_id: str
    max_request_bytes: int
    skip_corrupt: bool = False
    seal: dict[str, Any] | None = None
    skipped: list[dict[str, Any]] = field(default_factory=list)
    #: The segment ``seal`` was read from (a seal handed in sits where the cursor is).
    seal_segment: int | None = None
    #: Episodes that give no row: superseded by a resumed segment (content/supersede.py).
    superseded: frozenset[str] = frozenset()
    #: Errored episodes are held back (no row here): a resume may still retry them; the
    #: pass releases them when the run completes (docs/sync.md, "Resumed runs").
    hold_errored: bool = False
    #: Episodes passed over because no request can carry one of their rows (written before
    #: the runner refused such episodes at append): ``{segment, offset, episode_id, reason}``.
    too_large: list[dict[str, Any]] = field(default_factory=list)
    #: The spool was written under older masking rules: each episode is masked again by
    #: today's before it becomes a row (content/remask.py).
    remask: bool = False
    #: The run's listing to read by (the pass's, taken with its manifests: ``PassContext``);
    #: None: listed when read. Whether a segment came after the seal is asked anew at the end.
    segments: list[tuple[int, Path]] | None = None

    def __post_init__(self) -> None:
        if self.seal is not None and self.seal_segment is None and self.cursor is not None:
            self.seal_segment = self.cursor.segment_index

    def _records(self) -> Iterator[Any]:
        start = None if self.cursor is None else self.cursor.position
        for record in durable_records(self.run_dir, start, skip_corrupt=self.skip_corrupt, skipped=self.skipped,
                                      remask=self.remask, segments=self.segments):
            self.seal, self.seal_segment = track_seal(self.seal, self.seal_segment, record)
            yield record
        self.seal = seal_if_last(self.run_dir, self.seal, self.seal_segment)

    def unread_bytes(self, *, enough: int | None = None) -> int | None:
        """Bytes of the log past the cursor, from the segments' sizes (None when a size
        cannot be read): what reading the rest of the run costs, about. The last segment's,
        while its writer lives, up to its durable mark: its file also holds the padding
        ahead of its lines (docs/spool-format.md, section 5), which this stream never reads.
        ``enough``: sizes that come to at most this are the answer as they are (the mark
        could only make them less), so a small run's writer is not asked whether it lives."""
        try:
            sizes = []
            segments = list_segments(self.run_dir) if self.segments is None else self.segments
            for index, path in segments:
                if self.cursor is not None and index < self.cursor.segment_index:
                    continue
                skipped = self.cursor.offset if self.cursor is not None and index == self.cursor.segment_index else 0
                sizes.append((path, path.stat().st_size, skipped))
            total = sum(max(0, size - skipped) for _, size, skipped in sizes)
            if (enough is not None and total <= enough) or not sizes or not writer_alive(sizes[-1][0]):
                return total
            path, size, skipped = sizes[-1]  # the last segment: a live writer's
            return total - max(0, size - skipped) + max(0, min(size, durable_mark(path)) - skipped)
        except (OSError, AttributeError):
            return None

    def __iter__(self) -> Iterator[Row]:
        return self.rows()

    def rows(self) -> Iterator[Row]:
        for record in self._records():
            after = Cursor.past(record)
            if record.type != EPISODE or self._gives_no_row(record):
                self.cursor = after
                continue
            already = 0
            if (self.cursor is not None and self.cursor.rows_done
                    and (self.cursor.segment_index, self.cursor.offset)
                    == (record.segment_index, record.offset)):
                already = self.cursor.rows_done
            meta = record.meta or {}
            try:
                rows = project_episode_encoded(record.data, meta.get("rollout_number"),
                                               evaluation_id=self.evaluation_id,
                                               max_request_bytes=self.max_request_bytes)
            except SampleTooLargeError as exc:
                # It can never be sent: blocking on it would stop everything after it for
                # good. Pass over it, and say so (the state, status, the evaluation's metadata).
                self.too_large.append({"segment": record.segment_index, "offset": record.offset,
                                       "episode_id": exc.episode_id, "reason": str(exc)})
                self.cursor = after
                continue
            last = len(rows) - 1
            for number, (row, data) in enumerate(rows):
                if number < already:
                    continue
                cursor = after if number == last else Cursor.at(record.position, rows_done=number + 1)
                yield Row(data, row.get("sample_id"), cursor, number == last)
            self.cursor = after

    def _gives_no_row(self, record: Any) -> bool:
        return withheld(record, self.superseded, hold_errored=self.hold_errored) is not None


#: A request body that grows past this many bytes is *large*: it must first take one of
#: LARGE_BODIES' tokens. Small bodies (a small or live run's requests) never wait.
LARGE_BODY = 1 << 20

#: How many large request bodies may be alive at once in this process, whatever ``--jobs``:
#: each run holds up to two (one on the wire, the next being built), so without a
#: process-wide bound ``--jobs 4`` over four large runs held eight 25 MiB bodies (392 MB
#: peak RSS, Nov 29, benchmarks/sync_memory.py). A batch takes a token whole, before its body grows past
#: LARGE_BODY, and never takes a second one, so a batch that waits for a token holds none
#: and every token is held by a batch that can finish: no deadlock, even with one token.
LARGE_BODIES = threading.BoundedSemaphore(2)


class Batch:
    """Rows for one request, already laid out as the pieces of its body; ``end`` is where the
    cursor goes once they are acknowledged.

    The body is never one buffer: as rows arrive they are joined, with the envelope and the
    commas, into pieces of at most SEND_CHUNK bytes (one copy of each row, made here, on the
    read-ahead thread), each an exact ``bytes`` that the client hands to the connection as it
    is (platform_api/client.py): h11 copies any other buffer it is given, so a body laid out in
    one buffer was copied twice on its way out, once into the buffer and once in slices. A row
    of SEND_CHUNK or more is a piece of its own, never copied here (the client sends it in
    slices). The pieces are heap blocks well under the sync command's mmap threshold
    (sync/memory.py), so each body reuses the memory the last one freed instead of mapping
    and faulting in fresh pages. A body about to grow past LARGE_BODY first takes a
    LARGE_BODIES token, which :meth:`release` (or, for a batch dropped unsent, its collection)
    gives back.
    """

    __slots__ = ("_budget", "_length", "_on_wire", "_pending", "_pending_bytes", "_pieces", "count", "end",
                 "episodes", "last_sample_id", "released", "seal")

    def __init__(self) -> None:
        #: The body's pieces so far, each ready to send.
        self._pieces: list[bytes] = []
        #: What follows them, not joined into a piece yet (None once the body is finished).
        self._pending: list[bytes] | None = [_OPEN]
        self._pending_bytes = len(_OPEN)
        #: Bytes of the body so far, without its closing ``]}``.
        self._length = len(_OPEN)
        #: Set once the body is on the wire (or released): :func:`read_ahead` builds the next batch only then.
        self._on_wire = threading.Event()
        #: The LARGE_BODIES semaphore whose token this batch holds, if it holds one.
        self._budget: threading.BoundedSemaphore | None = None
        self.count = 0
        self.end: Cursor | None = None
        self.episodes = 0
        #: The sample id of its last row: what the platform's last row is once it landed.
        self.last_sample_id: Any = None
        #: Set on the last batch of a pass: the seal its end is past, if the log ends sealed.
        self.seal: dict[str, Any] | None = None
        self.released: list[str] = []  # a batch releasing held-back episodes: their ids, recorded once it landed

    @property
    def size(self) -> int:
        """Bytes of the finished body, the ``{"samples":[]}`` envelope counted."""
        return self._length + len(_CLOSE)

    def fits(self, row: bytes, limit: int) -> bool:
        """Whether ``row`` joins within ``limit`` (an empty batch takes any: the projection refused one too large)."""
        return not self.count or self.size + 1 + len(row) <= limit

    def add(self, row: Row) -> None:
        data = row.data
        size = len(data)
        if self._budget is None and self._length + 1 + size > LARGE_BODY:
            budget = LARGE_BODIES
            budget.acquire()
            self._budget = budget
        pending = self._pending
        assert pending is not None, "a finished body takes no more rows"
        if self.count:
            if self._pending_bytes + 1 > SEND_CHUNK:
                self._join()
            pending.append(_COMMA)
            self._pending_bytes += 1
            self._length += 1
        if size >= SEND_CHUNK:
            self._join()
            self._pieces.append(data)  # sent as it is, in the client's slices
        else:
            if self._pending_bytes + size > SEND_CHUNK:
                self._join()
            pending.append(data)
            self._pending_bytes += size
        self._length += size
        self.count += 1
        self.end = row.after
        self.episodes += row.closes_episode
        self.last_sample_id = row.sample_id

    def _join(self) -> None:
        pending = self._pending
        if pending:
            self._pieces.append(b"".join(pending))
            pending.clear()
            self._pending_bytes = 0

    def sent(self) -> None:
        """The whole body is on the connection: the request is the platform's to answer (the client says so)."""
        self._on_wire.set()

    def wait_sent(self, timeout: float) -> bool:
        """Whether the body went on the wire (or the batch was released) within ``timeout``."""
        return self._on_wire.wait(timeout)

    def release(self) -> None:
        """Drop the body once it is sent (the counts and cursor stay), and its token."""
        self._on_wire.set()  # sent or given up: nothing waits on it any more
        self._pieces = []
        self._pending = None
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.release()

    def __del__(self) -> None:
        # A batch dropped unsent (an error, a consumer that stopped early) gives its token back.
        budget = getattr(self, "_budget", None)
        if budget is not None:
            self._budget = None
            budget.release()

    def parts(self) -> list[bytes]:
        """The request body, ``{"samples":[row,...]}``, as the pieces it is sent in (the batch
        is finished by this)."""
        if self._pending is not None:
            if self._pending_bytes + len(_CLOSE) > SEND_CHUNK:
                self._join()
            self._pending.append(_CLOSE)
            self._join()
            self._pending = None
        return self._pieces

    def body(self) -> bytes:
        """The request body whole: for tools and tests; a sync sends :meth:`parts`."""
        return b"".join(self.parts())


_OPEN = b'{"samples":['
_COMMA = b","
_CLOSE = b"]}"
assert len(_OPEN) + len(_CLOSE) == ENVELOPE_BYTES


def batches(stream: RowStream, max_request_bytes: int) -> Iterator[Batch]:
    """Fill requests up to ``max_request_bytes`` (envelope counted) from the stream.

    A batch with no rows is yielded at the end when the stream moved past records that
    carry none (a seal, a resumed segment's header), so the cursor can reach the end. When
    the stream fails (corruption, a row too large), what was batched before is yielded
    first, then the error is raised: everything before the failure gets pushed.

    Only one batch is alive at a time here: the caller sends it before asking for the next.
    """
    start = stream.cursor
    batch = Batch()
    try:
        for row in stream.rows():
            if not batch.fits(row.data, max_request_bytes):
                yield batch
                batch = Batch()
            batch.add(row)
    except (CorruptSpoolError, SampleTooLargeError):
        if batch.count:
            yield batch
        raise
    if batch.count or stream.cursor != start:
        batch.end = stream.cursor  # past the records after the last row too (a seal)
        batch.seal = stream.seal
        yield batch


#: Up to this much left to read past the cursor, a run is read in the sending thread: the
#: rest fits one request or two, so there is nothing to read while one is on the wire, and
#: a thread of its own per small run (started, handed each batch, joined) cost more than
#: the reading; with 8 jobs it also doubled the threads taking turns at the GIL.
INLINE_REST_BYTES = 1 << 20


def read_ahead_if_worth_it(stream: RowStream, items: Generator[Batch, None, None]) -> Iterator[Batch]:
    """``items`` (batches of ``stream``) through :func:`read_ahead`, unless what is left of
    the run is small (``INLINE_REST_BYTES``): the same batches, in the same order, either way."""
    rest = stream.unread_bytes(enough=INLINE_REST_BYTES)
    if rest is not None and rest <= INLINE_REST_BYTES:
        return items
    return read_ahead(items)


#: The longest the read-ahead waits for the batch it handed over to be on the wire before it
#: builds the next one anyway (seconds): a body still going out by then is an upload slower
#: than the building, whose sender mostly waits on the socket with the GIL released, so the
#: next batch is better built alongside than after it.
ON_WIRE_WAIT = 0.25


def read_ahead(items: Generator[Batch, None, None]) -> Iterator[Batch]:
    """``items``, produced one batch ahead on a thread of their own.

    While a request is on the wire (the GIL released, waiting for the platform) the next
    batch is read, projected and encoded, instead of after the answer. At most two batches
    are alive: the producer hands one over and waits until it is taken before it builds the
    next, and the consumer releases each body once it is sent.

    The producer starts the next batch only once the one handed over is *on the wire*
    (:meth:`Batch.sent`: its whole body written to the connection), released, or
    ON_WIRE_WAIT after it was taken, so the building (CPU under the GIL) falls in the
    time the platform takes to store the rows and answer, not in the consumer's own work:
    the state written before the request (a few syscalls, each of which would wait up to
    the interpreter's switch interval for the GIL a busy producer holds) and the body's
    slices written one by one. Built as soon as the previous one was taken, the next batch
    made each state write before a 25 MiB request take 20-60 ms, not 1-2 (Dec 1,
    benchmarks/sync_timeline.py).

    Items and the error that ends them arrive in order, exactly as iterating ``items``
    directly would give them, and only the consumer touches the sync state. When the
    consumer stops early, the producer closes ``items`` and ends before this generator
    returns, so anything ``items`` updates (a stream's cursor, seal, skipped corruption) is
    settled when it does.
    """
    handoff: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def hand(kind: str, value: Any) -> bool:
        handoff.put((kind, value))
        while not stop.is_set():  # wait until it is taken (or the consumer gave up)
            if handoff.unfinished_tasks == 0:
                return True
            with handoff.all_tasks_done:
                handoff.all_tasks_done.wait(0.1)
        return False

    def on_wire(batch: Batch) -> bool:
        if not batch.count:
            return True  # nothing to send: the end of a pass
        deadline = time.monotonic() + ON_WIRE_WAIT
        while not batch.wait_sent(min(0.1, max(0.0, deadline - time.monotonic()))):
            if stop.is_set():
                return False
            if time.monotonic() >= deadline:
                return True  # a slow upload: its sender mostly waits on the socket
        return True

    def produce() -> None:
        try:
            for item in items:
                if not hand("item", item) or not on_wire(item):
                    return
            hand("end", None)
        except BaseException as exc:  # noqa: BLE001 - handed over, raised by the consumer
            hand("error", exc)
        finally:
            items.close()

    thread = threading.Thread(target=produce, name="prime-runs-sync-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = handoff.get()
            handoff.task_done()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        stop.set()
        with handoff.all_tasks_done:
            handoff.all_tasks_done.notify_all()
        try:  # unblock a producer waiting to hand over
            handoff.get_nowait()
            handoff.task_done()
        except queue.Empty:
            pass
        thread.join()


def skip_rows(stream: RowStream, count: int, *, partial: bool = False) -> tuple[Cursor | None, int, Any, int]:
    """Consume ``count`` rows without sending them; returns (cursor after them, episodes
    they closed, the last one's sample id, rows consumed). Used when the platform already
    holds them. With ``partial``, a stream that ends first is not an error: the cursor is
    its end and the count says how far it got."""
    if count == 0:
        return stream.cursor, 0, None, 0
    seen = episodes = 0
    last_id: Any = None
    for row in stream.rows():
        seen += 1
        episodes += row.closes_episode
        last_id = row.sample_id
        if seen == count:
            return row.after, episodes, last_id, seen
    if partial:
        return stream.cursor, episodes, last_id, seen
    raise SyncError(f"the platform holds {count} rows but this spool has only {seen} to give")
