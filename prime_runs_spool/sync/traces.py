"""Prime Traces as a run's destination store: batches cut from spool positions, exactly once
by content address (docs/sync.md, "Prime Traces").

A batch is the run's episode lines between two spool positions: the state's cursor (where
the previous committed batch ended) and an end the batching rule picks. Each line is the
episode record as the spool holds it (masked before it reached the disk), stamped with the
platform's run (``run.id`` = the evaluation id, ``run.type``, on the episode and every member
trace) and encoded as ``prime-traces`` encodes records; the boundaries are the library's own
(``prime_traces.iter_batches``: a batch closes before the line that would take it past the
target size), so a run synced after it ended is cut exactly as the library would cut its
JSONL file. The batch's idempotency key is the SHA-256 of those bytes.

Before a batch is sent, its end and digest are announced in the state (fsync'd). So a sync
killed anywhere either had not sent it (and cuts the same batch again) or finds it announced
and rebuilds exactly those bytes from the two positions: the same key, which the service
answers with the committed receipt instead of storing anything twice. No fence and no
reconciliation are needed, unlike samples; and the batch a live run's tail produced is as
fixed, once announced, as any other.

Which episodes give a line is the samples rule, by the same function (sync/rows.py,
``withheld``): a superseded episode never does, an errored one is held back until the run
completes and is then released in batches of its own, cut the same way from the held-back
episodes (a function of the sealed spool and the state's ``released``). An announced batch
is never re-cut, even when a later resume superseded one of its episodes: it is rebuilt
under the supersede lists it was cut with, sent, and the episode reported as superseded
after push (docs/sync.md, "Prime Traces" and "Resumed runs").
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prime_runs_spool.errors import CorruptSpoolError, FailureKind, PlatformError, ServiceNotEnabled, SyncError
from prime_runs_spool.spool.format import COMPLETED, EPISODE
from prime_runs_spool.sync.options import AUTO, SAMPLES, TRACES
from prime_runs_spool.sync.rows import (LARGE_BODIES, LARGE_BODY, durable_records, held_episodes,
                                        record_episode_id, seal_if_last, track_seal,
                                        withheld)
from prime_runs_spool.sync.state import Cursor, InFlight, SyncState

if TYPE_CHECKING:
    from prime_traces import Batch

    from prime_runs_spool.platform_api.traces import TracesUploader
    from prime_runs_spool.sync.engine import RunSync

# prime-traces (and with it httpx) is imported where an upload is made, not here: a sync
# with nothing to send must not pay for an HTTP stack (tests/test_sync_e2e.py).

#: The upload context's ``source``: which producer the service sees.
SOURCE = "prime-runs-spool"


@dataclass(frozen=True)
class Line:
    data: bytes
    #: Where the spool resumes after this episode.
    after: Cursor
    traces: int
    episode_id: str | None = None


def _line(record: Any, run_id: str, after: Cursor) -> Line:
    """An episode record as one Prime Traces line (stamped with the platform's run)."""
    from prime_runs_spool.platform_api.traces import RUN_TYPE, encode_line, stamp_run

    members = record.data.get("traces")
    return Line(encode_line(stamp_run(record.data, run_id, RUN_TYPE)), after,
                len(members) if isinstance(members, list) else 0, record_episode_id(record))


@dataclass
class LineStream:
    """The run's episode lines from ``cursor`` on. After iteration, ``seal`` holds the seal
    that ended the log (None when the last segment is unsealed) and ``cursor`` the end.

    An episode the samples rule withholds (sync/rows.py, ``withheld``: superseded, or
    errored and held back) gives no line: the cursor moves past it as past a seal.
    ``superseded`` is the engine's set unless given (a pending batch is rebuilt under the
    set it was cut with)."""

    engine: RunSync
    cursor: Cursor | None
    seal: dict[str, Any] | None = None
    skipped: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    superseded: frozenset[str] | None = None
    #: The segment ``seal`` was read from (a seal handed in sits where the cursor is).
    seal_segment: int | None = None

    def __post_init__(self) -> None:
        if self.seal is not None and self.seal_segment is None and self.cursor is not None:
            self.seal_segment = self.cursor.segment_index

    def lines(self) -> Iterator[Line]:
        engine = self.engine
        superseded = engine.superseded if self.superseded is None else self.superseded
        run_id = str(engine.state.evaluation_id)
        start = None if self.cursor is None else self.cursor.position
        for record in durable_records(engine.run_dir, start, skip_corrupt=engine.options.skip_corrupt,
                                      skipped=self.skipped, remask=engine.remask):
            after = Cursor.at(record.after)
            self.seal, self.seal_segment = track_seal(self.seal, self.seal_segment, record)  # the last segment's only
            if record.type == EPISODE and withheld(record, superseded, hold_errored=True) is None:
                yield _line(record, run_id, after)
            self.cursor = after
        if self.skipped and self.skipped[-1].get("last"):
            self.seal = None
        self.seal = seal_if_last(engine.run_dir, self.seal, self.seal_segment)
        self.done = True


@dataclass
class HeldStream:
    """The lines a completed run releases (sync/rows.py, ``held_episodes``), as a stream
    ``cut_batches`` can cut: the cursor stays where it is (they lie behind it)."""

    engine: RunSync
    cursor: Cursor | None
    seal: dict[str, Any] | None = None
    done: bool = False

    def lines(self) -> Iterator[Line]:
        engine = self.engine
        run_id = str(engine.state.evaluation_id)
        assert self.cursor is not None
        for record in held_episodes(engine.run_dir, engine.superseded, set(engine.state.released),
                                    skip_corrupt=engine.options.skip_corrupt, remask=engine.remask):
            yield _line(record, run_id, self.cursor)
        self.done = True


@dataclass
class Cut:
    """One batch (None: no episode, only records to move past, such as a seal) and where
    the cursor goes once it is committed."""

    batch: Batch | None
    end: Cursor | None
    episodes: int = 0
    traces: int = 0
    seal: dict[str, Any] | None = None
    #: The episode ids of its lines, in order.
    ids: list[str | None] = field(default_factory=list)
    #: For a batch of held-back episodes: their ids, added to the state's ``released``.
    released: list[str] = field(default_factory=list)


def cut_batches(stream: LineStream | HeldStream, target_bytes: int) -> Iterator[Cut]:
    """The stream's lines in the library's batches, each with the spool position it ends at.

    ``iter_batches`` reads one line past a batch before closing it, so the positions of the
    lines read wait in a queue: a batch of ``n`` lines ends where its ``n``-th line ends. The
    last batch ends past whatever follows its last episode (a seal), so the cursor can reach
    the end of the log.

    Memory is bounded as for samples (sync/rows.py): a batch about to grow past LARGE_BODY
    first takes one of the process-wide LARGE_BODIES tokens and gives it back once it has
    been sent (the caller drops each cut before asking for the next), so ``--jobs 4`` over
    large runs holds two 30 MiB batches, not four. A batch waiting for a token holds none."""
    from prime_traces import TraceTooLargeError, iter_batches

    from prime_runs_spool.platform_api.traces import MAX_LINE_BYTES

    reached = stream.cursor
    pending: deque[Line] = deque()
    failure: list[BaseException] = []
    held: list[Any] = []
    buffered = [0]  # bytes of the lines read and not yet in a yielded batch

    def feed() -> Iterator[bytes]:
        try:
            for line in stream.lines():
                if not held and buffered[0] + len(line.data) > LARGE_BODY:
                    LARGE_BODIES.acquire()
                    held.append(LARGE_BODIES)
                pending.append(line)
                buffered[0] += len(line.data)
                yield line.data
        except CorruptSpoolError as exc:  # everything before the corruption still goes
            failure.append(exc)

    def release() -> None:
        while held:
            held.pop().release()

    try:
        for batch in iter_batches(feed(), target_bytes=target_bytes, max_line_bytes=MAX_LINE_BYTES):
            taken = [pending.popleft() for _ in range(batch.num_lines)]
            buffered[0] -= batch.size
            last = stream.done and not pending
            reached = stream.cursor if last else taken[-1].after
            cut = Cut(batch, reached, len(taken), sum(line.traces for line in taken), stream.seal if last else None,
                      [line.episode_id for line in taken])
            del batch, taken
            yield cut
            del cut
            release()  # sent: the next batch may take the token
    except TraceTooLargeError as exc:
        raise SyncError(f"an episode's line is {exc.size} bytes, over Prime Traces' {exc.limit}-byte "
                        "limit for one line; it cannot be sent (sync --to samples splits it by trace)") from None
    finally:
        release()
    if failure:
        raise failure[0]
    if stream.cursor != reached:
        yield Cut(None, stream.cursor, seal=stream.seal)


class TracesPush:
    """The traces side of one run's pass: choose the store, then push and finish."""

    def __init__(self, engine: RunSync) -> None:
        self.engine = engine
        #: Set while this pass pushes to Prime Traces: the run's end then releases held-back
        #: episodes here, even before a first receipt recorded the store (``auto``).
        self.pushing = False

    @property
    def state(self) -> SyncState:
        return self.engine.state

    # -- which store ----------------------------------------------------------------------

    def recorded(self) -> str | None:
        """The store the state says this run uses; raises when ``--to`` asks for the other one
        (checked first thing, so even a finished run says so rather than "up to date")."""
        state = self.state
        recorded = state.store
        if recorded is None and (state.samples_pushed or (state.in_flight and state.in_flight.kind == "samples")):
            recorded = SAMPLES  # a state from before there was a choice
        if recorded is None and state.uploads:
            recorded = TRACES
        self._refuse_other(recorded)
        return recorded

    def _refuse_other(self, recorded: str | None) -> None:
        asked = self.engine.options.to
        if recorded is not None and asked != AUTO and asked != recorded:
            raise SyncError(f"this run's episodes went to {recorded} on this destination, not {asked}; "
                            f"sync it with --to {recorded} (or auto), or --replay it as a new evaluation")

    def choose(self, *, adopted: bool) -> str | None:
        """The store this pass uses: the one recorded (one run never ends up half in each),
        else the one asked for; None while ``auto`` has not found out yet."""
        state, asked = self.state, self.engine.options.to
        recorded = self.recorded()
        if recorded is None and adopted and self.engine.reconciler.total_samples():
            recorded = SAMPLES  # found again with a lost state, and samples are what it holds
            self._refuse_other(recorded)
        chosen = recorded or (None if asked == AUTO else asked)
        if chosen is not None and state.store != chosen:
            state.store = chosen
            self.engine.protocol.note()  # written before anything is sent to it (protocol.note)
        self.engine.report.store = chosen
        return chosen

    # -- pushing -----------------------------------------------------------------------------

    def dry_run(self) -> None:
        """What ``--dry-run`` reports for traces: the episodes and uncompressed bytes of the
        batches that would be sent from the cursor (stamped with the evaluation id, when the
        run has one yet), nothing sent."""
        report = self.engine.report
        stream = LineStream(self.engine, self.state.cursor, seal=self.state.seal)
        for cut in cut_batches(stream, self._target()):
            if cut.batch is not None:
                report.pushed_now += cut.episodes
                report.bytes_sent += cut.batch.size
        if stream.seal is not None and stream.seal.get("status") == COMPLETED:  # and what it releases
            for line in HeldStream(self.engine, stream.cursor).lines():
                report.pushed_now += 1
                report.bytes_sent += len(line.data)
        report.store = TRACES
        report.state = "dry_run"

    def push(self) -> bool:
        """Push the run's episodes to Prime Traces and finish the run. False when ``auto``
        learned that the account has no Prime Traces before anything was committed there:
        the store is then recorded as samples, and the caller pushes samples instead."""
        state = self.state
        try:
            if (self.engine.options.to == AUTO and state.store is None and not state.uploads
                    and not self.engine.client.traces_probe().enabled()):
                raise ServiceNotEnabled("Prime Traces is not enabled for this account")
            self._push()
        except ServiceNotEnabled as exc:
            if state.uploads:
                raise SyncError(f"{exc}, after {len(state.uploads)} batch(es) of this run were committed "
                                "there; the run stays in Prime Traces: turn it back on for the account, or "
                                "--replay the run to samples as a new evaluation") from None
            # Nothing of the run is in Prime Traces: no store is kept that would trap it there.
            state.store, state.in_flight = None, None
            if self.engine.options.to != AUTO:
                self.engine.protocol.save()
                raise SyncError(f"{exc}; nothing of this run was sent there: sync it with --to samples "
                                "(or auto)") from None
            state.store = SAMPLES
            self.engine.protocol.note()  # with the first samples announcement; lost, the probe is asked again
            self.engine.report.store = SAMPLES
            self.engine.report.warnings.append("Prime Traces is not enabled for this account; "
                                               "the run goes to legacy samples")
            return False
        return True

    def _target(self) -> int:
        from prime_runs_spool.platform_api.traces import TARGET_BATCH_BYTES

        return self.engine.options.traces_batch_bytes or TARGET_BATCH_BYTES

    def _push(self) -> None:
        engine = self.engine
        self.pushing = True
        pending = self.state.in_flight if self.state.in_flight and self.state.in_flight.kind == "traces" else None
        if pending is not None and pending.released:
            self._resend_released(pending)
        elif pending is not None:
            self._resend(pending)
        while True:
            # Starting past a seal already committed, the stream knows how the log ends.
            stream = LineStream(engine, self.state.cursor, seal=self.state.seal)
            try:
                for cut in cut_batches(stream, self._target()):
                    if cut.batch is None:
                        if cut.end is not None and cut.end != self.state.cursor:
                            self.state.advance(cut.end, 0, 0, cut.seal)
                            engine.protocol.save()
                        continue
                    self._send(cut)
                    del cut  # its bytes are not kept alive while the next batch is built
            finally:
                self._note_skipped(stream)
            if engine.pass_ended(stream.seal, self._drained):
                return

    def _drained(self) -> bool:
        """Nothing more to read from the cursor: no line, no seal."""
        probe = LineStream(self.engine, self.state.cursor)
        return next(probe.lines(), None) is None and probe.seal is None

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
        history = supersede_history_in_run(self.engine.run_dir)
        for superseded in [self.engine.superseded, *(h for h in history if h != self.engine.superseded)]:
            stream = LineStream(self.engine, self.state.cursor, superseded=superseded)
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
        wanted = set(pending.released)
        run_id = str(self.state.evaluation_id)
        taken: list[Line] = []
        for record in durable_records(self.engine.run_dir, skip_corrupt=self.engine.options.skip_corrupt,
                                      remask=self.engine.remask):
            if record.type == EPISODE and record_episode_id(record) in wanted:
                wanted.discard(record_episode_id(record))
                taken.append(_line(record, run_id, pending.end or record.after))
        if not self._resend_if_announced(pending, taken):
            raise SyncError(f"the held-back episodes announced for release ({len(pending.released)}) no longer "
                            "hash to the batch announced for them; was the spool modified? (prime-runs verify)")

    def _resend_if_announced(self, pending: InFlight, taken: list[Line]) -> bool:
        """Send ``taken`` again if its bytes are the announced batch's; False if they are not."""
        from prime_traces import Batch

        data = b"".join(line.data for line in taken)
        digest = hashlib.sha256(data).hexdigest()
        if digest != pending.digest:
            return False
        # Superseded by a resume after it was announced: sent anyway, and said.
        late = [i for i in (line.episode_id for line in taken)
                if i is not None and i in self.engine.superseded and i not in self.state.superseded_pushed]
        self.state.superseded_pushed.extend(late)
        batch = Batch(data=data, digest=digest, num_lines=len(taken), first_line_number=1)
        self._commit(batch, Cut(batch, pending.end, pending.episodes, pending.traces, pending.seal,
                                [line.episode_id for line in taken], list(pending.released)))
        return True

    def release_held(self) -> None:
        """The run completed: send the errored episodes held back that no resume superseded,
        in spool order, cut by the library's rule and announced like any batch (their ids
        recorded as released with the receipt). Which they are is a function of the sealed
        spool and ``released``, so a sync killed after a receipt cuts the same rest."""
        # Called from the push loop's finish (engine._finish);
        # an announced release batch was sent again at that loop's start.
        for cut in cut_batches(HeldStream(self.engine, self.state.cursor, seal=self.state.seal), self._target()):
            if cut.batch is None:
                continue
            cut.end, cut.seal = self.state.cursor, self.state.seal
            cut.released = [str(i) for i in cut.ids]
            self._send(cut)
            del cut

    def _send(self, cut: Cut) -> None:
        assert cut.batch is not None and cut.end is not None
        protocol = self.engine.protocol
        self.state.in_flight = InFlight(kind="traces", sent_at=protocol.clock(), episodes=cut.episodes,
                                        traces=cut.traces, end=cut.end, seal=cut.seal, digest=cut.batch.digest,
                                        released=cut.released)
        protocol.save()
        self._commit(cut.batch, cut)

    def _commit(self, batch: Batch, cut: Cut) -> None:
        from prime_runs_spool.platform_api.traces import receipt_id

        receipt = self._upload(batch)
        state = self.state
        assert cut.end is not None
        state.advance(cut.end, 0, cut.episodes, cut.seal)
        state.traces_pushed += cut.traces
        state.released.extend(i for i in cut.released if i not in state.released)
        state.uploads.append(receipt_id(receipt))
        state.store = TRACES
        state.in_flight = None
        self.engine.protocol.save()
        self.engine.report.store = TRACES
        self.engine.report.pushed_now += cut.episodes
        self.engine.report.bytes_sent += batch.size

    def _upload(self, batch: Batch) -> dict[str, Any]:
        """Send until committed: every failure but a refusal is retried with the same bytes."""
        from prime_runs_spool.platform_api.traces import receipt_id

        protocol = self.engine.protocol
        attempt = 0
        while True:
            try:
                receipt = self._client().upload(batch, self._context())
                if receipt_id(receipt) != batch.digest:
                    raise SyncError(f"Prime Traces answered upload id {receipt_id(receipt)!r} for a batch "
                                    f"whose digest is {batch.digest}")
                self.engine.options.backoff.answered()
                return receipt
            except ServiceNotEnabled:
                raise
            except PlatformError as exc:
                attempt += 1
                if exc.kind is FailureKind.FATAL:
                    raise SyncError(f"uploading episodes to Prime Traces: {exc}") from None
                protocol.back_off("uploading episodes to Prime Traces", exc, attempt)

    def _client(self) -> TracesUploader:
        """The destination's uploader, shared by every run of this sync (PlatformClient.traces)."""
        return self.engine.client.traces()

    def _context(self) -> dict[str, str]:
        from prime_runs_spool.platform_api.traces import RUN_TYPE

        manifest = self.engine.manifest
        context = {"source": SOURCE, "run_type": RUN_TYPE, "local_run_id": self.state.local_run_id}
        for key in ("framework", "model"):
            if manifest.get(key):
                context[key] = str(manifest[key])
        return context

    def _note_skipped(self, stream: LineStream) -> None:
        if not stream.skipped:
            return
        known = {(s["segment"], s["offset"]) for s in self.state.skipped}
        self.state.skipped.extend({k: v for k, v in s.items() if k != "last"} for s in stream.skipped
                                  if (s["segment"], s["offset"]) not in known)
        self.engine.protocol.save()

