"""A pass under a run's lease in an object store (store/lease.py): what a sync of the store
and a sync of a mirrored run's own folder (sync/mirrored.py) share.

- **Fencing**: every write of the state that announces a request first renews the lease,
  and records its generation in the state (:class:`LeasedProtocol`); a syncer taken over
  stops there, before that request.
- **The request the previous holder may still have out**, where this syncer cannot read
  its state, is waited out before anything is sent (:func:`under_lease`).
- **Whose state knows everything pushed** (the lease's ``last_state``): the syncers of the
  store share one state object, but a sync of the run's folder, or one with
  ``--state-dir``, keeps its own. A holder whose state is not the one the lease names
  treats its state as another copy's would be (sync/copies.py, ``foreign``): checked
  against the platform before it pushes. Until its pass has settled, the lease names no
  state at all, so a holder that dies before that leaves every next one checking too.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

from prime_runs_spool.errors import LeaseLost, StoreError
from prime_runs_spool.spool.layout import spool_dir
from prime_runs_spool.store.lease import Lease
from prime_runs_spool.sync.options import ERROR, FAILED_STATES, INTERRUPTED, SKIPPED, RunReport, SyncOptions
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.state import save_state

#: In an object store, beside a run's segments: the lease a syncer holds on the run while it
#: works on it (the store's counterpart of ``sync.lock``, docs/sync.md "Object stores").
SYNC_LEASE_NAME = "sync.lease.json"
#: What the lease names while a holder whose state is another's settles with the platform.
NO_STATE = ""


def sync_lease_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where a run in an object store keeps its syncer's lease (relative to the run)."""
    return spool_dir(run_dir) / SYNC_LEASE_NAME


def state_id(location: str) -> str:
    """The id the lease names a sync state by: a digest of where it is, so the lease, which
    every syncer of the store reads, names no machine's paths."""
    return hashlib.sha256(location.encode()).hexdigest()[:16]


def local_state_id(path: Path) -> str:
    """The id of a state file on this machine."""
    return state_id(f"{socket.gethostname()}:{os.path.realpath(path)}")


class LeasedProtocol(Protocol):
    """The protocol under a lease, its state a file on this machine: each save that
    announces a request renews the lease (the fence; a save announcing nothing renews it
    only once a third of its lifetime has passed) and records the lease's generation."""

    WRITES_ALONGSIDE = False  # the lease is renewed, its fence taken, before a request goes out
    LEASED = True  # that renewal announces the request in the lease (in_flight_until), for its next taker

    def __init__(self, path: Path, options: SyncOptions, *, clock: Callable[[], float],
                 sleep: Callable[[float], None], on_save: Callable[[], None], lease: Lease,
                 state: str | None = None, **more: object) -> None:
        super().__init__(path, options, clock=clock, sleep=sleep, on_save=on_save, **more)  # type: ignore[arg-type]
        self.lease = lease
        #: This pass's state, as the lease names it (:func:`state_id`).
        self.state_id = state or local_state_id(path)
        # The lease keeps syncers on every machine apart, as the copy lock does on one: a
        # lease this syncer made means no syncer ever held the run before.
        self.others_may_have_synced = not lease.created
        self.overtaken = lease.last_state is not None and lease.last_state != self.state_id
        #: The store failure that stopped this pass, if one did.
        self.failure: StoreError | None = None

    def _write(self) -> None:
        try:
            pending = self.state.in_flight
            # In the lease too: the next holder may not read this state.
            self.lease.in_flight_until = pending.sent_at + self.options.request_lifetime if pending else 0.0
            named = NO_STATE if self.overtaken else self.state_id
            renamed, self.lease.last_state = self.lease.last_state != named, named
            if pending is not None or renamed or not self.lease.held:
                self.lease.renew()  # the fence, and the announcement where a --state-dir taker reads it
            else:
                # Announcing nothing, it needs no fence: renewed less than a third of the lease
                # ago, no one can have taken it over (the check below rests on the same clock
                # rule). The release, or the next write, carries the lease's in_flight_until.
                self.lease.renew_if_old()
            self.state.fence = self.lease.generation
            self._write_state()
            if self.state.in_flight is not None and self.lease.since_renewed() >= self.lease.ttl:
                # Paused (or slow) between renewing and here for a whole lease: another syncer
                # may hold the run now. The announced request is not sent; whoever syncs next
                # settles it like any request in doubt.
                raise LeaseLost(f"{self.lease.store.location(self.lease.key)}: the lease ran out while "
                                "announcing a request, so it may have been taken over; this syncer stops without sending it")
        except StoreError as exc:
            self.failure = exc
            raise

    def _write_state(self) -> None:
        save_state(self.path, self.state, parents=False)  # a run's own folder: never made again, as a local pass's

    def pass_ended(self, report: RunReport) -> RunReport:
        """At the pass's end: a pass that checked its state against the platform and ended
        well leaves the lease naming its state, which now knows everything pushed; a lease
        lost is the run's error."""
        if isinstance(self.failure, LeaseLost):
            report.state, report.error = ERROR, str(self.failure)
        elif self.overtaken and report.state not in FAILED_STATES | {INTERRUPTED, SKIPPED}:
            self.lease.last_state = self.state_id
        return report


def wait_out_inherited_request(lease: Lease, options: SyncOptions, sleep: Callable[[float], None]) -> float:
    """Before anything is sent: wait until a request the previous holder announced where
    this sync cannot read it (its own state file, or ours is one) can no longer land (its
    time, plus the clock skew between the two machines). The lease is kept alive meanwhile,
    still announcing that request, for whoever takes it if this sync dies waiting. Returns
    the seconds waited.

    The time is the other machine's wall clock, so it is compared with this one's wall
    clock, asked again after each nap (a clock found ahead and set back means the request
    may land later than it first said). Never longer than a request lifetime (plus the
    skew) of this process's monotonic clock, which every machine is assumed to share and
    which a wall clock set back cannot stretch: the request was sent before this sync took
    the lease."""
    skew = lease.clock_skew
    longest, started = options.request_lifetime + skew, lease.monotonic()
    nap, waited = lease.sleeper(sleep), 0.0
    while (wait := min(lease.wait_until + skew - lease.clock(), longest - waited)) > 0:
        nap(min(wait, 5.0))
        waited = lease.monotonic() - started
    return waited


def under_lease(lease: Lease, options: SyncOptions, sleep: Callable[[float], None],
                passes: Callable[[], RunReport]) -> RunReport:
    """``passes`` under the lease just taken: kept alive meanwhile, the previous holder's
    request waited out first, released after."""
    try:
        with lease.kept_alive():
            waited = wait_out_inherited_request(lease, options, sleep)
            report = passes()
            if waited:
                report.warnings.insert(0, f"waited {waited:.0f} s for a request the previous holder of the lease "
                                          "announced where this sync cannot read it, so it cannot land twice")
            return report
    finally:
        try:
            lease.release()
        except StoreError:
            pass  # it expires by itself
