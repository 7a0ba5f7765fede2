"""Sync the runs under an object-store URL (``prime-runs sync s3://bucket/prefix``).

Every run is read where it lies (store/source.py: the ordinary reader over ranged reads), and
synced by the ordinary engine (sync/engine.py) under two changes, both in this module:

- **the lock is a lease** in the store (store/lease.py), taken before the run's first
  request and renewed before every write of the state that announces a request;
- **the state lives in the store** beside the spool (``spool/sync/<dest>.json``, as locally),
  written only by compare-and-swap on its etag (:class:`StoreProtocol`), or in
  ``--state-dir`` when given. Every non-idempotent request is announced in the state first,
  so two syncers can never both announce from the same state: the second one's write is
  refused, it reloads and reconciles (docs/sync.md, "Object stores").

A no-op re-sync costs one listing: the state's etag in the listing is compared with the one
cached on this machine, and the segments' sizes with the state's cursor; nothing is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


from prime_runs_spool.errors import LeaseLost, StateFormatError, Stopped, StoreConflict, StoreError, StoreSetupError
from prime_runs_spool.files import DIR_MODE, make_private_dir, read_regular_file, replace_private
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.spool.format import LIVE
from prime_runs_spool.store.lease import LONGEST_TTL, SHORTEST_TTL, SKEW_ENV, TTL_ENV, Lease, env_timing
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.store.source import StoreRun, find_store_runs, relist_segments
from prime_runs_spool.sync.claims import ClaimOrder
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.id_sets import IdSet, digest_of_name, named_by, sweep, unnamed
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.leased import LeasedProtocol, state_id, sync_lease_path, under_lease
from prime_runs_spool.sync.many import internal_error_report
from prime_runs_spool.sync.options import (DEFAULT_JOBS, ERROR, SKIPPED, UP_TO_DATE, RunReport, SyncOptions,
                                           seconds_problem)
from prime_runs_spool.sync.replay import latest_unfinished, new_replay_id
from prime_runs_spool.sync.state import (Destination, SyncState, replay_state_glob, save_state, sync_dir,
                                         sync_state_path)
from prime_runs_spool.sync.status import RunStatus, run_status
from prime_runs_spool.sync.user_cache import cache_root


def state_etag_path(state_path: Path) -> Path:
    """Beside a locally cached copy of a state kept in an object store: the etag it had."""
    return state_path.with_name(f"{state_path.name}.etag")

#: How many times a pass starts over after another syncer's state write got in between.
CONFLICT_PASSES = 3


class StoreProtocol(LeasedProtocol):
    """The protocol with the state in an object store: each save is fenced by the lease
    (:class:`LeasedProtocol`) and replaces the state only if it is still the version this
    syncer last read or wrote (``If-Match``). ``store`` None: a ``--state-dir``, where the
    state is a file on this machine and the lease alone fences."""

    def __init__(self, path: Path, options: SyncOptions, *, clock: Callable[[], float],
                 sleep: Callable[[float], None], on_save: Callable[[], None], lease: Lease,
                 store: ObjectStore | None, key: str, etag: str | None, stored: frozenset[str] = frozenset()) -> None:
        # Every syncer keeping its state in the store shares this one object.
        shared = state_id(store.location(key)) if store is not None else None
        super().__init__(path, options, clock=clock, sleep=sleep, on_save=on_save, lease=lease, state=shared)
        self.store, self.key, self.etag = store, key, etag
        if store is not None:  # the file is this machine's cache of the object: name the object
            self.shown = store.location(key)
        #: The keys of the files of ids (sync/id_sets.py) the store holds: those the state it
        #: was read from names, and those this pass made sure of.
        self._stored: set[str] = set(stored)

    def _write_state(self) -> None:
        made = self._store_id_sets()
        if made:
            # Another syncer taking the lease over while this one was stopped (SIGSTOP) past it
            # removes them as named by no state (``StoreRunSync._sweep``): a state naming them
            # written on waking named files gone. The lease renewed first, a holder taken over
            # writes no state (LeaseLost).
            self.lease.renew()
        if self.store is None:  # --state-dir: the state is a local file, the lease fences
            save_state(self.path, self.state)
        else:
            self.state.updated_at = time.time()
            data = self.state.to_json()
            if self.etag is None:
                self.etag = self.store.create(self.key, data)
            else:
                self.etag = self.store.replace(self.key, data, self.etag)
            _cache(self.path, self.state, self.etag)
        if made and self.lease.since_renewed() >= self.lease.ttl:
            self._store_id_sets(made)  # stopped a whole lease between the renewal and the write: put back

    def _store_id_sets(self, again: list[IdSet] | None = None) -> list[IdSet]:
        """The files of ids the state names stored before it names them (sync/id_sets.py): in
        the store, each an object beside it (and in this machine's cache), or in the
        ``--state-dir``. Those made now (or ``again``, made anew after a write that may have
        come a lease late); an object created before by any syncer counts, as one a sweep may remove."""
        made = []
        for found in again or named_by(self.state):
            if self.store is None:  # durable: the state itself is a file here
                if found.store(str(self.path.parent), again=again is not None):
                    made.append(found)
                continue
            key = id_set_key(self.key, found)
            creating = key not in self._stored or again is not None
            data = found.data() if creating else b""  # taken before the cache's copy lets the bytes go
            found.store(str(self.path.parent), durable=False)  # the cache: checked when read
            if creating:
                with contextlib.suppress(StoreConflict):  # there already: its name is its content
                    self.store.create(key, data)
                self._stored.add(key)
                made.append(found)
        return made


def id_set_key(state_key: str, found: IdSet) -> str:
    """The key of a file of ids (sync/id_sets.py) the state object at ``state_key`` names."""
    return f"{state_key.rsplit('/', 1)[0]}/{found.name}"


def _cache(path: Path, state: SyncState, etag: str | None) -> None:
    """Keep this machine's copy of a state held in the store, with its etag (written last,
    so an etag on disk always describes the copy beside it). Not fsync'd: it is a cache,
    trusted only while the store's listing shows the same etag."""
    marker = state_etag_path(path)
    marker.unlink(missing_ok=True)
    replace_private(path, state.to_json(), durable=False)
    if etag:
        replace_private(marker, etag.encode(), durable=False)


