"""Streaming reads of a run's spool (docs/spool-format.md, sections 4, 6 and 7).

The reader holds at most one line in memory (``MAX_LINE_BYTES``), whatever a spool's size,
and only ever reads forward. It never trusts a line it has not verified: the checksum is
checked on the raw bytes first (``framing.parse_line``), then the sequence number.

A line that fails is classified by its line feed and its NUL bytes. A line still missing
its line feed is the last thing on disk: NUL bytes alone are the writer's padding, anything
else a torn tail (it may be a line a live writer is writing right now: looking past it
would race with that writer). A complete but damaged line is corruption, unless it holds
a NUL byte and nothing intact follows it: no writer puts a NUL in a line, so it is a flush
written into the padding that a crash (or a live writer, right now) left partly on disk.
The segments are also checked against each other and their names
(``crosscheck.RunLedger``). Everything is read under the writer's feet: a writer only
writes past its last line, so what was read stays true.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from prime_runs_spool.errors import (CorruptSpoolError, NotARunError, PositionLostError, UnsupportedFormatError,
                                     corruption_message)
from prime_runs_spool.spool.crosscheck import RunLedger
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.process import process_alive
from prime_runs_spool.spool.format import CRASHED, EPISODE, FORMAT_VERSION, HEADER, Line, MANIFEST, MAX_LINE_BYTES, PAD_BYTE, SEAL, parse_line
from prime_runs_spool.spool.layout import list_segments, lock_path_of, segment_index, segment_path

#: A line longer than this is invalid; module-level so tests can shrink it.
_LINE_LIMIT = MAX_LINE_BYTES
#: How much of an over-long line is held at once while skipping it.
_SKIP_CHUNK = 1 << 20
_READ_BUFFER = 1 << 16
#: A header line is a few hundred bytes; reading this much of a segment always covers it.
_HEADER_LIMIT = 64 * 1024
_PAD = bytes((PAD_BYTE,))


#: The statuses a run can have besides its seal's (docs/spool-format.md, section 7).
LIVE = "live"
TORN = "torn"
CORRUPT = "corrupt"


def derive_status(*, corrupt: bool, last_sealed: str | None, live: bool, torn: bool) -> str:
    """A run's status from what its segments show: the one rule, shared by :class:`Spool`
    and by readers that follow a spool incrementally (the viewer's index).

    Corruption wins; then the last segment's seal; then a live writer; then a torn tail;
    a run with none of these is ``crashed`` (its writer died between two lines).
    """
    if corrupt:
        return CORRUPT
    if last_sealed is not None:
        return str(last_sealed)
    if live:
        return LIVE
    return TORN if torn else CRASHED


@dataclass(frozen=True, slots=True)
class Position:
    """The start of a line in a run, and the sequence number that line must carry."""

    segment_index: int
    offset: int
    next_seq: int


@dataclass(frozen=True, slots=True)
class Record:
    """One verified record. ``after`` is where to resume reading once it is handled."""

    segment_index: int
    offset: int
    end_offset: int
    seq: int
    type: str
    data: Any
    meta: dict[str, Any] | None

    @property
    def position(self) -> Position:
        """Where this record starts."""
        return Position(self.segment_index, self.offset, self.seq)

    @property
    def after(self) -> Position:
        return Position(self.segment_index, self.end_offset, self.seq + 1)


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes of a segment a resynchronizing reader passed over (docs/spool-format.md,
    section 4.2): complete lines that fail their checks, merged while no intact line comes
    between them, or lines missing between two intact ones (``length`` 0). ``lost`` is how
    many records the stretch held, from the sequence numbers around it (None when no
    intact line of the segment follows it); ``first_seq`` the first of them;
    ``episode_ids`` the ids still legible in a damaged line's meta (for the report, and to
    find the episode elsewhere), never trusted on their own."""

    segment_index: int
    path: Path
    offset: int
    length: int
    reason: str
    first_seq: int | None = None
    lost: int | None = None
    episode_ids: tuple[str, ...] = ()
    #: The rollout numbers legible beside ``episode_ids``, in the same order.
    rollout_numbers: tuple[int | None, ...] = ()

    @property
    def end_offset(self) -> int:
        return self.offset + self.length

    def message(self) -> str:
        """One line: where, how many bytes, why, and which records it cost."""
        what = f"{self.reason} ({self.length} bytes"
        if self.lost is None:
            what += "; how many records they held is unknown: no intact line of the segment follows"
        elif self.lost:
            seqs = f"seq {self.first_seq}" if self.lost == 1 else f"seq {self.first_seq}-{self.first_seq + self.lost - 1}"
            what += f"; {self.lost} record(s) lost: {seqs}"
        if self.episode_ids:
            what += f"; episode id(s) legible in them: {', '.join(self.episode_ids)}"
        return corruption_message(self.path, self.offset, what + ")")

    def as_dict(self) -> dict[str, Any]:
        return {"segment": self.segment_index, "offset": self.offset, "length": self.length, "reason": self.reason,
                "first_seq": self.first_seq, "lost": self.lost, "episode_ids": list(self.episode_ids)}


@dataclass(frozen=True)
class SegmentInfo:
    """What a full scan of one segment found. ``records`` counts the lines after the header."""

    path: Path
    index: int
    size: int
    run_id: str | None
    format_version: int | None
    records: int
    episodes: int
    sealed: str | None
    torn_offset: int | None
    corrupt_offset: int | None
    corrupt_reason: str | None
    live: bool
    #: The lock file is gone while the writer the header names is alive here (section 5).
    lock_missing: bool = False
    #: Every stretch of damage a resynchronizing read found (``Damage.as_dict``), the
    #: first DAMAGE_LISTED of them; ``damage_count`` counts them all.
    damage: list[dict[str, Any]] = field(default_factory=list)
    damage_count: int = 0

    @property
    def empty(self) -> bool:
        """No intact header: the writer died before its segment's first line was durable."""
        return self.format_version is None and self.corrupt_offset is None

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}  # no deep copy of path
        out["path"] = str(self.path)
        return out


