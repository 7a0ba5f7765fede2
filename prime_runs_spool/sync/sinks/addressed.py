"""Sinks that address a batch by its content: exactly once by an idempotency key, not by
counting (Prime Traces, sync/sinks/traces.py; any such sink needs only what differs).

A batch is the run's episode lines between two spool positions: the state's cursor (where
the previous committed batch ended) and an end the sink's batching rule picks. Its
idempotency key is the SHA-256 of its bytes. Before a batch is sent, its end and digest are
announced in the state (fsync'd). So a sync killed anywhere either had not sent it (and cuts
the same batch again) or finds it announced and rebuilds exactly those bytes from the two
positions: the same key, which the sink answers with the committed receipt instead of
storing anything twice. No fence and no reconciliation are needed, and the batch a live
run's tail produced is as fixed, once announced, as any other.

Which episodes give a line is the rule every sink follows (sync/records.py, ``withheld``): a
superseded episode never does, nor one the platform run held when sync adopted it from
vf-eval's own push (the state's ``on_platform``) or found it again with a state that starts
from nothing (``held_there``: a re-cut may close a batch elsewhere, another key), both fixed
before any batch is cut; an errored one is held back until the run completes and is
then released in batches of its own, cut the same way from the held-back episodes (a
function of the sealed spool and the state's ``released``). An announced batch is never
re-cut, even when a later resume superseded one of its episodes: it is rebuilt under the
supersede lists it was cut with, sent, and the episode reported as superseded after push
(docs/sync.md, "Prime Traces" and "Resumed runs").
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import FailureKind, PlatformError, ServiceNotEnabled, SyncError
from prime_runs_spool.plural import count, plural
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.sync.id_sets import IdSet, members_of, size_of
from prime_runs_spool.sync.options import SAMPLES
from prime_runs_spool.sync.reconcile import COMPLETED_STATUS
from prime_runs_spool.sync.records import durable_records, record_episode_id, seal_if_last, track_seal, withheld
from prime_runs_spool.sync.replay import replay_option
from prime_runs_spool.sync.sinks.base import Sink, StateOrigin
from prime_runs_spool.sync.state import Cursor, InFlight, SyncState


@dataclass(frozen=True)
class Line:
    data: bytes
    #: Where the spool resumes after this episode (a held-back one lies behind the cursor:
    #: the cursor, None before there is one).
    after: Cursor | None
    #: The episode's member traces.
    traces: int
    episode_id: str | None = None


@dataclass
class LineStream:
    """The run's episode lines from ``cursor`` on (the sink's :class:`SinkStream`).

    An episode the rule withholds (sync/records.py, ``withheld``: superseded, or errored and
    held back) gives no line: the cursor moves past it as past a seal. ``superseded`` is the
    pass's set unless given (a pending batch is rebuilt under the set it was cut with)."""

    sink: AddressedSink
    cursor: Cursor | None
    seal: dict[str, Any] | None = None
    skipped: list[dict[str, Any]] = field(default_factory=list)
    #: Always empty: a line too large for the sink fails the batch (the sink says why).
    too_large: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    superseded: frozenset[str] | None = None
    #: The segment ``seal`` was read from (a seal handed in sits where the cursor is).
    seal_segment: int | None = None
    #: The run's listing to read by (the pass's: ``PassContext.take_listing``); None: listed
    #: when read.
    segments: list[tuple[int, Path]] | None = None

    def __post_init__(self) -> None:
        if self.seal is not None and self.seal_segment is None and self.cursor is not None:
            self.seal_segment = self.cursor.segment_index

    def __iter__(self) -> Iterator[Line]:
        return self.lines()

    def lines(self) -> Iterator[Line]:
        context = self.sink.context
        superseded = context.superseded if self.superseded is None else self.superseded
        there = self.sink.already_there()
        start = None if self.cursor is None else self.cursor.position
        for record in durable_records(context.run_dir, start, skip_corrupt=context.options.skip_corrupt,
                                      skipped=self.skipped, remask=context.remask, segments=self.segments):
            after = Cursor.past(record)
            self.seal, self.seal_segment = track_seal(self.seal, self.seal_segment, record)  # the last segment's only
            if (record.type == EPISODE and withheld(record, superseded, hold_errored=True) is None
                    and record_episode_id(record) not in there):
                yield self.sink.line(record, after)
            self.cursor = after
        self.seal = seal_if_last(context.run_dir, self.seal, self.seal_segment)
        self.done = True


