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

How damage is described and read past is in ``resync``; what a reader learns about a
segment's writer in ``writer_state``; a whole run scanned to its status in ``scan``.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from prime_runs_spool.errors import CorruptSpoolError, PositionLostError, UnsupportedFormatError
from prime_runs_spool.spool.crosscheck import RunLedger
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.format import (EPISODE, FORMAT_VERSION, HEADER, HEADER_READ_LIMIT, Line, MANIFEST,
                                           MAX_LINE_BYTES, PAD_BYTE, SEAL, parse_line)
from prime_runs_spool.spool.layout import list_segments, segment_path
from prime_runs_spool.spool.resync import Damage, PendingDamage, glued_line
from prime_runs_spool.spool.writer_state import make_durable, writer_alive

#: A line longer than this is invalid; module-level so tests can shrink it.
_LINE_LIMIT = MAX_LINE_BYTES
#: How much of an over-long line is held at once while skipping it.
_SKIP_CHUNK = 1 << 20
_READ_BUFFER = 1 << 16
_PAD = bytes((PAD_BYTE,))


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


@dataclass
class SegmentState:
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


def _raw_lines(f: IO[bytes], offset: int, *, there: bool = False) -> Iterator[tuple[int, bytes | None, int]]:
    """``(offset, line, end)`` for each line from ``offset``.

    The last line may lack its line feed (end of file). An over-long line is skipped in
    chunks, never held whole, and comes back as ``b""`` when a line feed ends it, None when
    the file ends first. ``there``: ``f`` is at ``offset`` already (a file just opened, at
    0), so no seek is asked of it (an ``lseek`` a segment read).
    """
    if not there:
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


def walk_segment(
    path: Path, index: int, state: SegmentState, start: Position | None = None,
    ledger: RunLedger | None = None, *, resync: bool = False, alive: bool | None = None,
    durable_first: bool = False,
) -> Iterator[Record | Damage]:
    """Yield the records of one segment (after its header), filling in ``state``, and check
    it against the run's earlier segments (``ledger``; a fresh one checks it alone).
    ``alive``: whether the segment's writer was alive, as its caller asked just before the
    walk (None: the walk asks), so one read asks once. ``durable_first``: the segment, a dead
    writer's, is made durable (``writer_state.make_durable``) through the walk's own
    descriptor before a byte of it is read.

    Raises CorruptSpoolError after yielding every good record before the damage, and
    UnsupportedFormatError before yielding anything from a newer format. With ``resync``,
    damage is yielded as :class:`Damage` instead and the walk goes on at the next line
    boundary (docs/spool-format.md, section 4.2); only a newer format still raises.
    """
    ledger = ledger if ledger is not None else _ledger_at(index)
    resumed = start is not None and start.offset > 0
    walk = _Walk(path, index, state, start if resumed else None, ledger, resync, alive, durable_first)
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


class _Walk:
    """One walk over one segment's lines (docs/spool-format.md, sections 4 and 4.1).

    Without ``resync`` the first damage raises :class:`CorruptSpoolError`. With it, the
    damage is yielded as a :class:`Damage` and the walk goes on at the next line boundary,
    as LevelDB's log reader does: lines are newline-framed and checksummed, so the line
    after a damaged one is found, and trusted, on its own. What was lost is counted from
    the sequence numbers on either side; the counts of section 4.1 stop being checked for a
    segment once it lost anything, the identity checks never do.
    """

    def __init__(self, path: Path, index: int, state: SegmentState, start: Position | None, ledger: RunLedger,
                 resync: bool, alive: bool | None = None, durable_first: bool = False) -> None:
        self.path, self.index, self.state, self.start = path, index, state, start
        self.ledger, self.resync, self.alive, self.durable_first = ledger, resync, alive, durable_first
        self.pending: PendingDamage | None = None
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
            self.pending = PendingDamage(offset, offset, reason, self.expect)
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
        alive = local and (writer_alive(path) if self.alive is None else self.alive)
        mark = durable_mark(path) if local else 0
        with _open_segment(path) as f:
            # The size as the fsync's own fstat found it (a dead writer's segment no longer grows).
            found = make_durable(path, f.fileno()) if self.durable_first and local else None
            self.size = (found or os.fstat(f.fileno())).st_size if local else path.stat().st_size
            lines = _raw_lines(f, 0, there=True)  # just opened
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
                    glued = glued_line(raw)
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


def _check_header(path: Path, index: int, parsed: Line, state: SegmentState, ledger: RunLedger) -> None:
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
                first = f.readline(HEADER_READ_LIMIT)
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
    full_checks: bool = False, segments: list[tuple[int, Path]] | None = None,
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
    ``segments``: the run's listing (``layout.list_segments``), when its caller just took one
    (a pass reads the run's segments as it listed them for their manifests); else listed here.
    """
    return _items(run_dir, start, durable_only=durable_only, resync=False,  # type: ignore[return-value]
                  full_checks=full_checks, segments=segments)


def resync_records(
    run_dir: str | os.PathLike[str], start: Position | None = None, *, durable_only: bool = False,
    full_checks: bool = False, segments: list[tuple[int, Path]] | None = None,
) -> Iterator[Record | Damage]:
    """:func:`iter_records`, resynchronizing after damage (docs/spool-format.md, section
    4.2): each stretch of damage is yielded in its place as a :class:`Damage`, and every
    intact record after it is yielded too. Only a newer format (UnsupportedFormatError) and
    a recorded position the spool no longer holds (PositionLostError) still raise."""
    return _items(run_dir, start, durable_only=durable_only, resync=True, full_checks=full_checks,
                  segments=segments)


def _items(run_dir: str | os.PathLike[str], start: Position | None, *, durable_only: bool,
           resync: bool, full_checks: bool, segments: list[tuple[int, Path]] | None = None
           ) -> Iterator[Record | Damage]:
    segments = list_segments(run_dir) if segments is None else segments
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
        for item in _items(run_dir, None, durable_only=durable_only, resync=resync, full_checks=False,
                           segments=segments):
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
        for item in walk_segment(path, index, SegmentState(), from_here, ledger, resync=resync,
                                 alive=alive if durable_only else None, durable_first=durable_only and not alive):
            if limit is not None and item.end_offset > limit:
                return  # not yet durable; nothing after it may be read either
            yield item
