"""A batch's request body (sync/rows.py, ``Batch``) is exactly the envelope around its rows,
whatever buffer it is built in: a fresh one, or a large one reused from an earlier batch
that still holds that batch's bytes, longer or shorter than the new body."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

import prime_runs_spool.sync.rows as rows_module
from prime_runs_spool.sync.rows import Batch, Row
from prime_runs_spool.sync.state import Cursor

_rows = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=25)


def _fill(rows: list[bytes]) -> Batch:
    batch = Batch()
    for number, data in enumerate(rows):
        batch.add(Row(data, number, Cursor(segment_index=1, offset=number, next_seq=number), True))
    return batch


def _expected(rows: list[bytes]) -> bytes:
    return b'{"samples":[' + b",".join(rows) + b"]}"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_rows, min_size=1, max_size=4), spare=st.binary(max_size=2_000),
       large=st.integers(0, 600))
def test_every_body_is_its_rows_in_the_envelope_in_a_fresh_or_reused_buffer(
        monkeypatch, batches: list[list[bytes]], spare: bytes, large: int) -> None:
    spares = rows_module._SpareBodies()
    spares.give(bytearray(spare))  # a buffer an earlier batch left behind, its bytes still in it
    spares.in_use = 0
    monkeypatch.setattr(rows_module, "SPARE_BODIES", spares)
    monkeypatch.setattr(rows_module, "LARGE_BODY", large)  # past it, a batch takes a spare buffer
    for rows in batches:
        batch = _fill(rows)
        assert batch.size == len(_expected(rows))
        body = batch.body()
        assert bytes(body) == _expected(rows)
        del body
        batch.release()