@dataclass
class _SegmentState:
    """What a walk over a segment learned, filled in as it goes."""

    header: dict[str, Any] | None = None
    seal: dict[str, Any] | None = None
    torn_offset: int | None = None
    #: Where the NUL padding after the last line begins (docs/spool-format.md, section 4).
    padding_offset: int | None = None
    records: int = 0
    episodes: int = 0
    manifest: Any = field(default=None)
    has_manifest: bool = False


def _raw_lines(f: IO[bytes], offset: int) -> Iterator[tuple[int, bytes | None, int]]:
    """``(offset, line, end)`` for each line from ``offset``.

    The last line may lack its line feed (end of file). An over-long line is skipped in
    chunks, never held whole, and comes back as ``b""`` when a line feed ends it, None when
    the file ends first.
    """
    f.seek(offset)
    while True:
        line = f.readline(_LINE_LIMIT + 1)
        if not line:
            return
        if len(line) <= _LINE_LIMIT:
            end = offset + len(line)
            yield offset, line, end
            offset = end
            continue
        end = offset + len(line)
        while not line.endswith(b"\n"):
            line = f.readline(_SKIP_CHUNK)
            if not line:
                break
            end += len(line)
        yield offset, (b"" if line.endswith(b"\n") else None), end
        offset = end


def _walk_segment(
    path: Path, index: int, state: _SegmentState, start: Position | None = None,
    ledger: RunLedger | None = None, *, resync: bool = False,
) -> Iterator[Record | Damage]:
    """Yield the records of one segment (after its header), filling in ``state``, and check
    it against the run's earlier segments (``ledger``; a fresh one checks it alone).

    Raises CorruptSpoolError after yielding every good record before the damage, and
    UnsupportedFormatError before yielding anything from a newer format. With ``resync``,
    damage is yielded as :class:`Damage` instead and the walk goes on at the next line
    boundary (docs/spool-format.md, section 4.2); only a newer format still raises.
    """
    ledger = ledger if ledger is not None else _ledger_at(index)
    resumed = start is not None and start.offset > 0
    walk = _Walk(path, index, state, start if resumed else None, ledger, resync)
    try:
        ledger.begin(path, index, whole=not resumed)
    except CorruptSpoolError as exc:
        if not resync:
            ledger.damaged()
            raise
        ledger.lost()
        yield Damage(index, path, 0, 0, exc.reason)
    try:
        yield from walk.walk()
    except CorruptSpoolError:
        ledger.damaged()
        raise
    ledger.end()


def _ledger_at(index: int) -> RunLedger:
    """A ledger for reading one segment on its own: as if every segment before it was fine."""
    ledger = RunLedger(from_start=index == 1)
    ledger.last_index = index - 1
    return ledger


#: Where a damaged line's meta is looked for: the end of the line, before its trailer.
_LEGIBLE_TAIL = 4096
_LEGIBLE_META = re.compile(
    rb',"type":"episode","meta":(\{"episode_id":(?:null|"(?:[^"\\\n]|\\.){0,1024}"),"rollout_number":(?:null|\d{1,20})\})'
    rb',"crc":"[0-9a-f]{8}"\}\n\Z')
#: How a line starts; a damaged line is searched for it, to find an intact line glued to it.
_LINE_START = b'{"data":'
#: At most this many places in one damaged line are tried as the start of a glued line.
_GLUED_TRIES = 16