def listing_behind(run: StoreRun, state: SyncState | None) -> bool:
    """Whether ``state`` has been further than the run's listing shows its segments (its
    cursor in a segment not listed, or past the listed size; a recorded end past it): it
    was written after the listing was taken, by a syncer that read segments uploaded since
    (a resumed run's next segment, a live one grown). Read from that listing, the run was
    reported ``lost`` (exit 1, "sync it with --replay as a new evaluation": every episode
    pushed twice), ``status`` said LOST, or a grown segment "changed while it was read": so
    the run's folder is listed again (store/source.py, ``relist_segments``), only then."""
    cursor = state.cursor if state is not None else None
    if state is None or cursor is None:
        return False
    listed = {segment.index: segment.info.size for segment in run.segments}
    reached = max(cursor.offset, state.terminal_size or 0) if state.terminal is not None else cursor.offset
    return listed.get(cursor.segment_index, -1) < reached


def _parse(data: bytes) -> SyncState | None:
    try:
        return SyncState.from_json(data)
    except StateFormatError:
        return None


def default_local_root(url: str, state_dir: Path | None) -> Path:
    """This machine's folder for one store URL: under ``--state-dir`` when given (the state
    lives there), else in the user's cache (only copies of the store's state live there)."""
    base = state_dir if state_dir is not None else cache_root()
    root = base.expanduser() / "store" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    try:
        # With --state-dir the state lives below: its folders' names durable. Else a cache.
        make_private_dir(root, durable=state_dir is not None)
        os.chmod(base.expanduser() / "store", DIR_MODE)
    except OSError as exc:
        raise StoreError(f"cannot create {root} (this machine's folder for {url}): {exc.strerror}; "
                         "set --state-dir or XDG_CACHE_HOME to a writable folder") from None
    return root


