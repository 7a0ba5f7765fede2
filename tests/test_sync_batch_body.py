"""A batch's request body (sync/rows.py, ``Batch``) is exactly the envelope around its rows,
laid out as the pieces it is sent in: each an exact ``bytes`` of at most ``SEND_CHUNK`` that
the client hands to the connection uncopied, but a row of ``SEND_CHUNK`` or more, which is a
piece of its own (the client slices it)."""

from __future__ import annotations

import threading

from hypothesis import HealthCheck, given, settings, strategies as st

import prime_runs_spool.sync.rows as rows_module
from prime_runs_spool.platform_api.client import _Chunks
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


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_rows, min_size=1, max_size=4), chunk=st.integers(16, 700), large=st.integers(0, 600))
def test_every_body_is_its_rows_in_the_envelope_in_pieces_sent_as_they_are(
        monkeypatch, batches: list[list[bytes]], chunk: int, large: int) -> None:
    monkeypatch.setattr(rows_module, "SEND_CHUNK", chunk)  # pieces of at most this (more than the envelope), but a larger row
    monkeypatch.setattr(rows_module, "LARGE_BODY", large)  # past it, a batch takes a token
    monkeypatch.setattr(rows_module, "LARGE_BODIES", threading.BoundedSemaphore(len(batches)))
    for rows in batches:
        batch = _fill(rows)
        assert batch.size == len(_expected(rows))
        pieces = batch.parts()
        assert b"".join(pieces) == _expected(rows)
        assert all(type(piece) is bytes and piece for piece in pieces)
        big = {row for row in rows if len(row) >= chunk}
        assert all(len(piece) <= chunk or piece in big for piece in pieces), [len(p) for p in pieces]
        assert batch.parts() is pieces and batch.body() == _expected(rows)  # finished once
        batch.release()


def test_the_client_hands_each_piece_on_uncopied_and_slices_a_large_one() -> None:
    """h11 passes one exact ``bytes`` through as it is and copies any other buffer: a piece
    of the body reaches it as the very object the batch made, a larger one in views."""
    from prime_runs_spool.platform_api.client import SEND_CHUNK

    small, big = b"a" * 1000, b"b" * (SEND_CHUNK * 2 + 3)
    handed = list(_Chunks([small, big, b"]}"]))
    assert handed[0] is small and handed[-1] == b"]}"
    assert [len(h) for h in handed[1:-1]] == [SEND_CHUNK, SEND_CHUNK, 3]
    assert all(isinstance(h, memoryview) for h in handed[1:-1])
    assert len(_Chunks([small, big, b"]}"])) == len(small) + len(big) + 2
