"""What a resumed run inherits from the spool it continues.

verifiers' ``--resume`` restarts in the same run directory and re-logs the episodes it
kept. To continue the run rather than start a second one, the new writer needs the run's
id, whether a manifest was already written, the episode ids already recorded (so they are
not recorded twice), the rollout numbers already issued (so numbering continues), and the
summary so far (so ``finish`` covers the whole run). All of it comes from one forward pass
over the existing segments, holding one line at a time: memory grows with the number of
episode ids and rollout keys, never with the spool's size.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import RunInUseError
from prime_runs_spool.spool.format import EPISODE, MANIFEST
from prime_runs_spool.spool.header import read_header
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.content.episodes import RolloutCounter, episode_id_of, rollout_key
from prime_runs_spool.spool.reader import iter_records, resync_records
from prime_runs_spool.spool.resync import Damage
from prime_runs_spool.spool.writer_state import held_by_this_process, writer_alive
from prime_runs_spool.content.summary import SummaryAccumulator


@dataclass
class PriorRun:
    """The state of a run's existing spool, as a resuming writer needs it."""

    run_id: str | None = None
    manifest: dict[str, Any] | None = None
    episode_ids: set[str] = field(default_factory=set)
    counter: RolloutCounter = field(default_factory=RolloutCounter)
    summary: SummaryAccumulator = field(default_factory=SummaryAccumulator)
    episodes: int = 0
    segments: int = 0
    #: Every episode line of the existing segments, superseded ones included: what a reader
    #: counts, so what the new segment's header records (docs/spool-format.md, 4.1).
    episode_lines: int = 0
    #: The highest segment index scanned (0: none). The new segment is created only if it is
    #: still the last one, so two processes opening the run at once never both write it.
    last_index: int = 0


def scan_prior_run(run_dir: str | os.PathLike[str], superseded: Collection[str] = (), *,
                   past_damage: bool = False) -> PriorRun:
    """Stream the run's existing segments (none: an empty :class:`PriorRun`).

    ``superseded``: episode ids this resume replaces (content/supersede.py). They stay
    known (never recorded again) but count neither in the summary nor in the episodes
    total nor in the rollout numbers: the run continues from its effective set.

    Raises :class:`RunInUseError` when a live process still holds one of the segments,
    and lets the reader's ``CorruptSpoolError`` through: appending after damage would put
    new episodes where no reader can reach them. With ``past_damage`` the scan passes over
    damage (docs/spool-format.md, section 4.2) and counts only what a reader can still read,
    which is what a new segment's header must then record: the importer's way of adding
    episodes a spool cut short lost, without writing into the damaged bytes.
    """
    prior = PriorRun()
    segments = list_segments(run_dir)
    for _, path in segments:
        if writer_alive(path):
            if held_by_this_process(path):
                raise RunInUseError(
                    f"{path}: this process already has this run open (a Run not finished yet, "
                    "from a cell run before, say); finish() or abort() that Run, or keep logging "
                    "to it, instead of opening the run again")
            raise RunInUseError(
                f"{path}: another process is still writing this run; "
                "wait for it to exit before resuming the run"
            )
        if prior.run_id is None:
            prior.run_id = _header_run_id(path)
    prior.segments = len(segments)
    prior.last_index = segments[-1][0] if segments else 0
    numbers = _Numbers()
    records = resync_records(run_dir) if past_damage else iter_records(run_dir)
    for record in records:
        if isinstance(record, Damage):
            continue
        if record.type == MANIFEST and prior.manifest is None and isinstance(record.data, dict):
            prior.manifest = record.data
        elif record.type == EPISODE:
            prior.episode_lines += 1
            if isinstance(record.data, dict):
                _observe_episode(prior, record.data, record.meta or {}, superseded, numbers)
    numbers.give_back(prior.counter)
    return prior


@dataclass
class _Numbers:
    """Rollout numbers seen during the scan: held by an episode that stays, or released by
    a superseded one. A number is given back only if no remaining episode holds it (an
    earlier retry may already have taken it)."""

    held: dict[Any, set[int]] = field(default_factory=dict)
    released: list[tuple[Any, int]] = field(default_factory=list)

    def give_back(self, counter: RolloutCounter) -> None:
        for key, number in self.released:
            if number not in self.held.get(key, ()):
                counter.release(key, number)


def _observe_episode(
    prior: PriorRun, data: dict[str, Any], meta: dict[str, Any], superseded: Collection[str], numbers: _Numbers
) -> None:
    episode_id = meta.get("episode_id") or episode_id_of(data)
    if episode_id is not None:
        prior.episode_ids.add(str(episode_id))
    number = meta.get("rollout_number")
    if isinstance(number, int):
        prior.counter.observe(rollout_key(data), number)
    else:
        number = prior.counter.next_number(data)
    key = rollout_key(data)
    if episode_id is not None and str(episode_id) in superseded:
        # Its slot is re-run: the retry takes its number (lowest free first, once the scan
        # is done), and it counts neither in the summary nor in the run's episodes.
        if isinstance(number, int):
            numbers.released.append((key, number))
        return
    if isinstance(number, int):
        numbers.held.setdefault(key, set()).add(number)
    prior.episodes += 1
    prior.summary.add(data)


def _header_run_id(path: Path) -> str | None:
    """The run id in a segment's header line, or None when the header is not intact."""
    header = read_header(path)
    run_id = None if header is None else header.get("run_id")
    return run_id if isinstance(run_id, str) else None
