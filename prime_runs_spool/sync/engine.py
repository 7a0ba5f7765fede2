"""The sync protocol for one run and one destination (docs/sync.md).

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

So nothing is ever sent twice, and nothing is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.spool.format import COMPLETED, CRASHED, EPISODE, MANIFEST
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.errors import (
    CorruptSpoolError,
    FailureKind,
    PlatformError,
    SampleTooLargeError,
    SpoolError,
    StateProblem,
    SyncError,
)
from prime_runs_spool.spool.layout import list_segments, sync_state_path
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES, create_body, v0_metadata
from prime_runs_spool.spool.reader import iter_records, writer_alive
from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.rows import Batch, RowStream, batches, durable_records, read_ahead, skip_rows
from prime_runs_spool.sync.state import (
    Cursor,
    Destination,
    InFlight,
    SyncState,
    load_state,
    save_state,
)

#: The default request lifetime for the real platform: after this long, a request sent and
#: never answered can no longer be processed. Conservative on purpose (docs/sync.md).
DEFAULT_REQUEST_LIFETIME = 600.0

#: What :meth:`RunSync._send_once` returns for a request that landed but lost its answer.
LANDED = object()


@dataclass
class SyncOptions:
    request_lifetime: float = DEFAULT_REQUEST_LIFETIME
    max_request_bytes: int = MAX_REQUEST_BYTES
    skip_corrupt: bool = False
    dry_run: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    #: For --replay: push each run as a new evaluation. Without ``replay_id``, each run
    #: continues its latest unfinished replay or starts one (sync/replay.py).
    replay: bool = False
    #: The replay's id: its own state file, and the key the evaluation is found again by.
    replay_id: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()


@dataclass
class RunReport:
    path: str
    local_run_id: str | None = None
    name: str | None = None
    evaluation_id: str | None = None
    url: str | None = None
    pushed_now: int = 0
    pushed_total: int = 0
    #: up_to_date, synced (completed and finalized), live, failed, crashed, corrupt,
    #: skipped (another sync holds it), dry_run, error
    state: str = "error"
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    replay_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run_writer_alive(run_dir: Path) -> bool:
    """Whether any process still holds a writer lock on one of the run's segments."""
    return any(writer_alive(path) for _, path in list_segments(run_dir))


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """The run's manifest: the first manifest record of its first segment."""
    for record in iter_records(run_dir):
        if record.type == MANIFEST:
            return record.data
        if record.type == EPISODE:
            break
    return None


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
    ) -> None:
        self.run_dir = run_dir
        self.client = client
        self.destination = destination
        self.options = options
        self.clock = clock
        self.sleep = sleep
        self.on_progress = on_progress or (lambda report: None)
        self.report = RunReport(path=str(run_dir), replay_id=options.replay_id)
        #: The state file this sync reads and announces every step in.
        self.path = sync_state_path(run_dir, destination.key, options.replay_id)
        #: The run's manifest and its sync state: read by run() before anything uses them.
        self.manifest: dict[str, Any] = {}
        self.state: SyncState | None = None

    # -- entry point ---------------------------------------------------------------------

    def run(self) -> RunReport:
        report = self.report
        try:
            self._run()
        except CorruptSpoolError as exc:
            report.state, report.error = "corrupt", f"{exc}; everything before it was pushed"
        except (SpoolError, SampleTooLargeError) as exc:
            report.state, report.error = "error", str(exc)
        except OSError as exc:
            report.state = "error"
            report.error = f"{exc.filename or self.run_dir}: {exc.strerror or exc}"
        return report

    def _run(self) -> None:
        manifest = read_manifest(self.run_dir)
        if manifest is None:
            if run_writer_alive(self.run_dir):
                self.report.state = "live"
                self.report.warnings.append("no manifest yet; the writer is still starting")
                return
            raise SyncError("the spool has no manifest record; it cannot be synced (prime-runs verify shows why)")
        self.manifest = manifest
        local_id = str(manifest.get("run_id"))
        self.report.local_run_id = local_id
        self.report.name = manifest.get("name")
        untrusted = False
        try:
            state = load_state(self.path, destination=self.destination, local_run_id=local_id)
        except StateProblem as problem:
            self.report.warnings.append(f"{problem}; reconciling with the platform")
            state, untrusted = None, True
        fresh = state is None
        if state is None:
            state = SyncState(destination=self.destination, local_run_id=local_id,
                              replay_id=self.options.replay_id)
        self.state = state
        self._show()
        if not untrusted and self._up_to_date():
            self.report.state = "up_to_date" if state.finalized or state.terminal else "live"
            return
        if self.options.dry_run:
            self._dry_run()
            return
        adopted = self._ensure_evaluation(fresh=fresh, untrusted=untrusted)
        self._reconcile_samples(force=adopted)
        self._push_all()

    # -- small helpers ---------------------------------------------------------------------

    def _show(self) -> None:
        state = self.state
        self.report.evaluation_id = state.evaluation_id
        self.report.url = state.viewer_url
        self.report.pushed_total = state.samples_pushed
        self.on_progress(self.report)

    def _save(self) -> None:
        save_state(self.path, self.state)
        self._show()

    def _up_to_date(self) -> bool:
        """Nothing new since the last sync: answered from file sizes, not by reading."""
        state = self.state
        if state.in_flight is not None or state.cursor is None or state.evaluation_id is None:
            return False
        segments = list_segments(self.run_dir)
        if not segments or segments[-1][0] != state.cursor.segment_index:
            return False
        size = segments[-1][1].stat().st_size
        if state.finalized or state.terminal is not None:
            return size in (state.cursor.offset, state.terminal_size)
        return size == state.cursor.offset and run_writer_alive(self.run_dir)

    def _last_segment_size(self) -> int | None:
        segments = list_segments(self.run_dir)
        return segments[-1][1].stat().st_size if segments else None

    def _wait_until(self, deadline: float) -> None:
        while (remaining := deadline - self.clock()) > 0:
            self.sleep(min(remaining, 5.0))

    def _fence(self, sent_at: float) -> None:
        """Wait until a request sent at ``sent_at`` can no longer be processed."""
        self._wait_until(sent_at + self.options.request_lifetime)

    def _retry(self, what: str, call: Callable[[], Any]) -> Any:
        """Run an idempotent call, retrying every failure that is not fatal."""
        attempt = 0
        while True:
            try:
                return call()
            except PlatformError as exc:
                attempt += 1
                if exc.kind is FailureKind.FATAL or attempt >= self.options.backoff.max_attempts:
                    raise self._give_up(what, exc, attempt) from None
                self.sleep(self.options.backoff.delay(attempt, exc.retry_after))

    def _give_up(self, what: str, exc: PlatformError, attempt: int) -> SyncError:
        if exc.kind is FailureKind.FATAL:
            return SyncError(f"{what}: {exc}")
        return SyncError(f"{what}: still failing after {attempt} attempts ({exc}); "
                         "the state is saved, run prime-runs sync again later")

    def _settled(self, sent_at: float, landed: Callable[[], bool], *, in_doubt: bool = True) -> bool:
        """Did a request sent at ``sent_at`` land? Reads once; when it did not and the request
        may still be in flight, waits until it can no longer land and reads again."""
        if landed():
            return True
        if not in_doubt:
            return False
        self._fence(sent_at)
        return landed()

    def _send_once(self, what: str, in_flight: InFlight, send: Callable[[], Any],
                   landed: Callable[[], bool]) -> Any:
        """Send a request that must not be processed twice: announce it in the state, send it,
        and after a failure resend only once ``landed`` says it did not (and cannot) land.
        Returns the answer, or :data:`LANDED` when it landed but its answer was lost."""
        attempt = 0
        while True:
            sent_at = self.clock()
            self.state.in_flight = in_flight.model_copy(update={"sent_at": sent_at})
            self._save()
            try:
                return send()
            except PlatformError as exc:
                if exc.kind is FailureKind.FATAL:
                    raise self._give_up(what, exc, attempt + 1) from None
                if exc.kind is not FailureKind.NOT_SENT and self._settled(
                        sent_at, landed, in_doubt=exc.kind is FailureKind.IN_DOUBT):
                    return LANDED
                attempt += 1
                if attempt >= self.options.backoff.max_attempts:
                    raise self._give_up(what, exc, attempt) from None
                self.sleep(self.options.backoff.delay(attempt, exc.retry_after))

    # -- the evaluation ----------------------------------------------------------------------

    def _environment_names(self) -> list[str]:
        names = [str(name) for name in self.manifest.get("environments") or [] if name]
        return names or [str(self.manifest.get("name") or "default")]

    def _metadata(self, terminal: Mapping[str, Any] | None = None) -> dict[str, Any]:
        metadata = v0_metadata(self.manifest)
        metadata["local_run_id"] = self.state.local_run_id
        if self.options.replay_id:
            metadata["replay_id"] = self.options.replay_id
        if self.state.skipped:
            metadata["skipped_corruption"] = list(self.state.skipped)
        if terminal is not None:
            metadata["prime_runs"] = dict(terminal)
        return metadata

    def _create_payload(self, environment_ids: list[str]) -> dict[str, Any]:
        manifest = self.manifest
        return create_body(manifest, name=self.options.name or manifest.get("name") or self.state.local_run_id,
                           environment_ids=environment_ids,
                           tags=list(dict.fromkeys([*(manifest.get("tags") or []), *self.options.tags])),
                           metadata=self._metadata())

    def _find_existing(self) -> dict[str, Any] | None:
        """An evaluation already carrying this run's local id (and replay id), if any."""
        environment = self._environment_names()[0]
        matches: list[dict[str, Any]] = []
        skip = 0
        while True:
            page = self._retry("listing evaluations", lambda: self.client.list_evaluations(
                environment_name=environment, skip=skip, limit=100))
            items = page.get("evaluations") or []
            for item in items:
                metadata = item.get("metadata") or {}
                if (metadata.get("local_run_id") == self.state.local_run_id
                        and metadata.get("replay_id") == self.options.replay_id):
                    matches.append(item)
            skip += len(items)
            if not items or skip >= int(page.get("total") or 0):
                break
        if len(matches) > 1:
            self.report.warnings.append(
                f"{len(matches)} evaluations carry local run id {self.state.local_run_id}; using the oldest")
        matches.sort(key=lambda item: str(item.get("created_at") or ""))
        return matches[0] if matches else None

    def _adopt(self, evaluation: Mapping[str, Any]) -> None:
        evaluation_id = str(evaluation.get("evaluation_id") or evaluation.get("id"))
        self.state.evaluation_id = evaluation_id
        self.state.viewer_url = evaluation.get("viewer_url") or self.client.settings.viewer_url(evaluation_id)
        self.state.in_flight = None
        if str(evaluation.get("status", "")).upper() == "COMPLETED":
            self.state.finalized = True
        self._save()

    def _ensure_evaluation(self, *, fresh: bool, untrusted: bool) -> bool:
        """Make sure the state names this run's one evaluation; returns True when it was
        found on the platform rather than created now (its samples need reconciling)."""
        state = self.state
        pending = state.in_flight if state.in_flight and state.in_flight.kind == "create" else None
        if state.evaluation_id and pending is None:
            return False
        if untrusted:
            # Whatever wrote the damaged state may have had a request in flight.
            self._fence(self.clock())
        if pending is not None:
            if self._settled(pending.sent_at, self._adopt_existing):
                return True
        elif (fresh or untrusted) and self._adopt_existing():
            return True
        self._create()
        return False

    def _adopt_existing(self) -> bool:
        found = self._find_existing()
        if found is not None:
            self._adopt(found)
        return found is not None

    def _create(self) -> None:
        environment_ids = [
            self._retry(f"resolving environment {name!r}", lambda name=name: self.client.resolve_environment(name))
            for name in self._environment_names()
        ]
        payload = self._create_payload(environment_ids)
        created = self._send_once("creating the evaluation", InFlight(kind="create", sent_at=0.0),
                                  lambda: self.client.create_evaluation(payload), self._adopt_existing)
        if created is not LANDED:
            self._adopt(created)

    # -- samples ---------------------------------------------------------------------------

    def _stream(self) -> RowStream:
        return RowStream(self.run_dir, self.state.cursor, str(self.state.evaluation_id),
                         self.options.max_request_bytes, self.options.skip_corrupt, seal=self.state.seal)

    def _total_samples(self) -> int:
        evaluation = self._retry("reading the evaluation", lambda: self.client.get_evaluation(
            str(self.state.evaluation_id)))
        return int(evaluation.get("total_samples") or 0)

    def _reconcile_samples(self, *, force: bool) -> None:
        """Settle an announced samples request, or (``force``) re-derive the cursor from
        what the platform holds: our rows are always appended in order, so the count of
        rows on the platform says exactly how far the stream got."""
        state = self.state
        pending = state.in_flight if state.in_flight and state.in_flight.kind == "samples" else None
        if pending is None and not force:
            return
        if pending is not None and pending.end is not None:
            if self._settled(pending.sent_at, lambda: self._samples_landed(pending.rows)):
                self._acknowledge(pending.end, pending.rows, pending.episodes, pending.seal)
                return
        total = self._total_samples()
        missing = total - state.samples_pushed
        if missing < 0:
            raise SyncError(
                f"the platform holds {total} samples of evaluation {state.evaluation_id}, fewer than the "
                f"{state.samples_pushed} this sync recorded; refusing to guess (use --replay for a new evaluation)")
        if missing:
            cursor, episodes, last_id = skip_rows(self._stream(), missing)
            self._check_last_sample(total, last_id)
            assert cursor is not None
            state.advance(cursor, missing, episodes)
        state.in_flight = None
        self._save()

    def _samples_landed(self, rows: int) -> bool:
        """Whether the announced request of ``rows`` rows is on the platform; any count but
        "all of them" or "none of them" means the platform is not what we think it is."""
        total = self._total_samples()
        if total == self.state.samples_pushed + rows:
            return True
        if total == self.state.samples_pushed:
            return False
        raise SyncError(
            f"evaluation {self.state.evaluation_id} holds {total} samples; expected "
            f"{self.state.samples_pushed} or {self.state.samples_pushed + rows}: refusing to guess")

    def _acknowledge(self, end: Cursor, rows: int, episodes: int, seal: dict[str, Any] | None = None) -> None:
        self.state.advance(end, rows, episodes, seal)
        self.state.in_flight = None
        self._save()

    def _check_last_sample(self, total: int, expected_id: Any) -> None:
        """The row at index ``total - 1`` on the platform must be ours: if it is not, the
        count cannot be trusted to say what landed."""
        limit = 100
        page = (total - 1) // limit + 1
        listing = self._retry("reading samples", lambda: self.client.list_samples(
            str(self.state.evaluation_id), page=page, limit=limit))
        samples = listing.get("samples") or []
        index = (total - 1) % limit
        found = samples[index].get("sample_id") if index < len(samples) else None
        if found != expected_id:
            raise SyncError(
                f"evaluation {self.state.evaluation_id} holds samples that do not match this spool "
                f"(sample {total} is {found!r}, expected {expected_id!r}); refusing to guess "
                "(use --replay for a new evaluation)")

    def _push_all(self) -> None:
        while True:
            stream = self._stream()
            try:
                for batch in read_ahead(batches(stream, self.options.max_request_bytes)):
                    if batch.count:
                        try:
                            self._send(batch)
                        finally:
                            batch.release()  # its body and its large-body token, sent or not
                    elif batch.end is not None and batch.end != self.state.cursor:
                        self.state.advance(batch.end, 0, 0, batch.seal)
                        self._save()
            finally:
                if stream.skipped:
                    known = {(s["segment"], s["offset"]) for s in self.state.skipped}
                    self.state.skipped.extend(
                        {k: v for k, v in s.items() if k != "last"} for s in stream.skipped
                        if (s["segment"], s["offset"]) not in known)
                    self._save()
            if stream.seal is not None:
                self._finish(str(stream.seal.get("status")), stream.seal)
                return
            if run_writer_alive(self.run_dir):
                self.report.state = "live"
                return
            # The writer is gone. It may have appended (or sealed) between our last read
            # and its exit: read once more before calling the run crashed.
            if self._drained(stream):
                self._finish(CRASHED, None)
                return

    def _drained(self, stream: RowStream) -> bool:
        probe = self._stream()
        for _ in probe.rows():
            return False
        return probe.seal is None and probe.cursor == stream.cursor

    def _send(self, batch: Batch) -> None:
        body = batch.body()
        rows = batch.count
        assert batch.end is not None
        self._send_once("pushing samples",
                        InFlight(kind="samples", sent_at=0.0, rows=rows, episodes=batch.episodes,
                                 end=batch.end, seal=batch.seal),
                        lambda: self.client.push_samples(str(self.state.evaluation_id), body),
                        lambda: self._samples_landed(rows))
        self._acknowledge(batch.end, rows, batch.episodes, batch.seal)
        self.report.pushed_now += rows
        self.report.bytes_sent += len(body)
        del body  # _push_all releases the batch: the next one is built without this body alive
        self._show()

    # -- finishing ---------------------------------------------------------------------------

    def _summary(self, seal: Mapping[str, Any] | None) -> dict[str, Any]:
        if seal and isinstance(seal.get("summary"), Mapping):
            return dict(seal["summary"])
        accumulator = SummaryAccumulator()
        for record in durable_records(self.run_dir, skip_corrupt=self.options.skip_corrupt):
            if record.type == EPISODE:
                accumulator.add(record.data)
        return accumulator.result()

    def _finish(self, status: str, seal: Mapping[str, Any] | None) -> None:
        state = self.state
        metrics = self._summary(seal)
        evaluation_id = str(state.evaluation_id)
        if status == COMPLETED:
            if not state.finalized:
                metadata = self._metadata()
                self._retry("recording metadata", lambda: self.client.update_evaluation(
                    evaluation_id, metadata=metadata, metrics=metrics))
                self._finalize(metrics)
            state.terminal = COMPLETED
            state.terminal_size = self._last_segment_size()
            self._save()
            self.report.state = "synced"
            return
        terminal = {
            "status": status,
            "finished_at": (seal or {}).get("finished_at"),
            "error": (seal or {}).get("error"),
        }
        metadata = self._metadata(terminal)
        self._retry("recording the run's end", lambda: self.client.update_evaluation(
            evaluation_id, metadata=metadata, metrics=metrics))
        state.terminal = status
        state.terminal_size = self._last_segment_size()
        self._save()
        self.report.state = status

    def _finalize(self, metrics: Mapping[str, Any]) -> None:
        state = self.state
        evaluation_id = str(state.evaluation_id)

        def completed() -> bool:
            evaluation = self._retry("reading the evaluation", lambda: self.client.get_evaluation(evaluation_id))
            return str(evaluation.get("status", "")).upper() == "COMPLETED"

        pending = state.in_flight if state.in_flight and state.in_flight.kind == "finalize" else None
        if pending is None or not self._settled(pending.sent_at, completed):
            self._send_once("finalizing", InFlight(kind="finalize", sent_at=0.0),
                            lambda: self.client.finalize(evaluation_id, metrics), completed)
        state.finalized = True
        state.in_flight = None
        self._save()

    # -- dry run -----------------------------------------------------------------------------

    def _dry_run(self) -> None:
        stream = RowStream(self.run_dir, self.state.cursor, self.state.evaluation_id or "dry-run",
                           self.options.max_request_bytes, self.options.skip_corrupt)
        for batch in batches(stream, self.options.max_request_bytes):
            self.report.pushed_now += batch.count
            self.report.bytes_sent += batch.size if batch.count else 0
        self.report.state = "dry_run"
