"""A small run is read in the sending thread; a large one one batch ahead on a thread of
its own (sync/rows.py, ``read_ahead_if_worth_it``): the same batches either way."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import prime_runs_spool.sync.rows as rows
from prime_runs_spool.sync.rows import RowStream, batches, read_ahead_if_worth_it
from prime_runs_spool.sync.state import Cursor
from support.runs import build_run

LIMIT = 1 << 14  # several requests for the larger run


def _sent(run_dir: Path, cursor: Cursor | None = None) -> tuple[list[bytes], set[str]]:
    """The batches' bodies, and the names of the threads alive while they were handed out."""
    stream = RowStream(run_dir, cursor, "ev", LIMIT)
    bodies, threads = [], set()
    for batch in read_ahead_if_worth_it(stream, batches(stream, LIMIT)):
        threads |= {thread.name for thread in threading.enumerate()}
        bodies.append(bytes(batch.body()) if batch.count else b"")
        batch.release()
    return bodies, threads


@pytest.mark.parametrize("episodes", [3, 40])
def test_the_same_batches_with_or_without_a_read_ahead_thread(tmp_path: Path, monkeypatch, episodes: int) -> None:
    build_run(tmp_path, "read-ahead-run", episodes)
    inline, inline_threads = _sent(tmp_path)
    assert "prime-runs-sync-read-ahead" not in inline_threads  # a few KB: read where it is sent
    monkeypatch.setattr(rows, "INLINE_REST_BYTES", -1)  # as if the run were large
    ahead, ahead_threads = _sent(tmp_path)
    assert "prime-runs-sync-read-ahead" in ahead_threads
    assert inline == ahead and len(inline) >= (2 if episodes == 40 else 1)


def test_only_what_is_left_past_the_cursor_counts(tmp_path: Path, monkeypatch) -> None:
    build_run(tmp_path, "read-ahead-rest", 40)
    stream = RowStream(tmp_path, None, "ev", LIMIT)
    whole = stream.unread_bytes()
    assert whole is not None and whole > 40 * 1_000
    list(stream.rows())
    assert RowStream(tmp_path, stream.cursor, "ev", LIMIT).unread_bytes() == 0
    monkeypatch.setattr(rows, "INLINE_REST_BYTES", whole - 1)
    assert "prime-runs-sync-read-ahead" in _sent(tmp_path)[1]
    assert "prime-runs-sync-read-ahead" not in _sent(tmp_path, stream.cursor)[1]


def test_a_live_runs_padding_is_not_counted_as_left_to_read(tmp_path: Path) -> None:
    """A live writer's file holds a megabyte of padding after its lines (docs/spool-format.md,
    section 5), which a sync, reading up to the durable mark, never reads: a follower's
    pass over the few new episodes of a live run is read inline, not on a thread of its own."""
    from support.runs import RunBuilder

    builder = RunBuilder(tmp_path, "read-ahead-live")
    builder.open_segment()
    builder.add(3)
    stream = RowStream(tmp_path, None, "ev", LIMIT)
    rest = stream.unread_bytes()
    assert rest is not None and rest <= builder.writer.durable_bytes  # type: ignore[union-attr]
    assert "prime-runs-sync-read-ahead" not in _sent(tmp_path)[1]
    builder.seal()
