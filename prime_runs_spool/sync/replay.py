"""Which replay a ``--replay`` continues: the run's latest unfinished one, else a new one.

A replay pushes a run again as a *new* evaluation, with its own state file
(``spool/sync/<key>-replay-<id>.json``) and its id in the evaluation's metadata, so the run's
earlier evaluations and states are untouched. An interrupted replay must not turn into a
second new evaluation when the command is simply run again: that would be the duplicate
replay exists to avoid. So ``--replay`` first looks for a replay of this run to this
destination that has not reached its end, and carries that one on.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from prime_runs_spool.spool.format import SEAL_STATUSES
from prime_runs_spool.spool.layout import replay_state_glob, sync_dir
from prime_runs_spool.sync.state import SyncState

#: Ends a state records once the run's end is on the platform.
TERMINAL = SEAL_STATUSES


def finished(state: SyncState) -> bool:
    """Whether this state's evaluation got the run's end (finalized, or its end recorded)."""
    return state.in_flight is None and (state.finalized or state.terminal in TERMINAL)


def unfinished_replay(run_dir: Path, dest_key: str) -> str | None:
    """The id of the most recently updated unfinished replay of this run to ``dest_key``."""
    candidates: list[tuple[float, str]] = []
    for path in sync_dir(run_dir).glob(replay_state_glob(dest_key)):
        try:
            state = SyncState.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue  # a damaged replay state is not continued; a new replay starts instead
        if state.replay_id and state.destination.key == dest_key and not finished(state):
            candidates.append((state.updated_at, state.replay_id))
    return max(candidates)[1] if candidates else None


def replay_id_for(run_dir: Path, dest_key: str) -> str:
    """The replay to push ``run_dir`` under: the unfinished one, else a fresh id."""
    return unfinished_replay(run_dir, dest_key) or uuid.uuid4().hex