def _legible_meta(raw: bytes) -> tuple[str, int | None] | None:
    """The episode id and rollout number a damaged episode line's meta still shows, if its
    end is whole; unverified (the checksum failed): a hint to look the episode up by."""
    match = _LEGIBLE_META.search(raw[-_LEGIBLE_TAIL:])
    if match is None:
        return None
    try:
        meta = orjson.loads(match.group(1))
    except orjson.JSONDecodeError:
        return None
    episode_id, rollout = meta.get("episode_id"), meta.get("rollout_number")
    return (episode_id, rollout) if isinstance(episode_id, str) else None


def _glued_line(raw: bytes) -> int:
    """Where an intact line starts inside the damaged line ``raw`` (0: nowhere): a line
    whose line feed was damaged is glued to the next one, which is itself intact."""
    at = 0
    for _ in range(_GLUED_TRIES):
        at = raw.find(_LINE_START, at + 1)
        if at < 0:
            return 0
        if parse_line(raw[at:]) is not None:
            return at
    return 0


@dataclass
class _Pending:
    """Damaged lines not yet closed by an intact one."""

    offset: int
    end: int
    reason: str
    first_seq: int
    ids: list[str] = field(default_factory=list)
    rollouts: list[int | None] = field(default_factory=list)

    def add(self, end: int, raw: bytes | None) -> None:
        self.end = end
        meta = _legible_meta(raw) if raw else None
        if meta is not None:
            self.ids.append(meta[0])
            self.rollouts.append(meta[1])