@dataclass
class HeldStream:
    """The lines a completed run releases (``PassContext.held``), as a stream the batching
    rule can cut: the cursor stays where it is (they lie behind it)."""

    sink: AddressedSink
    cursor: Cursor | None
    seal: dict[str, Any] | None = None
    done: bool = False

    def lines(self) -> Iterator[Line]:
        there = self.sink.already_there()
        for record in self.sink.context.held():
            if record_episode_id(record) not in there:
                yield self.sink.line(record, self.cursor)
        self.done = True


@dataclass
class Cut:
    """One batch (``data`` None: no episode, only records to move past, such as a seal) and
    where the cursor goes once it is committed (the sink's :class:`SinkBatch`)."""

    data: bytes | None
    end: Cursor | None
    episodes: int = 0
    traces: int = 0
    seal: dict[str, Any] | None = None
    #: The episode ids of its lines, in order.
    ids: list[str | None] = field(default_factory=list)
    #: For a batch of held-back episodes: their ids, added to the state's ``released``.
    released: list[str] = field(default_factory=list)
    digest: str = ""
    #: What the report counts: the batch's episodes (0 when it has none).
    count: int = 0
    size: int = 0

    def __post_init__(self) -> None:
        if self.data is not None:
            self.digest = self.digest or hashlib.sha256(self.data).hexdigest()
            self.count, self.size = self.episodes, len(self.data)

    def release(self) -> None:
        """Sent: its bytes are not kept alive while the next batch is built."""
        self.data = None


