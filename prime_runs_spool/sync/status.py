"""What ``prime-runs status`` reports: per run, what the spool holds and, per destination,
what its sync state says is on the platform. Offline: no request is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.errors import SpoolError
from prime_runs_spool.spool.layout import sync_dir
from prime_runs_spool.spool.reader import Position, iter_records, read_run
from prime_runs_spool.sync.state import SyncState


@dataclass
class DestinationStatus:
    destination: str
    team_id: str | None
    evaluation_id: str | None
    url: str | None
    samples_pushed: int
    episodes_pushed: int
    #: Episodes in the spool past the acknowledged cursor.
    pending: int
    finalized: bool
    terminal: str | None
    replay_id: str | None = None
    in_flight: str | None = None


@dataclass
class RunStatus:
    path: str
    run_id: str | None = None
    name: str | None = None
    model: str | None = None
    state: str = "unknown"
    segments: int = 0
    episodes: int = 0
    destinations: list[DestinationStatus] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["destinations"] = [dict(d.__dict__) for d in self.destinations]
        return out


def _episodes_after(run_dir: Path, state: SyncState) -> int:
    cursor = state.cursor
    start = None if cursor is None else Position(cursor.segment_index, cursor.offset, cursor.next_seq)
    try:
        return sum(1 for record in iter_records(run_dir, start) if record.type == EPISODE)
    except SpoolError:
        return 0  # the corruption is reported by the run's own state


def run_status(run_dir: Path) -> RunStatus:
    status = RunStatus(path=str(run_dir))
    try:
        spool = read_run(run_dir)
    except SpoolError as exc:
        status.state, status.error = "error", str(exc)
        return status
    manifest = spool.manifest
    status.run_id = spool.run_id
    status.name = manifest.get("name")
    status.model = manifest.get("model")
    status.state = spool.status
    status.segments = len(spool.segments)
    status.episodes = spool.episodes_count
    if spool.corrupt is not None:
        status.error = f"{spool.corrupt.path}: corrupt at byte {spool.corrupt.corrupt_offset}: {spool.corrupt.corrupt_reason}"
    for path in sorted(sync_dir(run_dir).glob("*.json")):
        try:
            state = SyncState.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        status.destinations.append(DestinationStatus(
            destination=state.destination.base_url, team_id=state.destination.team_id,
            evaluation_id=state.evaluation_id, url=state.viewer_url,
            samples_pushed=state.samples_pushed, episodes_pushed=state.episodes_pushed,
            pending=_episodes_after(run_dir, state), finalized=state.finalized,
            terminal=state.terminal, replay_id=state.replay_id,
            in_flight=state.in_flight.kind if state.in_flight else None))
    return status