class _Walk:
    """One walk over one segment's lines (docs/spool-format.md, sections 4 and 4.1).

    Without ``resync`` the first damage raises :class:`CorruptSpoolError`. With it, the
    damage is yielded as a :class:`Damage` and the walk goes on at the next line boundary,
    as LevelDB's log reader does: lines are newline-framed and checksummed, so the line
    after a damaged one is found, and trusted, on its own. What was lost is counted from
    the sequence numbers on either side; the counts of section 4.1 stop being checked for a
    segment once it lost anything, the identity checks never do.
    """

    def __init__(self, path: Path, index: int, state: _SegmentState, start: Position | None, ledger: RunLedger,
                 resync: bool) -> None:
        self.path, self.index, self.state, self.start = path, index, state, start
        self.ledger, self.resync = ledger, resync
        self.pending: _Pending | None = None
        self.expect = 0
        self.size = 0

    def _problem(self, offset: int, reason: str) -> None:
        if not self.resync:
            raise CorruptSpoolError(self.path, offset, reason)
        self.ledger.lost()

    def _damaged(self, offset: int, end: int, raw: bytes | None, reason: str) -> None:
        """A damaged line: raises, or joins the pending stretch of damage."""
        self._problem(offset, reason)
        if self.pending is None:
            self.pending = _Pending(offset, offset, reason, self.expect)
        self.pending.add(end, raw)

    def _close(self, lost: int | None) -> Iterator[Damage]:
        pending, self.pending = self.pending, None
        if pending is not None:
            yield Damage(self.index, self.path, pending.offset, pending.end - pending.offset, pending.reason,
                         pending.first_seq, lost, tuple(pending.ids), tuple(pending.rollouts))

    def _whole(self, reason: str) -> Iterator[Damage]:
        """The segment cannot be read at all (its header): one damage over all of it."""
        self._problem(0, reason)
        self.pending = None
        yield Damage(self.index, self.path, 0, self.size, reason + "; nothing in the segment can be trusted without it")

    def walk(self) -> Iterator[Record | Damage]:
        path, state = self.path, self.state
        local = getattr(path, "open_bytes", None) is None  # an object store's segment has no mark
        # Both before reading. The writer's liveness: a read while it lived can overtake its
        # writes (rule 6), whatever it does by the time the walk gets there. Its mark: the
        # lines before it were durable before anything here was read.
        alive = local and writer_alive(path)
        mark = durable_mark(path) if local else 0
        with _open_segment(path) as f:
            self.size = os.fstat(f.fileno()).st_size if local else path.stat().st_size
            lines = _raw_lines(f, 0)
            if self.start is not None:
                first = next(lines, None)
                parsed = parse_line(first[1]) if first and first[1] else None
                if parsed is None:
                    yield from self._whole("the header is not intact, yet a position after it was recorded")
                    return
                if not (yield from self._header(parsed)):
                    return
                _position_holds(f, path, self.start)
                lines = _raw_lines(f, self.start.offset)
                self.expect = self.start.next_seq
            while (line := next(lines, None)) is not None:
                offset, raw, end = line
                parsed = parse_line(raw) if raw else None
                if parsed is None and raw and self.resync and raw.endswith(b"\n"):
                    glued = _glued_line(raw)
                    if glued:  # the damaged part, then the intact line glued to it
                        self._damaged(offset, offset + glued, raw[:glued], "a damaged line")
                        offset, raw, parsed = offset + glued, raw[glued:], parse_line(raw[glued:])
                if parsed is None:
                    if state.seal is not None:
                        self._problem(offset, "bytes after the seal")
                        yield Damage(self.index, path, offset, self.size - offset, "bytes after the seal",
                                     None, 0)
                        break
                    if raw is None or (raw and not raw.endswith(b"\n")):  # b"": an over-long complete line
                        # No line feed: the last bytes on disk. Padding if they are all NUL bytes
                        # (the writer's, ahead of its lines), else a torn tail.
                        if raw and not raw.strip(_PAD):
                            state.padding_offset = offset
                        else:
                            state.torn_offset = offset
                        break
                    if _PAD in raw and _holed_tail(lines, offset, mark, alive):
                        state.torn_offset = offset  # a flush a crash interrupted, or one being written
                        break
                    if _PAD in raw:
                        lines = _raw_lines(f, end)  # _holed_tail read ahead
                    # A complete line: an interrupted append cannot leave one behind.
                    if offset == 0 and self.start is None:
                        what = "the first line is not an intact header"
                    elif raw == b"":
                        what = "a line longer than the format's limit"
                    else:
                        what = "a damaged line"
                    if raw.endswith(b"\r\n"):
                        what += " (it ends in CR LF: the file's line endings were converted)"
                    reason = what + "; a complete line that fails its check is never a torn tail"
                    if offset == 0 and self.start is None:
                        yield from self._whole(reason)
                        return
                    self._damaged(offset, end, raw, reason)
                    continue
                if state.seal is not None:
                    reason = f"a {parsed.type} line after the seal"
                    self._problem(offset, reason)
                    yield Damage(self.index, path, offset, self.size - offset, reason, None, 0)
                    break
                if self.expect == 0:
                    if parsed.seq != 0:
                        if not self.resync:
                            raise CorruptSpoolError(path, offset, f"sequence number {parsed.seq}, expected 0")
                        yield from self._whole(f"the first line is a {parsed.type} line, not the header")
                        return
                    if not (yield from self._header(parsed)):
                        return
                    self.expect = 1
                    continue
                if parsed.seq != self.expect:
                    reason = f"sequence number {parsed.seq}, expected {self.expect}"
                    if parsed.seq < self.expect:  # a line out of place: a copy
                        self._damaged(offset, end, raw, reason)
                        continue
                    if self.pending is None:  # lines cut out cleanly: nothing damaged, records missing
                        self._problem(offset, reason)
                        yield Damage(self.index, path, offset, 0, f"records are missing before this line ({reason})",
                                     self.expect, parsed.seq - self.expect)
                yield from self._close(parsed.seq - self.expect)
                self.expect = parsed.seq
                item = yield from self._record(parsed, offset, end)
                if item is not None:
                    yield item
                self.expect += 1
            yield from self._close(None)
            end = state.torn_offset if state.torn_offset is not None else state.padding_offset
            if end is None:
                end = os.fstat(f.fileno()).st_size if local else mark
        # A live writer rewrites its mark in place, so a read racing with that rewrite can be
        # torn (digits of both values): only a dead writer's mark, which no longer moves, counts.
        if end < mark and not writer_alive(path):
            reason = (f"the segment's lines end at byte {end}, but its writer had made {mark} bytes durable: "
                      "it was truncated or lost bytes")
            self._problem(end, reason)
            yield Damage(self.index, path, end, mark - end, reason)

    def _header(self, parsed: Line) -> Generator[Damage, None, bool]:
        """Check the header; False when the segment cannot be read on (its damage yielded)."""
        try:
            _check_header(self.path, self.index, parsed, self.state, self.ledger)
        except CorruptSpoolError as exc:
            yield from self._whole(exc.reason)
            return False
        try:
            self.ledger.prior(self.path, self.state.header or {})
        except CorruptSpoolError as exc:
            self._problem(0, exc.reason)
            yield Damage(self.index, self.path, 0, 0, exc.reason)
        return True

    def _record(self, parsed: Line, offset: int, end: int) -> Generator[Damage, None, Record | None]:
        """The record of an intact line in its place, or None (its damage yielded)."""
        state = self.state
        if parsed.type == HEADER:
            self._problem(offset, "a second header")
            yield Damage(self.index, self.path, offset, end - offset, "a second header", parsed.seq, 1)
            return None
        if parsed.type == EPISODE:
            try:
                self.ledger.episode(self.path, offset, parsed.meta)
            except CorruptSpoolError as exc:
                self._problem(offset, exc.reason)
                ids = tuple(str(i) for i in [(parsed.meta or {}).get("episode_id")] if i is not None)
                yield Damage(self.index, self.path, offset, end - offset, exc.reason, parsed.seq, 1, ids)
                return None
            state.episodes += 1
        elif parsed.type == SEAL:
            try:
                self.ledger.seal(self.path, offset, parsed.seq, parsed.data)
            except CorruptSpoolError as exc:
                self._problem(offset, exc.reason)
                yield Damage(self.index, self.path, offset, 0, exc.reason)
            state.seal = parsed.data if isinstance(parsed.data, dict) else {"status": None}
        elif parsed.type == MANIFEST and not state.has_manifest:
            state.manifest, state.has_manifest = parsed.data, True
        state.records += 1
        return Record(self.index, offset, end, parsed.seq, parsed.type, parsed.data, parsed.meta)