class StoreRunSync:
    """Sync one run in the store to one destination: the up-to-date check, the lease, the
    passes of the engine."""

    def __init__(self, run: StoreRun, client: PlatformClient, destination: Destination, options: SyncOptions,
                 *, in_store: bool, wait: bool, index: EvaluationIndex | None,
                 on_progress: Callable[[RunReport], None] | None,
                 sleep: Callable[[float], None] = time.sleep, listed_at: float | None = None) -> None:
        if wait:  # for a copy of the run on this machine too (sync/copies.py)
            options = dataclasses.replace(options, copy_wait=None)
        self.run, self.client, self.destination, self.options = run, client, destination, options
        self.in_store, self.wait, self.index, self.on_progress = in_store, wait, index, on_progress
        self.sleep = sleep  # every wait of the pass (backoff, fence, another's lease): a stop ends it there
        #: When (this machine's clock) the listing the run was found in began; None: unknown.
        self.listed_at = listed_at
        self._locate(options.replay_id)
        #: Whether this run showed another syncer at work since the listing (it holds the
        #: lease, or wrote a state the listing did not show): what makes the claim order
        #: jump (sync/claims.py).
        self.met_another = False
        #: Whether the store held no state for the run when it was read before the lease.
        self.state_absent = False
        #: The keys of the files of ids the state read for the pass names: in the store.
        self.stored: frozenset[str] = frozenset()
        self.lease = Lease(run.store, run.key(sync_lease_path("").as_posix()), state_in_store=in_store)

    def _locate(self, replay_id: str | None) -> None:
        """Where this sync's state lives: the destination's, or one replay's of it."""
        self.path = sync_state_path(self.run, self.destination.key, replay_id)
        self.key = self.run.key(sync_state_path("", self.destination.key, replay_id).as_posix())

    def _choose_replay(self) -> None:
        """``--replay`` without an id, under the lease (as the local lock): continue the run's
        latest unfinished replay to this destination, else start a new one (sync/replay.py)."""
        pattern = self.run.key((sync_dir("") / replay_state_glob(self.destination.key)).as_posix())
        if self.in_store:
            keys = [key for key in self.run.objects if fnmatch.fnmatchcase(key, pattern)]
            documents = [(key.rsplit("/", 1)[-1], found[0]) for key in keys
                         if (found := self.run.store.read(key)) is not None]
        else:
            documents = []
            for path in self.path.parent.glob(replay_state_glob(self.destination.key)):
                try:
                    documents.append((path.name, read_regular_file(path)))
                except OSError:
                    continue  # as locally (sync/replay.py): a state that cannot be read is no replay to continue
        replay_id = latest_unfinished(documents, self.destination.key) or new_replay_id()
        self.options = dataclasses.replace(self.options, replay_id=replay_id)
        self._locate(replay_id)

    def sync(self) -> RunReport:
        try:
            if self.options.replay and self.options.replay_id is None:
                if self.options.dry_run:  # reads only: the replay it would push, no lease
                    self._choose_replay()
                else:
                    if not self.lease.take(wait=self.wait, sleep=self.sleep):
                        return self._held()
                    self._choose_replay()
                    return self._kept()
            done = self._up_to_date()
            if done is not None:
                return done
            if self.options.dry_run:  # reads only: no lease, no state written
                self._load_for_pass()
                return RunSync(self.run, self.client, self.destination, self.options, index=self.index,
                               on_progress=self.on_progress).run()
            if not self.lease.take(wait=self.wait, sleep=self.sleep):
                return self._held()
        except StoreError as exc:
            return RunReport(path=str(self.run), state=ERROR, error=str(exc))
        return self._kept()

    def _held(self) -> RunReport:
        self.met_another = True
        holder = self.lease.holder or {}
        return RunReport(path=str(self.run), state=SKIPPED,
                         error=f"another prime-runs sync ({holder.get('owner', 'unknown')}) holds "
                               "this run's lease (use --wait to wait for it)")

    def _kept(self) -> RunReport:
        """The passes under the lease just taken; released after."""
        return under_lease(self.lease, self.options, self.sleep, self._passes)

    def _known_state(self) -> SyncState | None:
        """The state as of the listing, read from the store only if this machine's copy is
        not that version. Read too when the listing had none: another syncer may have synced
        the run since (syncers on one prefix meet the runs the others did), and one GET
        then answers what a lease, a state and the segment's first lines would."""
        if not self.in_store:
            try:
                return _parse(read_regular_file(self.path))
            except OSError:
                return None
        listed = self.run.objects.get(self.key)
        try:
            if listed is not None and read_regular_file(state_etag_path(self.path)).decode(errors="replace") == listed.etag:
                return _parse(read_regular_file(self.path))
        except OSError:
            pass
        found = self.run.store.read(self.key)
        if found is None:
            self.state_absent = True
            return None
        self.met_another = listed is None or listed.etag != found[1]
        state = _parse(found[0])
        if state is not None:
            _cache(self.path, state, found[1])
        return state

    def _up_to_date(self) -> RunReport | None:
        state = self._known_state()
        if state is None:
            return None
        self._catch_up(state)
        probe = RunSync(self.run, self.client, self.destination, self.options, index=self.index)
        probe.protocol.state = state
        # The engine's own rule (sizes against the cursor), not a copy of it.
        if not probe._up_to_date():
            return None
        probe._show()  # the engine's own report of a state (its store, its totals), not a copy
        report = probe.report
        report.state = UP_TO_DATE if state.ended else LIVE
        report.local_run_id = state.local_run_id
        return report

    def _load_for_pass(self, *, first: bool = False) -> str | None:
        """Put the store's current state where the engine loads it; its etag. Not read again
        for the ``first`` pass when there was none just before this syncer made the run's
        lease: no syncer held the run since, so none wrote its state (one written some other
        way refuses the pass's first write, create-only, and the next pass reads it)."""
        if not self.in_store:
            with contextlib.suppress(OSError):
                self._catch_up(_parse(read_regular_file(self.path)))
            return None
        unread = first and self.state_absent and self.lease.created
        found = None if unread else self.run.store.read(self.key)
        self.stored = frozenset()
        if found is None:
            self.path.unlink(missing_ok=True)
            state_etag_path(self.path).unlink(missing_ok=True)
            return None
        data, etag = found
        state = _parse(data)
        if state is None:  # damaged: the engine sets it aside; we replace it by etag
            replace_private(self.path, data, durable=False)
            return etag
        if state.fence is not None and state.fence > self.lease.generation and not self._outranked(state.fence):
            raise LeaseLost(f"{self.run.store.location(self.key)} was written under a newer lease "
                            f"(generation {state.fence} > {self.lease.generation}): the run was taken over by "
                           "another syncer; this one stops")
        self.stored = self._fetch_id_sets(state)
        _cache(self.path, state, etag)
        self._catch_up(state)
        return etag

    def _outranked(self, fence: int) -> bool:
        """Whether this syncer's lease now ranks above ``fence`` (``Lease.outrank``): the
        lease object lost its count since the state was written, and no one took the run
        since this syncer did. False when another syncer took it over: this one stops."""
        try:
            self.lease.outrank(fence)
        except LeaseLost:
            return False
        return True

    def _catch_up(self, state: SyncState | None) -> None:
        if listing_behind(self.run, state):
            relist_segments(self.run)

    def _fetch_id_sets(self, state: SyncState) -> frozenset[str]:
        """The files of ids ``state`` names (sync/id_sets.py), beside this machine's copy of it:
        fetched from the store when they are not there whole (a name is its content). One the
        store lacks stays missing, and the engine's reading of the state says so, in one line.
        The keys of those the store is known to hold (the pass creates none of them again)."""
        known, folder = set(), str(self.path.parent)
        for found in named_by(state):
            key = id_set_key(self.key, found)
            if key in self.run.objects:
                known.add(key)
            if found.unstored:  # a state of version 1's: the copy of it, written as 2, names a file
                found.store(folder, durable=False)
                continue
            found.found_in(folder)
            if found.intact_at(found.path):  # a cache, not fsync'd: checked, not trusted by its name
                continue
            fetched = self.run.store.read(key)
            if fetched is not None:
                replace_private(Path(found.path), fetched[0], durable=False)
                known.add(key)
            else:  # gone (deleted as a damaged one's line says): missing here too, so the pass reconciles
                Path(found.path).unlink(missing_ok=True)
        return frozenset(known)

    def _sweep(self) -> None:
        """The files of ids no state names removed, under the lease, before the pass writes
        (sync/id_sets.py): this machine's copies, and the store's objects. Only objects the
        listing (made before the lease) showed; the states read whole first, unless the one
        just loaded names them all (a GET each: only where one may be unnamed); not when a
        syncer may have written a state the listing does not show (a new replay's, another
        destination's): a later pass does it."""
        sweep(self.path.parent)
        if not self.in_store or not self._listed_all_states():
            return
        folder = f"{self.key.rsplit('/', 1)[0]}/"
        names = [key[len(folder):] for key in self.run.objects if key.startswith(folder)]
        names = [name for name in names if "/" not in name]
        sets = [name for name in names if digest_of_name(name) is not None]
        try:
            if not sets or not unnamed(sets, [read_regular_file(self.path)]):
                return
        except OSError:
            pass  # none loaded: every state read
        try:
            documents = [found[0] for name in names if name not in sets
                         if (found := self.run.store.read(folder + name)) is not None]
            for name in unnamed(sets, documents):
                self.run.store.delete(folder + name)
        except StoreError:
            return  # left for a later pass: named or not, nothing depends on its removal

    def _listed_all_states(self) -> bool:
        """Whether the listing shows every state object of the run: none was written after it.
        So when this syncer made the lease, or took one its holder had released before the
        listing (the lease the listing shows), or one that ran out before the listing began."""
        lease, holder = self.lease, self.lease.holder or {}
        if lease.created:
            return True
        if holder.get("released") is True:
            listed = self.run.objects.get(lease.key)
            return listed is not None and listed.etag is not None and listed.etag == lease.taken_from
        expiry = holder.get("expires_at")
        return (self.listed_at is not None and isinstance(expiry, (int, float)) and not isinstance(expiry, bool)
                and expiry + lease.clock_skew < self.listed_at)

    def _passes(self) -> RunReport:
        report = RunReport(path=str(self.run), state=ERROR)
        for attempt in range(CONFLICT_PASSES):
            try:
                etag = self._load_for_pass(first=attempt == 0)
                if attempt == 0:
                    self._sweep()
            except StoreError as exc:
                report.error = str(exc)
                return report
            make: Any = functools.partial(StoreProtocol, lease=self.lease,
                                          store=self.run.store if self.in_store else None, key=self.key, etag=etag,
                                          stored=self.stored)
            engine = RunSync(self.run, self.client, self.destination, self.options, sleep=self.lease.sleeper(self.sleep),
                             on_progress=self.on_progress, index=self.index, make_protocol=make)
            report = engine.protocol.pass_ended(engine.run())
            failure = engine.protocol.failure
            if isinstance(failure, StoreConflict) and attempt + 1 < CONFLICT_PASSES:
                continue  # another syncer's write got in between: reload it and reconcile
            return report
        return report


