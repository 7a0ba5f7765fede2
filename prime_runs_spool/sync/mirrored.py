"""A local run that ``prime-runs mirror`` copies into an object store, synced from its own
folder (a ``prime-runs sync`` on the eval machine, or the online shipper).

Syncers of the store take the run's lease there; a sync of the folder takes the same lease,
found through the note the mirror leaves in the folder (store/mirror.py), so the two are
never at work on the run at once: the platform's samples endpoint only appends, and two
syncers each pushing the run would land it twice. Its state stays the folder's own, which
the lease names (sync/leased.py), so whichever syncs next knows whether the other pushed
since. A store that cannot be reached, or a lease another syncer holds, means nothing is
pushed from the folder: never without the lease. A pass that began before the mirror's
first note of the run checks for it before each request it announces
(:class:`UnleasedProtocol`), and goes on under the lease from there.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from prime_runs_spool.errors import MirroredMeanwhile, StoreError
from prime_runs_spool.store.lease import Lease
from prime_runs_spool.store.mirror import mirror_note_path
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.sync.leased import LeasedProtocol, sync_lease_path, under_lease
from prime_runs_spool.sync.options import ERROR, SKIPPED, RunReport, SyncOptions
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.state import Destination, sync_command

if TYPE_CHECKING:
    from prime_runs_spool.sync.engine import RunSync


class UnleasedProtocol(Protocol):
    """The protocol of a pass over a run no mirror had noted when it began: before each
    request it announces, one ``stat`` of the note; once there, :class:`MirroredMeanwhile`
    instead of the announcement (the request is neither written down nor sent)."""

    def __init__(self, path: Path, options: SyncOptions, *, run_dir: Path, **more: object) -> None:
        super().__init__(path, options, **more)  # type: ignore[arg-type]
        self.run_dir = run_dir
        #: The note's path, made once: asked before every announcement of the pass.
        self._note = os.fspath(mirror_note_path(run_dir))

    def _write(self) -> None:
        if self.state.in_flight is not None and os.path.exists(self._note):
            self.state.in_flight = None  # never written, never sent: no request in doubt
            raise MirroredMeanwhile
        super()._write()


def mirrored_pass(run_dir: Path, run_url: str, make_engine: Callable[[Callable[..., Protocol]], RunSync],
                  destination: Destination, options: SyncOptions, *, wait: bool,
                  sleep: Callable[[float], None]) -> RunReport:
    """One pass over the mirrored run at ``run_dir`` (its copy at ``run_url``) under that
    copy's lease, synced to ``destination``: ``make_engine`` is given the protocol to keep
    the state with. ``wait``: for a lease another syncer holds (else the run is
    ``skipped``, as a run another sync holds)."""
    try:
        lease = Lease(ObjectStore(run_url), sync_lease_path("").as_posix(), state_in_store=False)
        taken = lease.take(wait=wait, sleep=sleep)
    except StoreError as exc:
        command = sync_command(run_url, destination, options.to)
        return RunReport(path=str(run_dir), state=ERROR, error=unreachable_line(run_url, exc, command))
    if not taken:
        holder = (lease.holder or {}).get("owner", "unknown")
        return RunReport(path=str(run_dir), state=SKIPPED,
                         error=f"mirrored to {run_url}, where another prime-runs sync ({holder}) holds the run's "
                               "lease (use --wait to wait for it)")

    def passes() -> RunReport:
        engine = make_engine(functools.partial(LeasedProtocol, lease=lease))
        return engine.protocol.pass_ended(engine.run())  # type: ignore[attr-defined]

    return under_lease(lease, options, sleep, passes)


def unreachable_line(run_url: str, exc: StoreError, command: str) -> str:
    """Why a mirrored run was not pushed from its folder, and what to do: ``command``,
    the sync of its copy in the store to the same destination."""
    return (f"mirrored to {run_url}, whose lease keeps its syncers apart, and that could not be taken ({exc}); "
            f"nothing was pushed from this folder: sync it from the store ({command}), "
            "or again once the store is reachable")