def torn_after(segment: Path, offset: int) -> bool:
    """Whether a segment holds a torn tail after ``offset``, the end of its last good line:
    any byte there but the writer's NUL padding (docs/spool-format.md, section 4). For
    readers that know where the lines end and need not read them again (the viewer's index)."""
    with open(segment, "rb", buffering=0) as f:
        f.seek(offset)
        while True:
            chunk = f.read(_SKIP_CHUNK)
            if not chunk:
                return False
            if chunk.strip(_PAD):
                return True


def _holed_tail(lines: Iterator[tuple[int, bytes | None, int]], offset: int, mark: int, alive: bool) -> bool:
    """Whether the complete line at ``offset``, which holds a NUL byte, begins a torn tail
    (docs/spool-format.md, section 4, rule 6) rather than corruption.

    No writer puts a NUL byte in a line, so the line was never written whole: its bytes are
    part padding. That is a torn tail when it is the flush a live writer is writing right
    now (past its durable mark: a read can overtake the write, so more lines may follow;
    ``alive``: the writer was alive when the read began, whatever it did since), or, in a
    segment whose writer is gone, when nothing but such lines, padding and a line without
    its line feed follows it: a power cut left part of the last flush on disk, in any order.
    An intact line after it means the line was synced once (lines are synced in order):
    corruption. So is a hole before a live writer's mark: it was synced. Consumes ``lines``;
    the walk stops either way."""
    if alive:
        return offset >= mark
    for _, raw, _ in lines:
        if raw and raw.endswith(b"\n") and _PAD not in raw:
            return False
    return True


def _open_segment(path: Path) -> IO[bytes]:
    """A segment's bytes: a local file, or a segment in an object store, which opens its
    own ranged, bounded reads (``prime_runs_spool.store.source.StoreSegment``)."""
    own = getattr(path, "open_bytes", None)
    if own is not None:
        return own()
    return open(path, "rb", buffering=_READ_BUFFER)


