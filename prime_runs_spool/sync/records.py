"""Which of a run's spool records a sync ships, the same for every sink: the durable ones
(as far as a live writer's durable mark), damage passed over and noted or stopped at, the
seal that ends the run, and the episodes withheld (superseded by a resume, or held while a
resume may still retry them) and released.

Kept apart from the rows (sync/rows.py), which turn these records into the legacy samples
table's rows and batches: Prime Traces' lines (sync/sinks/addressed.py) read the same
records, so they follow the same rules by calling the same code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import CorruptSpoolError, UnsupportedFormatError
from prime_runs_spool.content.episodes import episode_id_of
from prime_runs_spool.content.remask import remask_episode
from prime_runs_spool.content.supersede import is_errored, verifiers_traces_path
from prime_runs_spool.spool.format import EPISODE, SEAL
from prime_runs_spool.spool.layout import segment_follows
from prime_runs_spool.spool.reader import Position, iter_records, resync_records
from prime_runs_spool.spool.resync import Damage
from prime_runs_spool.sync.options import RunReport
from prime_runs_spool.sync.recover import recovered_record, stretch_noted
from prime_runs_spool.sync.state import SyncState


def durable_records(run_dir: Path, start: Position | None = None, *, skip_corrupt: bool = False,
                    skipped: list[dict[str, Any]] | None = None, remask: bool = False,
                    segments: list[tuple[int, Path]] | None = None) -> Iterator[Any]:
    """The run's *durable* records from ``start`` (as far as a live writer's durable mark),
    every check of the format held as a read from the beginning would hold it. With
    ``skip_corrupt`` the reader resynchronizes after damage: each stretch of damage is
    passed over and noted in ``skipped`` (``Damage.as_dict`` plus its ``message``), and
    every intact record after it is read; a damaged episode that verifiers'
    ``traces.jsonl`` beside the spool holds intact is read from there instead
    (sync/recover.py; its note says ``recovered``). Not ``Spool.records()``, which reads everything
    on disk and stops at damage.

    With ``remask`` (the spool was written under older masking rules), every episode comes
    out masked again by today's (content/remask.py). Every path that sends an episode, or
    counts the rows one gives, reads it here, so none of them can send it otherwise.
    ``segments``: the run's listing to read by (the pass's own, taken with the manifests)."""
    records = _durable(run_dir, start, skip_corrupt, skipped, segments)
    if not remask:
        yield from records
        return
    for record in records:
        yield replace(record, data=remask_episode(record.data)) if record.type == EPISODE else record


def _durable(run_dir: Path, start: Position | None, skip_corrupt: bool,
             skipped: list[dict[str, Any]] | None, segments: list[tuple[int, Path]] | None) -> Iterator[Any]:
    if not skip_corrupt:
        yield from iter_records(run_dir, start, durable_only=True, full_checks=True, segments=segments)
        return
    for item in resync_records(run_dir, start, durable_only=True, full_checks=True, segments=segments):
        if not isinstance(item, Damage):
            yield item
            continue
        recovered = recovered_record(run_dir, item)
        if skipped is not None:
            note = {**item.as_dict(), "message": item.message()}
            if recovered is not None:
                where = verifiers_traces_path(Path(os.fspath(run_dir)))
                note["recovered"] = str(where)
                note["message"] += f"; episode {item.episode_ids[0]} recovered from {where}"
            skipped.append(note)
        if recovered is not None:
            yield recovered


def note_skipped(state: SyncState, report: RunReport, skipped: list[dict[str, Any]]) -> bool:
    """Keep the damage a stream passed over (``sync --skip-corrupt``): each stretch not yet
    in the state is added to ``state.skipped`` (what the evaluation's metadata lists as
    ``skipped_corruption``), said in one report line, and counted in the report. Returns
    whether the state changed (the caller saves it). Both stores call this."""
    known = {(s["segment"], s["offset"]) for s in state.skipped}
    new = [s for s in skipped if (s["segment"], s["offset"]) not in known]
    for stretch in new:
        known.add((stretch["segment"], stretch["offset"]))
        state.skipped.append(stretch_noted(stretch, state.cursor))
        report.skipped_corrupt += 1
        report.skipped_records += (stretch.get("lost") or 0) - (1 if stretch.get("recovered") else 0)
        report.warnings.append(f"skipped: {stretch.get('message') or stretch}")
    return bool(new)


def track_seal(seal: dict[str, Any] | None, seal_segment: int | None, record: Any
               ) -> tuple[dict[str, Any] | None, int | None]:
    """The seal that ends the log so far, and its segment, once ``record`` is read.

    Only the *last* segment's seal ends a run (docs/spool-format.md, section 7): a record
    of a later segment drops the seal (the run was resumed after it). The reader passes no
    headers on, so the record's segment index is what tells. Every stream that ships a run
    (rows for samples, lines for traces) follows its seal with this and :func:`seal_if_last`.
    """
    if seal is not None and record.segment_index != seal_segment:
        seal, seal_segment = None, None
    if record.type == SEAL:
        seal, seal_segment = record.data, record.segment_index
    return seal, seal_segment


def seal_if_last(run_dir: Path, seal: dict[str, Any] | None, seal_segment: int | None) -> dict[str, Any] | None:
    """``seal`` if no segment follows its own at the end of a pass, else None: a resumed
    writer that has written only its header yields no record, yet its run is not over
    (spool/layout.py, ``segment_follows``)."""
    if seal is None:
        return None
    return None if segment_follows(run_dir, seal_segment) else seal


def record_episode_id(record: Any) -> str | None:
    """The episode id of a spool episode record: the writer's stamp, else the episode's own."""
    value = (record.meta or {}).get("episode_id") or episode_id_of(record.data)
    return None if value is None else str(value)


#: Why an episode record gives nothing to a destination (docs/sync.md, "Resumed runs").
SUPERSEDED = "superseded"
HELD = "held"


def withheld(record: Any, superseded: frozenset[str] | set[str], *, hold_errored: bool) -> str | None:
    """The one rule, for every sink alike, of which episodes a run gives now:
    None when this episode record is sent, SUPERSEDED when a resumed segment replaced it
    (never sent), HELD when it errored and the run has not completed (a resume may still
    retry it; sent when the run completes, see :func:`held_episodes`)."""
    if record_episode_id(record) in superseded:
        return SUPERSEDED
    return HELD if hold_errored and is_errored(record.data) else None


def held_episodes(run_dir: Path, superseded: frozenset[str] | set[str], released: set[str], *,
                  skip_corrupt: bool = False, remask: bool = False) -> Iterator[Any]:
    """The episode records a completed run releases: the ones :func:`withheld` held back,
    not superseded and not already released, in spool order. A function of the spool and
    ``released`` only, so a sync that dies half way finds the same rest again. Every sink
    releases these (each sink's ``held_batches``, driven by the pass's run end), and
    reconciling a lost samples state reads them in this order. An episode without an id
    cannot be recorded as released, so it is never released (it would go again each time)."""
    for record in durable_records(run_dir, skip_corrupt=skip_corrupt, remask=remask):
        if record.type != EPISODE or withheld(record, superseded, hold_errored=True) != HELD:
            continue
        episode_id = record_episode_id(record)
        if episode_id is not None and episode_id not in released:
            yield record


def count_until_damage(records: Callable[[], Iterable[Any]]) -> int:
    """How many items ``records()`` yields before damage stops it: what the spool reader
    raises on a damaged or unreadable segment (a corrupt line, a format it does not know, a
    file it cannot read) ends the count. Nothing else is caught: a count that read 0 because
    of a bug would be a wrong line said without a word, so a bug reaches the run's
    internal-error report instead."""
    found = 0
    try:
        for _ in records():
            found += 1
    except (CorruptSpoolError, UnsupportedFormatError, OSError):
        pass
    return found
