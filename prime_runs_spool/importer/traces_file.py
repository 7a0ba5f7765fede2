"""Reading verifiers' ``traces.jsonl`` strictly: where its data ends, and where it is damaged.

verifiers appends one episode per line with neither fsync nor checksum, so a crash can
leave the last line torn (no line feed, cut short). That is the end of the data, never an
error. A damaged line that is *not* the last one is corruption: the file was damaged, and
nothing after it can be told apart from what it should have been, so the whole run is
refused (:class:`CorruptOutputError`, naming the file and the line).

The importer reads the file twice, holding one line at a time: a first pass checks every
line and learns the episode ids and where the data ends (:func:`scan_traces`); the second
(:func:`iter_episodes`) reads up to that end only, so lines appended in between are left
for the next import rather than imported unchecked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.content.episodes import check_episode
from prime_runs_spool.content.platform_runs import episode_run_id
from prime_runs_spool.errors import CorruptOutputError, ImportSourceError, MalformedEpisodeError


@dataclass
class TracesScan:
    """What a first pass over ``traces.jsonl`` learned (ids and counts, never the episodes)."""

    path: Path
    #: Episode ids, in file order.
    ids: list[str] = field(default_factory=list)
    #: The run id of the first episode (``run.id``): the run's id.
    run_id: str | None = None
    run_name: str | None = None
    #: Every distinct ``run.id`` on the episodes, in the order they first appear.
    run_ids: list[str] = field(default_factory=list)
    #: Episodes per task ``idx`` (of each episode's first trace).
    per_task: dict[Any, int] = field(default_factory=dict)
    #: Earliest ``timing.start`` among the traces (epoch seconds), for ``created_at``.
    started_at: float | None = None
    #: Where the checked data ends (bytes), and the torn tail past it, if any.
    end: int = 0
    torn_bytes: int = 0


def _lines(path: Path, end: int | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(line_number, end_offset, raw_line)`` for each line up to ``end`` (bytes)."""
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if end is not None and offset >= end:
                return
            offset += len(raw)
            yield number, offset, raw


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON: {str(exc).split(':')[0]}"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an episode object"
    if not isinstance(value.get("id"), str) or not isinstance(value.get("traces"), list):
        return None, "not an episode (no string id or no traces list)"
    return value, ""


def scan_traces(path: Path) -> TracesScan:
    """Check every line; raises :class:`CorruptOutputError` on a damaged line that is not
    the torn last one. An empty or blank line is skipped, as verifiers itself does."""
    scan = TracesScan(path=path)
    pending: tuple[int, str] | None = None  # a damaged line: corrupt if anything follows
    for number, end, raw in _lines(path):
        if not raw.strip():
            continue
        if pending is not None:
            raise CorruptOutputError(path, pending[0], pending[1])
        record, reason = _parse(raw)
        if record is None:
            if raw.endswith(b"\n"):
                raise CorruptOutputError(path, number, reason, whole=True)
            pending = (number, reason)  # a torn tail, unless a line follows (it cannot)
            scan.torn_bytes = len(raw)
            continue
        try:
            check_episode(record)  # refused here, whole, rather than half-way through the import
        except MalformedEpisodeError as exc:
            raise ImportSourceError(f"{path}: line {number} cannot be recorded ({exc}); "
                                    "nothing of this run was imported") from None
        _observe(scan, record)
        scan.end = end
    return scan


def _observe(scan: TracesScan, record: dict[str, Any]) -> None:
    scan.ids.append(record["id"])
    run_id = episode_run_id(record)
    if run_id is not None and run_id not in scan.run_ids:  # a few distinct ids at most
        scan.run_ids.append(run_id)
    if scan.run_id is None and run_id is not None:  # the run's id (content/platform_runs.py)
        scan.run_id = run_id
        name = record["run"].get("name")
        scan.run_name = name if isinstance(name, str) else None
    traces = record["traces"]
    first = traces[0] if traces and isinstance(traces[0], dict) else {}
    idx = ((first.get("task") or {}).get("data") or {}).get("idx")
    scan.per_task[idx] = scan.per_task.get(idx, 0) + 1
    for trace in traces:
        start = ((trace or {}).get("timing") or {}).get("start") if isinstance(trace, dict) else None
        if isinstance(start, (int, float)) and (scan.started_at is None or start < scan.started_at):
            scan.started_at = float(start)


def iter_episodes(scan: TracesScan) -> Iterator[dict[str, Any]]:
    """The episodes a scan checked, in file order, one line in memory at a time."""
    for _, _, raw in _lines(scan.path, scan.end):
        if raw.strip():
            record, reason = _parse(raw)
            if record is None:  # changed under us since the scan
                raise CorruptOutputError(scan.path, 0, f"changed while being imported: {reason}")
            yield record