def _check_header(path: Path, index: int, parsed: Line, state: _SegmentState, ledger: RunLedger) -> None:
    if parsed.type != HEADER or parsed.seq != 0:
        raise CorruptSpoolError(path, 0, f"the first line is a {parsed.type} line, not the header")
    data = parsed.data
    version = data.get("format_version") if isinstance(data, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptSpoolError(path, 0, f"the header has no valid format_version ({version!r})")
    if version > FORMAT_VERSION:
        raise UnsupportedFormatError(path, version, FORMAT_VERSION)
    state.header = data
    ledger.header(path, index, data)


def _check_earlier_headers(segments: list[tuple[int, Path]], upto: int, ledger: RunLedger,
                           resync: bool) -> Iterator[Damage]:
    """Rules 1 and 2 of section 4.1 for the segments before ``upto``, reading headers only:
    a reader resuming at a position still refuses a run whose segments disagree (or, with
    ``resync``, yields the damage)."""
    for index, path in segments:
        if index >= upto:
            return
        try:
            ledger.begin(path, index)
            with _open_segment(path) as f:
                first = f.readline(_HEADER_LIMIT)
            if not first.endswith(b"\n"):
                ledger.end()  # empty: its writer died before its header was durable
                continue
            parsed = parse_line(first)
            if parsed is None or parsed.type != HEADER or not isinstance(parsed.data, dict):
                raise CorruptSpoolError(path, 0, "the first line is not an intact header")
            ledger.header(path, index, parsed.data)
        except CorruptSpoolError as exc:
            if not resync:
                raise
            ledger.lost()
            yield Damage(index, path, 0, 0, exc.reason)
        ledger.end()


def position_lost(path: Path, start: Position) -> str | None:
    """Why the recorded position ``start`` is no longer the start of a line in its segment,
    or None when it still is (one byte read): what ``prime-runs status`` and sync's
    up-to-date answer check without reading the run."""
    try:
        with _open_segment(path) as f:
            return _lost_reason(f, path, start)
    except FileNotFoundError:
        return "the segment of the recorded position is missing"


def _check_position(path: Path, start: Position) -> None:
    """:func:`_position_holds` on a segment opened for it."""
    with _open_segment(path) as f:
        _position_holds(f, path, start)


def _position_holds(f: IO[bytes], path: Path, start: Position) -> None:
    """A recorded position must still be the start of a line: the segment reaches it and
    the byte before it is a line feed (docs/spool-format.md, section 6). A segment that no
    longer does lost lines a reader already read (and sync shipped): a power cut took back
    bytes that were never durable, or the file was cut or replaced. Raises
    :class:`PositionLostError`."""
    reason = _lost_reason(f, path, start)
    if reason is not None:
        raise PositionLostError(path, start.offset, reason)


def _lost_reason(f: IO[bytes], path: Path, start: Position) -> str | None:
    if start.offset <= 0:
        return None
    f.seek(start.offset - 1)
    before = f.read(1)
    if before == b"\n":
        return None
    if before and before != _PAD:
        # A line glued to a damaged one (section 4.2) starts after no line feed: it holds
        # when the line there is intact and carries the sequence number the position says.
        line = parse_line(f.readline(_LINE_LIMIT + 1))
        if line is not None and line.seq == start.next_seq:
            return None
    if not before:
        what = f"the segment now ends at byte {path.stat().st_size}"
    else:
        under = " (they are NUL padding now)" if before == _PAD else ""
        what = f"the byte before it is {before!r}, not a line feed: the lines there are gone{under}"
    return (f"a reader had read this segment up to byte {start.offset}, but {what}; lines already read (and "
            "shipped) were lost, e.g. to a power cut that took back bytes never made durable")


def iter_records(
    run_dir: str | os.PathLike[str], start: Position | None = None, *, durable_only: bool = False,
    full_checks: bool = False,
) -> Iterator[Record]:
    """Every record of a run after ``start`` (default: the beginning), all segments in order.

    Headers are checked, not yielded; manifests, episodes, seals and record types this
    version does not know are yielded. A torn tail ends its segment silently; corruption
    raises CorruptSpoolError once every good record before it has been yielded.

    ``durable_only``: in a segment whose writer is alive, stop at the writer's durable mark
    (docs/spool-format.md, section 5). A live writer's last lines can be in the file before
    they are fsync'd; whoever ships records elsewhere must not ship those.
    ``full_checks``: from a ``start``, hold every check of section 4.1 as a read from the
    beginning would, by reading the run from its beginning whenever a segment after the
    position's is to be read (and handing on only what lies at or past the position).
    Whoever ships records elsewhere must ask for it: without it, a later segment's
    ``prior_episodes`` cannot be checked, and an earlier segment that is short (a copy still
    arriving) would go unnoticed. A reader resuming within the last segment pays nothing.
    """
    return _items(run_dir, start, durable_only=durable_only, resync=False,  # type: ignore[return-value]
                  full_checks=full_checks)


def resync_records(
    run_dir: str | os.PathLike[str], start: Position | None = None, *, durable_only: bool = False,
    full_checks: bool = False,
) -> Iterator[Record | Damage]:
    """:func:`iter_records`, resynchronizing after damage (docs/spool-format.md, section
    4.2): each stretch of damage is yielded in its place as a :class:`Damage`, and every
    intact record after it is yielded too. Only a newer format (UnsupportedFormatError) and
    a recorded position the spool no longer holds (PositionLostError) still raise."""
    return _items(run_dir, start, durable_only=durable_only, resync=True, full_checks=full_checks)


def _items(run_dir: str | os.PathLike[str], start: Position | None, *, durable_only: bool,
           resync: bool, full_checks: bool) -> Iterator[Record | Damage]:
    segments = list_segments(run_dir)
    if start is not None and start.segment_index not in {index for index, _ in segments}:
        raise PositionLostError(
            segment_path(run_dir, start.segment_index), start.offset, "the segment of the recorded position is missing"
        )
    if full_checks and start is not None and segments[-1][0] > start.segment_index:
        if start.offset > 0:
            _check_position(dict(segments)[start.segment_index], start)
        # A later segment is to be read: its header's prior_episodes is checked against
        # every episode line before it (section 4.1, rule 3), so the run is read from its
        # start, and only what lies at or past the position is handed on. Once the reader
        # is past the boundary, reads start in the last segment again and cost nothing extra.
        for item in _items(run_dir, None, durable_only=durable_only, resync=resync, full_checks=False):
            if (item.segment_index, item.offset) >= (start.segment_index, start.offset) or isinstance(item, Damage):
                yield item
        return
    ledger = RunLedger(from_start=start is None)
    if start is not None:  # before anything is yielded: a refusal never follows a record
        yield from _check_earlier_headers(segments, start.segment_index, ledger, resync)
    for index, path in segments:
        if start is not None and index < start.segment_index:
            continue
        from_here = start if start is not None and index == start.segment_index else None
        alive = durable_only and writer_alive(path)
        limit = durable_mark(path) if alive else None
        if durable_only and not alive:
            make_durable(path)
        for item in _walk_segment(path, index, _SegmentState(), from_here, ledger, resync=resync):
            if limit is not None and item.end_offset > limit:
                return  # not yet durable; nothing after it may be read either
            yield item


#: Segments this process made durable, by identity and size: a dead writer's file does not
#: change, so a follower reading it pass after pass syncs it once.
_SYNCED: dict[str, tuple[int, int, int, int]] = {}
_SYNCED_MAX = 4096


def make_durable(path: Path) -> None:
    """fsync a segment whose writer is gone before its bytes are shipped (docs/spool-format.md,
    section 5, "Reading a dead writer's segment"). A killed writer's last lines can be in
    the page cache only, never fsync'd; a power cut would take them back after a reader
    shipped them. An fsync on a read-only descriptor makes them durable (the kernel writes a
    file's dirty pages whoever asks), so what is read after it cannot be taken back. A
    filesystem that cannot sync (read-only, or no fsync) holds nothing dirty from here; an
    I/O error is raised: the bytes may not be on disk, and must not be shipped as if they were.
    A segment in an object store is never in a page cache here: nothing to do."""
    if getattr(path, "open_bytes", None) is not None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return
    try:
        st = os.fstat(fd)
        key, identity = os.fspath(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if _SYNCED.get(key) == identity:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise
        if len(_SYNCED) >= _SYNCED_MAX:
            _SYNCED.clear()
        _SYNCED[key] = identity
    finally:
        os.close(fd)


def segment_manifests(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Each segment's manifest record (the line after its header), in segment order.

    Reads two lines per segment, never a whole segment: a resumed segment's manifest says
    what that process was opened with (and which episodes it supersedes), which a reader
    needs before it reads the episodes. A segment whose first lines are not intact is
    passed over here; ``iter_records`` reports the damage.
    """
    for _, path in list_segments(run_dir):
        manifest = _segment_manifest(path)
        if manifest is not None:
            yield manifest


def first_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's manifest as its first segment's first two lines hold it; None when they do
    not (no segment, damage: ``iter_records`` says what). The cheap read of a check that
    only needs the run's id, such as whether a run is already synced."""
    segments = list_segments(run_dir)
    return _segment_manifest(segments[0][1]) if segments else None


def _segment_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest record after the segment's header, if both lines are intact."""
    try:
        handle = _open_segment(path)
    except FileNotFoundError:
        return None
    with handle:
        header = parse_line(handle.readline(MAX_LINE_BYTES + 1))
        if header is None or header.type != HEADER:
            return None
        line = parse_line(handle.readline(MAX_LINE_BYTES + 1))
    return line.data if line is not None and line.type == MANIFEST and isinstance(line.data, dict) else None


def writer_alive(segment: Path) -> bool:
    """Whether a live process holds the segment's writer lock.

    Probes with a *shared*, non-blocking flock on a read-only descriptor and drops it at
    once: it conflicts with a writer's exclusive lock only, never with another reader,
    needs no write permission, and never creates a file. A segment in an object store
    answers for itself (no writer lock travels with a copied spool: never alive).
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
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def lock_deleted_under_writer(segment: Path) -> bool:
    """Whether the segment's lock file is missing while the process its header names is
    alive on this machine (docs/spool-format.md, section 5): someone deleted the lock of a
    live writer, which must still count as live. A header without the process's boot id
    and start time (an older writer, another machine) never counts."""
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
        with open(segment, "rb") as f:
            first = f.readline(_HEADER_LIMIT)
    except OSError:
        return None
    parsed = parse_line(first) if first.endswith(b"\n") else None
    if parsed is None or parsed.type != HEADER or not isinstance(parsed.data, dict):
        return None  # not cached: the header may not be durable yet
    if len(_WRITERS) >= _WRITERS_MAX:
        _WRITERS.clear()
    _WRITERS[key] = (identity, parsed.data.get("writer"))
    return parsed.data.get("writer")


#: How many stretches of damage a segment's scan lists (it counts them all): a segment of
#: garbage with many line feeds must not cost memory in proportion to its size.
DAMAGE_LISTED = 1000


def _scan(path: Path, index: int, state: _SegmentState, ledger: RunLedger | None = None) -> SegmentInfo:
    live = writer_alive(path)  # before reading: a writer that exits meanwhile leaves a sealed file
    damage: list[dict[str, Any]] = []
    first: Damage | None = None
    count = 0
    for item in _walk_segment(path, index, state, ledger=ledger, resync=True):
        if isinstance(item, Damage):
            first = first or item
            count += 1
            if len(damage) < DAMAGE_LISTED:
                damage.append(item.as_dict())
    header = state.header or {}
    return SegmentInfo(
        path=path,
        index=index,
        size=path.stat().st_size,
        run_id=header.get("run_id"),
        format_version=header.get("format_version"),
        records=state.records,
        episodes=state.episodes,
        sealed=state.seal.get("status") if state.seal is not None else None,
        torn_offset=state.torn_offset,
        corrupt_offset=first.offset if first else None,
        corrupt_reason=first.reason if first else None,
        live=live,
        lock_missing=live and lock_deleted_under_writer(path),
        damage=damage,
        damage_count=count,
    )


def scan_segment(path: str | os.PathLike[str]) -> SegmentInfo:
    """Read one segment to its end and say what it holds; raises only for a newer format."""
    path = Path(path)
    index = segment_index(path.name)
    if index is None:
        raise ValueError(f"{path} is not named like a spool segment (seg-NNNNNN.jsonl)")
    return _scan(path, index, _SegmentState())


class Spool:
    """A run's spool as read at one moment: its segments, manifest and status."""

    def __init__(self, run_dir: Path, segments: list[SegmentInfo], manifest: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.segments = segments
        self.manifest = manifest

    @property
    def run_id(self) -> str | None:
        return next((s.run_id for s in self.segments if s.run_id is not None), None)

    @property
    def corrupt(self) -> SegmentInfo | None:
        """The first segment holding corruption, if any."""
        return next((s for s in self.segments if s.corrupt_offset is not None), None)

    @property
    def problem(self) -> str | None:
        """Two writers on one run (docs/spool-format.md, section 5): an earlier segment whose
        writer is live while a later segment exists. Whatever that writer appends now is
        behind every sync cursor. None when the run has one writer at most."""
        for segment in self.segments[:-1]:
            if segment.live and segment.sealed is None:
                why = " (its lock file was deleted)" if segment.lock_missing else ""
                return (f"{segment.path}: its writer is still live{why} while a later segment exists: two "
                        "processes are writing this run, and what the earlier one appends now is never synced; "
                        "stop one of them")
        return None

    @property
    def warnings(self) -> list[str]:
        """What a reader should say about a run that is not wrong in itself (a deleted lock file)."""
        return [f"{segment.path.name}: its lock file was deleted while its writer is alive"
                for segment in self.segments if segment.lock_missing]

    @property
    def status(self) -> str:
        """``corrupt``, the last seal's status, ``live``, ``torn`` or ``crashed`` (section 7)."""
        last = self.segments[-1]
        return derive_status(corrupt=self.corrupt is not None, last_sealed=last.sealed, live=last.live,
                             torn=last.torn_offset is not None)

    @property
    def records_count(self) -> int:
        return sum(s.records for s in self.segments)

    @property
    def episodes_count(self) -> int:
        return sum(s.episodes for s in self.segments)

    def records(self, start: Position | None = None) -> Iterator[Record]:
        """Stream the run's records again, from disk (sees what was appended since)."""
        return iter_records(self.run_dir, start)

    def episodes(self) -> Iterator[Any]:
        """The episode records' data, as logged, in order, across all segments."""
        for record in iter_records(self.run_dir):
            if record.type == EPISODE:
                yield record.data


def read_run(run_dir: str | os.PathLike[str]) -> Spool:
    """Scan every segment of a run (read-only; fine while a writer appends).

    Raises NotARunError when the directory holds no segment and UnsupportedFormatError
    when any segment is newer than this reader.
    """
    if getattr(run_dir, "list_segments", None) is None:
        run_dir = Path(run_dir)
    segments = list_segments(run_dir)
    if not segments:
        raise NotARunError(f"{run_dir}: no spool segments (expected {segment_path(run_dir, 1)})")
    infos: list[SegmentInfo] = []
    manifest: dict[str, Any] | None = None
    ledger = RunLedger()
    for index, path in segments:
        state = _SegmentState()
        infos.append(_scan(path, index, state, ledger))
        if manifest is None and state.header is not None and isinstance(state.manifest, dict):
            manifest = state.manifest
    return Spool(run_dir, infos, manifest or {})
