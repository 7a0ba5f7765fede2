"""Reconciling the samples the state remembers with the samples the platform holds.

Our rows are always appended in order, so the count of rows on the platform says exactly
how far the stream got; the last row's id is checked so the count can be trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prime_runs_spool.errors import SyncError
from prime_runs_spool.spool.format import COMPLETED
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync.protocol import Protocol
from prime_runs_spool.sync.rows import RowStream, skip_rows


class Reconciler:
    """Answers "which of our samples are on the platform?" and moves the state to match."""

    def __init__(self, protocol: Protocol, client: PlatformClient, stream: Callable[[], RowStream],
                 released: Callable[[], Iterator[tuple[str, Any, bool]]] = lambda: iter(())) -> None:
        self.protocol = protocol
        self.client = client
        #: The run's row stream from the state's cursor (the engine's, so both read alike).
        self.stream = stream
        #: The rows a completed run's held-back episodes are released as, after the stream's
        #: (docs/sync.md, "Resumed runs"): ``(episode id, sample id, closes the episode)``.
        self.released = released

    def total_samples(self) -> int:
        state = self.protocol.state
        evaluation = self.protocol.retry("reading the evaluation", lambda: self.client.get_evaluation(
            str(state.evaluation_id)))
        return int(evaluation.get("total_samples") or 0)

    def reconcile(self, *, force: bool) -> None:
        """Settle an announced samples request, or (``force``) re-derive the cursor from
        what the platform holds: our rows are always appended in order, so the count of
        rows on the platform says exactly how far the stream got."""
        protocol = self.protocol
        state = protocol.state
        pending = state.in_flight if state.in_flight and state.in_flight.kind == "samples" else None
        if pending is None and not force:
            return
        if pending is not None and pending.end is not None:
            if protocol.settled(pending.sent_at, lambda: self.samples_landed(pending.rows)):
                protocol.acknowledge(pending.end, pending.rows, pending.episodes, pending.seal)
                return
        total = self.total_samples()
        missing = total - state.samples_pushed
        if missing < 0:
            raise SyncError(
                f"the platform holds {total} samples of evaluation {state.evaluation_id}, fewer than the "
                f"{state.samples_pushed} this sync recorded; refusing to guess (use --replay for a new evaluation)")
        if missing:
            stream = self.stream()
            cursor, episodes, last_id, seen = skip_rows(stream, missing, partial=True)
            if seen < missing:
                last_id = self._skip_released(stream, missing - seen, last_id)
            self._check_last_sample(total, last_id)
            assert cursor is not None
            state.advance(cursor, seen, episodes, stream.seal if seen < missing else None)
            if seen < missing:
                state.samples_pushed += missing - seen
        state.in_flight = None
        protocol.save()

    def _skip_released(self, stream: RowStream, count: int, last_id: Any) -> Any:
        """The platform holds ``count`` rows past the stream's end: a completed run's
        released episodes (pushed after the stream's rows, in their order). Record them as
        released; anything else is a platform that does not match this spool."""
        state = self.protocol.state
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
                    raise SyncError("the platform holds part of a held-back episode's rows; refusing to "
                                    "guess (use --replay for a new evaluation)")
                state.released = [*state.released, *closed]
                state.episodes_pushed += len(closed)
                return last_id
        raise SyncError(f"the platform holds {count} rows more than this spool has to give")

    def samples_landed(self, rows: int) -> bool:
        """Whether the announced request of ``rows`` rows is on the platform; any count but
        "all of them" or "none of them" means the platform is not what we think it is."""
        state = self.protocol.state
        total = self.total_samples()
        if total == state.samples_pushed + rows:
            return True
        if total == state.samples_pushed:
            return False
        raise SyncError(
            f"evaluation {state.evaluation_id} holds {total} samples; expected "
            f"{state.samples_pushed} or {state.samples_pushed + rows}: refusing to guess")

    def _check_last_sample(self, total: int, expected_id: Any) -> None:
        """The row at index ``total - 1`` on the platform must be ours: if it is not, the
        count cannot be trusted to say what landed."""
        evaluation_id = str(self.protocol.state.evaluation_id)
        limit = 100
        page = (total - 1) // limit + 1
        listing = self.protocol.retry("reading samples", lambda: self.client.list_samples(
            evaluation_id, page=page, limit=limit))
        samples = listing.get("samples") or []
        index = (total - 1) % limit
        found = samples[index].get("sample_id") if index < len(samples) else None
        if found != expected_id:
            raise SyncError(
                f"evaluation {evaluation_id} holds samples that do not match this spool "
                f"(sample {total} is {found!r}, expected {expected_id!r}); refusing to guess "
                "(use --replay for a new evaluation)")