def lease_problem() -> str | None:
    """Why this machine's lease settings (``PRIME_RUNS_LEASE_TTL``, ``..._CLOCK_SKEW``) cannot
    be used, or None. Unchecked, a NaN TTL wrote leases other syncers take for no lease (so
    two synced one run at once), one over a day likewise, a negative one expired at once."""
    try:
        ttl, skew = env_timing()
    except ValueError as exc:
        return str(exc)
    for name, value, least in ((TTL_ENV, ttl, SHORTEST_TTL), (SKEW_ENV, skew, 0.0)):
        problem = seconds_problem(value, least)
        if problem is None and value > LONGEST_TTL:
            problem = f"{value:g} is more than a lease may claim, {LONGEST_TTL:g} s"
        if problem:
            return f"{name}: {problem}"
    return None


def _stoppable_sleep(stop: threading.Event, seconds: float) -> None:
    if stop.wait(max(0.0, seconds)):
        raise Stopped


def sync_store(url: str, client: PlatformClient, destination: Destination, options: SyncOptions, *,
               jobs: int = DEFAULT_JOBS, wait: bool = False, state_dir: Path | None = None,
               store: ObjectStore | None = None,
               on_progress: Callable[[RunReport], None] | None = None,
               stop: threading.Event | None = None) -> list[RunReport]:
    """Sync every run under ``url``; reports in key order. One listing finds the runs, their
    segments and their states. ``state_dir``: keep the states there instead of in the store
    (the lease stays in the store: it is what other machines see). :class:`StoreSetupError`
    for lease settings that cannot be used (:func:`lease_problem`). ``stop`` (``--follow``'s,
    set by SIGINT): once set, a run not begun is not begun and every wait of a run under way
    raises :class:`Stopped`, its lease released; without it a pass backing off from a platform
    that is down held a SIGINT (two, three) for minutes."""
    problem = lease_problem()
    if problem:
        raise StoreSetupError(problem)
    store = store or ObjectStore(url)
    listed_at = time.time()
    listing = store.list()
    runs = find_store_runs(store, listing, default_local_root(store.url, state_dir))
    if not runs:
        return []
    index = EvaluationIndex(answers_new_runs=True)  # for a run whose lease this syncer made (StoreProtocol)
    sleep = time.sleep if stop is None else functools.partial(_stoppable_sleep, stop)
    order = ClaimOrder(len(runs))  # from a random place, jumping on meeting another syncer

    def one(run: StoreRun) -> tuple[RunReport, bool]:
        if stop is not None and stop.is_set():
            raise Stopped
        try:
            sync = StoreRunSync(run, client, destination, options, in_store=state_dir is None, wait=wait,
                                index=index, on_progress=on_progress, sleep=sleep, listed_at=listed_at)
            return sync.sync(), sync.met_another
        except Exception as exc:  # as locally (sync/many.py): one run's bug must not stop the others
            return internal_error_report(str(run), exc), False

    # Daemon threads only when stoppable: see _work_through.
    return _work_through(one, runs, order, max(1, jobs), daemon=stop is not None)


