"""The eval runner's API: open a run, log episodes as they land, finish or abort it.

A :class:`Run` is held for the length of an eval. ``open_run`` writes the manifest before
anything else, so a spool that holds an episode always says which run it belongs to.
``log_episodes`` returns only once every episode it recorded is durable: the eval may then
forget them. Every episode is masked at the credential locations *before* it is
serialized, so no secret ever reaches the disk, and stamped with the rollout number its
platform row will carry, assigned here in arrival order so sync never rescans the spool.

Exactly one writer process owns a run at a time. Within it, ``log_episodes`` is
thread-safe, and concurrent calls share fsyncs (the segment writer's group commit): the
run's own lock is held only to number episodes and, once they are durable, to count them
into the summary, never across a disk write.

This module admits and numbers episodes and holds the public API; how a run ends (finish,
abort, the exit hook) is runner/ending.py, the online shipper's supervision
runner/shipping.py, and the durable listeners runner/listeners.py.

docs/integration.md shows how an eval runner wires this in.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import RecordNotSerializableError, RunClosedError, RunMismatchError, WriterClosedError
from prime_runs_spool.spool.format import COMPLETED, MANIFEST, SEAL_STATUSES, Payload, episode_rest, prepare
from prime_runs_spool.content.error_scrub import error_forms, scrub_text
from prime_runs_spool.content.manifest import build_manifest, is_config_source_note, masked_config_values
from prime_runs_spool.content.masking import MaskRules
from prime_runs_spool.runner.modes import DISABLED, ONLINE, resolve_mode, writes_spool
from prime_runs_spool.content.episodes import RolloutCounter
from prime_runs_spool.runner.resume import PriorRun, scan_prior_run
from prime_runs_spool.content.platform_runs import PLATFORM_RUNS_KEY
from prime_runs_spool.content.supersede import SUPERSEDES_KEY
from prime_runs_spool.content.recovers import RECOVERS_KEY, Cut
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.runner.ending import Ending, out_of_descriptors, remember, seal_error_for, seal_status_for
from prime_runs_spool.runner.error_line import describe_error
from prime_runs_spool.runner.listeners import Listeners
from prime_runs_spool.runner.run_state import CLOSING, OPEN, RunState
from prime_runs_spool.runner.shipping import Shipping
from prime_runs_spool.runner.admission import (NOT_SERIALIZABLE_ADVICE, Prepared, extra_rules, masks_plainly, peek_id,
                                               prepare_episode)
from prime_runs_spool.runner.forks import Ownership

#: Told after each durable append and after the seal, with the run (runner/listeners.py).
DurableListener = Callable[["Run"], None]

_log = logging.getLogger("prime_runs_spool")

ExtraRules = MaskRules | Iterable[str | Iterable[str]] | None


class Run:
    """One eval run. Create it with :func:`open_run`; see the module docstring."""

    def __init__(
        self,
        *,
        run_id: str,
        run_dir: Path,
        mode: str,
        manifest: dict[str, Any],
        resumed: bool,
        writer: SegmentWriter | None,
        prior: PriorRun,
        episode_rules: MaskRules,
        error_forms: list[str] = [],  # noqa: B006 - never mutated
    ) -> None:
        self._id = run_id
        #: What masking took out of the config, as an error line may quote it: never sealed.
        self._error_forms = error_forms
        self._dir = run_dir
        self._mode = mode
        self._manifest = manifest
        self._resumed = resumed
        self._writer = writer
        self._episode_rules = episode_rules
        self._masks_plainly = masks_plainly(episode_rules)
        #: The run's lock, status, appends in flight and summary, shared with its ending.
        self._state = RunState(prior.summary)
        # Everything below is guarded by the state's lock too.
        self._seen = prior.episode_ids
        self._counter: RolloutCounter = prior.counter
        self._logged = 0
        self._skipped = 0
        #: Durable episodes of the whole run (earlier segments included): what pending counts from.
        self._prior_episodes = prior.episodes
        # The collaborators: a lock of theirs may be taken under the run's, never the reverse.
        #: The eval's in-process consumers, told after each durable append and the seal.
        self._listeners: Listeners[Run] = Listeners(run_id)
        #: Online mode's shipper (started by open_run), drained after the seal.
        self._shipping = Shipping(run_id, run_dir, pending=lambda: self.pending)
        #: The process that opened the run, the only one that may write or seal it.
        self._ownership = Ownership()
        #: finish, abort and the exit hook: the one way a run is sealed.
        self._ending = Ending(run_id, self._state, writer, self._shipping, self._listeners, self._ownership,
                              subject=self, scrub=lambda line: scrub_text(line, error_forms))
        self._ownership.after_fork += [self._state.reset_after_fork, self._ending.reset_after_fork]

    # -- identity -------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The run's local id; the caller stamps it on every episode (``episode.run.id``)."""
        return self._id

    @property
    def masked_config_forms(self) -> list[str]:
        """What masking took out of the run's config, each value as text may quote it: what
        a runner showing the eval's own output must clear from it too (runner/terminal_mask.py)."""
        return list(self._error_forms)

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def manifest(self) -> dict[str, Any]:
        """The run's manifest: the first segment's, for a resumed run."""
        return self._manifest

    @property
    def resumed(self) -> bool:
        """Whether this process continues a run an earlier process started."""
        return self._resumed

    @property
    def status(self) -> str:
        """``open``, then ``completed``, ``failed``, ``cancelled`` or ``crashed`` (``closing`` while being sealed)."""
        with self._state.cond:
            return self._state.status

    @property
    def episodes_logged(self) -> int:
        """Episodes this process recorded (durable), not counting skipped duplicates."""
        with self._state.cond:
            return self._logged

    @property
    def episodes_skipped(self) -> int:
        """Episodes not recorded because their id was already in the run's spool."""
        with self._state.cond:
            return self._skipped

    # -- online mode: the shipper's progress, for a runner's dashboard footer ------------

    @property
    def evaluation_url(self) -> str | None:
        """The platform evaluation's URL once the online shipper created it; else None."""
        state = self._shipping.progress()
        return state.viewer_url if state else None

    @property
    def pushed(self) -> int:
        """Episodes the platform acknowledged (online mode; 0 otherwise). Read from the
        shipper's state file: a small read, no request."""
        state = self._shipping.progress()
        return state.episodes_pushed if state else 0

    @property
    def not_shipped(self) -> str | None:
        """After the run's end in online mode: the line saying how many episodes were not
        shipped, why, and the command that ships them (also logged); None when all were."""
        return self._shipping.not_shipped

    @property
    def pending(self) -> int:
        """Durable episodes of the run not yet acknowledged by the platform (in offline
        mode: all of them, for ``prime-runs sync`` to ship)."""
        with self._state.cond:
            total = self._prior_episodes + self._logged
        return max(0, total - self.pushed)

    def summary(self) -> dict[str, Any]:
        """The run summary so far, over every durable episode of the run (all segments)."""
        with self._state.cond:
            return self._state.summary.result()

    def add_durable_listener(self, listener: DurableListener) -> None:
        """Call ``listener(run)`` after each durable append and after the seal.

        For a runner's own in-process consumers (a dashboard, a progress bar): they learn
        that there is more in the spool, and read it from there, so they never see anything
        that is not durable. (The online shipper is a separate process that watches the
        spool's files instead: docs/integration.md.) A listener's exception is logged,
        never raised into the eval; one that is not callable is refused here, where it
        was given, not logged as failing after every append.
        """
        if not callable(listener):
            raise TypeError(f"add_durable_listener takes a callable (listener(run)), not {type(listener).__name__}")
        self._listeners.add(listener)

    # -- logging episodes -----------------------------------------------------------------

    def log_episodes(self, episodes: Iterable[Any]) -> int:
        """Record ``episodes``; returns once each recorded one is durable.

        Returns how many were recorded. An episode whose id the run already holds (a
        resumed run re-logging what it kept, or a repeat within this call) is skipped and
        counted in :attr:`episodes_skipped`. Raises :class:`RunClosedError` once the run is
        finished or aborted, :class:`RunForkedError` in a forked child, and the writer's
        errors when the disk fails.
        """
        if self._ownership.forked:
            self._ownership.check(self._id)
        inside = self._state.inside  # a signal handler's call on this thread: refused (run_state.py)
        if getattr(inside, "append", False):
            raise self._state.reentered(self._id, "log_episodes")
        inside.append = True
        durable = admitted = False
        try:
            lines, records = self._admit(episodes, False)
            if not lines:
                return 0
            admitted = True
            if self._writer is not None:
                self._writer.append_episodes(lines)
            durable = True
        except WriterClosedError as exc:
            if self.status != OPEN:  # lost a race with finish/abort: say so plainly
                raise self._closed_error() from exc
            raise
        finally:
            listeners = self._settle(records, durable, False) if admitted else ()
            inside.append = False
            if inside.__dict__.get("deferred"):  # a handler's abort, sealed once this call is done
                self._ending.close_without_finishing(*inside.__dict__.pop("deferred"))
        if listeners:
            self._listeners.notify(self, listeners)
        return len(lines)

    async def log_episodes_async(self, episodes: Iterable[Any]) -> int:
        """:meth:`log_episodes` for an event loop: the loop never waits on a write or an fsync.

        Masking and serializing happen on the loop (about a millisecond per megabyte);
        the write and the sync happen on the writer's leader thread.

        Cancelling the call (a ``wait_for`` timeout) once its episodes reached the writer
        does not stop them reaching the disk, so it does not forget them either: the thread
        that makes them durable (or fails to) counts them, whatever became of this task.
        Until then ``finish`` waits for them, and a call with the same ids skips them.
        """
        if self._ownership.forked:
            self._ownership.check(self._id)
        lines, records = self._admit(episodes, True)
        if not lines:
            return 0
        if self._writer is None:
            self._listeners.notify(self, self._settle(records, True, True))
            return len(lines)
        heard: list[tuple[DurableListener, ...]] = []

        def settled(error: BaseException | None) -> None:  # on the thread that settled the group
            heard.append(self._settle(records, error is None, True))

        try:
            durable = self._writer.queue_episodes(lines, settled)
        except WriterClosedError as exc:
            if self.status != OPEN:  # lost a race with finish/abort: say so plainly
                raise self._closed_error() from exc
            raise
        await durable
        # A cancelled call's listeners are not called: the next append or the seal is heard.
        if heard and heard[0]:
            self._listeners.notify(self, heard[0])
        return len(lines)

    def _admit(
        self, episodes: Iterable[Any], is_async: bool
    ) -> tuple[list[tuple[Payload, bytes]], list[Prepared]]:
        """Check, mask and serialize each episode outside any lock (runner/admission.py),
        then de-duplicate and number them in arrival order (lock held, no I/O). One method
        for the two steps: a call less on every append.

        Returns each admitted episode's payload with the rest of its line's framing (its
        type and meta: ``episode_rest``), and the admitted episodes.

        All or nothing: any episode of the call that cannot be recorded fails it before
        anything is numbered or counted (its ``task.data.idx`` included, which the numbering
        counts by), so once the run is found open nothing can fail half way and leave ids
        taken, or numbers issued, by a call that raised. Should something still raise under
        the lock, the call's ids are given back before it propagates (its numbers are not: a
        gap in the rollout numbers, never a silently skipped retry).
        """
        if type(episodes) is not list and (
                isinstance(episodes, (Mapping, str, bytes)) or hasattr(episodes, "model_dump")):
            raise TypeError("log_episodes takes a list of episodes, not a single episode")
        seen = self._seen
        rules = self._episode_rules
        plain = self._masks_plainly
        prepared = []
        skipped = 0  # counted only once the call is admitted: a call that fails counts nothing
        try:
            for episode in list(episodes):
                if type(episode) is dict:  # _peek_id's common case (episode_id_of's reading), without the call
                    episode_id = episode.get("id")
                    if episode_id is not None and type(episode_id) is not str:
                        episode_id = str(episode_id)
                else:
                    episode_id = peek_id(episode)
                # Read without the lock: one set lookup, atomic under the GIL. Only a filter, so
                # a resumed run's re-logged episodes are not even serialized; the lock decides.
                if episode_id is not None and episode_id in seen:
                    skipped += 1
                    continue
                prepared.append(prepare_episode(episode, rules, episode_id, plain=plain, read=is_async))
        except RecordNotSerializableError as exc:  # says what is wrong; what to do, as the other refusals
            raise RecordNotSerializableError(exc.what, exc.field_path, exc.reason + NOT_SERIALIZABLE_ADVICE) from None

        lines: list[tuple[Payload, bytes]] = []
        records: list[Prepared] | None = None  # the admitted ones, once a duplicate is dropped
        seen = self._seen
        number_for = self._counter.next_number_for
        state = self._state
        lock = state.lock
        lock.acquire()  # not ``with``: about half the cost, on every append
        try:
            if state.status != OPEN:
                raise self._closed_error()
            if skipped:
                self._skipped += skipped
            episode_id = None
            try:
                for episode in prepared:
                    # unpacked: one step, where each named field is an attribute lookup
                    _record, payload, episode_id, key, _reading = episode
                    if episode_id is not None:
                        if episode_id in seen:
                            self._skipped += 1
                            if records is None:
                                records = prepared[:len(lines)]
                            continue
                        seen.add(episode_id)
                    lines.append((payload, episode_rest(episode_id, number_for(key))))
                    if records is not None:
                        records.append(episode)
            except BaseException:
                # What preparing could not rule out (a rollout key the counter cannot hash: an
                # idx of a str subclass without a hash): the call's ids are given back, so a
                # retry of its good episodes is recorded, not skipped as duplicates.
                admitted = prepared[:len(lines)] if records is None else records
                seen.difference_update([e.episode_id for e in admitted if e.episode_id is not None])
                if episode_id is not None:  # the one that failed: taken, not framed
                    seen.discard(episode_id)
                raise
            if lines:
                state.inflight += 1
                if is_async:
                    state.inflight_async += 1
        finally:
            lock.release()
        return lines, prepared if records is None else records

    def _settle(self, records: list[Prepared], durable: bool, is_async: bool) -> tuple[DurableListener, ...]:
        """Count durable episodes into the summary; let a waiting ``finish`` go on. Returns
        the listeners to tell (outside the lock, by whoever awaits the append).

        Nothing here can leave the append counted in flight: ``finish`` and the exit hook
        wait for that count, so a failure here once stranded the run forever.
        """
        state = self._state
        lock = state.lock
        lock.acquire()  # not ``with``: about half the cost, on every append
        try:
            if durable:
                self._logged += len(records)
                summary = state.summary
                for record in records:
                    # Recorded whatever happens here, so a failure (reading it, before or
                    # here; counting it, here) is logged, never raised (check_episode keeps
                    # it from happening), and counts nothing of the episode.
                    masked, payload, _id, _key, reading = record  # unpacked: no attribute lookup
                    try:
                        if reading is None:  # a caller that waited: read and counted in one pass
                            summary.add(masked, payload.data)
                        elif type(reading) is tuple:
                            summary.add_reading(reading)
                        else:  # the error reading it raised
                            self._summary_failed(record, reading)
                    except Exception as exc:
                        self._summary_failed(record, exc)
            else:
                # Not durable: a retry of these episodes must not be taken for a duplicate
                # and silently skipped; it has to meet the writer's error again.
                self._seen.difference_update(record.episode_id for record in records)
        finally:
            state.inflight -= 1
            if is_async:
                state.inflight_async -= 1
            if state.status != OPEN:  # only a finish (CLOSING) waits for appends in flight
                state.cond.notify_all()
            lock.release()
        return self._listeners.snapshot() if durable and self._writer is not None else ()

    def _summary_failed(self, record: Prepared, exc: Exception) -> None:
        _log.error("run %s: episode %s is recorded, but the summary cannot count it: %s",
                   self._id, record.episode_id, describe_error(exc))

    def _closed_error(self) -> RunClosedError:
        if self._state.status == CLOSING:
            return RunClosedError(f"run {self._id} is being finished; it takes no more episodes")
        return RunClosedError(f"run {self._id} is already {self._state.status}; it takes no more episodes")

    # -- ending the run -------------------------------------------------------------------

    def finish(self, summary: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Seal the run ``completed``; returns the summary sealed with it.

        Without ``summary``, the summary of every episode of the run is computed from what
        was logged (no re-read). From the moment it starts, new appends are refused with
        :class:`RunClosedError`; it waits only for those already admitted, so it returns
        however busy other threads keep the run, and the summary and the seal cover exactly
        the durable episodes. Idempotent: once the run is sealed (either way), returns what
        was sealed and does nothing else. In a forked child it raises :class:`RunForkedError`.
        """
        self._ownership.check(self._id)
        if getattr(self._state.inside, "append", False):
            raise self._state.reentered(self._id, "finish")
        return self._ending.finish(summary)

    def abort(self, error: BaseException | str, *, status: str | None = None) -> None:
        """Seal the run ``failed``, or ``cancelled`` for an interrupt or a cancellation.

        The error is recorded as one line: ``Type: message``, truncated, or
        ``interrupted`` for a cancellation (as prime-runs 0.1.4 records it). ``status`` (a
        seal status other than ``completed``) overrides the choice when the caller knows how
        the run ended better than the error's type says (``prime-runs import`` reads it from
        the eval's outputs); the error is then recorded as given. Never raises on
        the way out of a failing eval: a seal that cannot be written is logged (the reader
        then sees the segment unsealed, i.e. crashed). Idempotent, and a no-op after
        :meth:`finish` and in a forked child (the run is its parent's).
        """
        if status is not None and (status == COMPLETED or status not in SEAL_STATUSES):
            raise ValueError(f"abort seals one of {[s for s in SEAL_STATUSES if s != COMPLETED]}, not {status!r}")
        if status is None:
            status, line = seal_status_for(error), seal_error_for(error)
        else:
            line = describe_error(error)
        if getattr(self._state.inside, "append", False):  # a handler's: sealed once the interrupted append ends
            self._state.inside.deferred = (status, scrub_text(line, self._error_forms))
        else:
            self._ending.close_without_finishing(status, scrub_text(line, self._error_forms))

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._ownership.forked:  # a forked child leaving the block: the run is its parent's
            return
        if exc is None:
            self.finish()
        else:
            self.abort(exc)

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickle, copy and deepcopy all ask this
        raise self._ownership.not_copyable(self._id)

    def __repr__(self) -> str:
        return f"Run(id={self._id!r}, mode={self._mode!r}, status={self.status!r}, dir={str(self._dir)!r})"


def open_run(
    run_dir: str | os.PathLike[str],
    *,
    name: str,
    environments: Sequence[str] = (),
    model: str | None = None,
    framework: str = "verifiers",
    config: Any = None,
    config_file: str | os.PathLike[str] | None = None,
    num_examples: int | None = None,
    rollouts_per_example: int | None = None,
    run_id: str | None = None,
    mode: str | None = None,
    mask_rules: ExtraRules = None,
    created_at: dt.datetime | str | None = None,
    ship_timeout: float | None = None,
    supersedes: Sequence[str] = (),
    platform_runs: Sequence[str] = (),
    past_damage: bool = False,
    recovers: Cut | None = None,
) -> Run:
    """Open (or resume) the run in ``run_dir`` and write its manifest before anything else.

    ``config`` is a pydantic model or a mapping; only the fields somebody set are recorded,
    with every credential table masked. ``config_file`` is the ``@`` file the run was
    launched from: recorded, comments dropped, only when it sets no credential location.
    ``mask_rules`` adds a producer's own locations (docs/masking.md), matched against the
    config and against every episode record.

    ``mode`` (else ``PRIME_RUNS_MODE``, else ``offline``): ``offline`` writes the spool;
    ``online`` does too and ships it in the background while the run goes on (a child
    ``prime-runs sync --follow``; docs/integration.md); ``disabled`` writes nothing and
    gives the same object, with a locally issued id. ``ship_timeout`` (else
    ``PRIME_RUNS_SHIP_TIMEOUT``, else 30 s): how long ``finish``/``abort`` let the online
    shipper drain before stopping it.

    When ``run_dir`` already holds a spool, this continues that run: same id (a different
    ``run_id`` is an error), a new segment whose manifest record carries ``"resumed": true``
    and what this process was opened with, episode ids already recorded skipped, rollout
    numbers and the summary continued. ``supersedes``: episode ids of the spool that this
    resume replaces (verifiers' ``--resume`` re-runs their slots; content/supersede.py);
    listed in the new segment's manifest record, left out of the summary from then on.
    ``platform_runs``: platform run ids already holding episodes this segment records
    (what vf-eval pushed on its own; content/platform_runs.py), listed in its manifest.
    ``past_damage``: continue a spool that is damaged, after the damage, counting only what
    a reader can read (runner/resume.py); the importer's alone, to add what a spool cut
    short lost (importer/outputs.py). Its damaged bytes stay as they are, still reported.
    ``recovers``: the cut whose lost episodes this segment holds, named in its manifest
    (content/recovers.py), so that a sync that read them before the cut never ships them twice.
    """
    mode = resolve_mode(mode)
    run_dir = Path(run_dir)
    extra = extra_rules(mask_rules)
    episode_rules = MaskRules.defaults_for_episode().extended(extra) if extra else MaskRules.defaults_for_episode()

    superseded = frozenset(supersedes)
    prior = scan_prior_run(run_dir, superseded, past_damage=past_damage) if writes_spool(mode) else PriorRun()
    if prior.run_id is not None and run_id is not None and run_id != prior.run_id:
        raise RunMismatchError(
            f"{run_dir} holds run {prior.run_id}, not {run_id}; "
            "resume it without a run id, or use another run directory"
        )
    run_id = prior.run_id or run_id or str(uuid.uuid4())
    resumed = prior.manifest is not None

    manifest, warnings = build_manifest(
        run_id=run_id,
        name=name,
        environments=environments,
        model=model,
        framework=framework,
        config=config,
        config_file=config_file,
        num_examples=num_examples,
        rollouts_per_example=rollouts_per_example,
        created_at=created_at,
        extra_rules=extra,
    )
    for warning in warnings:  # a launch file kept out of the manifest is a note: the run is whole
        _log.log(logging.INFO if is_config_source_note(warning) else logging.WARNING,
                 "run %s: %s", run_id, warning)
    # A resumed spool's own id is a local one (or already listed by its first segment).
    platform_runs = [run for run in dict.fromkeys(platform_runs) if run != prior.run_id]
    if platform_runs:
        manifest[PLATFORM_RUNS_KEY] = platform_runs
    if resumed:
        manifest["resumed"] = True
        if supersedes:
            manifest[SUPERSEDES_KEY] = sorted(superseded & prior.episode_ids)
        if recovers is not None:
            manifest[RECOVERS_KEY] = recovers.as_manifest()

    writer = None
    if mode != DISABLED:
        # Serialized first: a manifest refused after the segment was made (a name that is not
        # UTF-8) left a segment without one, a run no sync could ever send.
        manifest_payload = prepare(manifest, MANIFEST)
        try:
            writer = SegmentWriter.create(run_dir, run_id, expected_last=prior.last_index,
                                          prior_episodes=prior.episode_lines)
        except OSError as exc:  # out of descriptors: said with the runs this process holds open
            raise out_of_descriptors(exc)
        try:
            writer.append(MANIFEST, manifest_payload)
        except BaseException:
            writer.close()
            raise
    run = Run(
        run_id=run_id,
        run_dir=run_dir,
        mode=mode,
        manifest=prior.manifest if resumed else manifest,
        resumed=resumed,
        writer=writer,
        prior=prior,
        episode_rules=episode_rules,
        error_forms=error_forms(masked_config_values(config, extra)) if config is not None else [],
    )
    if writer is not None:
        remember(run._ending)
        if mode == ONLINE:
            run._shipping.start(ship_timeout)
    return run


