"""A whole run as read at one moment: each segment scanned to its end, and the run's
status (docs/spool-format.md, section 7).

Where the reader streams records, a scan reads every line of every segment to say what
a run holds: its segments' counts, seals, torn tails and damage, its manifest, and the
one status derived from them. ``prime-runs status``, ``verify`` and the viewer start here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import NotARunError
from prime_runs_spool.spool.crosscheck import RunLedger
from prime_runs_spool.spool.format import CORRUPT, CRASHED, EPISODE, LIVE, TORN
from prime_runs_spool.spool.layout import list_segments, segment_index, segment_path
from prime_runs_spool.spool.reader import Position, Record, SegmentState, iter_records, walk_segment
from prime_runs_spool.spool.resync import Damage
from prime_runs_spool.spool.writer_state import lock_deleted_under_writer, writer_alive


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


#: How many stretches of damage a segment's scan lists (it counts them all): a segment of
#: garbage with many line feeds must not cost memory in proportion to its size.
DAMAGE_LISTED = 1000


def _scan(path: Path, index: int, state: SegmentState, ledger: RunLedger | None = None) -> SegmentInfo:
    live = writer_alive(path)  # before reading: a writer that exits meanwhile leaves a sealed file
    damage: list[dict[str, Any]] = []
    first: Damage | None = None
    count = 0
    for item in walk_segment(path, index, state, ledger=ledger, resync=True):
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
    return _scan(path, index, SegmentState())


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
        state = SegmentState()
        infos.append(_scan(path, index, state, ledger))
        if manifest is None and state.header is not None and isinstance(state.manifest, dict):
            manifest = state.manifest
    return Spool(run_dir, infos, manifest or {})