class AddressedSink(Sink):
    """What every content-addressed sink does alike; a subclass says how an episode becomes
    a line (:meth:`line`), where batches close (:meth:`cut`) and how one is uploaded
    (:meth:`upload`)."""

    @abstractmethod
    def encode(self, record: Any) -> bytes:
        """An episode record as this sink's line, stamped with ``context.run_id``."""

    @abstractmethod
    def cut(self, stream: LineStream | HeldStream) -> Iterator[Cut]:
        """The stream's lines in batches, each with the position it ends at; the last past
        whatever follows its last line (a ``Cut`` with no data when nothing does)."""

    @abstractmethod
    def upload(self, cut: Cut) -> str:
        """Upload the batch's bytes under its digest; the receipt's upload id. Raises
        PlatformError (its kind says whether to retry), ServiceNotEnabled when the account
        has no such sink."""

    @classmethod
    def pushed_total(cls, state: SyncState) -> int:
        """The episodes this state's batches carried, and those the platform held when the
        run was found without a state that vouches for them: an earlier sync's, its state
        lost (``held_there``), or vf-eval's own push (``on_platform``), as the samples
        table's count holds vf-eval's rows. None of them is in a batch (``already_there``)."""
        return state.episodes_pushed + size_of(state.held_there) + size_of(state.on_platform)

    def already_there(self) -> frozenset[str]:
        """The episodes that give no line because the platform held them when sync found the
        run without a state that vouches for it: vf-eval pushed them (``on_platform``), or an
        earlier sync whose state was lost did (``held_there``)."""
        state = self.state
        return members_of(state.on_platform) | members_of(state.held_there)

    def line(self, record: Any, after: Cursor | None) -> Line:
        members = record.data.get("traces")
        return Line(self.encode(record), after, len(members) if isinstance(members, list) else 0,
                    record_episode_id(record))

    #: The digest of the batch this pass announced, and whether it went out with no answer
    #: (:meth:`in_doubt`).
    announced_here: str | None = None
    unanswered: bool = False
    #: The digest of the batch whose announcement was just written, its send time the time
    #: of the try about to leave (:meth:`_stamp`).
    stamped: str | None = None

    def in_doubt(self) -> bool:
        """The announced batch may be committed unless this pass announced it and every
        answer it got says it was not stored (a refusal such as ``service_not_enabled``, a
        rate limit): a send with no answer, or a gateway's (platform_api/traces.py,
        ``classify``), leaves it in doubt, and so does an
        announcement from an earlier pass, which may have sent it. Content addressing settles
        it once the sink answers again: the same bytes under the same key, stored once."""
        pending = self.state.in_flight
        return (super().in_doubt() and pending is not None
                and (pending.digest != self.announced_here or self.unanswered))

    def refuse_if_committed(self, reason: Exception) -> None:
        uploads = self.state.uploads
        doubtful = self.in_doubt()
        if not uploads and not doubtful:
            return
        there = (f"after {count(len(uploads), 'batch', 'batches')} of this run "
                 f"{plural(len(uploads), 'was', 'were')} committed there") if uploads else ""
        if doubtful:
            there = (f"{there}, " if there else "") + ("a batch of this run sent there may have been committed "
                                                      "(its answer was lost)")
        raise SyncError(f"{reason}; {there}, so the run stays in {self.title}: turn it back on for the account and "
                        f"sync again, or sync it with {replay_option(self.state.replay_id)} --to {SAMPLES} as a new "
                        "evaluation") from None

    def advice_elsewhere(self, other: str) -> str:
        """How to sync the run to ``other`` instead, told when this sink cannot take it: with
        ``--to`` when nothing of the run is here, nor may be (the recorded choice released, so
        that command is not refused); else with ``--replay``, a new evaluation, since a run
        is never half in each sink."""
        if self._may_hold_some():
            return f"sync it with {replay_option(self.state.replay_id)} --to {other} as a new evaluation"
        self._release_choice()
        return f"sync it with --to {other}"

    def _may_hold_some(self) -> bool:
        """Whether some of the run is here, or may be: a batch committed or in doubt,
        episodes vf-eval or a lost state's sync pushed there, or a sink found on the platform
        (whose state cannot tell it holds nothing)."""
        state = self.state
        return bool(state.uploads or self.in_doubt() or state.on_platform or state.held_there
                    or state.sink_from_platform)

    def _release_choice(self) -> None:
        """Nothing of the run is here: the recorded choice is released, so a run is not
        trapped in a sink that holds nothing (``--to`` another one is not refused)."""
        if self.state.store == self.name:
            self.state.store = None
            self.context.protocol.note()  # written as the pass ends (its failure flushes the state)

    # -- the contract ------------------------------------------------------------------------

    def stream(self) -> LineStream:
        # Starting past a seal already committed, the stream knows how the log ends.
        return LineStream(self, self.state.cursor, seal=self.state.seal, segments=self.context.take_listing())

    def batches(self, stream: LineStream) -> Iterator[Cut]:  # type: ignore[override]
        return self.cut(stream)

    def held_batches(self) -> Iterator[Cut]:
        """Cut by the sink's own rule and announced like any batch (their ids recorded as
        released with the receipt). Which they are is a function of the sealed spool and
        ``released``, so a sync killed after a receipt cuts the same rest."""
        for cut in self.cut(HeldStream(self, self.state.cursor, seal=self.state.seal)):
            if cut.data is None:
                continue
            cut.end, cut.seal = self.state.cursor, self.state.seal
            cut.released = [str(i) for i in cut.ids]
            yield cut

    #: Episode ids the platform held when a pass whose state cannot vouch for it began
    #: (another copy of the run may have uploaded the same batches): a batch the service
    #: answers by replaying its receipt stored nothing, and is not reported pushed now.
    there_before: frozenset[str] = frozenset()
    #: The same ids as the listing gave them (its order), for the state.
    listed: tuple[str, ...] = ()

    def episodes_there(self) -> list[str]:
        """The ids of the episodes the platform's run holds; none known unless a sink can say."""
        return []

    def settle(self, origin: StateOrigin) -> bool:
        """The batch the state announces, sent again: the same bytes, so the same key. An
        evaluation found rather than created has its status read: the listing it was found
        in (read once per sync, with the sync's own creates) may predate another copy's
        finalize, and a second finalize runs the platform's statistics job again."""
        if origin.adopted and not self.state.finalized:
            self._read_finalized(None)
        if origin.adopted or (origin.foreign and not origin.fresh):  # else created now: holds nothing
            self.listed = tuple(dict.fromkeys(self.context.protocol.retry(
                f"listing the episodes {self.title} holds for the run", self.episodes_there)))
            self.there_before = frozenset(self.listed)
        pending = self.state.in_flight
        if pending is not None and pending.kind == self.name:
            if pending.released:
                self._resend_released(pending)
            else:
                self._resend(pending)
        if origin.adopted and self._starts_from_nothing():
            self._hold_what_is_there()
        return True

    def _starts_from_nothing(self) -> bool:
        """A state that has sent nothing here (the state lost, or another ``--state-dir``):
        its batches are cut from the start of the spool, and a batch an earlier sync cut while
        the run was live may close elsewhere this time (another key)."""
        state = self.state
        return state.cursor is None and not state.uploads and not state.released and state.in_flight is None

    def _hold_what_is_there(self) -> None:
        """What the listing showed is committed there: those episodes are never sent again,
        so a re-cut stores none of them twice, and no episode is lost (what the listing does
        not show is sent). Recorded in the state before any batch is cut, so every batch of
        the run is cut, and rebuilt, without them."""
        state = self.state
        known = members_of(state.on_platform)
        held = IdSet.of(i for i in self.listed if i not in known)
        if held:
            state.held_there = held
            self.context.protocol.note()

    def before_finalize(self, answer: Mapping[str, Any] | None) -> None:
        """The evaluation's status, read before a finalize this pass cannot vouch for (it did
        not create the evaluation with every request answered): the state it started from
        may be older than the platform (restored from a backup or an earlier copy, edited),
        saying "not finalized" of an evaluation a later pass finalized. Content addressing
        makes its batches safe to send again; a finalize it does not, and a second one runs
        the platform's statistics job again. (The samples sink reads the status when it
        checks such a state against the count.) ``answer``: the metadata PUT's, when it
        carries the status."""
        self._read_finalized(answer)

    def _read_finalized(self, answer: Mapping[str, Any] | None) -> None:
        status = (answer or {}).get("status")
        if not isinstance(status, str):
            context = self.context
            found = context.protocol.retry("reading the evaluation",
                                           lambda: context.client.get_evaluation(context.run_id))
            status = str(found.get("status", ""))
        self.state.finalized = status.upper() == COMPLETED_STATUS

    def send(self, cut: Cut) -> None:  # type: ignore[override]
        assert cut.data is not None and cut.end is not None
        protocol = self.context.protocol
        self.state.in_flight = InFlight(kind=self.name, sent_at=protocol.clock(), episodes=cut.episodes,
                                        traces=cut.traces, end=cut.end, seal=cut.seal, digest=cut.digest,
                                        released=cut.released)
        self.announced_here, self.unanswered = cut.digest, False  # not sent yet
        protocol.save()
        self.stamped = cut.digest
        self._commit(cut)

    # -- committing ----------------------------------------------------------------------------

    def _commit(self, cut: Cut) -> None:
        try:
            receipt = self.context.protocol.retry(f"uploading episodes to {self.title}", lambda: self._attempt(cut),
                                                  passing=(ServiceNotEnabled,))
        except BaseException:
            self._withdraw_if_never_out(cut)
            raise
        state, report = self.state, self.context.report
        assert cut.end is not None
        state.advance(cut.end, 0, cut.episodes, cut.seal)
        state.traces_pushed += cut.traces
        state.released.extend(i for i in cut.released if i not in state.released)
        state.uploads.append(receipt)
        state.store = self.name
        state.in_flight = None
        self.context.protocol.save()
        report.store = self.name
        report.pushed_now += self._new_there(cut)
        report.bytes_sent += cut.size

    def _new_there(self, cut: Cut) -> int:
        """How many of the batch's episodes the platform did not hold before this pass."""
        if not self.there_before or len(cut.ids) != cut.episodes:
            return cut.episodes
        return sum(1 for i in cut.ids if i not in self.there_before)

    def _attempt(self, cut: Cut) -> str:
        """One try of the upload; a try that may have left with no answer saying it was not
        stored (no answer at all, or anything but a failure whose kind says so) leaves the
        batch :meth:`in_doubt`. ``NOT_SENT`` is a connection never made (refused, a name not
        resolved, a connect timeout): nothing left this machine."""
        self._stamp(cut)
        try:
            return self._upload(cut)
        except BaseException as exc:
            if not isinstance(exc, PlatformError) or exc.kind is FailureKind.IN_DOUBT:
                self.unanswered = True
            raise

    def _stamp(self, cut: Cut) -> None:
        """Before a try of the announced batch, other than the one its announcement was just
        written for (a retry, or a later pass sending it again): its send time set to now, in
        a write of the state, which under a lease renews it and tells the next holder until
        when the try may land (sync/leased.py, ``in_flight_until``). Left at the first try's
        time, a retry a backoff later, or a resend an hour later, was announced as landing
        by then: a second signal gave the lease up while it was out, and a holder with its
        own state took the run at once, read the listing before it landed, and cut the
        batch's episodes again, for a second copy under another key."""
        pending = self.state.in_flight
        if self.stamped == cut.digest:
            self.stamped = None
        elif pending is not None and pending.kind == self.name and pending.digest == cut.digest:
            protocol = self.context.protocol
            self.state.in_flight = replace(pending, sent_at=protocol.clock())
            protocol.save()

    def _withdraw_if_never_out(self, cut: Cut) -> None:
        """A batch this pass announced, given up (or the pass stopped) with no try of it in
        doubt, was not stored: its announcement is withdrawn, and the recorded choice with it
        when nothing else of the run is here. Left announced, every later pass took it for a
        batch that may have landed: ``--to samples`` refused, the run kept in this sink."""
        pending = self.state.in_flight
        if (pending is None or pending.kind != self.name or pending.digest != cut.digest
                or self.announced_here != cut.digest or self.unanswered):
            return
        self.state.in_flight = None
        self.context.protocol.note()
        if not self._may_hold_some():
            self._release_choice()

    def _upload(self, cut: Cut) -> str:
        receipt = self.upload(cut)
        if receipt != cut.digest:
            raise SyncError(f"{self.title} answered upload id {receipt!r} for a batch whose digest is {cut.digest}")
        return receipt

    def _resend(self, pending: InFlight) -> None:
        """The announced batch, rebuilt from its two positions: the same bytes, the same key.

        Rebuilt under the supersede lists it was cut with: a resume since then may have
        superseded one of its episodes, and the announced bytes are what must be sent again
        (docs/sync.md, "Prime Traces"). So each earlier state of the run's superseded set is
        tried, newest first, and the one whose bytes hash to the digest is sent (the digest
        is SHA-256: no other set gives those bytes)."""
        from prime_runs_spool.content.supersede import supersede_history_in_run

        assert pending.end is not None
        end = (pending.end.segment_index, pending.end.offset)
        context = self.context
        history = supersede_history_in_run(context.run_dir)
        for superseded in [context.superseded, *(h for h in history if h != context.superseded)]:
            stream = LineStream(self, self.state.cursor, superseded=superseded)
            taken: list[Line] = []
            for line in stream.lines():
                if (line.after.segment_index, line.after.offset) > end:
                    break
                taken.append(line)
            if self._resend_if_announced(pending, taken):
                return
        raise SyncError(f"the spool's episodes up to segment {pending.end.segment_index} byte "
                        f"{pending.end.offset} no longer hash to the batch announced for them; "
                        "was the spool modified? (prime-runs verify)")

    def _resend_released(self, pending: InFlight) -> None:
        """An announced batch of held-back episodes, rebuilt from its ids (in spool order, as
        it was cut): no later resume changes those records, so the bytes are the same."""
        context = self.context
        wanted = set(pending.released)
        taken: list[Line] = []
        for record in durable_records(context.run_dir, skip_corrupt=context.options.skip_corrupt,
                                      remask=context.remask):
            if record.type == EPISODE and record_episode_id(record) in wanted:
                wanted.discard(record_episode_id(record))
                taken.append(self.line(record, pending.end or Cursor.at(record.after)))
        if not self._resend_if_announced(pending, taken):
            raise SyncError(f"the held-back episodes announced for release ({len(pending.released)}) no longer "
                            "hash to the batch announced for them; was the spool modified? (prime-runs verify)")

    def _resend_if_announced(self, pending: InFlight, taken: list[Line]) -> bool:
        """Send ``taken`` again if its bytes are the announced batch's; False if they are not."""
        data = b"".join(line.data for line in taken)
        digest = hashlib.sha256(data).hexdigest()
        if digest != pending.digest:
            return False
        # Superseded by a resume after it was announced: sent anyway, and said.
        late = [i for i in (line.episode_id for line in taken)
                if i is not None and i in self.context.superseded and i not in self.state.superseded_pushed]
        self.state.superseded_pushed.extend(late)
        self._commit(Cut(data, pending.end, pending.episodes, pending.traces, pending.seal,
                         [line.episode_id for line in taken], list(pending.released), digest=digest))
        return True
