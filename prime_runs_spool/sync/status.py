"""What ``prime-runs status`` reports: per run, what the spool holds and, per destination,
what its sync state says is on the platform. Offline: no request is made."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.plural import episodes as plural_episodes, plural
from prime_runs_spool.spool.format import CRASHED, EPISODE
from prime_runs_spool.errors import SpoolError, corruption_message
from prime_runs_spool.files import OnLink, unreadable_message
from prime_runs_spool.spool.layout import find_runs, list_segments, segment_name
from prime_runs_spool.sync.id_sets import size_of
from prime_runs_spool.sync.state import state_home, sync_dir, sync_state_path
from prime_runs_spool.spool.reader import iter_records, position_lost
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.sync.state import StateFormatError, SyncState, read_state
from prime_runs_spool.sync.recover import damaged_seal_advice
from prime_runs_spool.content.supersede import superseded_in_run


@dataclass
class DestinationStatus:
    destination: str
    team_id: str | None
    evaluation_id: str | None
    url: str | None
    samples_pushed: int
    episodes_pushed: int
    #: Episodes in the spool not acknowledged: past the cursor, or more if the spool holds
    #: more episodes than were pushed (an earlier segment that grew behind the cursor).
    pending: int
    finalized: bool
    terminal: str | None
    replay_id: str | None = None
    in_flight: str | None = None
    #: Errored episodes not pushed when the run's end was last synced: held back until the
    #: run completes (a resume may retry them).
    held_back: int = 0
    #: Episodes a resume superseded after they were pushed: the platform keeps their rows.
    superseded_after_push: int = 0
    #: Episodes sync passed over because no request can carry one of their rows.
    skipped_too_large: int = 0
    #: Set when the last sync found the platform holding samples it cannot account for.
    mismatch: str | None = None
    #: Set when the spool no longer holds lines this destination was sent: its cursor is no
    #: longer the start of a line, or the spool holds fewer episodes than were pushed.
    lost: str | None = None
    #: The sink the run's episodes go to there: "traces", "samples", or None (undecided); the
    #: key keeps its name, as in the state file and `--json`.
    store: str | None = None
    #: What Prime Traces holds of the run: committed uploads and the traces they carried.
    uploads: int = 0
    traces_pushed: int = 0
    #: Episodes vf-eval pushed there itself before the run's evaluation was adopted.
    pushed_by_vf_eval: int = 0
    #: Episodes an earlier sync had put in Prime Traces when this state started from
    #: nothing (its state lost): never sent again by this one (the state's ``held_there``).
    held_there: int = 0


@dataclass
class RunStatus:
    path: str
    run_id: str | None = None
    name: str | None = None
    model: str | None = None
    #: The spool's status (``Spool.status``): completed, failed, crashed, live, torn, corrupt;
    #: ``error`` when the run cannot be read.
    status: str = "unknown"
    segments: int = 0
    episodes: int = 0
    #: Episodes a resumed segment superseded (content/supersede.py): not part of the results.
    superseded: int = 0
    destinations: list[DestinationStatus] = field(default_factory=list)
    error: str | None = None
    #: What is not wrong in itself but worth saying (a lock file deleted under its writer).
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        # The --json key stays "state" (docs/cli.md), in the same place.
        out = {("state" if key == "status" else key): value for key, value in self.__dict__.items()}
        out["destinations"] = [dict(d.__dict__) for d in self.destinations]
        return out


def _lost(run_dir: Path, episodes: int, state: SyncState) -> str | None:
    """Whether the spool lost lines this destination was already sent (docs/sync.md, "Lines
    lost under the cursor"): its cursor no longer starts a line (one byte read), or the
    spool holds fewer episodes than were pushed."""
    cursor = state.cursor
    if cursor is not None:
        segment = dict(list_segments(run_dir)).get(cursor.segment_index)
        reason = (position_lost(segment, cursor.position) if segment is not None
                  else "the segment of the recorded position is missing")
        if reason is not None:
            return f"{segment_name(cursor.segment_index)}: {reason}"
    recovered = sum(1 for stretch in state.skipped if stretch.get("recovered"))  # read from traces.jsonl
    if episodes + recovered < state.episodes_pushed:
        return (f"the spool holds {plural_episodes(episodes + recovered)}, {state.episodes_pushed} "
                f"{plural(state.episodes_pushed, 'was', 'were')} pushed")
    return None


def _episodes_after(run_dir: Path, state: SyncState) -> int:
    cursor = state.cursor
    start = None if cursor is None else cursor.position
    try:
        return sum(1 for record in iter_records(run_dir, start) if record.type == EPISODE)
    except SpoolError:
        return 0  # the corruption is reported by the run's own state


def mismatch_text(mismatch: dict[str, Any] | None) -> str | None:
    """A recorded sample-count mismatch, as ``status`` shows it."""
    if not mismatch:
        return None
    return (f"the platform holds {mismatch.get('platform_samples')} samples, this spool's sync accounts for "
            f"{mismatch.get('spool_samples')} ({mismatch.get('detail')}); not finalized")


def unreadable_status(path: Path, exc: OSError) -> RunStatus:
    """The status of a directory under the paths that could not be read (a run may be in it)."""
    return RunStatus(path=str(path), status="error", error=unreadable_message(exc, path))


def statuses(paths: Iterable[Path], on_link: OnLink | None = None,
             state_dir: Path | None = None) -> list[RunStatus]:
    """The status of every run under ``paths``, and of every directory that could not be
    read among them (in walk order): one unreadable run never hides the others. ``on_link``
    is told of each link to a folder outside the paths, not followed (``layout.find_runs``).
    ``state_dir``: where a sync with ``--state-dir`` kept the states of read-only spools."""
    found: list[RunStatus] = []
    for run_dir in find_runs(paths, lambda path, exc: found.append(unreadable_status(path, exc)), on_link=on_link):
        found.append(run_status(run_dir, state_dir=state_dir))
    return found


def state_paths(run_dir: Path, state_dir: Path | None) -> list[Path]:
    """The run's state files, as its next sync starts from them: those beside the spool and,
    for a read-only spool synced with a state directory, those kept there, each over the one
    of its name beside the spool (written before the spool was read-only, then carried on
    from there: sync/state.py, ``adopt_states``). Without this a run synced only from the
    state directory reads "not synced anywhere yet", an invitation to push it again. Read by
    ``status`` and by the viewer alike."""
    paths = {path.name: path for path in sync_dir(run_dir).glob("*.json")}
    home = state_home(run_dir, state_dir) if state_dir is not None else None
    if home is not None and home != run_dir:
        paths.update({path.name: path for path in sync_dir(home).glob("*.json")})
    return [paths[name] for name in sorted(paths)]


def _state_path(run_dir: Path, state: SyncState, state_dir: Path | None) -> Path:
    """Where the run's next sync keeps ``state``: beside the spool, or under ``state_dir``
    for a read-only one (what a command a warning suggests must name)."""
    home = (state_home(run_dir, state_dir) if state_dir is not None else None) or run_dir
    return sync_state_path(home, state.destination.key, state.replay_id)


def _local_states(run_dir: Path, warnings: list[str], state_dir: Path | None = None) -> Iterator[bytes]:
    """The run's state files; one that cannot be read is said in ``warnings``, not skipped
    in silence (status would otherwise show its destination as never synced)."""
    for path in state_paths(run_dir, state_dir):
        try:
            yield read_state(path)[1]  # the twin's bytes, where a power cut tore the file (sync/state_file.py)
        except StateFormatError:
            yield b""  # damaged: said below
        except OSError as exc:
            warnings.append(f"sync state {path} cannot be read ({exc.strerror or exc})")


def run_status(run_dir: Path, states: Iterable[bytes] | None = None, state_dir: Path | None = None) -> RunStatus:
    """``states``: the run's sync state documents, when they are not files beside the spool
    (a run in an object store keeps them as objects: sync/store_sync.py); ``state_dir``: the
    state directory a read-only spool's syncs kept theirs in."""
    run = RunStatus(path=str(run_dir))
    try:
        spool = read_run(run_dir)
    except SpoolError as exc:
        run.status, run.error = "error", str(exc)
        return run
    except OSError as exc:
        return unreadable_status(run_dir, exc)
    manifest = spool.manifest
    run.run_id = spool.run_id
    run.name = manifest.get("name")
    run.model = manifest.get("model")
    run.status = spool.status
    run.segments = len(spool.segments)
    run.episodes = spool.episodes_count
    superseded = superseded_in_run(run_dir)
    run.superseded = len(superseded)
    if spool.corrupt is not None:
        run.error = corruption_message(spool.corrupt.path, spool.corrupt.corrupt_offset, spool.corrupt.corrupt_reason)
    else:
        run.error = spool.problem
    run.warnings = spool.warnings
    # Two writers (Spool.problem): an earlier segment grows behind every cursor, so what is
    # past the cursor undercounts; every episode not pushed is pending then. Otherwise the
    # cursor says it exactly (an episode that gets no row is never "pushed").
    behind = spool.episodes_count if spool.problem else 0
    for document in _local_states(run_dir, run.warnings, state_dir) if states is None else states:
        try:
            state = SyncState.from_json(document)
        except ValueError:
            run.warnings.append("a sync state is damaged; the next sync reconciles it with the platform "
                                "(a replay's: --replay-id ID continues that replay, --replay alone starts a new one)")
            continue
        run.destinations.append(DestinationStatus(
            destination=state.destination.base_url, team_id=state.destination.team_id,
            evaluation_id=state.evaluation_id, url=state.viewer_url,
            samples_pushed=state.samples_pushed, episodes_pushed=state.episodes_pushed,
            pending=max(_episodes_after(run_dir, state), behind - state.episodes_pushed),
            finalized=state.finalized,
            terminal=state.terminal, replay_id=state.replay_id,
            in_flight=state.in_flight.kind if state.in_flight else None,
            held_back=state.held_back,
            superseded_after_push=len(state.superseded_pushed),
            skipped_too_large=len(state.skipped_too_large),
            mismatch=mismatch_text(state.mismatch),
            lost=_lost(run_dir, spool.episodes_count, state),
            store=state.store, uploads=len(state.uploads), traces_pushed=state.traces_pushed,
            pushed_by_vf_eval=size_of(state.on_platform), held_there=size_of(state.held_there)))
        if state.terminal != CRASHED:
            continue
        kept = _state_path(run_dir, state, state_dir) if states is None else None  # a store's: no --state-dir
        advice = damaged_seal_advice(run_dir, state, kept)
        if advice is not None and advice not in run.warnings:  # a run synced to two places: said once
            run.warnings.append(advice)
    return run

