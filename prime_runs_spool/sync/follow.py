"""``prime-runs sync --follow``: keep live spools flowing to the platform as they grow.

The follower adds no protocol of its own. Each step is one ordinary :class:`RunSync` pass,
under the run's sync lock, which the follower holds for as long as it follows the run; so
everything docs/sync.md guarantees (one evaluation, exactly once, one finalize, crash
recording) holds for following too, and a follower killed anywhere leaves a state that the
next sync or follower carries on from.

What following adds is *when* to run a pass. Every ``poll_interval`` the follower looks at
each run's *signature*: the segment list, each segment's size, and whether the last
segment's writer lock is held (a ``listdir``, a ``stat`` per segment and one ``flock``
probe; no reading). Only a changed signature costs a pass, which reads from the state's
cursor, so a quiet run costs almost nothing however large its spool is. Every
``rescan_interval`` the paths are walked again for runs that appeared.

A pass that ends in ``error`` (the platform down longer than ``--max-attempts`` allows, say)
is tried again after a backoff delay even if the spool did not change: a following shipper
must ride out an outage rather than give up on it.

Stopping: :attr:`Follower.stop` (set by SIGINT/SIGTERM in the command) is checked between
steps and wakes every wait, including the engine's backoff and fence waits, which then
raise :class:`Stopped`. The state is consistent at every instant by design, so stopping
there loses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.errors import SpoolError, Stopped
from prime_runs_spool.spool.format import CANCELLED, CRASHED, FAILED
from prime_runs_spool.spool.layout import find_runs, list_segments
from prime_runs_spool.spool.reader import durable_mark, writer_alive
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.sync.many import sync_lock
from prime_runs_spool.sync.state import Destination

#: Report states after which a run with no live writer has nothing left to follow.
DONE_STATES = frozenset({"synced", "up_to_date", FAILED, CANCELLED, CRASHED, "corrupt"})
#: Report states that mean the run did not get where it should.
FAILED_STATES = frozenset({"error", "corrupt"})

Signature = tuple[tuple[tuple[int, int], ...], bool, int | None]


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
class Followed:
    """One run the follower knows about."""

    run_dir: Path
    lock: FileLock | None = None
    #: The signature seen before the last pass began (None: no pass yet).
    seen: Signature | None = None
    report: RunReport | None = None
    #: After an error: when to try again, and how many errors in a row.
    retry_at: float = 0.0
    errors: int = 0
    #: Nothing to do until the spool changes: the lock is released.
    done: bool = False


@dataclass
class Follower:
    paths: list[Path]
    client: PlatformClient
    destination: Destination
    options: SyncOptions
    follow: FollowOptions = field(default_factory=FollowOptions)
    #: Called with a run's report whenever its state, evaluation or error changes.
    on_report: Callable[[RunReport], None] = lambda report: None
    stop: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.monotonic
    runs: dict[Path, Followed] = field(default_factory=dict)
    #: The environment listings shared by the followed runs (sync/index.py).
    index: EvaluationIndex = field(default_factory=EvaluationIndex)

    def run(self) -> list[RunReport]:
        """Follow until stopped (or idle, with ``exit_when_idle``); the last report of each run."""
        next_scan = 0.0
        try:
            while not self.stop.is_set():
                if self.clock() >= next_scan:
                    self._scan()
                    next_scan = self.clock() + self.follow.rescan_interval
                for followed in list(self.runs.values()):
                    self._check_stop()
                    self._step(followed)
                if self.follow.exit_when_idle and self.idle():
                    break
                self._sleep(self.follow.poll_interval)
        except Stopped:
            pass
        finally:
            for followed in self.runs.values():
                self._release(followed)
        return [f.report for f in self.runs.values() if f.report is not None]

    def idle(self) -> bool:
        """Every run found is done (or failed) with no writer live: nothing more will come
        without a new writer."""
        return all(f.done for f in self.runs.values())

    # -- waiting and stopping ------------------------------------------------------------

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped

    def _sleep(self, seconds: float) -> None:
        """The engine's sleep too: a stop wakes it and ends the step there."""
        if self.stop.wait(max(0.0, seconds)):
            raise Stopped

    # -- runs ------------------------------------------------------------------------------

    def _scan(self) -> None:
        for run_dir in _find(self.paths):
            key = run_dir.resolve()
            if key not in self.runs:
                self.runs[key] = Followed(run_dir)

    def _step(self, followed: Followed) -> None:
        failing = followed.report is not None and followed.report.state == "error"
        if failing and self.clock() < followed.retry_at:
            return
        current = signature(followed.run_dir)
        if current == followed.seen and not failing:
            return
        if not self._acquire(followed):
            return
        followed.done = False
        followed.seen = current
        report = RunSync(followed.run_dir, self.client, self.destination, self.options,
                         sleep=self._sleep, index=self.index).run()
        self._record(followed, report, live=current[1])

    def _record(self, followed: Followed, report: RunReport, *, live: bool) -> None:
        previous = followed.report
        followed.report = report
        if report.state == "error":
            followed.errors += 1
            followed.retry_at = self.clock() + self.options.backoff.delay(followed.errors)
            # No writer can change anything, and the pass already retried --max-attempts
            # times: leave it to a later sync rather than follow it forever.
            followed.done = not live
        else:
            followed.errors = 0
            followed.done = report.state in DONE_STATES and not live
        if followed.done:
            self._release(followed)
        if previous is None or (previous.state, previous.evaluation_id, previous.error) != (
                report.state, report.evaluation_id, report.error):
            self.on_report(report)

    def _acquire(self, followed: Followed) -> bool:
        if followed.lock is not None:
            return True
        lock = sync_lock(followed.run_dir)
        try:
            lock.acquire()
        except (Timeout, OSError) as exc:
            skipped = RunReport(path=str(followed.run_dir), state="skipped",
                                error="another prime-runs sync is working on this run; following it once that ends"
                                if isinstance(exc, Timeout) else f"cannot take the sync lock: {exc}")
            if followed.report is None or followed.report.state != "skipped":
                followed.report = skipped
                self.on_report(skipped)
            return False
        followed.lock = lock
        return True

    @staticmethod
    def _release(followed: Followed) -> None:
        if followed.lock is not None:
            followed.lock.release()
            followed.lock = None


def _find(paths: Iterable[Path]) -> list[Path]:
    """The runs under ``paths`` now; a path that vanished while following just has none."""
    found = []
    for path in paths:
        try:
            found.extend(find_runs([path]))
        except (SpoolError, OSError):
            continue
    return found
