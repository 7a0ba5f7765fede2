"""``prime-runs sync --follow``: keep live spools flowing to the platform as they grow.

The follower adds no protocol of its own. Each step is one ordinary :class:`RunSync` pass,
under the run's sync lock, which the follower holds for as long as it follows the run; so
everything docs/sync.md guarantees (one evaluation, exactly once, one finalize, crash
recording) holds for following too, and a follower killed anywhere leaves a state that the
next sync or follower carries on from.

What following adds is *when* to run a pass. The follower looks at a run's *signature*:
the segment list, each segment's size, and whether the last segment's writer lock is held
(a ``listdir``, a ``stat`` per segment and one ``flock`` probe; no reading). Only a changed
signature costs a pass, which reads from the state's cursor, so a look costs the same
however large the spool is. It looks when the kernel says the run's spool changed
(sync/watch.py), at most once per ``poll_interval``; where the kernel cannot tell, it polls,
doubling an idle run's interval up to ``IDLE_POLL_CAP``. Idle runs thus cost what their
changes cost, not runs x polls. The paths are walked again for new runs when a watched
folder of the tree changes, and every ``rescan_interval`` where one is not watched.

Runs that have no spool yet (eval outputs written without one: the command's importer, a
layer above) come through :attr:`Follower.discover`, called before each walk: it spools what
is new or grown (stat calls answer an unchanged folder) and names the roots to walk. Such
outputs grow with no event a watch of the tree gives, so while there are any the paths are
walked every ``rescan_interval``.

A pass that ends in ``error`` (the platform down longer than ``--max-attempts`` allows, say)
is tried again after a backoff delay even if the spool did not change: a following shipper
must ride out an outage rather than give up on it.

Stopping: :attr:`Follower.stop` (set by SIGINT/SIGTERM in the command) is checked between
steps and wakes every wait, including the engine's backoff and fence waits, which then
raise :class:`Stopped`. The state is consistent at every instant by design, so stopping
there loses nothing.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.errors import SpoolError, Stopped
from prime_runs_spool.spool.format import CANCELLED, CORRUPT, CRASHED, FAILED
from prime_runs_spool.files import OnLink, OnUnreadable, links_outside, make_private_dir
from prime_runs_spool.spool.layout import find_runs, list_segments, spool_dir, spool_identity
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.writer_state import writer_alive
from prime_runs_spool.sync.index import FOLLOWER_ANSWERS_FOR, EvaluationIndex
from prime_runs_spool.sync.options import ERROR, FAILED_STATES, GONE, LOST, SKIPPED, SYNCED, UP_TO_DATE, RunReport, SyncOptions
from prime_runs_spool.sync.many import (SyncLock, gone_segments_report, local_pass, read_only_report, spool_mode_lines,
                                        sync_lock, unreadable_report)
from prime_runs_spool.sync.state import Destination, state_home
from prime_runs_spool.sync.state_adoption import adopt_states
from prime_runs_spool.sync.watch import ChangeWatch
from prime_runs_spool.signal_event import SignalEvent

#: Report states after which a run with no live writer has nothing left to follow.
DONE_STATES = frozenset({SYNCED, UP_TO_DATE, FAILED, CANCELLED, CRASHED, CORRUPT, LOST})

Signature = tuple[tuple[tuple[int, int], ...], bool, int | None]

#: The longest an idle run goes without a look when only polling can tell of its changes:
#: an episode appended to a long-idle run is seen within about this (docs/sync.md).
IDLE_POLL_CAP = 1.0
#: The same when the kernel reports its changes (sync/watch.py): a safety net only.
TRUSTED_LOOK_INTERVAL = 30.0
#: Walks of the paths for new runs when every folder of the tree is watched: a safety net.
TRUSTED_RESCAN_INTERVAL = 30.0
#: How soon a pass skipped because another sync was pushing a copy of the run is tried again.
COPY_RETRY_INTERVAL = 1.0
#: How often a wait on events looks at the stop flag.
STOP_CHECK_INTERVAL = 0.25


@dataclass
class FollowOptions:
    #: Seconds between looks at each run's signature.
    poll_interval: float = 0.1
    #: Seconds between walks of the paths for new runs.
    rescan_interval: float = 1.0
    #: Return once every run found is done and no writer is live (see :meth:`Follower.idle`);
    #: otherwise follow until stopped.
    exit_when_idle: bool = False


def signature(run_dir: Path) -> Signature:
    """What the run's spool looks like from outside: segment sizes, whether the last
    segment's writer is alive, and how far it has fsync'd. Any append made durable, new
    segment, seal or writer death changes it."""
    sizes = []
    segments = list_segments(run_dir)
    for index, path in segments:
        try:
            sizes.append((index, path.stat().st_size))
        except FileNotFoundError:
            continue
    alive = bool(segments) and writer_alive(segments[-1][1])
    return tuple(sizes), alive, durable_mark(segments[-1][1]) if alive else None


@dataclass
class Discovered:
    """What :attr:`Follower.discover` found before a walk."""

    #: The folders to walk for runs (the paths, and wherever spools of theirs are kept).
    roots: list[Path]
    #: Folders under the paths that may yet become or feed a run with no event to say so
    #: (eval outputs without a spool of their own): the paths are walked every rescan.
    growing: bool = False
    #: Some folder was left for a later look (an eval still pushing from it): not idle yet.
    waiting: bool = False


@dataclass
class Followed:
    """One run the follower knows about."""

    run_dir: Path
    #: Which folder its spool is (``layout.spool_identity``): a pass that fails because the
    #: run was moved away meanwhile, or a new spool made at its path since, is told by it.
    folder: tuple[int, int] | None = None
    lock: SyncLock | None = None
    #: The folder whose ``spool/`` keeps its lock and state (sync/state.py, ``state_home``):
    #: the run folder, or its folder under the state directory for a read-only spool.
    home: Path | None = None
    #: The signature seen before the last pass began (None: no pass yet).
    seen: Signature | None = None
    report: RunReport | None = None
    #: After an error: when to try again, and how many errors in a row.
    retry_at: float = 0.0
    errors: int = 0
    #: Nothing to do until the spool changes: the lock is released.
    done: bool = False
    #: When to take its signature next, when it was last taken, and the current idle
    #: interval (it doubles while nothing changes, up to a cap: see :meth:`Follower._step`).
    next_look: float = 0.0
    last_look: float = float("-inf")
    interval: float = 0.0
    #: Whether the kernel tells us of its changes (sync/watch.py).
    watched: bool = False
    #: The last report that named the run's evaluation (what a :meth:`Follower._gone` line names).
    pushed: RunReport | None = None
    #: What taking the lock found of the spool's modes (``many.spool_mode_lines``) and of the
    #: states it carries on from (``adopt_states``), for the next pass's report.
    mode_lines: list[str] = field(default_factory=list)


@dataclass
class Follower:
    paths: list[Path]
    client: PlatformClient
    destination: Destination
    options: SyncOptions
    follow: FollowOptions = field(default_factory=FollowOptions)
    #: Called with a run's report whenever its state, evaluation or error changes.
    on_report: Callable[[RunReport], None] = lambda report: None
    stop: threading.Event = field(default_factory=SignalEvent)
    clock: Callable[[], float] = time.monotonic
    runs: dict[Path, Followed] = field(default_factory=dict)
    #: What the kernel tells of changes to the runs and the tree; closed when :meth:`run` ends.
    watch: ChangeWatch = field(default_factory=ChangeWatch)
    #: Directories under the paths that could not be read at the last walk, with the report
    #: printed for each (once, when first met).
    unreadable: dict[Path, RunReport] = field(default_factory=dict)
    #: The environment listings shared by the followed runs (sync/index.py): a new run
    #: needs no read of its own while the listing is recent.
    index: EvaluationIndex = field(default_factory=lambda: EvaluationIndex(
        answers_new_runs=True, answers_for=FOLLOWER_ANSWERS_FOR))
    #: Where the lock and state of a spool on a read-only folder are kept (``--state-dir``);
    #: without it such a run is an ``error`` naming the option.
    state_dir: Path | None = None
    #: Called before each walk (see the module docstring); None: the paths are the roots.
    discover: Callable[[], Discovered] | None = None
    #: What it said last.
    discovered: Discovered | None = None
    #: Told at each walk of each symbolic link to a folder outside the paths, not followed
    #: (``layout.find_runs``); the command says each once.
    on_link: OnLink | None = None

    def run(self) -> list[RunReport]:
        """Follow until stopped (or idle, with ``exit_when_idle``); the last report of each run."""
        next_scan, last_scan, tree_pending = 0.0, float("-inf"), False
        try:
            while not self.stop.is_set():
                changed, tree_changed, lost = self.watch.take()
                tree_pending = tree_pending or tree_changed
                now = self.clock()
                if tree_pending:  # a folder of the tree changed: walk soon, at most once a poll
                    next_scan = min(next_scan, last_scan + self.follow.poll_interval)
                if now >= next_scan:
                    # A folder watched only now may have changed before its watch: walk again.
                    tree_pending = self._scan()
                    last_scan = now
                    rare = self.watch.tree_complete and not lost and not (
                        self.discovered is not None and self.discovered.growing)
                    next_scan = self.clock() + (TRUSTED_RESCAN_INTERVAL if rare else self.follow.rescan_interval)
                for key, followed in list(self.runs.items()):
                    self._check_stop()
                    if lost or key in changed:  # told it changed: look now, or once the poll interval allows
                        followed.next_look = min(followed.next_look, followed.last_look + self.follow.poll_interval)
                    # An idle run due within half a poll interval is looked at now: one
                    # wake-up serves many, however the idle runs' looks are spread.
                    early = self.follow.poll_interval / 2 if followed.interval > self.follow.poll_interval else 0.0
                    if self.clock() + early >= followed.next_look:
                        self._step(key, followed)
                if self.follow.exit_when_idle and self.idle():
                    break
                due = min([next_scan, *(f.next_look for f in self.runs.values())])
                self._wait(due - self.clock())
        except Stopped:
            pass
        finally:
            for followed in self.runs.values():
                self._release(followed)
            self.watch.close()
        return [f.report for f in self.runs.values() if f.report is not None] + list(self.unreadable.values())

    def idle(self) -> bool:
        """Every run found is done (or failed) with no writer live: nothing more will come
        without a new writer, and no folder was left for a later look."""
        waiting = self.discovered is not None and self.discovered.waiting
        return all(f.done for f in self.runs.values()) and not waiting

    # -- waiting and stopping ------------------------------------------------------------

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped

    def _sleep(self, seconds: float) -> None:
        """The engine's sleep too: a stop wakes it and ends the step there."""
        if self.stop.wait(max(0.0, seconds)):
            raise Stopped

    def _wait(self, seconds: float) -> None:
        """Until the next look is due, an event comes, or a stop (seen within a quarter second)."""
        if not self.watch.available:
            self._sleep(seconds)
            return
        seconds = max(0.0, seconds)
        if self.watch.wait(min(seconds, STOP_CHECK_INTERVAL)) and not self._event_due():
            # Events about runs that are to be looked at later anyway (a busy writer's
            # appends): read the next ones a little later, rather than spin on each.
            self._sleep(min(seconds, self.follow.poll_interval / 2))
        self._check_stop()

    def _event_due(self) -> bool:
        """Whether an event just read makes a look (or a walk) due now."""
        changed, tree = self.watch.pending()
        if tree:
            return True
        now = self.clock()
        return any(followed.last_look + self.follow.poll_interval <= now
                   for key in changed if (followed := self.runs.get(key)) is not None)

    # -- runs ------------------------------------------------------------------------------

    def _scan(self) -> bool:
        """Walk the paths for new runs (and unreadable directories); True when a folder
        got a new watch, so another walk must follow (sync/watch.py)."""
        unreadable: dict[Path, RunReport] = {}

        def note(path: Path, exc: OSError) -> None:
            unreadable[path] = self.unreadable.get(path) or gone_segments_report(
                path, exc, self.destination, self.options, self.state_dir)

        roots = self.paths
        if self.discover is not None:
            self.discovered = self.discover()
            roots = self.discovered.roots
        folders: set[Path] = set()
        missing = set(self.runs)
        for run_dir in _find(roots, note, folders.add, self.on_link):
            key = run_dir.resolve()
            missing.discard(key)
            if key not in self.runs:
                folder = spool_identity(run_dir)
                for old, moved in list(self.runs.items()):  # moved here: its old folder is gone first,
                    if folder is not None and moved.folder == folder and old != key:  # and its lock let go
                        missing.discard(old)
                        self._gone(old, moved)
                self.runs[key] = Followed(run_dir, folder)
            self.runs[key].watched = self.watch.watch_run(key, spool_dir(run_dir))
        for key in missing:  # moved or deleted, maybe with no event on its spool: looked at now (_gone)
            self.runs[key].next_look = 0.0
        added = self.watch.watch_tree(folders)
        for path, report in unreadable.items():
            if path not in self.unreadable:
                self.on_report(report)  # said once; a directory that becomes readable is followed
        self.unreadable = unreadable
        return added

    def _step(self, key: Path, followed: Followed) -> None:
        now = self.clock()
        followed.last_look = now
        followed.next_look = now + self.follow.poll_interval  # unless decided otherwise below
        failing = followed.report is not None and followed.report.state == ERROR
        if failing and now < followed.retry_at:
            followed.next_look = followed.retry_at
            return
        try:
            current = signature(followed.run_dir)
        except OSError as exc:  # its spool became unreadable: this run waits, the others go on
            self._record(followed, unreadable_report(followed.run_dir, exc), live=False)
            return
        if not current[0] or spool_identity(followed.run_dir) != followed.folder:
            # No segment left (no longer a run, layout.is_run_dir), or another spool made at
            # its path since: the run followed was deleted or moved away.
            self._gone(key, followed)
            return
        if current == followed.seen and not failing:
            # Idle. When the kernel tells us of every change (sync/watch.py), the next look is
            # a safety net only; when polling must find changes, look again later and later.
            if followed.watched and self.watch.watching(key):
                followed.interval = TRUSTED_LOOK_INTERVAL
            else:
                followed.interval = min(max(followed.interval * 2, self.follow.poll_interval),
                                        max(IDLE_POLL_CAP, self.follow.poll_interval))
            followed.next_look = now + followed.interval
            return
        followed.interval = 0.0
        if not self._acquire(followed):
            return
        followed.done = False
        followed.seen = current
        # copy_wait 0: a copy of the run pushed by another sync must not hold up every other
        # run followed; the pass reports it skipped and is tried again (see _record).
        assert followed.home is not None  # set by _acquire
        warnings, followed.mode_lines = followed.mode_lines, []
        report = local_pass(followed.run_dir, followed.home, self.client, self.destination,
                            dataclasses.replace(self.options, copy_wait=0.0), warnings=warnings, wait=False,
                            sleep=self._sleep, index=self.index)
        if report.state in FAILED_STATES and spool_identity(followed.run_dir) != followed.folder:
            self._gone(key, followed)  # moved away under the pass: not lost, nor an error (and nothing sent twice)
            return
        self._record(followed, report, live=current[1])

    def _gone(self, key: Path, followed: Followed) -> None:
        """The run's folder was deleted or moved away while followed (its spool holds no
        segment): said once, then followed no more. A pass there would only misname it (a
        spool with no manifest, a read-only folder) and its state's save would make the
        folder again; a run moved under the paths is found where it is now, its lock
        released here first. The line names the evaluation the run's passes pushed into."""
        self._release(followed)
        del self.runs[key]
        before = followed.pushed or followed.report
        self.on_report(RunReport(
            path=str(followed.run_dir), state=GONE, local_run_id=before.local_run_id if before else None,
            name=before.name if before else None, evaluation_id=before.evaluation_id if before else None,
            url=before.url if before else None, pushed_total=before.pushed_total if before else 0,
            error="its folder was deleted or moved away while followed; followed no more (what was pushed "
                  "stays on the platform; a run moved under the paths is followed where it is now)"))

    def _record(self, followed: Followed, report: RunReport, *, live: bool) -> None:
        previous = followed.report
        if (previous is not None and previous.state == SYNCED and report.state == UP_TO_DATE
                and previous.evaluation_id == report.evaluation_id):
            # A pass after the one that finished the run (its writer was still letting go
            # of the lock then) finds nothing to do: the run is still the synced one, not
            # news, and its last line stays ``synced`` as docs/cli.md says.
            report = previous
        followed.report = report
        if report.evaluation_id:
            followed.pushed = report
        if report.state == ERROR:
            followed.errors += 1
            followed.retry_at = self.clock() + self.options.backoff.delay(followed.errors)
            followed.next_look = followed.retry_at
            # No writer can change anything, and the pass already retried --max-attempts
            # times: leave it to a later sync rather than follow it forever.
            followed.done = not live
        else:
            followed.errors = 0
            followed.done = report.state in DONE_STATES and not live
        if report.state == SKIPPED:
            # Another sync is pushing a copy of the run (sync/copies.py): a pass again soon,
            # whether or not this spool changes (that copy may end before it has all of this one).
            followed.seen = None
            followed.next_look = self.clock() + COPY_RETRY_INTERVAL
            report.error = f"{report.error}; tried again every {COPY_RETRY_INTERVAL:g} s"
        if followed.done:
            self._release(followed)
        if previous is None or (previous.state, previous.evaluation_id, previous.error) != (
                report.state, report.evaluation_id, report.error):
            self.on_report(report)

    def _acquire(self, followed: Followed) -> bool:
        if followed.lock is not None:
            return True
        home = state_home(followed.run_dir, self.state_dir)
        if home is None:  # a read-only spool and no --state-dir: said once, as a plain sync says it
            self._record(followed, read_only_report(followed.run_dir), live=False)
            return False
        if home != followed.run_dir:
            try:
                make_private_dir(spool_dir(home))
            except OSError as exc:
                self._record(followed, RunReport(path=str(followed.run_dir), state=ERROR,
                                                 error=f"cannot keep its sync state in {spool_dir(home)}: "
                                                       f"{exc.strerror or exc}"), live=False)
                return False
        lock = sync_lock(home)
        try:
            taken, problem = lock.acquire(), None
        except OSError as exc:
            taken, problem = False, exc
        if not taken:
            skipped = RunReport(path=str(followed.run_dir), state=SKIPPED,
                                error="another prime-runs sync is working on this run; following it once that ends"
                                if problem is None else f"cannot take the sync lock: {problem}")
            if followed.report is None or followed.report.state != SKIPPED:
                followed.report = skipped
                self.on_report(skipped)
            return False
        followed.lock, followed.home = lock, home
        followed.mode_lines = [*adopt_states(followed.run_dir, home),  # what could not be carried on from
                               *spool_mode_lines(followed.run_dir, home, self.options)]
        return True

    @staticmethod
    def _release(followed: Followed) -> None:
        if followed.lock is not None:
            followed.lock.release()
            followed.lock = None


def _find(paths: Iterable[Path], on_unreadable: OnUnreadable, on_folder: Callable[[Path], None],
          on_link: OnLink | None = None) -> list[Path]:
    """The runs under ``paths`` now; a path that vanished while following just has none,
    and a directory that cannot be read is told to ``on_unreadable``, not skipped. Each
    path is walked alone, so ``on_link`` hears only of links outside all of them."""
    paths = list(paths)
    if on_link is not None:
        on_link = links_outside(paths, on_link)
    found = []
    for path in paths:
        try:
            found.extend(find_runs([path], on_unreadable, on_folder, on_link))
        except SpoolError:
            continue
    return found
