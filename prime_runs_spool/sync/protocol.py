"""The exactly-once core of a sync (docs/sync.md): announce, send once, settle, fence.

Invariant, true at every instant a process could die: the platform holds exactly the first
``state.samples_pushed`` rows of the run's row stream on ``state.evaluation_id``, plus at
most the one request that ``state.in_flight`` announces. Every non-idempotent request is
announced in the state file (with its send time) before it is sent, and settled after:

- its answer arrived: the state moves past it;
- it certainly was not processed (connection refused, 429): it is sent again;
- the platform answered an error (500, 503): one read tells whether it acted;
- it is in doubt (timeout, reset, 502, 504, a sync killed mid-request): a read tells if it
  landed; if not, sync waits until it can no longer land (its send time plus the request
  lifetime) and reads again before sending anything.

So nothing is ever sent twice, and nothing is skipped. This module knows no request in
particular: the evaluation (sync/evaluation.py), each sink's batches (sync/sinks/), the
samples read back (sync/reconcile.py) and the finalize call all go through it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import FailureKind, PlatformError, RequestFailedError, SyncError, UnknownEvaluation
from prime_runs_spool.platform_api.answer_cap import answers_within
from prime_runs_spool.plural import count
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.replay import replay_option
from prime_runs_spool.sync.retry import Wait
from prime_runs_spool.sync import state_file
from prime_runs_spool.sync.state import Cursor, InFlight, SyncState, distrust, save_state

#: What :meth:`Protocol.send_once` returns for a request that landed but lost its answer.
LANDED = object()

#: Why a fence waits, unless its caller says: a request of this run got no answer.
IN_DOUBT = "a request sent earlier got no answer and may still land"
#: A fence shorter than this is not told: it is over before anyone could read the line.
TOLD_FENCE_SECONDS = 1.0
#: The part of a request lifetime within which a body's last byte must go out, counted from
#: the send time its announcement gives: the rest is the platform's, which is assumed to
#: commit a request at most this part of a lifetime after it arrives (docs/sync.md).
FINISH_WITHIN = 0.5


class Protocol:
    """The state file of one run and destination, and the rules for every request it announces."""

    #: Whether an announcement may be written while its request's body goes out
    #: (:meth:`_announce_alongside`): a state file on this machine may; a pass under a lease
    #: in an object store (sync/leased.py) renews the lease with each announcement, first.
    WRITES_ALONGSIDE = True
    #: Whether every request is announced in a run's lease before it is sent, so whoever takes
    #: the lease next fences it (sync/leased.py): what a copy lock's note says (sync/copies.py).
    LEASED = False

    def __init__(self, path: Path, options: SyncOptions, *, clock: Callable[[], float],
                 sleep: Callable[[float], None], on_save: Callable[[], None],
                 monotonic: Callable[[], float] | None = None) -> None:
        #: The state file this sync reads and announces every step in.
        self.path = path
        #: What messages call the state: the file, unless it is a copy of one kept elsewhere.
        self.shown: str | None = None
        #: What messages call the run (its folder or URL): set by the engine.
        self.run: str = str(path)
        self.options = options
        #: Wall-clock seconds: only what is written to the state (``in_flight.sent_at``).
        self.clock = clock
        #: This process's monotonic clock: what every wait is measured on (an injected
        #: ``clock`` drives both, so tests can run the protocol on a fake time).
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        self.sleep = sleep
        #: This process's monotonic clock when the state was read: an announced request from
        #: an earlier process is at least that old (:meth:`request_age`), whatever the wall
        #: clock says.
        self._loaded = self.monotonic()
        #: ``(sent_at, monotonic)`` of the last request this process sent.
        self._sent: tuple[float, float] | None = None
        #: Set when a request was settled as "did not land" after its fence, so the next
        #: batch resends rows a late commit could duplicate: that batch is checked.
        self.check_next_batch = False
        #: Whether every request :meth:`send_once` sent in this pass was answered at its first
        #: try: a failed one may have landed later than a read says, so the count is read
        #: again before finalizing (sync/engine.py, ``RunSync._count_exact``).
        self.all_answered = True
        #: Called after every save, so the report follows the state.
        self.on_save = on_save
        #: Whether a sync elsewhere may have worked on the run without leaving a note in its
        #: copy lock on this machine (sync/copies.py): locally no; in an object store, unless
        #: this syncer made the run's lease (sync/store_sync.py). A run no one else can have
        #: synced is found in the sync's listing of its environment (sync/index.py).
        self.others_may_have_synced = False
        #: Whether another sync state than this one may have recorded pushes since this one
        #: was last written, as the run's lease in an object store says (sync/leased.py):
        #: then this state is checked against the platform as another copy's would be.
        self.overtaken = False
        #: The run's sync state: loaded (or started) by the engine before any request.
        self.state: SyncState | None = None
        #: Whether the state holds changes :meth:`note` made that the file does not have yet.
        self.unsaved = False
        #: Set while a write is under way, so still set after one that failed.
        self._writing = False
        #: What the state file announces, as read or last written (:meth:`left_in_doubt`).
        self._durable: InFlight | None = None
        #: How the pass writes its state: in place from its first announcement on.
        self.writer = state_file.Writer(str(path))
        #: Called before the pass writes each announcement: the run's copy lock notes that a
        #: request of this pass may be out (sync/copies.py), so a pass that ends before its
        #: first (killed, stopped at once) costs the next one no fence, and returns the mark
        #: the state is written with from then on (``SyncState.pass_mark``), which tells the
        #: next pass that the state it reads is the one this pass wrote last.
        self.before_announcement: Callable[[], str] | None = None

    def save(self) -> None:
        """Write the state now, atomically and durably: what announces a request, before it
        is sent, and what records anything the platform cannot tell the next sync."""
        self._writing = True
        if self.state is not None and self.state.in_flight is not None:
            self._announcing()
        self._write()
        self._writing = self.unsaved = False
        self._durable = self.state.in_flight if self.state is not None else None
        self.on_save()

    def _write(self) -> None:
        save_state(self.path, self.state, self.writer)

    def _announce_alongside(self) -> Callable[[], None]:
        """Start writing the state that announces a request on another thread (:func:`_announcers`),
        and return the gate its sender passes before the body's last byte: it waits for the
        write, and raises what the write raised (the request is then never complete, so never
        processed).

        A request the platform has not received whole cannot be acted on (its length is
        declared), so the announcement is durable before the platform can act on the request,
        as when it is written first; meanwhile the body goes out, and the write's fsyncs (1-12
        ms each at load, one per samples request) no longer stand between two requests. Only
        where :attr:`WRITES_ALONGSIDE` says so; elsewhere the announcement is written before
        the request, as :meth:`save` writes it. Nothing changes the state while it is written:
        the sending thread only reads it."""
        self._writing = True
        self._announcing()
        self.unsaved = False  # what the write carries; a note made while it runs stays unsaved
        announced = self.state.in_flight
        written = _announcers().submit(self._write)
        settled: list[bool] = []

        def durable() -> None:
            failed = written.exception()  # waits for the write; what it raised is raised here, by the gate
            if failed is not None:
                raise failed
            if not settled:
                settled.append(True)
                self._writing, self._durable = False, announced
                self.on_save()
        return durable

    def _announcing(self) -> None:
        """Before an announcement is written: a stopped pass sends nothing more, and each one
        is told (:attr:`before_announcement`) before it can be read, its mark in the state."""
        self.checkpoint()
        if (told := self.before_announcement) is not None:
            self.state.pass_mark = told()

    def note(self) -> None:
        """The state changed in a way the next sync can learn again from the platform: the
        answer to a request the file already announces (an evaluation created, rows or a
        finalize that landed), or a fact read from the spool or the platform again at no
        risk (a cursor past records that are not rows, the sink episodes go to, the metrics
        sent with an idempotent PUT). Not written on its own: the next :meth:`save` (the
        announcement of the next request, written before that request is sent) carries it,
        or :meth:`flush` at the end of the pass. A process killed in between leaves a file
        that is behind but still true (the invariant allows the request it announces to
        have landed), and the next sync settles that request as after any crash, by one
        read and without a fence, because it did land (docs/sync.md, "State")."""
        self.unsaved = True
        self.on_save()

    def flush(self, *, quietly: bool = False) -> None:
        """Write what :meth:`note` left unsaved, once, at the end of a pass (the engine's
        ``run``), whether it went well or not: so a finished run's file says so (the next
        sync's "up to date?" answers from it without a request), and a failed pass leaves
        no more for the next sync to read back than it must. Never after a write that
        failed: that one may have been announcing a request that then was not sent, and
        writing it now would make the next sync fence a request that never left.
        ``quietly``: a failure to write is not raised (the pass is failing already), and the
        file is not this process's to trust (state.py ``distrust``)."""
        try:
            if not self.unsaved or self._writing:
                return
            try:
                self.save()
            except Exception:
                if not quietly:
                    raise
        finally:
            self.writer.end()  # the pass's last write: its twin blanked
            if quietly:  # a failed pass's state is checked by the next, as another process's
                distrust(self.path)

    def loaded(self) -> None:
        """Note that the state was just read: the moment fences of its requests start from."""
        self._loaded = self.monotonic()
        self._durable = self.state.in_flight if self.state is not None else None

    def left_in_doubt(self) -> InFlight | None:
        """The request this pass leaves announced, for the run's copy lock to note at its end
        (sync/copies.py): the state's, unless the write that was to announce it failed (then
        it was never sent, and a note of it cost the next pass a fence): what the file still
        announces, then."""
        pending = self.state.in_flight if self.state is not None else None
        return self._durable if pending is not None and self._writing else pending

    def acknowledge(self, end: Cursor, rows: int, episodes: int, seal: dict[str, Any] | None = None,
                    last_sample_id: Any = None) -> None:
        """A samples request landed: move the state past it."""
        pending = self.state.in_flight
        if pending is not None and pending.released:
            self.state.released.extend(i for i in pending.released if i not in self.state.released)
        self.state.advance(end, rows, episodes, seal, last_sample_id)
        self.state.in_flight = None
        self.note()  # the file announces the request: the next sync sees it landed

    def fence(self, sent_at: float, why: str = IN_DOUBT, skip: str = "") -> None:
        """Wait until a request sent at ``sent_at`` (wall clock) can no longer be processed.
        A wait of a second or more is told first (``why``, when it ends, and ``skip``: how a
        person may end it sooner), as a retry is: it may last a whole request lifetime, and a
        sync that says nothing for minutes looks hung.

        Until the request is surely a lifetime old (:meth:`fence_age`), never longer than one
        lifetime of this process's monotonic clock: a request this process sent is counted
        from its own send, one read from the state from the moment the state was read (a
        ``sent_at`` in the future counts as just sent). docs/sync.md, "Clocks", says what a
        wall clock stepped forward can do to the second.
        """
        lifetime = self.options.request_lifetime
        if (delay := lifetime - self.fence_age(sent_at)) >= TOLD_FENCE_SECONDS:
            self.options.backoff.waiting(Wait(run=self.run, why=why, delay=delay, until=self.clock() + delay,
                                              skip=skip))
        while (remaining := lifetime - self.fence_age(sent_at)) > 0:
            self.sleep(min(remaining, 5.0))

    def request_age(self, sent_at: float, since: float) -> float:
        """How old a request announced with the send time ``sent_at`` (wall clock) may be:
        the longer of its age by the wall clock and by this process's monotonic clock since
        ``since``, a moment it had certainly been sent by (its send here, or the reading of
        the state that announces it). The gate before a body's last byte refuses a request
        this says may be half a lifetime old: the monotonic clock, which a wall clock set
        back cannot shorten; the wall one, which a taker's fence counts in (it has only
        ``sent_at``), and which goes on while Linux's monotonic clock stops for a suspended
        machine."""
        return max(self.clock() - sent_at, self.monotonic() - since)

    def fence_age(self, sent_at: float) -> float:
        """How old a request announced with the send time ``sent_at`` surely is, for the
        fence that waits until it can no longer land. One this process sent: its own
        monotonic clock since its send alone, which no wall clock stepped forward can
        lengthen (a suspend only makes the fence longer). One read from the state: the age
        :meth:`request_age` gives from the reading, the best a later process can know."""
        if self._sent is not None and self._sent[0] == sent_at:
            return self.monotonic() - self._sent[1]
        return self.request_age(sent_at, self._loaded)

    def retry(self, what: str, call: Callable[[], Any], *,
              passing: tuple[type[PlatformError], ...] = ()) -> Any:
        """Run an idempotent call, retrying every failure that is not fatal. ``passing``:
        failures raised as they are, for the caller to act on (a sink found unavailable)."""
        attempt = 0
        backoff = self.options.backoff
        while True:
            self.checkpoint()
            sent = backoff.monotonic()
            try:
                with answers_within(backoff.time_left()):
                    answer = call()
            except passing:
                raise
            except PlatformError as exc:
                attempt += 1
                if exc.kind is FailureKind.FATAL:
                    raise self._give_up(what, exc, attempt) from None
                self.back_off(what, exc, attempt, sent)
                continue
            self.options.backoff.answered()
            return answer

    def checkpoint(self) -> None:
        """Where a pass asked to stop ends: before a request is announced or sent. The pass's
        ``sleep`` raises :class:`~prime_runs_spool.errors.Stopped` once a stop was asked
        (sync/interrupt.py, the follower's), so sleeping no time at all is the question."""
        self.sleep(0.0)

    def _give_up(self, what: str, exc: PlatformError, attempt: int, seconds: float = 0.0) -> SyncError:
        return _give_up(what, exc, attempt, seconds, replay_id=self.state.replay_id if self.state else None)

    def back_off(self, what: str, exc: PlatformError, attempt: int, sent: float | None = None) -> None:
        """After failure number ``attempt`` of a request sent at ``sent`` (the backoff's
        clock): wait (told to whoever watches the retries, sync/retry.py) before the next
        try, or give up when the attempts or the time allowed are spent."""
        backoff = self.options.backoff
        wait = backoff.next_wait(what, str(exc), attempt, exc.retry_after, sent)
        if wait is None:
            raise self._give_up(what, exc, attempt, backoff.gave_up_after()) from None
        self.sleep(wait)

    def settled(self, sent_at: float, landed: Callable[[], bool], *, in_doubt: bool = True) -> bool:
        """Did a request sent at ``sent_at`` land? Reads once; when it did not and the request
        may still be in flight, waits until it can no longer land and reads again."""
        if landed():
            return True
        if not in_doubt:
            return False
        self.fence(sent_at)
        if landed():
            return True
        self.check_next_batch = True  # a late commit would meet the resend: look after it
        return False

    def send_once(self, what: str, in_flight: InFlight, send: Callable[[Callable[[], None]], Any],
                  landed: Callable[[], bool], *, alongside: bool = False) -> Any:
        """Send a request that must not be processed twice: announce it in the state, send it,
        and after a failure resend only once ``landed`` says it did not (and cannot) land.
        Returns the answer, or :data:`LANDED` when it landed but its answer was lost.

        ``send`` takes the gate its request passes before the last byte of its body
        (:meth:`_in_time`): every request announced here, whatever it is (an evaluation's
        creation, a batch of rows, a finalize). ``alongside``: the announcement is written
        while the body goes out (:meth:`_announce_alongside`), else before ``send`` is called."""
        attempt = 0
        alongside = alongside and self.WRITES_ALONGSIDE
        doubted = False  # whether a try got no answer after its bytes may have left
        while True:
            sent_at, started = self.clock(), self.monotonic()
            self.state.in_flight = dataclasses.replace(in_flight, sent_at=sent_at)
            gate = self._announce_alongside() if alongside else None
            if gate is None:
                self.save()
            self._sent = (sent_at, self.monotonic())
            sent = self.options.backoff.monotonic()
            try:
                try:
                    with answers_within(self.options.backoff.time_left()):
                        answer = send(self._in_time(gate or _written, sent_at, started))
                finally:
                    if gate is not None:
                        gate()  # the write is over whatever became of the request; its failure wins
            except PlatformError as exc:
                self.all_answered = False
                if exc.kind is FailureKind.FATAL:
                    # Refused (a 4xx) or never sent: it did not happen. Left announced, the next
                    # sync fenced it for a whole request lifetime (10 minutes by default) before
                    # doing anything, after a refusal the user had just fixed (a 403, a 422).
                    # The pass's end (``flush``) records that.
                    self.state.in_flight = None
                    self.note()
                    raise self._give_up(what, exc, attempt + 1) from None
                if exc.kind is not FailureKind.NOT_SENT and self.settled(
                        sent_at, landed, in_doubt=exc.kind is FailureKind.IN_DOUBT):
                    return LANDED
                attempt += 1
                doubted = doubted or exc.kind is FailureKind.IN_DOUBT
                try:
                    self.back_off(what, exc, attempt, sent)
                except BaseException:
                    if not doubted:
                        # Given up (or stopped while waiting), no try in doubt: each one never
                        # left (a connection refused) or was answered and read as not landed.
                        # Left announced, the next sync fenced it for a request lifetime, as
                        # after a platform that was down for a moment.
                        self.state.in_flight = None
                        self.note()
                    raise
                continue
            self.options.backoff.answered()
            return answer

    def _in_time(self, durable: Callable[[], None], sent_at: float, started: float) -> Callable[[], None]:
        """The gate before a body's last byte: the announcement is durable (``durable``), and
        the announced send time is less than :data:`FINISH_WITHIN` of a lifetime ago.

        Every fence of this request (this process's, or a taker's reading the state or the
        lease) ends a lifetime after that send time. A process paused (SIGSTOP, a swapped-out
        VM) between announcing and sending sent its request only once it woke, long after:
        the platform, which counts from arrival, committed it after another syncer had
        fenced it, found it not landed and sent it again: its rows twice, a second
        evaluation, a second finalize. Its headers went out before this check, so a request
        let through here arrives within half a lifetime of its send time and is committed
        within the other half. One held past it is left unfinished (never acted on) and
        announced and sent afresh, which under a lease renews the lease first: a syncer
        taken over meanwhile stops there. The hold is the request's age as a taker's fence
        may count it, the longer of the two clocks' (:meth:`request_age`): a suspended
        machine's, too."""
        limit = self.options.request_lifetime * FINISH_WITHIN

        def gate() -> None:
            durable()
            if (late := self.request_age(sent_at, started)) >= limit:
                raise PlatformError(FailureKind.NOT_SENT, f"a request held up {late:.2f} s before its last byte "
                                    f"(over half its {self.options.request_lifetime:g} s lifetime) was left "
                                    "unfinished, so it cannot land; it is announced and sent again")
        return gate


