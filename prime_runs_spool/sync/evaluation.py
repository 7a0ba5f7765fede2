"""The run's one evaluation on the platform: found again, adopted, or created exactly once.

A run is matched to its evaluation by the local run id (and replay id) in the evaluation's
metadata, so a sync that lost its state finds the same evaluation instead of making a second.
A run whose episodes vf-eval already pushed (their platform run ids, listed in the segment
manifests: content/platform_runs.py) is matched to that evaluation, when this destination
has it: what it holds is reconciled, only the rest is sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.content.environments import environment_list
from prime_runs_spool.errors import PlatformError, SyncError
from prime_runs_spool.platform_api.v0 import create_body, is_evaluation_id, manifest_problem, v0_metadata
from prime_runs_spool.sync.id_sets import IdSet
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.sync.protocol import LANDED, Protocol
from prime_runs_spool.sync.sinks.registry import is_sink
from prime_runs_spool.sync.state import CREATE, InFlight, SyncState, metadata_digest
from prime_runs_spool.sync.state_adoption import unreadable_source

if TYPE_CHECKING:
    from prime_runs_spool.sync.sinks.base import Sink

#: The evaluation's metadata key naming the sink that holds the run's episodes, so a sync that
#: finds the evaluation again with no state of its own reads it there, even where that sink
#: cannot be asked (docs/sync.md, "Sinks").
SINK_KEY = "prime_runs_sink"


class Evaluation:
    """Finds, creates and adopts the evaluation a run's rows go to; builds its metadata."""

    def __init__(self, protocol: Protocol, client: PlatformClient, options: SyncOptions,
                 report: RunReport, index: EvaluationIndex | None = None) -> None:
        self.protocol = protocol
        self.client = client
        self.options = options
        #: Where a surprise found on the platform (several matching evaluations) is told.
        self.report = report
        #: The environment's evaluations, shared with the other runs of this sync (or this
        #: run's own): what finding the run's evaluation again reads.
        self.index = index if index is not None else EvaluationIndex()
        #: Platform runs vf-eval pushed the run's episodes to, newest first (set by the engine).
        self.platform_runs: list[str] = []
        #: Set once this pass created the evaluation and had the answer: the platform then
        #: holds no row this pass did not send (the engine skips the count read before
        #: finalizing when every request since was answered).
        self.created = False
        #: Set by the engine for a state it could not trust (errors.py, ``StateProblem``): when a
        #: request that state may have left in flight was sent (inf: it cannot tell; None: none).
        self.untrusted_sent_at: float | None = float("inf")

    def metadata(self, manifest: Mapping[str, Any], terminal: Mapping[str, Any] | None = None, *,
                 sink: str | None = None) -> dict[str, Any]:
        """The evaluation's metadata: the manifest's, plus what finds this run again and the
        sink its episodes are in (``sink``, else the one it names already): a PUT replaces the
        document whole, so every one carries it."""
        state = self.protocol.state
        metadata = v0_metadata(manifest)
        metadata["local_run_id"] = state.local_run_id
        if self.options.replay_id:
            metadata["replay_id"] = self.options.replay_id
        if sink or state.evaluation_sink:
            metadata[SINK_KEY] = sink or state.evaluation_sink
        if state.skipped:
            metadata["skipped_corruption"] = list(state.skipped)
        if state.skipped_too_large:
            metadata["skipped_too_large"] = list(state.skipped_too_large)
        if terminal is not None:
            metadata["prime_runs"] = dict(terminal)
        if state.mismatch:
            metadata["prime_runs_mismatch"] = dict(state.mismatch)
        return metadata

    def name_sink(self, manifest: Mapping[str, Any], name: str, *, once: bool = False) -> None:
        """The evaluation names another sink than the one a pass is about to push to (``auto``
        fell back after the create, or ``--to`` took a run nothing was sent for elsewhere):
        it is told ``name`` first, so a sync that finds it again follows the run. Idempotent.
        ``once``: one try, not retried (its failure raised as it is)."""
        state = self.protocol.state
        metadata = self.metadata(manifest, sink=name)

        def put() -> Any:
            return self.client.update_evaluation(str(state.evaluation_id), metadata=metadata)
        if once:
            self.protocol.checkpoint()  # a stopped pass sends nothing more
            put()
        else:
            self.protocol.retry("recording the run's sink", put)
        state.metadata_sent = metadata_digest(metadata)
        state.evaluation_sink = name
        self.protocol.note()

    @contextlib.contextmanager
    def naming(self, manifest: Mapping[str, Any], sink: Sink) -> Iterator[None]:
        """A push to ``sink`` under an evaluation that names it: renamed first where it names
        another (:meth:`name_sink`), and named back if the push fails with nothing of the run
        sent there (every try refused a connection, or refused: its batch withdrawn) and it
        named the sink a create names when it cannot tell (``choice.AUTO_ORDER[-1]``, which
        every account has). Left naming a sink that holds nothing (``auto`` whose Prime Traces
        probe had no answer: the service's URL unreachable), the run, its state lost, was
        followed there on an account without Prime Traces and refused for good, ``--replay``
        only. Not on a stop (no request is sent then): a run stopped there stays named so."""
        from prime_runs_spool.sync.sinks.choice import AUTO_ORDER

        state, before = self.protocol.state, self.protocol.state.evaluation_sink
        if before in (None, sink.name):
            yield
            return
        self.name_sink(manifest, sink.name)  # before anything is sent there
        try:
            yield
        except Exception:
            if before == AUTO_ORDER[-1] and state.evaluation_sink == sink.name and not sink.used_by(state):
                with contextlib.suppress(Exception):  # one try: the push's own failure is the run's error
                    self.name_sink(manifest, before, once=True)
            raise

    def ensure(self, manifest: Mapping[str, Any], *, fresh: bool, untrusted: bool, never_held: bool = False,
               sink_for_create: Callable[[], str] | None = None, rows: Callable[[], int] | None = None) -> bool:
        """Make sure the state names this run's one evaluation; returns True when it was
        found on the platform rather than created now (its samples need reconciling).
        ``never_held``: no copy of the run on this machine ever held its copy lock
        (sync/copies.py), so the sync's listing of the environment answers (sync/index.py).
        ``sink_for_create``: asked only when an evaluation is to be created, for the sink its
        metadata names (sync/sinks/choice.py, ``for_create``). ``rows``: every row the run
        yields, counted (sync/sinks/counted.py), asked only to pass over an untrusted state's
        wait (:meth:`_finished_with_every_row`)."""
        problem = manifest_problem(manifest)
        if problem:  # before any request: the same spool cannot become an evaluation later either
            raise SyncError(f"the run's manifest cannot be sent: {problem} (docs/manifest.md)")
        protocol = self.protocol
        state = protocol.state
        pending = state.in_flight if state.in_flight and state.in_flight.kind == CREATE else None
        if state.evaluation_id and pending is None:
            return self._follow_vf_eval(state.evaluation_id)
        if untrusted and self.untrusted_sent_at is not None:
            if rows is not None and self._finished_with_every_row(manifest, rows):
                return True
            # Whatever wrote the state may have had a request in flight: when, if it can tell.
            unknown = {"skip": self._skip_unknown_wait()} if self.untrusted_sent_at == float("inf") else {}
            protocol.fence(min(self.untrusted_sent_at, protocol.clock()),
                           "its sync state cannot be trusted, and a request it announced may still land", **unknown)
        if pending is not None:
            if protocol.settled(pending.sent_at, lambda: self._adopt_existing(manifest)):
                return True
        elif (fresh or untrusted) and self._adopt_existing(manifest, never_held=never_held and not untrusted):
            return True
        if sink_for_create is not None:
            state.evaluation_sink = sink_for_create()  # announced with the create, which carries it
        self._create(manifest)
        return False

    def _finished_with_every_row(self, manifest: Mapping[str, Any], rows: Callable[[], int]) -> bool:
        """Whether the run's evaluation, found finalized and holding every row the run yields,
        is adopted at once, before an untrusted state's wait. No request that state may have
        left can still land: a finalize follows only settled requests, and no row is sent
        twice, so one on its way would be rows missing from the count. Nor is anything sent
        again: the evaluation is found (no create), finalized (no finalize), and holds every
        row (none to send); only an idempotent PUT may follow. Read in that order, cheapest
        first: the listing, the evaluation, then the run (its rows built, never sent). When
        it does not hold, the wait follows, and everything read here is read again after it
        (tests/test_sync_told_waits.py: rows on their way to a finalized evaluation)."""
        found = self._find_existing(manifest)
        if found is None:
            return False
        evaluation_id = str(found.get("evaluation_id") or found.get("id"))
        evaluation = self.protocol.retry("reading the evaluation", lambda: self.client.get_evaluation(evaluation_id))
        if str(evaluation.get("status", "")).upper() != "COMPLETED" or evaluation["total_samples"] != rows():
            return False
        self._adopt_found({**found, "status": evaluation["status"]})
        return True

    def _skip_unknown_wait(self) -> str:
        """How a person may end the wait for a state that cannot say what it had in flight:
        nothing the sync can read bounds it (docs/sync.md, "State"), but one who knows no
        sync of the run ran for a request lifetime knows no request of it can land."""
        lifetime = self.options.request_lifetime
        source = unreadable_source(self.protocol.path)
        return (f"if no sync of this run ran in the last {lifetime:.0f} s, none can land: stop this sync"
                + (f", make {source} readable" if source else "")
                + f" and remove {self.protocol.shown or self.protocol.path} to go on at once")

    def _environment_names(self, manifest: Mapping[str, Any]) -> list[str]:
        names = [str(name) for name in environment_list(manifest.get("environments")) if name]
        return names or [str(manifest.get("name") or "default")]

    def _create_payload(self, manifest: Mapping[str, Any], environment_ids: list[str]) -> dict[str, Any]:
        return create_body(manifest,
                           name=self.options.name or manifest.get("name") or self.protocol.state.local_run_id,
                           environment_ids=environment_ids,
                           tags=list(dict.fromkeys([*_tags(manifest.get("tags")), *self.options.tags])),
                           metadata=self.metadata(manifest))

    def _find_existing(self, manifest: Mapping[str, Any], *, never_held: bool = False) -> dict[str, Any] | None:
        """An evaluation already carrying this run's local id (and replay id), if any."""
        local_run_id = self.protocol.state.local_run_id
        environment = self._environment_names(manifest)[0]

        def read_page(skip: int, limit: int) -> Mapping[str, Any]:
            return self.protocol.retry("listing evaluations", lambda: self.client.list_evaluations(
                environment_name=environment, skip=skip, limit=limit))

        matches = [dict(item) for item in self.index.find(environment, read_page,
                                                          (local_run_id, self.options.replay_id),
                                                          never_held=never_held)]
        if len(matches) > 1:
            self.report.warnings.append(
                f"{len(matches)} evaluations carry local run id {local_run_id}; using the oldest")
        matches.sort(key=lambda item: str(item.get("created_at") or ""))
        return matches[0] if matches else None

    def _adopt(self, evaluation: Mapping[str, Any]) -> None:
        state = self.protocol.state
        evaluation_id = str(evaluation.get("evaluation_id") or evaluation.get("id"))
        state.evaluation_id = evaluation_id
        state.viewer_url = evaluation.get("viewer_url") or self.client.settings.viewer_url(evaluation_id)
        state.in_flight = None
        if str(evaluation.get("status", "")).upper() == "COMPLETED":
            state.finalized = True
        # Found by its local run id, as the next sync would find it again: carried by the
        # next save (the announcement of the run's first request to it) or the pass's end.
        self.protocol.note()

    def _adopt_existing(self, manifest: Mapping[str, Any], *, never_held: bool = False) -> bool:
        found = self._find_existing(manifest, never_held=never_held)
        if found is not None:  # the oldest carrying the run's id: a newer vf-eval pushed to wins
            self._adopt_found(found)
            self._follow_vf_eval(str(self.protocol.state.evaluation_id))
            return True
        found = self._pushed_by_vf_eval()
        if found is not None:
            self._adopt_found(found)
        return found is not None

    def _adopt_found(self, found: Mapping[str, Any]) -> None:
        """Adopt an evaluation found on the platform, with the sink its metadata names."""
        self._adopt(found)
        metadata = found.get("metadata")
        named = metadata.get(SINK_KEY) if isinstance(metadata, Mapping) else None
        self.protocol.state.evaluation_sink = named if isinstance(named, str) and is_sink(named) else None

    def _follow_vf_eval(self, evaluation_id: str) -> bool:
        """The spool names a platform run vf-eval pushed to after the state's evaluation (a
        pushing ``vf-eval --resume`` opened it and pushed every episode kept so far there):
        that one is adopted in its place, with nothing in flight, as a state that starts from
        nothing, so only what it lacks is sent and nothing more goes to the older (docs/sync.md,
        "Runs vf-eval pushed"). After: listed before it (newest first), or, for an evaluation
        sync created (not listed), created later on the platform. True when it was adopted."""
        runs, state = self.platform_runs, self.protocol.state
        if state.in_flight is not None or not runs or runs[0] == evaluation_id:
            return False
        listed = evaluation_id in runs
        since: list[str] = []

        def take(found: Mapping[str, Any]) -> bool:
            if not listed:
                since[:] = since or [str(self.protocol.retry("reading the run's evaluation", lambda: (
                    self.client.get_evaluation(evaluation_id))).get("created_at") or "")]
                if not (since[0] and str(found.get("created_at") or "") > since[0]):
                    return False
            _start_again(state)
            return True
        found = self._pushed_by_vf_eval(runs[:runs.index(evaluation_id)] if listed else runs, take=take)
        if found is None:
            return False
        self._adopt(found)
        self.report.warnings.append(f"vf-eval pushed this run to {found['evaluation_id']} after {evaluation_id}: "
                                    "synced there from now on")
        return True

    def _pushed_by_vf_eval(self, runs: list[str] | None = None,
                           take: Callable[[Mapping[str, Any]], bool] | None = None) -> dict[str, Any] | None:
        """The newest platform run vf-eval pushed this run's episodes to (of ``runs``, else
        all it did), if this destination has it (one ``GET`` per id; a 404 or 403 means
        another platform's or team's run). Never for a replay: a replay is a new evaluation
        by definition. ``take``: asked of each found, before what it holds is listed; False
        passes it over."""
        if self.options.replay_id:
            return None
        for run_id in self.platform_runs if runs is None else runs:
            if not is_evaluation_id(run_id):
                continue

            def get(run_id: str = run_id) -> dict[str, Any] | None:
                try:
                    return self.client.get_evaluation(run_id)
                except PlatformError as exc:
                    if exc.status in (403, 404):
                        return None
                    raise

            found = self.protocol.retry(f"looking up the platform run {run_id} vf-eval pushed to", get)
            if found and (take is None or take(found)):
                held = self.protocol.retry(f"listing the episodes of the platform run {run_id}",
                                           lambda run_id=run_id: self.client.trace_run_episode_ids(run_id))
                self.protocol.state.on_platform = IdSet.of(held)
                self.report.warnings.append(
                    f"adopted evaluation {run_id}: vf-eval already pushed this run there; only what it lacks is sent")
                return {"evaluation_id": run_id, **dict(found)}
        return None

    def _create(self, manifest: Mapping[str, Any]) -> None:
        environment_ids = [
            self.index.environment_id(name, lambda name=name: self.protocol.retry(
                f"resolving environment {name!r}", lambda: self.client.resolve_environment(name)))
            for name in self._environment_names(manifest)
        ]
        payload = self._create_payload(manifest, environment_ids)
        environment = self._environment_names(manifest)[0]
        with self.index.creating(environment):
            created = self.protocol.send_once("creating the evaluation", InFlight(kind=CREATE, sent_at=0.0),
                                              lambda gate: self.client.create_evaluation(payload, before_last=gate),
                                              lambda: self._adopt_existing(manifest))
            if created is not LANDED:
                self.index.add(environment, {**created, "metadata": payload["metadata"]})
        if created is not LANDED:
            self._adopt(created)
            self.created = True
            # What the evaluation's metadata now is: the run's end sends it again only changed.
            self.protocol.state.metadata_sent = metadata_digest(payload["metadata"])


def _start_again(state: SyncState) -> None:
    """``state`` as a new one for its run and destination: what it says of another
    evaluation (cursor, counts, sink, what was held there) says nothing of the next."""
    keep = ("version", "destination", "local_run_id", "replay_id", "fence", "pass_mark", "updated_at")
    fresh = SyncState(destination=state.destination, local_run_id=state.local_run_id, replay_id=state.replay_id)
    for item in dataclasses.fields(SyncState):
        if item.init and item.name not in keep:
            setattr(state, item.name, getattr(fresh, item.name))


def _tags(tags: Any) -> list[str]:
    """The manifest's tags as a list: one tag given as a string is one tag (as one
    environment is, content/environments.py), not one per letter."""
    return [tags] if isinstance(tags, str) else list(tags or [])
