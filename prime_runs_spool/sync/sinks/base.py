"""The contract every sink keeps, and what a pass gives a sink (docs/sync.md, "Sinks").

A *sink* is where a run's episodes go on a destination: the legacy samples table
(``samples``), Prime Traces (``traces``), or any other registered beside them
(sync/sinks/registry.py). The pass (sync/engine.py) drives every sink through the same steps
and knows none of them in particular:

1. :meth:`Sink.settle`, before anything is pushed: settle the batch the state announces
   for this sink, and check the state against what the sink holds. False: nothing to push.
2. The push loop: :meth:`Sink.stream` from the state's cursor, cut by :meth:`Sink.batches`;
   each batch with something in it goes through :meth:`Sink.send`, which announces it in
   the state before it leaves and moves the state past it once it is committed. A batch
   with nothing in it only moves the cursor past records that give nothing (the pass's one
   rule for those, docs/sync.md, "Records that give nothing").
3. The run's end: a completed run's :meth:`Sink.held_batches`, each sent the same way, then
   :meth:`Sink.before_finalize`.

A sink sees a :class:`PassContext` (the state through the protocol, the client, the report,
the options, what the pass read of the spool), never the pass itself: nothing here can call
back into the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol as Shape

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.records import held_episodes
from prime_runs_spool.sync.state import Cursor, SyncState

#: The run id a dry run stamps on what it counts, before the run has an evaluation.
DRY_RUN_ID = "dry-run"


@dataclass
class PassContext:
    """What a pass gives the sink it drives. ``manifest``, ``superseded`` and ``remask`` are
    filled in by the pass once it has read the spool's manifests, before any sink reads."""

    run_dir: Path
    #: The exactly-once core: the state file, announcing, settling, fencing, retrying.
    protocol: Protocol
    client: PlatformClient
    report: RunReport
    options: SyncOptions
    #: Tells the pass's progress callback that the report changed.
    show: Callable[[], None]
    manifest: dict[str, Any] = field(default_factory=dict)
    #: Episode ids a resumed segment superseded: they never go anywhere.
    superseded: frozenset[str] = frozenset()
    #: The spool was written under older masking rules: every episode is masked again.
    remask: bool = False
    #: Then, what the run's error line is cleared of (content/remask.py, ``error_forms_of``).
    error_forms: list[str] = field(default_factory=list)
    #: Whether each sink asked this pass is available, None for no answer (sync/sinks/choice.py):
    #: ``auto``'s probe before the create answers its push too.
    available: dict[str, bool | None] = field(default_factory=dict)
    #: The run's segments as the pass listed them to read their manifests, for the first
    #: stream to read by (:meth:`take_listing`): its superseded episodes are those manifests'.
    listing: list[tuple[int, Path]] | None = None

    def take_listing(self) -> list[tuple[int, Path]] | None:
        """The pass's listing, once: the first stream reads the segments whose manifests the
        pass read; a later one (the pass reads again, a writer still appending) lists anew."""
        listing, self.listing = self.listing, None
        return listing

    @property
    def state(self) -> SyncState:
        return self.protocol.state

    @property
    def run_id(self) -> str:
        """The platform's id of the run (the evaluation's), stamped on what is sent."""
        evaluation_id = self.state.evaluation_id
        return DRY_RUN_ID if evaluation_id is None else str(evaluation_id)

    def held(self) -> Iterator[Any]:
        """The errored episodes a completed run releases, not yet released, in spool order
        (sync/records.py, ``held_episodes``)."""
        return held_episodes(self.run_dir, self.superseded, set(self.state.released),
                             skip_corrupt=self.options.skip_corrupt, remask=self.remask)


@dataclass(frozen=True)
class StateOrigin:
    """How the pass came by the state it hands the sink, which says how far to trust it."""

    #: No state file: this pass starts one.
    fresh: bool
    #: The file was damaged and set aside.
    untrusted: bool
    #: The evaluation was found on the platform rather than known or created now.
    adopted: bool
    #: Another copy of the spool may have pushed to the evaluation since the state was written.
    foreign: bool


class SinkStream(Shape):
    """What :meth:`Sink.stream` returns: the run's items from the state's cursor. After
    iteration, ``cursor`` is where reading ended and ``seal`` the seal that ends the log
    (None while unsealed); ``skipped`` lists corruption passed over (``--skip-corrupt``),
    ``too_large`` the episodes no request can carry."""

    cursor: Cursor | None
    seal: dict[str, Any] | None
    skipped: list[dict[str, Any]]
    too_large: list[dict[str, Any]]

    def __iter__(self) -> Iterator[Any]: ...


