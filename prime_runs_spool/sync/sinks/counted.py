"""What a run's sink would be sent, counted and never sent: ``--dry-run``'s figures, and the
rows a run yields to a state that starts from nothing, every one of which an evaluation found
finalized must hold before a lost state's wait is passed over (sync/evaluation.py,
``Evaluation.ensure``)."""

from __future__ import annotations

from collections.abc import Iterator

from prime_runs_spool.spool.format import COMPLETED
from prime_runs_spool.sync.options import SAMPLES
from prime_runs_spool.sync.sinks.base import PassContext, Sink
from prime_runs_spool.sync.sinks.choice import make


def unsent(sink: Sink) -> Iterator[tuple[int, int]]:
    """The items (in ``sink``'s unit) and bytes of each batch the push loop would send it from
    the state's cursor, then of each a completed run releases: the batches it would cut, each
    released once counted, so a count holds one batch at a time, as a push does. One by one,
    so a run that turns out damaged part way has what came before it counted."""
    stream = sink.stream()
    for batch in sink.batches(stream):
        try:
            yield batch.count, batch.size if batch.count else 0
        finally:
            batch.release()
    if stream.seal is not None and stream.seal.get("status") == COMPLETED:
        for batch in sink.held_batches():
            try:
                yield batch.count, batch.size
            finally:
                batch.release()


def rows_yielded(context: PassContext) -> int:
    """Every row the run yields, as the samples sink would push them to a state that starts
    from nothing (the pass's, whose state was lost): what the platform's ``total_samples``
    counts. The run is read, and its rows built, once."""
    return sum(count for count, _ in unsent(make(SAMPLES, context)))
