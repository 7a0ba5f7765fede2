"""One run's pass to one destination (docs/sync.md).

A pass reads the manifest and the state, then: nothing new (up to date), a dry run, or the
evaluation (sync/evaluation.py), the sink (sync/sinks/choice.py picks it), the one push loop
that drives any sink (sync/sinks/base.py says the contract), and the run's end (metadata,
finalize). Every request it makes goes through the exactly-once core in sync/protocol.py,
whose docstring states the invariant.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prime_runs_spool.content.remask import error_forms_of, needs_remask, remask_manifest, travelling_error
from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.content.platform_runs import platform_runs_of
from prime_runs_spool.content.supersede import supersedes_of
from prime_runs_spool.errors import (
    CopyBusyError,
    CorruptSpoolError,
    PositionLostError,
    SampleCountMismatchError,
    SampleTooLargeError,
    SpoolError,
    StateProblem,
    SyncError,
)
from prime_runs_spool.files import shown
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.v0 import TERMINAL_PLATFORM_STATUS, terminal_status_body
from prime_runs_spool.plural import episodes, plural
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.format import COMPLETED, CORRUPT, CRASHED, EPISODE, FAILED, LIVE, MANIFEST
from prime_runs_spool.spool.layout import list_segments, segment_size_and_version, spool_identity
from prime_runs_spool.spool.manifests import first_manifest, run_manifests
from prime_runs_spool.spool.reader import position_lost
from prime_runs_spool.spool.writer_state import run_writer_alive
from prime_runs_spool.sync.copies import UNKNOWN, CopyLock
from prime_runs_spool.sync.evaluation import Evaluation
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.options import DRY_RUN, ERROR, LOST, PUSHED, SKIPPED, SYNCED, UP_TO_DATE, RunReport, SyncOptions
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.pushed_lines import read_again, record_versions, same_versions
from prime_runs_spool.sync.recover import SKIP_CORRUPT_ADVICE, check_recovered, damaged_seal_advice
from prime_runs_spool.sync.replay import replay_option
from prime_runs_spool.sync.records import count_until_damage, durable_records, note_skipped, record_episode_id
from prime_runs_spool.sync.sinks import choice, counted
from prime_runs_spool.sync.sinks.base import PassContext, Sink, SinkStream, StateOrigin
from prime_runs_spool.sync.sinks.registry import is_sink
from prime_runs_spool.sync.state import (FINALIZE, Destination, InFlight, SyncState, disk_full_line, load_state,
                                         metadata_digest, state_before_damage, sync_state_path)


def _no_errors(seal: Mapping[str, Any] | None) -> bool:
    """The seal's summary says no episode of the run's effective set errored: nothing can be
    held back, so finishing needs no second read of the spool (the common case)."""
    summary = (seal or {}).get("summary")
    return isinstance(summary, Mapping) and summary.get("avg_error") == 0


class RunSync:
    """Sync one run to one destination. Not thread-safe: one per run, under its sync lock."""

    def __init__(
        self,
        run_dir: Path,
        client: PlatformClient,
        destination: Destination,
        options: SyncOptions,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        on_progress: Callable[[RunReport], None] | None = None,
        index: EvaluationIndex | None = None,
        monotonic: Callable[[], float] | None = None,
        make_protocol: Callable[..., Protocol] = Protocol,
    ) -> None:
        self.run_dir, self.folder = run_dir, spool_identity(run_dir)  # the spool read: moved away, nothing is lost
        self.client = client
        self.destination = destination
        self.options = options
        self.on_progress = on_progress or (lambda report: None)
        self.report = RunReport(path=str(run_dir), replay_id=options.replay_id)
        #: The exactly-once core: the state file, announcing, settling and fencing requests.
        #: ``make_protocol``: a subclass keeping the state elsewhere (sync/store_sync.py).
        self.protocol = make_protocol(sync_state_path(run_dir, destination.key, options.replay_id), options,
                                      clock=clock, sleep=sleep, on_save=self._show,
                                      **({"monotonic": monotonic} if monotonic is not None else {}))
        self.protocol.run = shown(str(run_dir))
        #: Finds, adopts or creates the run's one evaluation.
        self.evaluation = Evaluation(self.protocol, client, options, self.report, index)
        #: What the pass gives a sink; its manifest (masked again when the spool was written
        #: under older masking rules), superseded set and remask flag are read by run().
        self.context = PassContext(run_dir, self.protocol, client, self.report, options, self._show)
        #: The sink this pass pushes to, once chosen: the run's end releases held-back
        #: episodes there, even before a first batch recorded it (``auto``).
        self.sink: Sink | None = None
        #: The evaluation this pass found on the platform was finalized already: another copy
        #: of the run, further on, completed it (sync/copies.py; an artifact of the run taken
        #: before it ended, synced after it). This copy's own end is not recorded over it.
        self.completed_elsewhere = False

    @property
    def state(self) -> SyncState:
        """The run's sync state, held by the protocol (loaded by run() before any use)."""
        return self.protocol.state

    @property
    def manifest(self) -> dict[str, Any]:
        return self.context.manifest

    # -- entry point ---------------------------------------------------------------------

    def run(self) -> RunReport:
        report = self.report
        try:
            try:
                try:
                    self._run()
                except BaseException:
                    self.protocol.flush(quietly=True)  # the pass's own failure is the one told
                    raise
                self.protocol.flush()
            except SampleCountMismatchError as exc:
                self._record_mismatch(exc)
                raise
            except PositionLostError as exc:
                self._record_lost(exc)
                raise
        except CopyBusyError as exc:  # the other copy is syncing the run: not a failure
            report.state, report.error = SKIPPED, str(exc)
        except PositionLostError as exc:
            report.state, report.error = LOST, (f"{exc}. The platform holds what was pushed of this run, which the "
                                                "spool no longer has whole: not finalized; check the spool, then sync "
                                                f"it with {replay_option(self.state.replay_id)} as a new evaluation")
        except CorruptSpoolError as exc:  # errored episodes before it are held (guarantee 2): not "pushed"
            if self.protocol.state is None:  # met reading the segments' first two lines: nothing pushed, none held
                if (before := state_before_damage(self.protocol.path, self.destination)) is not None:
                    self._show(before)  # what the platform holds from before: its total, not 0
                report.state, report.error = CORRUPT, (
                    f"{exc}; this pass pushed nothing: the damage is in a segment's header or manifest, which the "
                    "run's evaluation and resumes are read from, so not even --skip-corrupt passes it")
                return report
            held = count_until_damage(self.context.held)
            report.state, report.error = CORRUPT, f"{exc}; everything before it {PUSHED[self.options.dry_run]}" + (
                f" but {held} errored {plural(held, 'one')}, held until the run completes" if held else "") + (
                "" if self.options.skip_corrupt else SKIP_CORRUPT_ADVICE)
        except (SpoolError, SampleTooLargeError) as exc:
            report.state, report.error = ERROR, str(exc)
        except OSError as exc:
            report.state = ERROR
            report.error = disk_full_line(exc, self.run_dir) or f"{exc.filename or self.run_dir}: {exc.strerror or exc}"
        return report

    def probe(self) -> RunReport | None:
        """The run's report when it is up to date, else None (a pass is needed).

        The same rule as a pass (the state against the files' sizes, the sink ``--to``
        names), read without the run's lock and writing nothing: what is read is a whole
        state (or one read damaged mid-write: a pass deals with it), and one that says the spool
        was all sent while the files still end where it says is the answer a pass would
        give. So a sync of many runs answers the unchanged ones in its own thread, not
        through the worker pool, where runs with nothing to send would only contend for
        the GIL. Anything unusual (no manifest, no state or a damaged one, an error) is
        None: the pass, under the lock, deals with it.
        """
        try:
            if not self.protocol.path.exists():  # never synced here: no need to read the spool
                return None
            manifest = first_manifest(self.run_dir)  # two lines: a damaged spool is the pass's to report
            if manifest is None:
                return None
            local_id = str(manifest.get("run_id"))
            state = load_state(self.protocol.path, destination=self.destination, local_run_id=local_id)
            if state is None:
                return None
            self.protocol.state = state
            # --to naming the other sink is the pass's error to report
            choice.recorded(state, self.options.to)
            if not self._up_to_date():
                return None
        except (StateProblem, SpoolError, SampleTooLargeError, OSError):
            return None
        self.report.local_run_id, self.report.name = local_id, manifest.get("name")
        self._show()
        self.report.state = UP_TO_DATE if state.ended else LIVE
        return self.report

    def _run(self) -> None:
        # Every segment's manifest from one listing (two lines each): the first read goes by it too.
        self.context.listing = list_segments(self.run_dir)
        manifest, manifests = run_manifests(self.run_dir, self.context.listing)
        if manifest is None:
            if run_writer_alive(self.run_dir):
                self.report.state = LIVE
                self.report.warnings.append("no manifest yet; the writer is still starting")
                return
            raise SyncError("the spool has no manifest record; it cannot be synced (prime-runs verify shows why)")
        context = self.context
        # Written, or resumed, under older masking rules: nothing of it travels until today's
        # mask it (a segment's own manifest says what the process that wrote it masked).
        context.remask = any(needs_remask(m) for m in [manifest, *manifests])
        context.manifest = remask_manifest(manifest, self.report.warnings) if context.remask else manifest
        context.error_forms = error_forms_of(manifest) if context.remask else []
        # Episodes a resumed segment replaced (content/supersede.py): never sent.
        context.superseded = frozenset(supersedes_of(manifests))
        # Platform runs vf-eval pushed these episodes to itself: the evaluation to adopt.
        self.evaluation.platform_runs = platform_runs_of(manifests)
        local_id = str(manifest.get("run_id"))
        self.report.local_run_id = local_id
        self.report.name = manifest.get("name")
        untrusted = False
        try:
            state = load_state(self.protocol.path, destination=self.destination, local_run_id=local_id,
                               shown=self.protocol.shown)
        except StateProblem as problem:
            self.report.warnings.append(f"{problem}; reconciling with the platform")
            state, untrusted, self.evaluation.untrusted_sent_at = None, True, problem.sent_at
        fresh = state is None
        if state is None:
            state = SyncState(destination=self.destination, local_run_id=local_id,
                              replay_id=self.options.replay_id)
        self.protocol.state = state
        self.protocol.loaded()
        self._show()
        choice.recorded(state, self.options.to)  # a run in one sink is never sent to another
        if not untrusted and self._up_to_date(again=True):
            self.report.state = UP_TO_DATE if state.ended else LIVE
            return
        # A segment recovering a cut this state's cursor passed holds what was shipped: lost.
        check_recovered(self.run_dir, manifests, state.cursor, state.skipped)
        if self.options.dry_run:
            self._dry_run()
            return
        # From here on the pass may write to the platform: one copy of the run at a time on
        # this machine (sync/copies.py), whichever folder it is in.
        copies = CopyLock(self.destination.key, local_id, self.options.replay_id, self.protocol.path,
                          str(self.run_dir)).hold(self.options.copy_wait, self.protocol)
        try:
            self._fence_other_copy(copies.in_doubt(), another=copies.foreign)
            self._write_pass(fresh=fresh, untrusted=untrusted, foreign=copies.foreign or self.protocol.overtaken,
                             other_sink=copies.sink if copies.foreign else None,
                             never_held=not copies.previous and not self.protocol.others_may_have_synced)
            other = copies.previous.get("run")
            if copies.foreign and isinstance(other, str) and other != copies.run and not self.report.pushed_now:
                self.report.copy_of = other  # synced before this one: said, not a bare "pushed 0"
        finally:
            copies.release(self.protocol.left_in_doubt(), self.state.store)

    def _fence_other_copy(self, sent_at: float | None, *, another: bool) -> None:
        """Wait out a request the last pass of another copy (``another``), or of this folder,
        may still have on its way (``CopyLock.in_doubt``), before anything reads the platform."""
        now = self.protocol.clock()
        if sent_at is None or sent_at + self.options.request_lifetime <= now:
            return  # none, or one that can no longer land
        which = "another copy of this run" if another else "this run, stopped mid-pass,"
        self.protocol.fence(now if sent_at == UNKNOWN else sent_at,
                            f"the last sync of {which} ended with a request that may still land")
        self.report.warnings.append(f"the last sync of {which} ended with a request in doubt; "  # once waited, not before
                                    "waited until it could no longer land (docs/sync.md, \"Concurrency\")")

    def _write_pass(self, *, fresh: bool, untrusted: bool, foreign: bool, other_sink: str | None,
                    never_held: bool = False) -> None:
        """The pass's part that writes to the platform, under the run's copy lock.
        ``foreign``: another state (a copy of the spool) may have pushed to the run's
        evaluation since this state was last written, so nothing in it is trusted unchecked.
        ``never_held``: no pass of any copy of the run on this machine held that lock before."""
        state = self.state
        pending = state.in_flight
        if foreign and pending is not None and is_sink(pending.kind):
            choice.make(pending.kind, self.context).another_copy_pushed()
        # A copy may have created the evaluation meanwhile: looked for before one is created.
        adopted = self.evaluation.ensure(self.manifest, fresh=fresh or foreign, untrusted=untrusted,
                                         never_held=never_held, rows=lambda: counted.rows_yielded(self.context),
                                         sink_for_create=lambda: choice.for_create(self.context))
        self.completed_elsewhere = adopted and state.finalized
        origin = StateOrigin(fresh=fresh, untrusted=untrusted, adopted=adopted, foreign=foreign)
        choice.push(self.context, adopted=adopted, other_copy_sink=other_sink,
                    push_to=lambda sink: self._push(sink, origin))

    # -- the push loop -----------------------------------------------------------------------

    def _push(self, sink: Sink, origin: StateOrigin) -> None:
        """Push the run to ``sink`` and finish it: the one loop every sink is driven by."""
        self.sink = sink
        with self.evaluation.naming(self.manifest, sink):  # named there before anything is sent
            if not sink.settle(origin):
                return
            while True:
                stream = sink.stream()
                try:
                    for batch in sink.batches(stream):
                        try:
                            # Before the cursor can pass the damage: noted only once the pass
                            # ended, a SIGKILL mid-pass would forget it for good.
                            self._note_skipped(stream)
                            if batch.count:
                                sink.send(batch)
                            else:
                                self._advance_past(batch.end, batch.seal)
                        finally:
                            batch.release()  # its body and its large-body token, sent or not
                finally:
                    self._note_skipped(stream)
                if self._pass_ended(stream.seal, lambda: self._drained(sink, stream)):
                    return

    def _advance_past(self, end: Any, seal: dict[str, Any] | None) -> None:
        """The one rule for records that give nothing to any sink (a seal, a resumed
        segment's header, a withheld episode): the cursor moves past them, noted and not
        written on its own (docs/sync.md, "Records that give nothing"). Lost, they are read
        again at no risk: nothing was sent for them."""
        if end is not None and end != self.state.cursor:
            self.state.advance(end, 0, 0, seal)
            self.protocol.note()

    def _note_skipped(self, stream: SinkStream) -> None:
        """Keep what the stream passed over: corruption (``--skip-corrupt``) and episodes no
        request can carry, in the state (so status shows them and finishing puts them in the
        evaluation's metadata) and, for the latter, in the report."""
        state = self.state
        if note_skipped(state, self.report, stream.skipped):
            self.protocol.save()
        known = {(s["segment"], s["offset"]) for s in state.skipped_too_large}
        new = [s for s in stream.too_large if (s["segment"], s["offset"]) not in known]
        if new:
            state.skipped_too_large.extend(new)
            self.protocol.save()
            for skipped in new:
                self.report.warnings.append(f"skipped: {skipped['reason']}")

    def _pass_ended(self, seal: dict[str, Any] | None, drained: Callable[[], bool]) -> bool:
        """How a pass that read to the end of the log ends: with the seal's status; ``live``
        while the writer holds its lock; ``crashed`` once the writer is gone and
        ``drained()`` (a read after that) finds nothing more, since it may have appended, or
        sealed, between our last read and its exit. False: read again."""
        if seal is not None:
            self._finish(str(seal.get("status")), seal)
            return True
        if run_writer_alive(self.run_dir):
            self.report.state = LIVE
            if self.state.live_again():  # an end recorded before (a resumed run's) holds no more
                self.protocol.note()
            return True
        if drained():
            self._finish(CRASHED, None)
            advice = self.options.skip_corrupt and damaged_seal_advice(self.run_dir, self.state, self.protocol.path)
            if advice:
                self.report.warnings.append(advice)
            return True
        return False

    def _drained(self, sink: Sink, stream: SinkStream) -> bool:
        """Nothing more to read past where ``stream`` ended: no item, no seal, no record."""
        probe = sink.stream()
        for _ in probe:
            return False
        return probe.seal is None and probe.cursor == stream.cursor

    def _release_held(self) -> None:
        """The run completed: send the errored episodes held back, those no resume
        superseded, in batches the sink cuts, each announced like any of its batches."""
        assert self.sink is not None
        for batch in self.sink.held_batches():
            try:
                self.sink.send(batch)
            finally:
                batch.release()

    # -- small helpers ---------------------------------------------------------------------

    def _show(self, state: SyncState | None = None) -> None:
        choice.show(self.report, state or self.state)
        self.on_progress(self.report)

    def _up_to_date(self, again: bool = False) -> bool:
        """Nothing new since the last sync: answered from file sizes, not by reading."""
        state = self.state
        if state.in_flight is not None or state.cursor is None or state.evaluation_id is None or state.mismatch:
            return False
        segments = list_segments(self.run_dir)
        if not segments or segments[-1][0] != state.cursor.segment_index:
            return False
        if segments[-1][0] != len(segments):
            return False  # a segment missing before the last (one listing tells): the pass reads, and reports it
        if getattr(segments[-1][1], "open_bytes", None) is None and position_lost(segments[-1][1],
                                                                                  state.cursor.position):
            return False  # lines already pushed are gone: the pass reads, and reports it
        size, version = segment_size_and_version(segments[-1][1])
        if state.ended:
            if size not in (state.cursor.offset, state.terminal_size):
                return False
            # Another version (a state from before versions were recorded: the size decides): changed in place, its
            # pushed lines are read again by a pass, never by a probe (sync/pushed_lines.py).
            return same_versions(state, segments, version) or (again and read_again(
                self.protocol, self.run_dir, segments, size, version, self.report.warnings))
        if not run_writer_alive(self.run_dir):
            return False
        # A live writer's lines go into padding: its mark, not its file's size, grows.
        return size == state.cursor.offset or durable_mark(segments[-1][1]) == state.cursor.offset

    def _record_terminal(self, status: str) -> None:
        """Record the run's end as sent, with its segments as they are now, which _up_to_date
        compares (sync/pushed_lines.py, record_versions): a stat each, no listing."""
        state = self.state
        state.terminal = status
        record_versions(state, self.run_dir)

    # -- finishing ---------------------------------------------------------------------------

    def _summary(self, seal: Mapping[str, Any] | None) -> dict[str, Any]:
        """The seal's summary (a resumed run's covers its effective set), else one computed
        by streaming the spool's effective set: every episode but the superseded ones."""
        if seal and isinstance(seal.get("summary"), Mapping):
            return dict(seal["summary"])
        accumulator = SummaryAccumulator()
        for record in durable_records(self.run_dir, skip_corrupt=self.options.skip_corrupt):
            if record.type == EPISODE and record_episode_id(record) not in self.context.superseded:
                accumulator.add(record.data)
        return accumulator.result()

    def _held_back(self) -> int:
        """Errored episodes of the effective set not pushed: held until the run completes."""
        return sum(1 for _ in self.context.held())

    def _supersede_note(self) -> dict[str, Any]:
        """What the evaluation's metadata says about superseded episodes already pushed."""
        state = self.state
        pushed = sorted(self.context.superseded & set(state.released) | set(state.superseded_pushed))
        if pushed != state.superseded_pushed:
            state.superseded_pushed = pushed
            self.protocol.save()
        if pushed:
            self.report.warnings.append(
                f"{episodes(len(pushed))} pushed before a resume superseded {plural(len(pushed), 'it', 'them')}: the "
                f"platform keeps {plural(len(pushed), 'its row', 'their rows')} (append-only); sync --replay gives a "
                "clean evaluation")
            return {"superseded_after_push": pushed}
        return {}

    def _finish(self, status: str, seal: Mapping[str, Any] | None) -> None:
        state = self.state
        assert self.sink is not None
        if status == COMPLETED and not _no_errors(seal):
            self._release_held()
        note = self._supersede_note()
        metrics = self._summary(seal)
        evaluation_id = str(state.evaluation_id)
        if status == COMPLETED:
            answer = None
            metadata = self.evaluation.metadata(self.manifest, note or None)
            # The metadata travels with the create; the metrics with the finalize. A PUT only
            # for what they did not carry: metadata changed since it was last sent (or not
            # known to be there), or, after the first finalize, metrics a resumed run's later
            # seal changed.
            if (metadata_digest(metadata) != state.metadata_sent
                    or (state.finalized and metrics != state.metrics_sent)):
                answer = self._put_metadata("recording metadata", metadata, metrics)
            if not state.finalized:
                if answer is not None or not self._count_exact():
                    self.sink.before_finalize(answer)  # may find it finalized already
            if not state.finalized:
                self._finalize(metrics)
            self._record_terminal(COMPLETED)
            state.held_back = 0
            self.protocol.save()
            self.report.state = SYNCED
            return
        if self.completed_elsewhere:
            self._record_terminal(status)
            self.protocol.save()
            self.report.state = UP_TO_DATE
            self.report.warnings.append(
                f"another copy of this run, further on, completed its evaluation; this copy ends {status} "
                "(taken before the run ended), so its end is not recorded over the completed one")
            return
        terminal = {
            "status": status,
            "finished_at": (seal or {}).get("finished_at"),
            # masked at the seal since the runner masks it; a spool from before (or from
            # another producer) may still quote a URL with its credentials, or its config's key
            "error": travelling_error((seal or {}).get("error"), self.context.error_forms),
            # errored episodes not pushed: a resume is expected to retry them
            "held_back": (held := self._held_back()),
            **note,
        }
        self._put_metadata("recording the run's end", self.evaluation.metadata(self.manifest, terminal), metrics)
        # Then close it out as prime-runs 0.1.4 does: a second request, because the
        # platform's status guard refuses a whole update once the evaluation is closed
        # (409: already closed, which counts as done), and the metadata must land anyway.
        body = terminal_status_body(status if status in TERMINAL_PLATFORM_STATUS else FAILED, terminal["error"])
        self.protocol.retry("closing the evaluation out", lambda: self.client.set_terminal_status(evaluation_id, body))
        self._record_terminal(status)
        state.held_back = held
        self.protocol.save()
        self.report.state = status

    def _put_metadata(self, what: str, metadata: dict[str, Any], metrics: Mapping[str, Any] | None) -> Any:
        """``PUT`` the evaluation's metadata (and ``metrics``), recording what it now holds;
        returns the answer. Idempotent: lost from the state, it costs one more PUT."""
        state = self.state
        answer = self.protocol.retry(what, lambda: self.client.update_evaluation(
            str(state.evaluation_id), metadata=metadata, metrics=metrics))
        state.metadata_sent = metadata_digest(metadata)
        if metrics is not None:
            state.metrics_sent = dict(metrics)
        self.protocol.note()
        return answer

    def _count_exact(self) -> bool:
        """Whether the state's row count is the platform's without a read: this pass created
        the evaluation and had every request to it answered, all under the run's copy lock,
        so nothing but its own acknowledged rows can be there (no request settled by a
        read, none resent after a fence)."""
        return self.evaluation.created and self.protocol.all_answered

    def _finalize(self, metrics: Mapping[str, Any]) -> None:
        state = self.state
        evaluation_id = str(state.evaluation_id)

        def completed() -> bool:
            evaluation = self.protocol.retry("reading the evaluation", lambda: self.client.get_evaluation(evaluation_id))
            return str(evaluation.get("status", "")).upper() == "COMPLETED"

        pending = state.in_flight if state.in_flight and state.in_flight.kind == FINALIZE else None
        if pending is None or not self.protocol.settled(pending.sent_at, completed):
            self.protocol.send_once("finalizing", InFlight(kind=FINALIZE, sent_at=0.0), lambda gate: self.client.finalize(
                evaluation_id, metrics, before_last=gate), completed)
        state.finalized = True
        state.metrics_sent = dict(metrics)  # the finalize carries them
        state.in_flight = None
        self.protocol.note()  # the file announces the finalize: the next sync reads its status

    def _record_lost(self, exc: PositionLostError) -> None:
        """The spool lost lines the platform already holds: recorded as a mismatch (the
        platform holds what the spool cannot account for), so the state, ``status`` and the
        evaluation's metadata say so, and nothing is finalized over it. Counted in episodes,
        the unit every sink shares."""
        state = self.state
        if state.evaluation_id is None or spool_identity(self.run_dir) != self.folder:  # moved: not lost
            return
        given = 0
        try:  # how many of the pushed episodes the spool still gives, read from its start
            for record in durable_records(self.run_dir, skip_corrupt=self.options.skip_corrupt):
                if record.type == EPISODE:
                    given += 1
                    if given >= state.episodes_pushed:
                        break
        except (SpoolError, SampleTooLargeError):
            pass  # the spool gives no more than it gave up to there
        self._record_mismatch(SampleCountMismatchError(
            state.evaluation_id, state.episodes_pushed, given,
            f"counted in episodes: the spool lost lines already pushed: {exc.reason}", replay_option(state.replay_id)))

    def _record_mismatch(self, exc: SampleCountMismatchError) -> None:
        """Make a mismatch loud where people look: the state (``status``) and the
        evaluation's metadata. The run is not finalized while it stands."""
        state = self.state
        state.mismatch = {"platform_samples": exc.platform_samples, "spool_samples": exc.spool_samples,
                          "detail": exc.detail,
                          "found_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.protocol.save()
        try:
            self._put_metadata("recording the mismatch", self.evaluation.metadata(self.manifest), None)
        except SyncError as failure:
            self.report.warnings.append(f"the mismatch is not in the evaluation's metadata: {failure}")

    # -- dry run -----------------------------------------------------------------------------

    def _dry_run(self) -> None:
        """What the pass would send from the cursor, counted in the sink's unit and never
        sent: the batches the push loop would cut, and what a completed run releases."""
        name, shown = choice.for_dry_run(self.state, self.options.to, self.options.auto_sink)
        for count, size in counted.unsent(choice.make(name, self.context)):
            self.report.pushed_now += count
            self.report.bytes_sent += size
        self.report.store = shown
        self.report.state = DRY_RUN
