"""Sync every run found under some paths, in parallel, each under its own sync lock.

One run's failure never stops the others: each run gets its own report, and the caller
turns the reports into an exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path
from typing import TYPE_CHECKING

from prime_runs_spool.errors import MirroredMeanwhile, SegmentsGoneError, Stopped, StoreError
from prime_runs_spool.files import FILE_MODE, OnLink, OTHERS_ACCESS, make_private_dir, open_to_others_lines, unreadable_message
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.spool.layout import find_runs, spool_dir, spool_identity
from prime_runs_spool.sync.interrupt import Interrupt
from prime_runs_spool.sync.options import (AUTO, DEFAULT_JOBS, ERROR, FAILED_STATES, GONE, INTERRUPTED, SKIPPED, RunReport,
                                          SyncOptions)
from prime_runs_spool.sync.replay import replay_id_for
from prime_runs_spool.sync.id_sets import sweep
from prime_runs_spool.sync.state import (Destination, disk_full_line, state_before_damage, state_home, sync_dir,
                                         sync_state_path)
from prime_runs_spool.sync.state_adoption import adopt_states
from prime_runs_spool.sync.unchanged import Unchanged, look, state_path_of

if TYPE_CHECKING:
    from prime_runs_spool.sync.engine import RunSync
    from prime_runs_spool.sync.index import EvaluationIndex
    from prime_runs_spool.sync.protocol import Protocol

# The engine (and the protocol, the sinks, the reader under them) is imported where a run is
# read: a re-sync of runs found up to date before needs neither
# (sync/unchanged.py).


#: The run's sync lock: at most one sync or follower works on a run at a time.
SYNC_LOCK_NAME = "sync.lock"


def sync_lock_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / SYNC_LOCK_NAME

class SyncLock:
    """The run's sync lock (``spool/sync.lock``), an exclusive ``flock`` on a descriptor of
    its own: at most one sync or follower works on a run at a time, and the kernel drops it
    when its holder dies. Opened without following a link, the file made ``0600``, the folder
    never made (it is the run's spool folder, or one sync made under its state directory).
    A plain flock, not a lock library's: taking and dropping it is a few system calls, paid
    by every run a sync passes over."""

    def __init__(self, path: Path, *, wait: bool = False) -> None:
        self.path = path
        self.wait = wait
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock: False when another holds it and this one does not ``wait``;
        ``OSError`` when its file cannot be opened (or is not a regular file)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device in its place
                raise OSError(errno.EINVAL, f"{SYNC_LOCK_NAME} is not a regular file; remove it (sync makes it again)",
                              os.fspath(self.path))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):  # EACCES: contention, on some filesystems
                    raise
                os.close(fd)
                return False
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock (closing its descriptor drops the flock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def sync_lock(run_dir: Path, *, wait: bool = False) -> SyncLock:
    """The run's sync lock (``spool/sync.lock``; ``run_dir``: the run's state home, see
    :func:`~prime_runs_spool.sync.state.state_home`), not yet taken."""
    return SyncLock(sync_lock_path(run_dir), wait=wait)


def run_home(run_dir: Path, state_dir: Path | None, options: SyncOptions) -> Path | None:
    """The folder whose ``spool/`` keeps the run's lock and state for this sync
    (:func:`~prime_runs_spool.sync.state.state_home`). A dry run writes nothing to it, so a
    read-only spool with no state directory is counted from its own folder (the state a sync
    left beside it before it was archived, read and never written) instead of refused."""
    home = state_home(run_dir, state_dir)
    if home is None and options.dry_run:
        return run_dir
    return home


def read_only_report(run_dir: Path) -> RunReport:
    """The report of a spool on a read-only folder, with no state directory to sync it from."""
    return RunReport(path=str(run_dir), state=ERROR,
                     error=f"{spool_dir(run_dir)} is read-only: sync keeps a run's lock and state beside its spool; "
                           "give --state-dir DIR (or PRIME_RUNS_STATE_DIR=DIR) to keep them there instead")


def spool_open_to_others(run_dir: Path) -> bool:
    """Whether others may enter the run's spool folder: a probe then leaves the run to a pass,
    which makes it private or says it is not (``files.open_to_others_lines``). One ``stat``."""
    try:
        return bool(os.stat(spool_dir(run_dir)).st_mode & OTHERS_ACCESS)
    except OSError:
        return False


def spool_mode_lines(run_dir: Path, home: Path, options: SyncOptions) -> list[str]:
    """What a sync or a follower says, under the run's lock, of a spool others may read (an
    artifact unpacked by a tool that drops modes): made private where sync writes beside it
    anyway (its state home is the run folder, not a dry run), else named with the command
    that does it (``files.open_to_others_lines``). A spool folder no one else may enter
    (:func:`spool_open_to_others`, one ``stat``) is not walked: what it holds is reached
    only through it, whatever its own modes, as the probe of a run up to date already
    takes it. The walk was 11 system calls a run, at every pass."""
    if not spool_open_to_others(run_dir):
        return []
    return open_to_others_lines(spool_dir(run_dir), tighten=home == run_dir and not options.dry_run)


def engine_for(run_dir: Path, home: Path, client: PlatformClient, destination: Destination, options: SyncOptions,
               *, protocol: Callable[..., Protocol] | None = None, **kwargs: object) -> RunSync:
    """The run's pass, its state kept under ``home`` (the run folder itself, or its folder
    under the state directory for a read-only spool). ``protocol``: what keeps the state
    (sync/leased.py's under a lease), else the plain file's :class:`Protocol`."""
    from prime_runs_spool.sync.engine import RunSync
    from prime_runs_spool.sync.protocol import Protocol

    make = protocol or Protocol
    if home != run_dir:
        def relocated(path: Path, *args: object, **more: object) -> Protocol:
            return make(home / path.relative_to(run_dir), *args, **more)

        kwargs["make_protocol"] = relocated
    else:
        kwargs["make_protocol"] = make
    return RunSync(run_dir, client, destination, options, **kwargs)  # type: ignore[arg-type]


def local_pass(run_dir: Path, home: Path, client: PlatformClient, destination: Destination, options: SyncOptions,
               *, warnings: list[str], wait: bool, sleep: Callable[[float], None],
               made: list[RunSync] | None = None, **kwargs: object) -> RunReport:
    """One pass over a local run, under its lock (held by the caller): and under the lease
    of its copy in an object store too when ``prime-runs mirror`` copies it into one
    (sync/mirrored.py), so that a sync of that store and this one never push it both.
    ``warnings``: what the report says before the pass's own (``spool_mode_lines``).
    ``made``: given the pass's engine once made (whose report a stop reports)."""
    def make(protocol: Callable[..., Protocol] | None = None) -> RunSync:
        engine = engine_for(run_dir, home, client, destination, options, protocol=protocol, sleep=sleep, **kwargs)
        engine.report.warnings += warnings
        if made is not None:
            made.append(engine)
        return engine

    from prime_runs_spool.store.mirror import mirrored_to

    try:
        run_url = mirrored_to(run_dir)
    except StoreError as exc:
        return RunReport(path=str(run_dir), state=ERROR, error=str(exc))
    if options.dry_run:  # reads only: no lease, as over the store
        return make().run()
    sweep(sync_dir(home))  # under the run's lock, before the pass writes (sync/id_sets.py)
    from prime_runs_spool.sync.mirrored import UnleasedProtocol, mirrored_pass

    if run_url is None:
        try:
            return make(functools.partial(UnleasedProtocol, run_dir=run_dir)).run()
        except MirroredMeanwhile:
            try:
                run_url = mirrored_to(run_dir)
            except StoreError as exc:
                return RunReport(path=str(run_dir), state=ERROR, error=str(exc))
            assert run_url is not None  # the note is only ever replaced whole
    return mirrored_pass(run_dir, run_url, make, destination, options, wait=wait, sleep=sleep)


def for_run(run_dir: Path, destination: Destination, options: SyncOptions) -> SyncOptions:
    """The options for one run: with ``replay`` and no explicit id, the run's own replay id
    (its latest unfinished replay to this destination, else a new one). Call under the lock."""
    if options.replay and options.replay_id is None:
        return dataclasses.replace(options, replay_id=replay_id_for(run_dir, destination.key))
    return options


def sync_run(
    run_dir: Path,
    client: PlatformClient,
    destination: Destination,
    options: SyncOptions,
    *,
    wait: bool = False,
    on_progress: Callable[[RunReport], None] | None = None,
    index: EvaluationIndex | None = None,
    sleep: Callable[[float], None] = time.sleep,
    state_dir: Path | None = None,
    made: list[RunSync] | None = None,
    home: Path | None = None,
) -> RunReport:
    """Sync one run, unless another sync holds it, or a copy of it (then report ``skipped``,
    or wait). ``index``: the environment listings shared with the other runs of this sync.
    ``sleep``: every wait of the pass; an :class:`Interrupt`'s ends the pass (``interrupted``).
    ``state_dir``: where the lock and state of a spool on a read-only folder are kept.
    ``made``: given the pass's engine once made, so that a caller that stops waiting for the
    pass can still say what it pushed. ``home``: :func:`run_home`'s answer for the run, when
    the caller's probe asked it already (a ``stat``, an ``access`` and a ``statvfs``)."""
    if wait:  # for a copy of the run in another folder too (sync/copies.py)
        options = dataclasses.replace(options, copy_wait=None)
    home = home or run_home(run_dir, state_dir, options)
    if home is None:
        return read_only_report(run_dir)
    if home != run_dir:
        try:
            make_private_dir(spool_dir(home))
        except OSError as exc:
            return RunReport(path=str(run_dir), state=ERROR,
                             error=f"cannot keep its sync state in {spool_dir(home)}: {exc.strerror or exc}")
    # A dry run reads and sends nothing: it takes no lock in the run's own folder, which it
    # leaves as it found it (a sync at work meanwhile may push some of what it counts).
    lock = None if options.dry_run and home == run_dir else sync_lock(home, wait=wait)
    try:
        if lock is not None and not lock.acquire():
            return RunReport(path=str(run_dir), state=SKIPPED,
                             error="another prime-runs sync is working on this run (use --wait to wait for it)")
    except OSError as exc:
        if exc.errno == errno.ENOENT and home == run_dir and spool_identity(run_dir) is None:  # moved since found
            return RunReport(path=str(run_dir), state=GONE, error=MOVED_AWAY)
        return RunReport(path=str(run_dir), state=ERROR,
                         error=f"cannot take the sync lock in {spool_dir(home)}: {exc.strerror}")
    made = [] if made is None else made
    try:
        adopted = adopt_states(run_dir, home)  # what could not be carried on from: said first
        report = local_pass(run_dir, home, client, destination, for_run(home, destination, options),
                            warnings=adopted + spool_mode_lines(run_dir, home, options), wait=wait, sleep=sleep,
                            made=made, on_progress=on_progress, index=index)
    except Stopped:
        return interrupted_report(run_dir, made[-1].report if made else None)
    except OSError as exc:  # e.g. its state folder cannot be listed, or a state copied into a full disk: this run only
        report = RunReport(path=str(run_dir), state=ERROR,
                           error=disk_full_line(exc, run_dir) or unreadable_message(exc, run_dir))
    except Exception as exc:  # a bug met on this run must not cost the others their sync
        return internal_error_report(str(run_dir), exc)
    finally:
        if lock is not None:
            lock.release()
    return gone_if_moved(run_dir, report, made[0].folder if made else None)


#: What a plain sync says of a run moved away (or deleted) under its pass: ``--follow``
#: follows it where it went (sync/follow.py); a sync that ends leaves it to the next one.
MOVED_AWAY = ("its folder was moved away or deleted while this sync read it: nothing is lost (what was pushed stays "
              "on the platform; no mismatch is recorded); sync it where it is now to carry on")


def gone_if_moved(run_dir: Path, report: RunReport, folder: tuple[int, int] | None) -> RunReport:
    """``report``, or, when it failed because the run's spool folder is no longer the one the
    pass began with (``folder``; None: none there), ``gone``: reading on at the old path the
    pass found a segment missing (``lost``) or no such file (``error``), for a run that lost
    nothing. What it pushed is kept in the report."""
    if report.state in FAILED_STATES and folder is not None and spool_identity(run_dir) != folder:
        report.state, report.error = GONE, MOVED_AWAY
    return report


def interrupted_report(run_dir: Path, report: RunReport | None) -> RunReport:
    """The report of a run the stop reached before its pass ended: what it pushed, and that
    the next sync carries on."""
    report = report or RunReport(path=str(run_dir))
    report.state = INTERRUPTED
    report.error = "stopped by a signal before its pass ended; the state is saved, the next sync carries on"
    return report


def internal_error_report(path: str, exc: Exception) -> RunReport:
    """The report of a run whose pass met an error no code path expected: that run's
    ``error``, so the others (local or in a store) still get their sync."""
    return RunReport(path=path, state=ERROR, error=f"internal error: {type(exc).__name__}: {exc}")


def unreadable_report(path: Path, exc: OSError) -> RunReport:
    """The report of a directory under the paths that could not be read: a run may be in it,
    so the sync did not get everything it was asked to (exit 1)."""
    return RunReport(path=str(path), state=ERROR, error=unreadable_message(exc, path))


def gone_segments_report(path: Path, exc: OSError, destination: Destination, options: SyncOptions,
                         state_dir: Path | None) -> RunReport:
    """:func:`unreadable_report`, counting for a run whose segments were deleted
    (``SegmentsGoneError``, its sync state left) what its state says the destination holds:
    its evaluation and total, as a run cut to nothing reports them. Without it the run said
    "pushed 0 (total 0)" of episodes the platform holds, all this copy has left of them."""
    report = unreadable_report(path, exc)
    if not isinstance(exc, SegmentsGoneError) or (options.replay and options.replay_id is None):
        return report  # a new replay: nothing pushed before
    run_dir = Path(exc.filename).parent if exc.filename else path  # the spool folder's run
    try:
        home = state_home(run_dir, state_dir)
    except OSError:
        return report
    before = None if home is None else state_before_damage(sync_state_path(home, destination.key, options.replay_id),
                                                           destination)
    if before is not None:
        from prime_runs_spool.sync.sinks.choice import show

        show(report, before)
    return report


def discover(paths: Iterable[Path], on_link: OnLink | None = None,
             on_unreadable: Callable[[Path, OSError], RunReport] = unreadable_report) -> list[Path | RunReport]:
    """The runs under ``paths`` in walk order, with a ready report (``on_unreadable``'s) in
    place of each directory that could not be read; ``on_link`` is told of each link to a
    folder outside the paths that the walk did not follow (``layout.find_runs``)."""
    found: list[Path | RunReport] = []
    for run_dir in find_runs(paths, lambda path, exc: found.append(on_unreadable(path, exc)), on_link=on_link):
        found.append(run_dir)
    return found


def sync_paths(
    paths: Iterable[Path],
    client: PlatformClient,
    destination: Destination,
    options: SyncOptions,
    *,
    jobs: int = DEFAULT_JOBS,
    wait: bool = False,
    on_progress: Callable[[RunReport], None] | None = None,
    stop: Interrupt | None = None,
    first_pass: Callable[[], None] | None = None,
    state_dir: Path | None = None,
    on_link: OnLink | None = None,
) -> list[RunReport]:
    """Sync every run under ``paths``; reports come back in discovery order. ``stop``: once
    asked, no run is begun, every pass ends at its next safe point, and this returns within
    the stop's grace, each run not finished reported ``interrupted``. A directory
    that cannot be read gets a report of its own (``error``, naming it and why) in its place
    among the others, which are synced all the same. The runs share one
    :class:`EvaluationIndex`, so finding each new run's evaluation costs no request for a run
    never synced on this machine and one small one otherwise, instead of a listing of the
    whole environment (sync/index.py). ``first_pass``: called
    once, in this thread, before the first pass begins (none does when every run is up to
    date): the command checks the API key there. ``state_dir``: where the lock and state of
    each spool on a read-only folder are kept (without it, such a run is an ``error`` naming
    ``--state-dir``). ``on_link``: told of each symbolic link to a folder outside the paths,
    not followed, so the command can name what it left out."""
    found = discover(paths, on_link, functools.partial(gone_segments_report, destination=destination, options=options,
                                                       state_dir=state_dir))
    if not found:
        return []
    index: EvaluationIndex | None = None  # made for the first run that takes a pass
    known = None if options.replay else Unchanged(destination)
    homes: dict[Path, Path] = {}  # each probed run's state home, handed on to its pass
    sleep = stop.sleep if stop is not None else time.sleep
    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="prime-runs-sync")
    work: list[tuple[Path | RunReport, Future[RunReport] | RunReport | None]] = []
    passes: dict[int, list[RunSync]] = {}  # by place in ``work``: each pass's engine, once made
    try:
        for item in found:
            if isinstance(item, RunReport):
                work.append((item, item))
            elif stop is not None and stop.is_set():
                work.append((item, None))  # not begun: the stop came first
            elif (ready := up_to_date(item, client, destination, options, on_progress, state_dir, known,
                                      homes)) is not None:
                homes.pop(item, None)
                work.append((item, ready))
            else:
                if first_pass is not None:
                    first_pass, begin = None, first_pass
                    begin()
                    if stop is not None and stop.is_set():
                        work.append((item, None))
                        continue
                if index is None:
                    from prime_runs_spool.sync.index import EvaluationIndex

                    index = EvaluationIndex(answers_new_runs=True)
                made = passes.setdefault(len(work), [])
                work.append((item, pool.submit(sync_run, item, client, destination, options, wait=wait,
                                               on_progress=on_progress, index=index, sleep=sleep,
                                               state_dir=state_dir, made=made, home=homes.pop(item, None))))
        futures = [done for _, done in work if isinstance(done, Future)]
        if stop is None:
            wait_for(futures)
        else:
            _until_done_or_stopped(futures, stop)
        return [_report(item, done, passes.get(place, [])) for place, (item, done) in enumerate(work)]
    finally:
        stopped = stop is not None and stop.is_set()
        # Stopped: runs not begun are not begun, and a pass still on the wire after the grace
        # is left to the process's end (its request announced), not waited for.
        pool.shutdown(wait=not stopped, cancel_futures=stopped)
        if known is not None:
            known.save()


