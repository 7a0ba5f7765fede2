"""Reconciling the samples the state remembers with the samples the platform holds.

Our rows are always appended in order, so the count of rows on the platform says exactly
how far the stream got; the last row's id is checked so the count can be trusted. One
writer of the run appends them in another order: an import of outputs plain vf-eval wrote,
whose run ``prime-runs eval --resume`` continues in a spool of its own, logging the kept
episodes in the order verifiers' resume rewrote them (grouped by task). So where the last
row differs, the rows are compared as a multiset of sample ids: the platform holding
exactly the stream's first rows in another order is those rows, and the rest of the stream
is what it lacks (docs/sync.md, "Runs continued by plain vf-eval"). The
state file is only ever a cache of that: one read from disk is checked before it is
trusted (:meth:`Reconciler.verify`), a disagreement is settled by deriving the cursor again
from the platform's count, and a platform holding rows the stream cannot account for is a
:class:`SampleCountMismatchError`, never guessed past (docs/sync.md, "State" and "When an
assumption fails").
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prime_runs_spool.errors import RequestFailedError, SampleCountMismatchError, SyncError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.spool.format import COMPLETED
from prime_runs_spool.sync.options import SAMPLES
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.replay import replay_option
from prime_runs_spool.sync.rows import RowStream, skip_rows
from prime_runs_spool.sync.state import FINALIZE

#: The evaluation status of a finalized evaluation.
COMPLETED_STATUS = "COMPLETED"

#: Rows a read of the platform's samples asks for at once.
SAMPLES_PAGE = 100


def rows_in_pages(read_page: Callable[[int], list[Any]], first: int, last: int,
                  limit: int = SAMPLES_PAGE) -> Iterator[Any]:
    """The platform's rows ``first``..``last`` (1-based, inclusive), read a page of ``limit``
    at a time through ``read_page(page)``, so no more than one page is held; ends early
    where a page comes back short."""
    number = first
    while number <= last:
        page = (number - 1) // limit + 1
        rows = read_page(page)
        index = (number - 1) % limit
        if index >= len(rows):
            return
        for row in rows[index:index + last - number + 1]:
            yield row
            number += 1
        if len(rows) < limit:
            return


def same_rows(ours: Iterable[Any], theirs: Iterable[Any]) -> bool:
    """Whether two runs of sample ids hold the same ids as often, in any order. An id that
    is None identifies nothing, so it never matches."""
    counted: Counter[Any] = Counter()
    for sample_id in ours:
        if sample_id is None:
            return False
        counted[sample_id] += 1
    for sample_id in theirs:
        if not counted[sample_id]:
            return False
        counted[sample_id] -= 1
    return not +counted


class Reconciler:
    """Answers "which of our samples are on the platform?" and moves the state to match."""

    def __init__(self, protocol: Protocol, client: PlatformClient, stream: Callable[[], RowStream],
                 stream_from_start: Callable[[], RowStream],
                 released: Callable[[], Iterator[tuple[str, Any, bool]]] = lambda: iter(())) -> None:
        self.protocol = protocol
        self.client = client
        #: The run's row stream from the state's cursor (the engine's, so both read alike).
        self.stream = stream
        #: The same stream from the run's first row.
        self.stream_from_start = stream_from_start
        #: The rows a completed run's held-back episodes are released as, after the stream's
        #: (docs/sync.md, "Resumed runs"): ``(episode id, sample id, closes the episode)``.
        self.released = released

    def evaluation(self) -> dict[str, Any]:
        state = self.protocol.state
        return self.protocol.retry("reading the evaluation", lambda: self.client.get_evaluation(
            str(state.evaluation_id)))

    def total_samples(self) -> int:
        return int(self.evaluation().get("total_samples") or 0)

    def reconcile(self, *, force: bool) -> None:
        """Settle an announced samples request, or (``force``) re-derive the cursor from
        what the platform holds: our rows are always appended in order, so the count of
        rows on the platform says exactly how far the stream got."""
        protocol = self.protocol
        state = protocol.state
        pending = state.in_flight if state.in_flight and state.in_flight.kind == SAMPLES else None
        if pending is None and not force:
            return
        if pending is not None and pending.end is not None:
            if protocol.settled(pending.sent_at, lambda: self.samples_landed(pending.rows)):
                protocol.acknowledge(pending.end, pending.rows, pending.episodes, pending.seal,
                                     pending.last_sample_id)
                return
        evaluation = self.evaluation()
        total = int(evaluation.get("total_samples") or 0)
        if force and str(evaluation.get("status", "")).upper() == COMPLETED_STATUS:
            # Found, not created: the listing it was found in (read once per sync, with this
            # sync's own creates) may predate another copy's finalize. Never a second one.
            state.finalized = True
        missing = total - state.samples_pushed
        if missing > 0:
            try:
                self._take(self.stream, missing, total)
                missing = 0
            except RequestFailedError:
                raise  # the platform could not be read: nothing is known, the pass fails
            except SyncError:
                pass  # not from the cursor: derived again from the start below
        if missing:
            self.rederive(total)
        state.in_flight = None
        protocol.save()

    def _take(self, stream_at: Callable[[], RowStream], count: int, total: int) -> None:
        """Acknowledge ``count`` rows the platform holds past the state (its last one the
        platform's row ``total``): the stream's rows from its cursor, then, past a completed
        run's end, its released held-back episodes in release order. ``stream_at`` opens the
        stream there (twice when the platform's last row is not the stream's: the rows are
        then compared in any order, :meth:`reordered`). Raises SyncError (a
        :class:`SampleCountMismatchError` for rows that are not ours) if the spool cannot
        account for them; the state is changed only when it can."""
        state = self.protocol.state
        stream = stream_at()
        cursor, episodes, last_id, seen = skip_rows(stream, count, partial=True)
        closed: list[str] = []
        if seen < count:
            last_id, closed = self._skip_released(stream, count - seen, last_id)
        found = self.platform_sample_id(total)
        if found != last_id:
            if seen < count or not self.reordered(stream_at(), count, total):
                raise self.mismatch(total, f"the platform's sample {total} is {found!r}, the spool's {last_id!r}, "
                                           "and its samples are not the spool's in another order")
            last_id = found  # what the platform's last row is, as verify() reads it
        assert cursor is not None
        state.advance(cursor, seen, episodes, stream.seal if seen < count else None)
        state.last_sample_id = last_id
        if seen < count:
            state.samples_pushed += count - seen
            state.released = [*state.released, *closed]
            state.episodes_pushed += len(closed)

    def _skip_released(self, stream: RowStream, count: int, last_id: Any) -> tuple[Any, list[str]]:
        """The platform holds ``count`` rows past the stream's end: a completed run's
        released episodes (pushed after the stream's rows, in their order). Returns the last
        one's sample id and the episodes they close; anything else is a platform that does
        not match this spool (SyncError)."""
        if not (stream.seal and stream.seal.get("status") == COMPLETED):
            raise SyncError(f"the platform holds {count} rows more than this spool has to give")
        seen, closed = 0, []
        for episode_id, sample_id, closes in self.released():
            seen += 1
            last_id = sample_id
            if closes:
                closed.append(episode_id)
            if seen == count:
                if not closes:
                    raise SyncError("the platform holds part of a held-back episode's rows")
                return last_id, closed
        raise SyncError(f"the platform holds {count} rows more than this spool has to give")

    def verify(self) -> bool:
        """Check a state read from disk against the platform before anything is pushed: the
        evaluation's ``status`` against ``finalized``, ``total_samples`` against
        ``samples_pushed`` and the platform's last row against ``last_sample_id``. Where
        they disagree the platform wins. Returns True when the state had to be changed."""
        protocol = self.protocol
        state = protocol.state
        evaluation = self.evaluation()
        total = int(evaluation.get("total_samples") or 0)
        completed = str(evaluation.get("status", "")).upper() == COMPLETED_STATUS
        changed = False
        if completed != state.finalized:
            state.finalized = completed  # never a second finalize; never a finalize skipped
            if completed and state.in_flight is not None and state.in_flight.kind == FINALIZE:
                state.in_flight = None
            if not completed:
                state.terminal = state.terminal_size = state.terminal_version = None
            changed = True
        if state.in_flight is None or state.in_flight.kind != SAMPLES:
            if state.released:
                # Held-back episodes went after the stream's rows (docs/sync.md, "Resumed runs"),
                # with no sample id kept: the count is checked, and derived again if it differs.
                if total != state.samples_pushed:
                    self.rederive(total)
                    changed = True
            elif total != state.samples_pushed or (total and self.platform_sample_id(total) != state.last_sample_id):
                self.rederive(total)
                changed = True
            elif state.mismatch is not None:
                state.mismatch = None  # the platform agrees again (the evaluation was repaired)
                changed = True
        if changed:
            protocol.save()
        return changed

    def behind(self, total: int) -> int | None:
        """This spool's rows, when it is an earlier copy of the run than the one that pushed
        the platform's ``total`` rows (a CI artifact taken before the run ended, synced after
        the whole run was): the platform's first rows are exactly this spool's, the spool
        ends before a ``completed`` seal, and the platform's last row is none of this
        spool's (a late commit repeats one of ours: that is a mismatch). Else None."""
        stream = self.stream_from_start()
        ids: set[Any] = set()
        seen, last_id = 0, None
        for row in stream.rows():
            seen += 1
            ids.add(row.sample_id)
            last_id = row.sample_id
            if seen >= total:
                return None
        if not seen or (stream.seal or {}).get("status") == COMPLETED:
            return None
        if self.platform_sample_id(seen) != last_id or self.platform_sample_id(total) in ids:
            return None
        return seen

    def rederive(self, total: int) -> None:
        """Set the state to "the platform holds the run's first ``total`` rows" (the
        stream's from its start, then any released held-back episodes), checked against the
        platform's last row; raise :class:`SampleCountMismatchError`, the state untouched,
        if the spool cannot account for them. Not saved."""
        state = self.protocol.state
        before = copy.deepcopy(state)
        state.cursor, state.segments, state.seal = None, {}, None
        state.samples_pushed = state.episodes_pushed = 0
        state.last_sample_id = None
        state.released = []
        state.terminal = state.terminal_size = state.terminal_version = None
        if not total:
            return
        try:
            self._take(self.stream_from_start, total, total)
        except SyncError as exc:
            for item in dataclasses.fields(state):
                setattr(state, item.name, getattr(before, item.name))
            if isinstance(exc, (SampleCountMismatchError, RequestFailedError)):
                raise  # a request that failed is no verdict on the platform's rows
            raise self.mismatch(total, str(exc)) from None

    def check(self, when: str, evaluation: Mapping[str, Any] | None = None) -> None:
        """One read: the platform must hold exactly the rows the state acknowledged.
        ``evaluation``: an answer the platform just gave with the evaluation in it (the
        metadata PUT's, before finalizing); its ``total_samples`` is that read, when it
        carries one (the docs promise it only of ``GET /evaluations/{id}``), else the GET is
        made."""
        known = (evaluation or {}).get("total_samples")
        total = known if isinstance(known, int) and not isinstance(known, bool) else self.total_samples()
        if total != self.protocol.state.samples_pushed:
            raise self.mismatch(total, f"found {when}")

    def mismatch(self, total: int, detail: str) -> SampleCountMismatchError:
        state = self.protocol.state
        return SampleCountMismatchError(state.evaluation_id, total, state.samples_pushed, detail,
                                        replay_option(state.replay_id))

    def samples_landed(self, rows: int) -> bool:
        """Whether the announced request of ``rows`` rows is on the platform; any count but
        "all of them" or "none of them" means the platform is not what we think it is."""
        state = self.protocol.state
        total = self.total_samples()
        if total == state.samples_pushed + rows:
            return True
        if total == state.samples_pushed:
            return False
        raise self.mismatch(total, f"expected {state.samples_pushed} or {state.samples_pushed + rows}")

    def reordered(self, stream: RowStream, count: int, total: int) -> bool:
        """Whether the platform's rows ``total - count + 1``..``total`` are the stream's next
        ``count`` rows in another order (same sample ids, each as often). One streaming read
        of the spool and of the platform's pages; only the ids are held, for one pass."""
        ours = (row.sample_id for _, row in zip(range(count), stream.rows()))
        return same_rows(ours, self.platform_sample_ids(total - count + 1, total))

    def platform_sample_ids(self, first: int, last: int) -> Iterator[Any]:
        """The sample ids of the platform's rows ``first``..``last`` (1-based), page by page."""
        return (row.get("sample_id") if isinstance(row, Mapping) else None
                for row in rows_in_pages(self._samples_page, first, last))

    def _samples_page(self, page: int) -> list[Any]:
        evaluation_id = str(self.protocol.state.evaluation_id)
        listing = self.protocol.retry("reading samples", lambda: self.client.list_samples(
            evaluation_id, page=page, limit=SAMPLES_PAGE))
        return list(listing.get("samples") or [])

    def platform_sample_id(self, total: int) -> Any:
        """The sample id of the platform's row number ``total`` (1-based), or None."""
        return next(self.platform_sample_ids(total, total), None)
