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
from prime_runs_spool.content.recovers import cuts_recovered
from prime_runs_spool.errors import MalformedEpisodeError, PositionLostError
from prime_runs_spool.files import shell_word
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.content.supersede import VERIFIERS_TRACES_NAME, verifiers_traces_path
from prime_runs_spool.spool.layout import list_segments, segment_path
from prime_runs_spool.spool.reader import Position, Record
from prime_runs_spool.spool.resync import Damage
from prime_runs_spool.sync.state import SyncState, state_dir_kept, sync_command


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


#: What a run stopped by damage is told to do next (its report's error ends with it), unless
#: its sync already skips damage: without it a user meets ``corrupt`` and no way on.
SKIP_CORRUPT_ADVICE = ("; sync again with --skip-corrupt to push the intact records after it (each stretch skipped "
                       "is named, and recorded in the evaluation)")
#: The key of a skipped stretch (``state.skipped``) that lay behind the cursor when a pass
#: noted it: the records there had been read, and shipped, before they were damaged.
AFTER_PUSH = "after_push"


def stretch_noted(stretch: dict[str, Any], cursor: Any) -> dict[str, Any]:
    """A stretch of damage as the state keeps it (``state.skipped``): without its message,
    and marked ``after_push`` when it lies behind ``cursor`` (a segment damaged after it was
    read: nothing of it was skipped, what it held was shipped)."""
    kept = {key: value for key, value in stretch.items() if key != "message"}
    if cursor is not None and (stretch["segment"], stretch["offset"]) < (cursor.segment_index, cursor.offset):
        kept[AFTER_PUSH] = True
    return kept


def damaged_seal_advice(run_dir: Any, state: SyncState, state_path: Path | None) -> str | None:
    """What to do about a run that reads ``crashed`` only because damage in place took the
    end of its last segment, where its seal would be, while verifiers' ``traces.jsonl`` lies
    beside the spool; None for any other run. ``state``: the run's sync state, whose
    skipped stretches tell the damage, and whose destination and sink the advised sync carries,
    with its replay and, for a state kept under a ``--state-dir`` (``state_path``: where the
    state lies), that folder: pasted, the sync carries on from this state.

    The completion is not taken from verifiers' files here (docs/sync.md, "A damaged seal"):
    nothing proves the damaged line was the seal and not a record ``traces.jsonl`` lacks,
    and a new seal after damage in place could follow a seal a sync already read and
    finalized. Cut short instead of damaged in place, the spool is one the import step makes
    good from ``traces.jsonl`` (a seal as the eval ended, in a new segment), and a sync that
    read past the cut finds the segment shorter: so the advice is to cut it there, by hand."""
    if getattr(run_dir, "list_segments", None) is not None:  # in an object store: no traces.jsonl here
        return None
    traces = verifiers_traces_path(Path(os.fspath(run_dir)))
    segments = list_segments(run_dir)
    if not segments or not traces.is_file():
        return None
    index, segment = segments[-1]
    try:
        size = segment.stat().st_size
    except OSError:
        return None
    for stretch in state.skipped:
        if (stretch.get("segment") == index and stretch.get("lost") is None and not stretch.get("episode_ids")
                and not stretch.get(AFTER_PUSH) and stretch.get("offset", -1) + stretch.get("length", 0) == size):
            offset = int(stretch["offset"])
            kept = state_dir_kept(state_path, Path(os.fspath(run_dir))) if state_path is not None else None
            more = [*(["--replay", "--replay-id", state.replay_id] if state.replay_id else []),
                    *(["--state-dir", str(kept)] if kept is not None else []), "--skip-corrupt"]
            return (f"the run reads crashed because the damage at byte {offset} of {segment} ends its last segment, "
                    f"where its seal would be; if the eval ended ({traces} says how), cut the damaged line off "
                    f"(keep a copy of the segment first to keep its bytes): truncate -s {offset} "
                    f"{shell_word(segment)}; then "
                    f"{sync_command(str(run_dir), state.destination, state.store, *more)} "
                    f"seals the run as {VERIFIERS_TRACES_NAME} says, finalizing it and sending its held-back episodes "
                    "if it completed (docs/sync.md, \"A damaged seal\")")
    return None


def check_recovered(run_dir: Any, manifests: list[dict[str, Any]], cursor: Any,
                    skipped: list[dict[str, object]]) -> None:
    """Refuse a run whose cut-recovering segment (content/recovers.py) holds copies of
    episodes this destination's sync already shipped: its ``cursor`` (as the state was
    loaded) lies in a later segment than the cut, and no pass passed that cut with ``--skip-corrupt`` while
    its cursor was still before it (a stretch ``skipped`` at the cut, not ``after_push``).
    Then the sync read the damaged segment whole, before it was cut, and shipped what the new
    segment holds: :class:`PositionLostError`, the run ``lost``, nothing sent. A cursor at
    or before the cut has shipped none of them: they go, once, where the stream reaches them."""
    if cursor is None:
        return
    passed = {(s.get("segment"), s.get("offset")) for s in skipped if not s.get(AFTER_PUSH)}
    for cut in cuts_recovered(manifests):
        # A cursor inside the cut segment past its lines is the reader's to refuse (docs/spool-format.md, section 6).
        if cursor.segment_index > cut.segment and tuple(cut) not in passed:
            raise PositionLostError(
                segment_path(run_dir, cut.segment), cut.offset,
                f"the segment was cut here, and the episodes past the cut were read before the cut (and shipped): "
                f"a later segment recovered them from {VERIFIERS_TRACES_NAME}, copies this sync will not ship again")
