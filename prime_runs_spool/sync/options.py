"""What one sync is asked to do (:class:`SyncOptions`) and what it says it did (:class:`RunReport`).

Kept apart from the engine so the command line, the follower and the console can build
options and read reports without the protocol that acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.sync.retry import Backoff

#: The default request lifetime for the real platform: after this long, a request sent and
#: never answered can no longer be processed. Conservative on purpose (docs/sync.md).
DEFAULT_REQUEST_LIFETIME = 600.0


@dataclass
class SyncOptions:
    request_lifetime: float = DEFAULT_REQUEST_LIFETIME
    max_request_bytes: int = MAX_REQUEST_BYTES
    skip_corrupt: bool = False
    dry_run: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    #: For --replay: push each run as a new evaluation. Without ``replay_id``, each run
    #: continues its latest unfinished replay or starts one (sync/replay.py).
    replay: bool = False
    #: The replay's id: its own state file, and the key the evaluation is found again by.
    replay_id: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()


@dataclass
class RunReport:
    path: str
    local_run_id: str | None = None
    name: str | None = None
    evaluation_id: str | None = None
    url: str | None = None
    pushed_now: int = 0
    pushed_total: int = 0
    #: up_to_date, synced (completed and finalized), live, failed, crashed, corrupt,
    #: skipped (another sync holds it), dry_run, error
    state: str = "error"
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    replay_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