#: Seconds between the command's looks at the stop while passes run: a signal only sets it.
STOP_LOOK = 0.1


def _until_done_or_stopped(futures: list[Future[RunReport]], stop: Interrupt) -> None:
    """Wait for every pass; once the stop is asked, for at most its grace. The command's
    thread wakes every :data:`STOP_LOOK` seconds, not at each pass's end: a wait for the
    first of the futures still pending put a waiter on each of them at every end, work that
    grew with the square of the runs (1.1 ms of this thread's CPU a run over 2,000 new runs,
    each taking the GIL from the passes; docs/benchmarks.md)."""
    ended = _all_ended(futures)
    while not ended.wait(STOP_LOOK):
        if stop.is_set():
            ended.wait(stop.grace_left())
            return


def _all_ended(futures: list[Future[RunReport]]) -> threading.Event:
    """An event set once every future has ended: one callback each, run where it ends."""
    ended = threading.Event()
    left = [len(futures)]
    lock = threading.Lock()

    def one_ended(_: Future[RunReport]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            ended.set()

    if not futures:
        ended.set()
    for future in futures:
        future.add_done_callback(one_ended)
    return ended


def _report(item: Path | RunReport, done: Future[RunReport] | RunReport | None, made: list[RunSync]) -> RunReport:
    """A run's report; for a pass the stop's grace did not see end (a request still on the
    wire), a copy of what its engine reported so far: what it pushed is said, not 0."""
    if isinstance(done, RunReport):
        return done
    assert isinstance(item, Path)
    if done is None or done.cancelled() or not done.done():
        so_far = dataclasses.replace(made[-1].report, warnings=list(made[-1].report.warnings),
                                     notices=list(made[-1].report.notices)) if made else None
        return interrupted_report(item, so_far)
    return done.result()


def unfinished(reports: Iterable[RunReport]) -> int:
    """How many runs a stop ended before their pass did."""
    return sum(1 for report in reports if report.state == INTERRUPTED)

def up_to_date(run_dir: Path, client: PlatformClient, destination: Destination, options: SyncOptions,
               on_progress: Callable[[RunReport], None] | None, state_dir: Path | None = None,
               known: Unchanged | None = None, homes: dict[Path, Path] | None = None) -> RunReport | None:
    """The report of a run with nothing to send, found in this thread, or None. ``known``:
    the runs found up to date before, whose files, unchanged, answer without a read
    (sync/unchanged.py); else the probe reads the state and the spool's first lines
    (RunSync.probe), and what it finds is kept there. A replay is chosen under the run's
    lock, so it always takes the pool. ``homes``: told the run's state home, for its pass."""
    if options.replay:
        return None
    try:
        home = run_home(run_dir, state_dir, options)
        if home is None:
            return read_only_report(run_dir)
        if homes is not None:
            homes[run_dir] = home
        if known is not None and (ready := known.answer(run_dir, home, options.to)) is not None:
            if on_progress is not None:
                on_progress(ready)
            return ready
        if not os.path.exists(state_path_of(home, destination)):  # never synced here: the pass, no probe
            return None
        before = look(run_dir, home, destination) if known is not None else None
        if spool_open_to_others(run_dir):
            return None
        engine = engine_for(run_dir, home, client, destination, options, on_progress=on_progress)
        report = engine.probe()
        if known is not None and report is not None:
            from prime_runs_spool.sync.sinks import choice

            known.learn(before, report, choice.recorded(engine.state, AUTO))
        return report
    except Exception:  # the pass reports whatever this is, under the lock
        return None
