"""Whether a spool the eval wrote and verifiers' ``traces.jsonl`` beside it hold the same episodes.

A run folder can be written by two programs in turns: ``prime-runs eval`` (verifiers' eval
with the spool's hooks: ``traces.jsonl`` and the spool) and plain ``vf-eval``, which knows
nothing of the spool and only appends to ``traces.jsonl`` (``vf-eval @
<run>/configs/resolved/eval.json --resume`` is what verifiers' own messages tell the user
to run). The spool then lacks what plain vf-eval wrote, and nothing else would say so.
``traces.jsonl`` is verifiers' record of the run, so it is the reference, compared by
episode id in both directions:

- an episode in ``traces.jsonl`` and not in the spool was written by plain vf-eval (or by
  a ``prime-runs eval`` killed between its two appends: verifiers writes ``traces.jsonl``
  first): the importer spools it, in a new segment (importer/outputs.py);
- an episode of the spool's effective set missing from ``traces.jsonl`` was dropped by a
  ``--resume`` that retried it (the supersede rule, content/supersede.py, applies), or lost
  from a ``traces.jsonl`` cut short (a torn last line), which keeps it: the importer tells
  them apart (importer/outputs.py, ``_dropped_by_resume``).

A live writer (``prime-runs eval`` still running) is left alone: its ``traces.jsonl`` is
ahead of its spool by design, for the moment between the two appends.

Comparing reads both files whole (one line at a time, keeping only ids), so a mark in the
spool folder (``traces-agreed.json``) records the versions of ``traces.jsonl`` and of the
segments last found to agree; a sync of an unchanged run costs a few ``stat`` calls.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_runs_spool.content.episodes import episode_id_of
from prime_runs_spool.content.supersede import kept_episode_ids, superseded_in_run
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.errors import CorruptSpoolError, SpoolError
from prime_runs_spool.files import replace_private
from prime_runs_spool.importer.paths import agreed_mark_path, import_mark_path
from prime_runs_spool.plural import episodes
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.writer_state import writer_alive


@dataclass(frozen=True)
class Disagreement:
    """How a spool and its ``traces.jsonl`` differ, by episode id."""

    traces_path: Path
    #: Episodes ``traces.jsonl`` holds and the spool lacks (the importer spools them).
    only_in_traces: int
    #: Episodes of the spool's effective set that ``traces.jsonl`` no longer holds.
    only_in_spool: int
    #: ``traces.jsonl`` lost them in place (:func:`lost_in_place`): no resume dropped them.
    lost_in_place: bool = False

    def describe(self) -> str:
        parts = []
        if self.only_in_traces:
            parts.append(f"{self.traces_path} holds {episodes(self.only_in_traces)} the spool lacks "
                         "(written by plain vf-eval?): the next prime-runs sync or import spools them")
        if self.only_in_spool and self.lost_in_place:
            parts.append(f"the spool holds {episodes(self.only_in_spool)} {self.traces_path} lost in place (the same "
                         "file, shorter: a power cut?, not a --resume): the spool keeps them and sync ships them")
        elif self.only_in_spool:
            parts.append(f"the spool holds {episodes(self.only_in_spool)} {self.traces_path} no longer holds "
                         "(dropped by a --resume, or the file was cut short): the next prime-runs sync or import "
                         "supersedes those a resume dropped and keeps the others")
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {"traces": str(self.traces_path), "only_in_traces": self.only_in_traces,
                "only_in_spool": self.only_in_spool, "lost_in_place": self.lost_in_place}


def version(run_dir: Path) -> dict[str, Any] | None:
    """What the mark compares: ``traces.jsonl``'s identity and size, and each segment's.
    None when there is no ``traces.jsonl`` (nothing to agree with), or when the spool folder
    cannot be listed (another user's, a FIFO named like a segment): the spool's own verdict
    names it, in its place among the runs."""
    try:
        traces = os.stat(verifiers_traces_path(run_dir))
        listed = list_segments(run_dir)
    except OSError:
        return None
    segments = []
    for index, path in listed:
        try:
            found = os.stat(path)
        except OSError:
            return None
        segments.append([index, found.st_size, found.st_mtime_ns])
    return {"traces": [traces.st_dev, traces.st_ino, traces.st_size, traces.st_mtime_ns], "segments": segments}


def is_live(run_dir: Path) -> bool:
    """A writer holds the run's last segment: the eval is still running."""
    segments = list_segments(run_dir)
    return bool(segments) and writer_alive(segments[-1][1])


def agreed(run_dir: Path, current: dict[str, Any] | None = None) -> bool:
    """The mark says this very ``traces.jsonl`` and these segments were found to agree."""
    current = version(run_dir) if current is None else current
    if current is None:
        return True
    try:
        with open(agreed_mark_path(run_dir), "rb") as handle:
            return bool(json.loads(handle.read(1 << 20)) == current)
    except (OSError, ValueError):
        return False


def lost_in_place(run_dir: Path, traces_version: list[Any]) -> bool:
    """``traces.jsonl`` (as ``traces_version``, ``[device, inode, size, mtime]``, says it is
    now) is the very file last found to agree, or the last import read, and holds fewer bytes
    than it did then: it lost lines in place (a power cut before vf-eval's unsynced writes
    reached the disk), which no ``--resume`` does (it writes a new file and renames it in)."""
    before: Any = None
    try:
        with open(agreed_mark_path(run_dir), "rb") as handle:
            before = json.loads(handle.read(1 << 20)).get("traces")
    except (OSError, ValueError, AttributeError):
        pass
    if isinstance(before, list) and len(before) == 4:
        return before[:2] == traces_version[:2] and isinstance(before[2], int) and traces_version[2] < before[2]
    try:
        with open(import_mark_path(run_dir), "rb") as handle:
            mark = json.loads(handle.read(1 << 20))
        read = mark.get("source_bytes")
        return mark.get("source_file") == traces_version[:2] and isinstance(read, int) and traces_version[2] < read
    except (OSError, ValueError, AttributeError):
        return False


def needs_catching_up(run_dir: Path) -> bool:
    """Cheap: a ``traces.jsonl`` beside the spool, no live writer, and not the versions last agreed."""
    return version(run_dir) is not None and not agreed(run_dir) and not is_live(run_dir)


def mark_agreed(run_dir: Path, traces_version: list[Any]) -> None:
    """Record that the spool as it is now agrees with ``traces.jsonl`` as it was when read
    (``traces_version``, taken before reading it, so a change while it was read is seen
    next time). Best effort: a folder that cannot take it is compared again next time."""
    current = version(run_dir)
    if current is None:
        return
    current["traces"] = traces_version
    try:
        replace_private(agreed_mark_path(run_dir), json.dumps(current).encode(), durable=True)
    except OSError:
        pass


def spool_episode_ids(run_dir: Path) -> list[str | None]:
    """The spool's episode ids in spool order, superseded ones included (one line held at a time)."""
    ids: list[str | None] = []
    for record in iter_records(run_dir):
        if record.type == EPISODE:
            meta = record.meta or {}
            found = meta.get("episode_id") or episode_id_of(record.data)
            ids.append(None if found is None else str(found))
    return ids


def disagreement(run_dir: Path, *, damage_raises: bool = False) -> Disagreement | None:
    """How the spool and ``traces.jsonl`` differ, or None (they agree, there is no
    ``traces.jsonl``, the eval is still writing, or the spool cannot be read: its own
    verdict says why; with ``damage_raises`` its ``CorruptSpoolError`` goes through). Reads
    both files when the mark does not vouch for them."""
    current = version(run_dir)
    if current is None or agreed(run_dir, current) or is_live(run_dir):
        return None
    traces = verifiers_traces_path(run_dir)
    try:
        in_traces = kept_episode_ids(traces)
        superseded = superseded_in_run(run_dir)
        in_spool = {episode_id for episode_id in spool_episode_ids(run_dir) if episode_id is not None}
    except (OSError, SpoolError) as exc:
        if damage_raises and isinstance(exc, CorruptSpoolError):
            raise
        return None
    effective = in_spool - superseded
    found = Disagreement(traces, len(in_traces - in_spool), len(effective - in_traces),
                         lost_in_place(run_dir, current["traces"]))
    return found if found.only_in_traces or found.only_in_spool else None