def _written() -> None:
    """The gate of a request whose announcement was written before it was sent."""


#: The threads announcements are written on while their requests' bodies go out, shared by
#: every pass of the process: a thread started for each one cost more CPU than the write's
#: own work. Made when first needed; a thread is added only when none is idle (as many as
#: passes announce at once). Not daemons, as a pass's own thread is not: a process that
#: exits meanwhile ends a write first, never leaving its temporary file behind.
_ANNOUNCERS: list[ThreadPoolExecutor] = []
_ANNOUNCERS_MADE = threading.Lock()
#: At most this many writes at once; more wait for one to end (each is a few fsyncs).
_ANNOUNCERS_MAX = 64


def _announcers() -> ThreadPoolExecutor:
    with _ANNOUNCERS_MADE:
        if not _ANNOUNCERS:
            _ANNOUNCERS.append(ThreadPoolExecutor(max_workers=_ANNOUNCERS_MAX,
                                                  thread_name_prefix="prime-runs-sync-announce"))
        return _ANNOUNCERS[0]


def _give_up(what: str, exc: PlatformError, attempt: int, seconds: float = 0.0, *,
             replay_id: str | None = None) -> RequestFailedError:
    """The pass's failure after ``exc``. ``replay_id``: the replay whose state the pass
    keeps, which an unknown evaluation's advice must not continue (sync/replay.py)."""
    if isinstance(exc, UnknownEvaluation):
        return RequestFailedError(f"{what}: {exc}; if so, push the run again as a new evaluation with "
                                  f"{replay_option(replay_id)}")
    if exc.kind is FailureKind.FATAL:
        return RequestFailedError(f"{what}: {exc}")
    tries = count(attempt, "attempt")
    spent = f" over {seconds:.0f} s of failures on this platform" if seconds >= 1 else ""
    return RequestFailedError(f"{what}: still failing after {tries}{spent} ({exc}); "
                              "the state is saved, run prime-runs sync again later")
