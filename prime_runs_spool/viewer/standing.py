"""Where a spooled run stands: what is written, and what each sync state says went where.

Written: the index's episodes, the run's segments, and its seal (or none yet). Synced: per
destination, the figures of its sync state file (``sync/state.py``, read, never written):
the platform and the store it went to there, how many episodes (and samples or traces) are
acknowledged, how many of the spool's are past its cursor, whether it was finalized, and
the evaluation's link. The viewer reads the state files only, like ``prime-runs status``:
no request is made, so the figures are what the last sync knew.

The runs page refreshes every second, so each state file is parsed again only when its
size or modification time changed.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prime_runs_spool.sync.status import state_paths
from prime_runs_spool.sync.options import SAMPLES, TRACES
from prime_runs_spool.sync.state import StateFormatError, SyncState, read_state

#: How a store is named on a page.
STORE_NAMES = {TRACES: "Prime Traces", SAMPLES: "samples table"}
#: The prefix of a local platform's destination (``sync/state.py``'s ``local_destination``).
_LOCAL = "local:"


@dataclass(frozen=True)
class Synced:
    """One destination's figures, as its state file holds them."""

    platform: str
    team: str | None
    store: str | None
    episodes: int
    samples: int
    traces: int
    uploads: int
    #: Episodes of the spool (as far as the index has read it) at or past the state's cursor.
    pending: int
    finalized: bool
    terminal: str | None
    evaluation_id: str | None
    url: str | None
    in_flight: str | None
    mismatch: bool
    replay_id: str | None

    @property
    def store_name(self) -> str:
        return STORE_NAMES.get(self.store or "", "no store chosen yet")

    @property
    def link(self) -> str | None:
        """The evaluation's URL when it is a web address: a state file is only data, and a
        ``javascript:`` URL in one must never become a link."""
        try:
            scheme = urlsplit(self.url).scheme if self.url else ""
        except ValueError:
            return None
        return self.url if scheme in ("http", "https") else None


@dataclass(frozen=True)
class Damaged:
    """A state file that is not one (sync reconciles it with the platform on its next pass)."""

    name: str
    reason: str


def platform_name(base_url: str) -> str:
    """A destination as a reader knows it: the local platform's database, else its URL."""
    if base_url.startswith(_LOCAL):
        return f"local platform ({base_url[len(_LOCAL):]})"
    return base_url


class SyncStates:
    """The sync state files of one run, parsed again only when they change: beside its spool,
    or, for a read-only spool, where its syncs with ``--state-dir`` kept them (``state_dir``)."""

    def __init__(self, run_dir: Path, state_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        self.state_dir = state_dir
        self._parsed: dict[str, tuple[tuple[int, int], SyncState | Damaged]] = {}

    def read(self) -> list[SyncState | Damaged]:
        out: list[SyncState | Damaged] = []
        seen = {}
        for path in state_paths(self.run_dir, self.state_dir):  # none: never synced, or not readable
            name = path.name
            try:
                info = os.stat(path)
            except OSError:
                continue
            stamp = (info.st_size, info.st_mtime_ns)
            cached = self._parsed.get(str(path))
            if cached is None or cached[0] != stamp:
                cached = (stamp, _parse(path, name))
            seen[str(path)] = cached
            out.append(cached[1])
        self._parsed = seen
        return out


def _parse(path: Path, name: str) -> SyncState | Damaged:
    try:
        return read_state(path)[0]
    except OSError as exc:
        return Damaged(name, f"cannot be read ({exc.strerror or exc})")
    except StateFormatError:
        return Damaged(name, "damaged; the next sync reconciles it with the platform")


def _place(row: Any) -> tuple[int, int]:
    return row.where.segment_index, row.where.offset


def synced(state: SyncState, rows: list[Any]) -> Synced:
    """``state``'s figures; ``rows``: the index's rows, in spool order (their ``where`` a
    spool position), so the episodes past the cursor are found by bisection."""
    cursor = state.cursor
    pending = len(rows) if cursor is None else len(rows) - bisect_left(
        rows, (cursor.segment_index, cursor.offset), key=_place)
    return Synced(
        platform=platform_name(state.destination.base_url), team=state.destination.team_id, store=state.store,
        episodes=state.episodes_pushed, samples=state.samples_pushed, traces=state.traces_pushed,
        uploads=len(state.uploads), pending=pending, finalized=state.finalized, terminal=state.terminal,
        evaluation_id=state.evaluation_id, url=state.viewer_url,
        in_flight=state.in_flight.kind if state.in_flight else None, mismatch=state.mismatch is not None,
        replay_id=state.replay_id)


@dataclass(frozen=True)
class Standing:
    """What a page says of where a run stands."""

    episodes: int
    segments: int
    #: The seal's status, or None: not sealed (yet, or ever: a crash).
    sealed: str | None
    synced: list[Synced]
    damaged: list[Damaged]

    @property
    def anywhere(self) -> bool:
        return bool(self.synced)


def standing(rows: list[Any], segments: int, sealed: str | None, states: list[SyncState | Damaged]) -> Standing:
    found = [synced(state, rows) for state in states if isinstance(state, SyncState)]
    return Standing(len(rows), segments, sealed, found, [state for state in states if isinstance(state, Damaged)])