class SinkBatch(Shape):
    """What :meth:`Sink.batches` yields: ``count`` things to send (what the report counts:
    rows for samples, episodes for Prime Traces; 0 for a batch that only moves the cursor
    to ``end``, past ``seal``), ``size`` bytes of them."""

    count: int
    end: Cursor | None
    seal: dict[str, Any] | None

    @property
    def size(self) -> int: ...

    def release(self) -> None:
        """Drop what the batch holds (its body, its large-body token) once sent or given up."""


class Sink(ABC):
    """One destination's place for a run's episodes. Subclasses set ``name`` (what the state
    file records, and the in-flight kind its batches are announced under) and ``title``
    (how messages name it), and register themselves (sync/sinks/registry.py)."""

    name: ClassVar[str]
    title: ClassVar[str]

    def __init__(self, context: PassContext) -> None:
        self.context = context

    @property
    def state(self) -> SyncState:
        return self.context.protocol.state

    # -- which sink ------------------------------------------------------------------------

    @classmethod
    def used_by(cls, state: SyncState) -> bool:
        """Whether a state that names no sink (written before the choice was recorded)
        shows that this one received the run's episodes."""
        return False

    @classmethod
    def pushed_total(cls, state: SyncState) -> int:
        """What the report counts as on the platform, in this sink's unit."""
        return state.episodes_pushed

    def available(self) -> bool | None:
        """Whether the account has this sink: asked before ``auto`` tries it, so an account
        without it costs one cheap read, never a batch. None: no answer about the account
        (taken as yes, and left for the first batch to tell)."""
        return True

    #: Whether :meth:`holds_run` saying no is the whole truth once this machine's copies
    #: of the run had their requests waited out (engine.py, ``_fence_other_copy``): a
    #: count, which nothing announced elsewhere can still add to. A listing is not (a batch
    #: in doubt may commit behind it), nor an answer that cannot be read.
    counts_what_it_holds: ClassVar[bool] = False

    def holds_run(self) -> bool:
        """Whether the sink holds episodes of the run's evaluation, found again with its
        state lost (so a choice that cannot be read from the state is read here)."""
        return False

    def in_doubt(self) -> bool:
        """Whether the batch the state announces for this sink may have been committed there
        with no answer saying so: sent, its answer lost, or announced by an earlier pass,
        which may have sent it. Such a batch counts as committed: the run goes nowhere else,
        and the announcement is kept until an answer settles it."""
        pending = self.state.in_flight
        return pending is not None and pending.kind == self.name

    def refuse_if_committed(self, reason: Exception) -> None:
        """The sink turned out unavailable (``reason``) mid-pass: raise SyncError if any of
        the run's batches were committed there, or may have been (:meth:`in_doubt`): the run
        stays where it is."""

    # -- pushing -----------------------------------------------------------------------------

    def another_copy_pushed(self) -> None:
        """Another copy of the spool may have pushed since the state was written: make the
        batch the state announces safe to forget (its count alone no longer tells whether it
        landed). Called before the evaluation is looked for again."""

    def settle(self, origin: StateOrigin) -> bool:
        """Settle the batch the state announces and check the state against the sink, before
        the push loop. False: nothing is to be pushed (the report says why)."""
        return True

    @abstractmethod
    def stream(self) -> SinkStream:
        """The run's items from the state's cursor (carrying on past the state's seal)."""

    @abstractmethod
    def batches(self, stream: SinkStream) -> Iterator[SinkBatch]:
        """``stream`` cut into batches, the last one past whatever follows the last item."""

    @abstractmethod
    def held_batches(self) -> Iterator[SinkBatch]:
        """The batches releasing a completed run's held-back episodes (``context.held()``),
        each carrying their ids so :meth:`send` records them as released."""

    @abstractmethod
    def send(self, batch: SinkBatch) -> None:
        """Send one batch exactly once: announce it, send it, settle it, and move the state
        (and the report) past it."""

    def before_finalize(self, answer: Mapping[str, Any] | None) -> None:
        """A last check before the evaluation is finalized; ``answer``: the metadata PUT's."""
