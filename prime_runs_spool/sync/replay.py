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

from prime_runs_spool.files import read_regular_file
from prime_runs_spool.spool.format import SEAL_STATUSES
from prime_runs_spool.sync.state import replay_state_glob, sync_dir, sync_state_path, valid_replay_id
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
            documents.append((path.name, read_regular_file(path)))
        except OSError:
            continue
    return latest_unfinished(documents, dest_key)


def latest_unfinished(documents: Iterable[tuple[str, bytes]], dest_key: str) -> str | None:
    """Of these replay states, ``(file name, bytes)`` (a run's local files, or its objects in
    a store), the id of the most recently updated one to ``dest_key`` that is not finished.

    A state counts only where it lies under its own name: one whose ``replay_id`` is not a
    replay id, or names another file (a spool received from elsewhere can hold anything),
    is passed over, so continuing it can never write outside the run's sync folder."""
    candidates: list[tuple[float, str]] = []
    for name, document in documents:
        try:
            state = SyncState.from_json(document)
        except ValueError:
            continue  # a damaged replay state is not continued; a new replay starts instead
        replay_id = state.replay_id
        if not replay_id or not valid_replay_id(replay_id) or state.destination.key != dest_key:
            continue
        if sync_state_path("", dest_key, replay_id).name == name and not finished(state):
            candidates.append((state.updated_at, replay_id))
    return max(candidates)[1] if candidates else None


def new_replay_id() -> str:
    return uuid.uuid4().hex


def replay_option(replay_id: str | None) -> str:
    """The options that push a run again as a new evaluation, for a message's advice:
    ``--replay``; said of a replay's own state (``replay_id``), which ``--replay`` alone
    would continue, the same with a new id, so the command as printed starts another."""
    return "--replay" if replay_id is None else f"--replay --replay-id {new_replay_id()}"


def replay_id_for(run_dir: Path, dest_key: str) -> str:
    """The replay to push ``run_dir`` under: the unfinished one, else a fresh id."""
    return unfinished_replay(run_dir, dest_key) or new_replay_id()
