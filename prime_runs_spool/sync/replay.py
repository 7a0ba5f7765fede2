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
from collections.abc import Iterable
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
    documents = []
    for path in sync_dir(run_dir).glob(replay_state_glob(dest_key)):
        try:
            documents.append(path.read_bytes())
        except OSError:
            continue
    return latest_unfinished(documents, dest_key)


def latest_unfinished(documents: Iterable[bytes], dest_key: str) -> str | None:
    """Of these replay states (a run's local files, or its objects in a store), the id of
    the most recently updated one to ``dest_key`` that is not finished."""
    candidates: list[tuple[float, str]] = []
    for document in documents:
        try:
            state = SyncState.from_json(document)
        except ValueError:
            continue  # a damaged replay state is not continued; a new replay starts instead
        if state.replay_id and state.destination.key == dest_key and not finished(state):
            candidates.append((state.updated_at, state.replay_id))
    return max(candidates)[1] if candidates else None


def new_replay_id() -> str:
    return uuid.uuid4().hex


def replay_id_for(run_dir: Path, dest_key: str) -> str:
    """The replay to push ``run_dir`` under: the unfinished one, else a fresh id."""
    return unfinished_replay(run_dir, dest_key) or new_replay_id()