def _work_through(work: Callable[[StoreRun], tuple[RunReport, bool]], runs: list[StoreRun], order: ClaimOrder,
                  jobs: int, *, daemon: bool) -> list[RunReport]:
    """``work`` over ``runs`` in ``jobs`` threads, taking them in ``order``, which jumps when a
    run showed another syncer's work; reports in the runs' order. ``daemon`` (a stoppable
    sync), unlike a ThreadPoolExecutor's threads, which the interpreter joins at exit: a
    second SIGINT (``Stopped`` raised in this thread's join) ends the follow at once, not when
    a request the platform never answers times out; the state is consistent at every
    instant, and a lease left held expires. A worker's exception (``Stopped`` after the first
    SIGINT) is raised once every worker has ended, so each released its lease."""
    results: list[RunReport | None] = [None] * len(runs)
    failures: list[BaseException] = []

    def worker() -> None:
        while (taken := order.take()) is not None:
            number, stretch = taken
            try:
                results[number], met = work(runs[number])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failures.append(exc)
                return
            if met:
                order.met_another(stretch)

    threads = [threading.Thread(target=worker, name=f"prime-runs-sync-{n}", daemon=daemon)
               for n in range(min(jobs, len(runs)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return [report for report in results if report is not None]


def store_status(url: str, store: ObjectStore | None = None) -> list[RunStatus]:
    """``prime-runs status`` over a store URL: each run's spool and the states beside it, as
    ``sync/status.py`` reports a local run. Reads the store; no platform request."""
    store = store or ObjectStore(url)
    runs = find_store_runs(store, store.list(), Path("/nonexistent-local-face"))
    out = []
    for run in runs:
        folder = run.key(sync_state_path("", "x").parent.as_posix()) + "/"
        keys = sorted(k for k in run.objects if k.startswith(folder) and k.endswith(".json")
                      and "/" not in k[len(folder):])
        documents = [found[0] for key in keys if (found := store.read(key)) is not None]
        if any(listing_behind(run, _parse(document)) for document in documents):
            relist_segments(run)
        out.append(run_status(run, states=documents))  # type: ignore[arg-type]
    return out
