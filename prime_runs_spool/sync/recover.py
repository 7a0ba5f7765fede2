"""A damaged spool episode found again in verifiers' ``traces.jsonl`` beside the spool.

``sync --skip-corrupt`` passes over damage (docs/spool-format.md, section 4.2). When the run
folder also holds verifiers' own record of the run, the episode a damaged line held is
usually there intact: verifiers wrote the same episode to ``traces.jsonl``. The damaged
line's meta often stays legible (it sits at the line's end, a few bytes against the
episode's kilobytes), and names the episode id and rollout number. An episode of
``traces.jsonl`` with exactly that id, that passes the checks an import applies
(``check_episode``) and is masked as an import masks it (today's episode rules), is what
the spool would hold had it been imported: it takes the damaged line's place in the stream.

Only a stretch that lost exactly one record, with one legible id, is recovered: the
record's place in the stream (its cursor) is then the stretch's own, as a line's is. The
legible id is never trusted by itself: it must name an episode ``traces.jsonl`` holds.
Bounded memory: ``traces.jsonl`` is read one line at a time, and a line is parsed only when
it holds the id's JSON text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.content.episodes import check_episode
from prime_runs_spool.content.remask import remask_episode
from prime_runs_spool.errors import MalformedEpisodeError
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.spool.reader import Position, Record
from prime_runs_spool.spool.resync import Damage


def recoverable_id(damage: Damage) -> str | None:
    """The episode id a stretch of damage can be recovered by: one record lost, one id legible."""
    if damage.lost not in (1, None) or len(damage.episode_ids) != 1 or damage.first_seq is None:
        return None
    return damage.episode_ids[0]


def find_in_traces(run_dir: Any, episode_id: str) -> dict[str, Any] | None:
    """The episode ``episode_id`` of the run's ``traces.jsonl``, checked and masked as an
    import would write it; None when the file is not there, or holds no such episode that
    passes."""
    if getattr(run_dir, "list_segments", None) is not None:  # a run in an object store: no traces.jsonl here
        return None
    path = verifiers_traces_path(Path(os.fspath(run_dir)))
    needle = orjson.dumps(episode_id)
    try:
        handle = open(path, "rb")
    except OSError:
        return None
    with handle:
        for line in handle:
            if needle not in line:
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(row, dict) or row.get("id") != episode_id or not isinstance(row.get("traces"), list):
                continue
            try:
                check_episode(row)
            except MalformedEpisodeError:
                return None
            return remask_episode(row)
    return None


def recovered_record(run_dir: Any, damage: Damage) -> Record | None:
    """The record that takes a damaged stretch's place, recovered from ``traces.jsonl``, or None."""
    episode_id = recoverable_id(damage)
    if episode_id is None:
        return None
    episode = find_in_traces(run_dir, episode_id)
    if episode is None:
        return None
    assert damage.first_seq is not None
    rollout = damage.rollout_numbers[0] if damage.rollout_numbers else None
    after = Position(damage.segment_index, damage.end_offset, damage.first_seq + 1)
    return Record(damage.segment_index, damage.offset, after.offset, after.next_seq - 1, EPISODE, episode,
                  {"episode_id": episode_id, "rollout_number": rollout})
