"""The read-ahead thread of a push (sync/rows.py, ``read_ahead``): the next batch is built
while the platform works on the one on the wire, never while the consumer announces and
sends it: built meanwhile, it made each state write before a 25 MiB request take 20-60 ms
(Dec 1, benchmarks/sync_timeline.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from prime_runs_spool.sync.rows import ON_WIRE_WAIT, Batch, Row, read_ahead
from prime_runs_spool.sync.state import Cursor


def _batch(number: int) -> Batch:
    batch = Batch()
    batch.add(Row(b'{"n":%d}' % number, number, Cursor(segment_index=1, offset=number, next_seq=number), True))
    return batch


def test_the_next_batch_is_built_only_once_the_one_handed_over_is_on_the_wire() -> None:
    built: list[int] = []
    second = threading.Event()

    def produce() -> Iterator[Batch]:
        for number in range(3):
            built.append(number)
            if number == 1:
                second.set()
            yield _batch(number)

    got = []
    for batch in read_ahead(produce()):
        got.append(batch.count)
        if len(got) == 1:
            assert not second.wait(ON_WIRE_WAIT / 2), "built while the first batch was not sent yet"
            assert built == [0]
            batch.sent()
            assert second.wait(5), "not built once the first batch was on the wire"
        else:
            batch.sent()
        batch.release()
    assert built == [0, 1, 2] and got == [1, 1, 1]


def test_a_batch_released_unsent_lets_the_next_one_be_built() -> None:
    """A request that failed before its body went out still lets the producer go on (the
    batch is released), and a consumer that stops early stops the producer."""
    def produce() -> Iterator[Batch]:
        for number in range(3):
            yield _batch(number)

    items = read_ahead(produce())
    start = time.monotonic()
    first = next(items)
    first.release()
    second = next(items)
    assert time.monotonic() - start < 5
    items.close()  # the producer waits for the second batch to be sent: it must not hang
    second.release()


def test_an_error_after_a_sent_batch_still_arrives() -> None:
    def produce() -> Iterator[Batch]:
        yield _batch(0)
        raise ValueError("broken")

    items = read_ahead(produce())
    first = next(items)
    first.sent()
    with pytest.raises(ValueError, match="broken"):
        next(items)


def test_a_body_still_going_out_does_not_hold_the_next_batch_for_long() -> None:
    """A slow upload (a remote platform): the next batch is built alongside it after
    ON_WIRE_WAIT, not only after the whole body went out."""
    built = threading.Event()

    def produce() -> Iterator[Batch]:
        yield _batch(0)
        built.set()
        yield _batch(1)

    items = read_ahead(produce())
    first = next(items)  # never marked sent
    start = time.monotonic()
    assert built.wait(5)
    assert time.monotonic() - start >= ON_WIRE_WAIT * 0.9
    first.release()
    next(items).release()
    items.close()
