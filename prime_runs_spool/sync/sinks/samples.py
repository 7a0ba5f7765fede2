"""The legacy samples table as a sink: v0 rows appended to the run's evaluation.

The endpoint only appends, so exactly once rests on the protocol (sync/protocol.py): each
request is announced before it is sent and, when its answer is lost, settled by counting the
evaluation's rows (sync/reconcile.py); the row stream is deterministic, so the count says
exactly how far it got (docs/sync.md, "The protocol, per run").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prime_runs_spool.errors import SampleCountMismatchError, SampleTooLargeError
from prime_runs_spool.platform_api.v0 import project_episode_encoded
from prime_runs_spool.sync.options import SAMPLES, UP_TO_DATE
from prime_runs_spool.sync.reconcile import Reconciler
from prime_runs_spool.sync.records import record_episode_id
from prime_runs_spool.sync.rows import Batch, Row, RowStream, batches, read_ahead_if_worth_it
from prime_runs_spool.sync.sinks.base import PassContext, Sink, StateOrigin
from prime_runs_spool.sync.sinks.registry import register
from prime_runs_spool.sync.state import InFlight, SyncState


class SamplesSink(Sink):
    name = SAMPLES
    title = "legacy samples"
    counts_what_it_holds = True  # total_samples

    def __init__(self, context: PassContext) -> None:
        super().__init__(context)
        #: Matches the state's sample count with the platform's.
        self.reconciler = Reconciler(context.protocol, context.client, self.stream, self._stream_from_start,
                                     self._released_rows)

    @classmethod
    def used_by(cls, state: SyncState) -> bool:
        return bool(state.samples_pushed or (state.in_flight and state.in_flight.kind == SAMPLES))

    @classmethod
    def pushed_total(cls, state: SyncState) -> int:
        return state.samples_pushed

    def holds_run(self) -> bool:
        return bool(self.reconciler.total_samples())

    # -- before pushing ----------------------------------------------------------------------

    def another_copy_pushed(self) -> None:
        """Our request in doubt, and another copy may have pushed since: its count cannot
        tell whether ours landed. Waited out, the platform's count is the whole truth
        (checked in :meth:`settle`, as a state from disk is)."""
        pending = self.state.in_flight
        if pending is not None and pending.kind == SAMPLES:
            self.context.protocol.fence(pending.sent_at)
            self.state.in_flight = None

    def settle(self, origin: StateOrigin) -> bool:
        state, report = self.state, self.context.report
        # A state that parses is a cache, not the truth (an older copy, an edit, another copy
        # having pushed since): checked against the platform before anything is pushed,
        # unless this process wrote it and no other copy held the run since.
        cached = (not (origin.fresh or origin.untrusted or origin.adopted)
                  and (not state.written_here or state.mismatch or origin.foreign))
        try:
            if cached:
                self._pass_settled_announcement()
            self.reconciler.reconcile(force=origin.adopted)
            if cached:
                if self.reconciler.verify():
                    report.warnings.append("the sync state disagreed with the platform; the platform's "
                                           "count was taken (docs/sync.md, \"State\")")
        except SampleCountMismatchError as exc:
            rows = self.reconciler.behind(exc.platform_samples)
            if rows is None:
                raise
            # Nothing this copy holds is missing there, and nothing of it is to be sent: its
            # rows are acknowledged as the platform's first ones (behind() checked them), so
            # ``status`` shows none pending; the next pass checks the state again (verify).
            self.reconciler.rederive(rows)
            self.context.protocol.save()
            report.state = UP_TO_DATE
            report.warnings.append(
                f"this copy of the run holds {rows} of the evaluation's {exc.platform_samples} samples, its first "
                "ones: another copy, further on, pushed the rest; nothing to push (docs/sync.md, \"Concurrency\")")
            return False
        return True

    def _pass_settled_announcement(self) -> None:
        """A cached state's announced request, when the platform holds rows beyond it: a later
        pass settled it and pushed on (the state is older than the platform: a copy taken
        while the request was out, put back). Its count cannot say whether it landed, and
        need not: once it can no longer land (a fence, spent long ago for an old state), the
        platform's count and last row are checked as for any cached state (``verify``)."""
        pending = self.state.in_flight
        if pending is None or pending.kind != SAMPLES:
            return
        if self.reconciler.total_samples() > self.state.samples_pushed + pending.rows:
            self.context.protocol.fence(pending.sent_at)
            self.state.in_flight = None

    # -- the rows ----------------------------------------------------------------------------

    def stream(self) -> RowStream:
        context = self.context
        return RowStream(context.run_dir, self.state.cursor, context.run_id, context.options.max_request_bytes,
                         context.options.skip_corrupt, seal=self.state.seal, superseded=context.superseded,
                         hold_errored=True, remask=context.remask, segments=context.take_listing())

    def _stream_from_start(self) -> RowStream:
        """The run's rows from its first, read as the pushes read them (what ``stream`` does
        from the cursor)."""
        context = self.context
        return RowStream(context.run_dir, None, context.run_id, context.options.max_request_bytes,
                         context.options.skip_corrupt, superseded=context.superseded, hold_errored=True,
                         remask=context.remask)

    def batches(self, stream: RowStream) -> Iterator[Batch]:  # type: ignore[override]
        return read_ahead_if_worth_it(stream, batches(stream, self.context.options.max_request_bytes))

    def held_batches(self) -> Iterator[Batch]:
        """In spool order, in requests of the usual size, each announced like any samples
        request (its ids recorded as released once it is known to have landed), so a sync
        killed half way neither loses nor repeats one."""
        state, limit = self.state, self.context.options.max_request_bytes
        batch = Batch()
        for record in self.context.held():
            try:
                rows = project_episode_encoded(record.data, (record.meta or {}).get("rollout_number"),
                                               evaluation_id=self.context.run_id, max_request_bytes=limit)
            except SampleTooLargeError as exc:  # never sendable: passed over and said, as in the stream
                if not any(s.get("episode_id") == exc.episode_id for s in state.skipped_too_large):
                    state.skipped_too_large.append({"segment": record.segment_index, "offset": record.offset,
                                                    "episode_id": exc.episode_id, "reason": str(exc)})
                    self.context.report.warnings.append(f"skipped: {exc}")
                continue
            for _, data in rows:
                if not batch.fits(data, limit):
                    yield batch
                    batch = Batch()
                batch.add(Row(data, None, state.cursor, True))
            batch.released.append(str(record_episode_id(record)))
        if batch.count:
            yield batch

    def _released_rows(self) -> Iterator[tuple[str, Any, bool]]:
        """The rows releasing the held episodes sends, in order: ``(episode id, sample id,
        closes the episode)``. Reconciling a completed run whose state was lost reads past
        the stream into these (the platform may hold some of them already)."""
        for record in self.context.held():
            try:
                rows = project_episode_encoded(record.data, (record.meta or {}).get("rollout_number"),
                                               evaluation_id=self.context.run_id,
                                               max_request_bytes=self.context.options.max_request_bytes)
            except SampleTooLargeError:
                continue  # never sent (see held_batches)
            for number, (row, _) in enumerate(rows):
                yield str(record_episode_id(record)), row.get("sample_id"), number == len(rows) - 1

    # -- sending -----------------------------------------------------------------------------

    def send(self, batch: Batch) -> None:  # type: ignore[override]
        context, state = self.context, self.state
        protocol = context.protocol
        body = batch.parts()
        rows = batch.count
        released = list(batch.released)
        # A batch of held-back episodes lies behind the cursor: it leaves it, and its seal, where they are.
        episodes = len(released) if released else batch.episodes
        seal = state.seal if released else batch.seal
        end = batch.end
        assert end is not None
        protocol.send_once("pushing held-back episodes" if released else "pushing samples",
                           InFlight(kind=self.name, sent_at=0.0, rows=rows, episodes=episodes, end=end,
                                    seal=seal, last_sample_id=batch.last_sample_id, released=released),
                           lambda gate: context.client.push_samples(str(state.evaluation_id), body,
                                                                    on_sent=batch.sent, before_last=gate),
                           # written alongside only a body that has bytes to send before its last
                           # piece: one of a single piece would only wait for the write, on another
                           # thread, at the cost of handing it over (most small runs' one request)
                           lambda: self.reconciler.samples_landed(rows), alongside=len(body) > 1)
        protocol.acknowledge(end, rows, episodes, seal, batch.last_sample_id)
        if protocol.check_next_batch:  # rows resent after a fence: did the first copy land late?
            protocol.check_next_batch = False
            self.reconciler.check("after rows were resent once an earlier request could no longer land")
        context.report.pushed_now += rows
        context.report.bytes_sent += batch.size
        del body  # the pass releases the batch: the next one is built without this body alive
        context.show()

    def before_finalize(self, answer: Mapping[str, Any] | None) -> None:
        # Never finalize over rows we cannot account for: read from the PUT's answer (the
        # evaluation, as of that request) when it carries the count.
        self.reconciler.check("before finalizing", answer)


register(SamplesSink)
