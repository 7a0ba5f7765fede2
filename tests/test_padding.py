"""The padding a writer puts ahead of its lines (docs/spool-format.md, sections 4 and 5).

Lines are written into NUL bytes already on disk, so an fdatasync has no new file size to
commit. What must hold: the padding is never data (a killed writer's segment reads as a
clean end, a sealed or closed one ends at its last line, a seal is never followed by
padding even at the instant it becomes durable), a flush caught half on disk by a crash or
by a reader is a torn tail only where nothing intact follows it, and a durable line lost
under the padding is still corruption.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.env import child_env
from support.local_client import local_settings
from support.runs import RunBuilder, build_run
from support.disk import BOTH_PATHS, choose_path, split_synced_writes
from prime_runs_spool.errors import CorruptSpoolError, SpoolWriteError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.spool import durable_file
from prime_runs_spool.spool.format import PADDING_BYTES
from prime_runs_spool.spool.layout import durable_mark_path_of, list_segments
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.scan import read_run, scan_segment
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Destination

DEST = Destination(key="padding-dest", base_url="http://local")


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes().rstrip(b"\0")
    return data.splitlines(keepends=True)


def test_lines_go_into_the_padding_and_the_file_does_not_grow(tmp_path: Path, monkeypatch) -> None:
    syncs: list[int] = []
    real_sync = durable_file._fdatasync
    monkeypatch.setattr(durable_file, "_fdatasync", lambda fd: syncs.append(fd) or real_sync(fd))
    split_synced_writes(monkeypatch)
    writer = SegmentWriter.create(tmp_path, "pad")
    sizes = []
    for n in range(30):
        writer.append("episode", {"n": n, "text": "x" * 2000})
        sizes.append(writer.path.stat().st_size)
    assert len(set(sizes)) == 1, "every append grew the file: no padding ahead of the lines"
    assert sizes[0] > writer.durable_bytes
    assert writer.path.read_bytes()[writer.durable_bytes:] == bytes(sizes[0] - writer.durable_bytes)
    assert len(syncs) == 31  # the header's and one per append: padding costs no sync of its own
    writer.close()


@pytest.mark.parametrize("end", ["seal", "close"])
def test_a_sealed_or_closed_segment_ends_at_its_last_line(tmp_path: Path, end: str) -> None:
    writer = SegmentWriter.create(tmp_path, "pad")
    for n in range(5):
        writer.append("episode", {"n": n})
    path = writer.path
    writer.seal("completed") if end == "seal" else writer.close()
    data = path.read_bytes()
    assert data.endswith(b"}\n") and b"\0" not in data
    assert read_run(tmp_path).status == ("completed" if end == "seal" else "crashed")


def test_a_seal_is_never_followed_by_padding_not_even_when_it_becomes_durable(tmp_path: Path, monkeypatch) -> None:
    """A crash right after the seal's sync must not leave padding behind it: bytes after a
    seal are corruption. So the padding is cut before the seal is written, not at close."""
    writer = SegmentWriter.create(tmp_path, "pad")
    writer.append("episode", {"n": 1})
    at_sync: list[bytes] = []
    real_sync = durable_file._fdatasync
    monkeypatch.setattr(durable_file, "_fdatasync",
                        lambda fd: at_sync.append(writer.path.read_bytes()) or real_sync(fd))
    split_synced_writes(monkeypatch)
    writer.append("episode", {"n": 2})
    writer.seal("completed")
    assert at_sync[0].endswith(b"\0")  # the padding was there before the seal
    assert at_sync[-1].endswith(b"}\n") and b'"type":"seal"' in at_sync[-1].splitlines()[-1]


def test_a_killed_writer_leaves_padding_that_reads_as_a_clean_end(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from prime_runs_spool import SegmentWriter
        writer = SegmentWriter.create({str(tmp_path)!r}, "killed")
        for n in range(5):
            writer.append("episode", {{"n": n}})
        print("ready", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=child_env())
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    (_, path), = list_segments(tmp_path)
    assert path.read_bytes().endswith(b"\0" * 1024)  # it died with padding ahead of its lines
    info = scan_segment(path)
    assert info.torn_offset is None and info.corrupt_offset is None and info.episodes == 5
    assert read_run(tmp_path).status == "crashed"
    assert [r.data["n"] for r in iter_records(tmp_path) if r.type == "episode"] == list(range(5))
    resumed = SegmentWriter.create(tmp_path, "killed", expected_last=1, prior_episodes=5)
    resumed.append("episode", {"n": 5})
    resumed.seal("completed")
    assert [r.data["n"] for r in iter_records(tmp_path) if r.type == "episode"] == list(range(6))


@BOTH_PATHS
def test_a_padding_write_that_fails_costs_no_append(tmp_path: Path, monkeypatch, caplog, path) -> None:
    """A disk with room for the lines and not for their padding: in one synced pwritev the
    kernel writes the lines and comes back short; the writer then pads with a pwrite of
    its own, which fails, and it pads no more."""
    choose_path(monkeypatch, path)
    real_pwritev = durable_file._pwritev

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def room_for_lines(fd: int, parts, offset: int, flags: int = 0) -> int:
        return real_pwritev(fd, [part for part in parts if part is not durable_file._PADDING], offset, flags)

    monkeypatch.setattr(durable_file, "_pwrite", full)
    monkeypatch.setattr(durable_file, "_pwritev", room_for_lines)
    writer = SegmentWriter.create(tmp_path, "full")
    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        for n in range(3):
            writer.append("episode", {"n": n})
    assert writer.path.stat().st_size == writer.durable_bytes  # no padding, every line there
    assert sum("cannot pad" in r.getMessage() for r in caplog.records) == 1  # said once, then stopped
    writer.seal("completed")
    assert [r.data["n"] for r in iter_records(tmp_path) if r.type == "episode"] == [0, 1, 2]


def test_a_flush_too_large_to_pay_for_padding_is_appended_as_is(tmp_path: Path) -> None:
    writer = SegmentWriter.create(tmp_path, "big")
    writer.append("episode", {"text": "y" * PADDING_BYTES})  # past the header's padding, and large
    assert writer.path.stat().st_size == writer.durable_bytes
    writer.append("episode", {"n": 1})  # small again: padded again
    assert writer.path.stat().st_size == writer.durable_bytes + PADDING_BYTES
    writer.close()


def _closed_segment(run_dir: Path, records: list[dict], *, keep_mark: bool) -> Path:
    writer = SegmentWriter.create(run_dir, "prop")
    for record in records:
        writer.append("episode", record)
    path = writer.path
    writer.close()
    if not keep_mark:
        durable_mark_path_of(path).unlink(missing_ok=True)  # a copy without the marks
    return path


def _holed(line: bytes, start: int, length: int) -> bytes:
    """``line`` with NUL bytes over part of it, its line feed kept: a page of it never reached the disk."""
    start = min(start, len(line) - 2)
    length = max(1, min(length, len(line) - 1 - start))
    return line[:start] + bytes(length) + line[start + length:]


records_strategy = st.lists(st.fixed_dictionaries({"n": st.integers(0, 99), "text": st.text(max_size=300)}),
                            min_size=2, max_size=6)
prop_settings = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@prop_settings
@given(records=records_strategy, pad=st.integers(1, 5000), cut=st.integers(1, 400))
def test_padding_after_the_last_line_is_no_data_and_a_part_line_before_it_is_torn(
    tmp_path_factory, records, pad: int, cut: int
) -> None:
    run_dir = tmp_path_factory.mktemp("pad")
    path = _closed_segment(run_dir, records, keep_mark=True)
    lines = _lines(path)
    body = b"".join(lines)
    path.write_bytes(body + bytes(pad))
    info = scan_segment(path)
    assert (info.torn_offset, info.corrupt_offset, info.episodes) == (None, None, len(records))
    assert read_run(run_dir).status == "crashed"
    partial = lines[-1][: min(cut, len(lines[-1]) - 1)]  # a line started in the padding, not finished
    path.write_bytes(body + partial + bytes(pad))
    info = scan_segment(path)
    assert (info.torn_offset, info.corrupt_offset, info.episodes) == (len(body), None, len(records))
    assert read_run(run_dir).status == "torn"


@prop_settings
@given(records=records_strategy, pad=st.integers(0, 3000), start=st.integers(0, 400), length=st.integers(1, 400),
       followed=st.booleans())
def test_a_line_with_a_hole_is_torn_only_when_nothing_intact_follows_it(
    tmp_path_factory, records, pad: int, start: int, length: int, followed: bool
) -> None:
    run_dir = tmp_path_factory.mktemp("hole")
    path = _closed_segment(run_dir, records, keep_mark=False)
    lines = _lines(path)
    head, last = b"".join(lines[:-2]), lines[-2:]
    # The second-to-last line came back with a hole; after it, the last line intact or holed too.
    tail = last[1] if followed else _holed(last[1], start, length)
    path.write_bytes(head + _holed(last[0], start, length) + tail + bytes(pad))
    info = scan_segment(path)
    if followed:  # that later line was synced, so the holed one had been too: a loss, never skipped
        assert info.corrupt_offset == len(head)
        with pytest.raises(CorruptSpoolError):
            list(iter_records(run_dir))
    else:
        assert (info.torn_offset, info.corrupt_offset) == (len(head), None)
        assert info.episodes == len(records) - 2
        assert read_run(run_dir).status == "torn"


def test_a_durable_line_lost_under_the_padding_is_corruption(tmp_path: Path) -> None:
    """The writer's mark said the line was fsync'd: a hole in it is a loss, not a torn tail."""
    path = _closed_segment(tmp_path, [{"n": 1}, {"n": 2}], keep_mark=True)
    lines = _lines(path)
    assert durable_mark_path_of(path).exists()
    path.write_bytes(b"".join(lines[:-1]) + _holed(lines[-1], 5, 10) + bytes(100))
    info = scan_segment(path)
    assert info.corrupt_offset is not None and "durable" in (info.corrupt_reason or "")
    assert read_run(tmp_path).status == "corrupt"


def test_a_reader_that_overtakes_a_live_writer_sees_a_torn_tail_not_corruption(tmp_path: Path) -> None:
    """A write into the padding can be read half done, holes included, with later lines
    after it: past the durable mark of a live writer that is the flush being written."""
    builder = RunBuilder(tmp_path, "overtaken")
    writer = builder.open_segment()
    builder.add(3, size=100)
    lines = _lines(writer.path)
    fd = os.open(writer.path, os.O_WRONLY)
    try:  # what a reader may see while the writer copies its next two lines in
        os.pwrite(fd, _holed(lines[-1], 10, 30) + lines[-1], writer.durable_bytes)
    finally:
        os.close(fd)
    spool = read_run(tmp_path)
    assert spool.status == "live" and spool.corrupt is None
    assert spool.segments[-1].torn_offset == writer.durable_bytes
    builder.abandon()


def test_a_live_run_with_nothing_new_is_answered_without_a_pass(tmp_path: Path) -> None:
    """Its lines go into padding, so the file's size never matches the cursor: the durable
    mark does, and a new durable line moves it."""
    builder = RunBuilder(tmp_path / "runs" / "live", "live-probe")
    builder.open_segment()
    builder.add(2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            first, = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions())
            assert first.pushed_now == 2
            run = RunSync(tmp_path / "runs" / "live", client, DEST, SyncOptions())
            assert run.probe() is not None  # up to date, though the file is longer than the cursor
            builder.add(1)
            assert RunSync(tmp_path / "runs" / "live", client, DEST, SyncOptions()).probe() is None
            again, = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions())
            assert again.pushed_now == 1
    builder.seal()


def test_a_copy_of_a_live_run_copied_again_with_more_lines_of_the_same_size_is_synced(
        tmp_path: Path, monkeypatch) -> None:
    """A CI job copies a live run's folder (no locks travel) and later copies it again. The
    new lines went into the padding, so the copied segment kept its size: the sync tells
    the versions apart (docs/sync.md), it does not take the run for unchanged."""
    import shutil

    import prime_runs_spool.spool.writer_state as writer_state

    # As on another machine: the process the copy's header names is not one running here.
    monkeypatch.setattr(writer_state, "process_alive", lambda writer: False)

    builder = RunBuilder(tmp_path / "live", "copied-twice")
    writer = builder.open_segment()
    builder.add(2)
    copy = tmp_path / "copies" / "run"

    def copy_run() -> None:
        shutil.copytree(builder.run_dir, copy, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", "*.durable", "sync"))

    copy_run()
    size = (copy / "spool" / writer.path.name).stat().st_size
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            first, = sync_paths([tmp_path / "copies"], client, DEST, SyncOptions())
            assert (first.state, first.pushed_now) == ("crashed", 2)
            builder.add(1)
            copy_run()
            assert (copy / "spool" / writer.path.name).stat().st_size == size  # the same size, one line more
            again, = sync_paths([tmp_path / "copies"], client, DEST, SyncOptions())
            assert (again.state, again.pushed_now) == ("crashed", 1)
            third, = sync_paths([tmp_path / "copies"], client, DEST, SyncOptions())
            assert (third.state, third.pushed_now) == ("up_to_date", 0)
    builder.seal()


def test_ctrl_c_while_close_cuts_the_padding_still_releases_the_writer_lock(tmp_path: Path, monkeypatch) -> None:
    """A SIGINT delivered as close's ftruncate returns raises KeyboardInterrupt there: the
    segment, its mark and its writer lock must still be let go, or readers take the closed
    segment for a live one until the process exits (as test_durable_mark.py asks of the mark)."""
    from prime_runs_spool.spool.writer_state import writer_alive

    writer = SegmentWriter.create(tmp_path, "pad")
    writer.append("episode", {"n": 1})
    real = os.ftruncate

    def ftruncate(fd: int, length: int) -> None:
        real(fd, length)
        raise KeyboardInterrupt  # the signal's handler runs as the call returns

    monkeypatch.setattr(durable_file.os, "ftruncate", ftruncate)
    with pytest.raises(KeyboardInterrupt):
        writer.close()
    monkeypatch.undo()
    assert not writer_alive(writer.path)
    writer.close()  # and a second close is quiet
    assert read_run(tmp_path).status == "crashed"


@pytest.mark.parametrize("cut_at", [1, 2, 3])
def test_a_power_cut_while_the_seal_is_synced_never_leaves_padding_after_it(
        tmp_path: Path, monkeypatch, cut_at: int) -> None:
    """The seal is written into the file cut to its last line. An fdatasync writes the data
    first and commits the new size after: a power cut in between brings back the bytes
    written in place with the size the last completed sync made durable. Had the cut not
    been synced before the seal was written, that is the seal followed by the old padding,
    which reads as corruption ("bytes after the seal"), though nothing reported durable
    was lost. Modelled here: every page written survives, the size is the last synced one."""
    writer = SegmentWriter.create(tmp_path, "pad")
    writer.append("episode", {"n": 1})
    path = writer.path
    synced = [path.stat().st_size]
    calls = [0]
    real_sync = durable_file._fdatasync

    def fdatasync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == cut_at:
            raise OSError(errno.EIO, "power is off")
        real_sync(fd)
        synced[0] = os.fstat(fd).st_size

    monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
    split_synced_writes(monkeypatch)
    try:
        writer.seal("completed")
    except SpoolWriteError:
        pass
    data = path.read_bytes()
    path.write_bytes(data[: synced[0]] + bytes(max(0, synced[0] - len(data))))
    spool = read_run(tmp_path)
    assert spool.corrupt is None, spool.corrupt
    assert spool.status in ("completed", "crashed")
    assert [r.data["n"] for r in iter_records(tmp_path) if r.type == "episode"] == [1]


def _write_at(path: Path, data: bytes, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def test_a_reader_that_overtook_a_writer_which_then_closed_still_sees_a_torn_tail(tmp_path: Path) -> None:
    """A reader copies a page of the padding before the writer's next lines reach it and
    the page after once they did: a line with a hole, intact lines after it. If the writer
    then finishes, seals or closes, and exits before the reader gets to that line, whether
    it is alive *now* says nothing about what the reader read: it was alive when the read
    began, so the hole is a write overtaken, not a synced line lost (a kill leaves no holes;
    a power cut stops the reader too). It read as corruption."""
    builder = RunBuilder(tmp_path, "overtaken-then-closed")
    writer = builder.open_segment()
    builder.add(3, size=100)
    lines = _lines(writer.path)
    _write_at(writer.path, _holed(lines[-1], 10, 30) + lines[-1], writer.durable_bytes)
    records = iter_records(tmp_path)
    first = next(records)  # the read is under way: the segment's first bytes are read
    builder.abandon()  # the writer closes and lets go of its lock
    rest = list(records)  # on the bytes read while it was alive
    assert [first.type] + [r.type for r in rest] == ["manifest", "episode", "episode", "episode"]


def test_a_hole_in_a_durable_line_of_a_live_writer_is_corruption(tmp_path: Path) -> None:
    """Section 4, rule 6: a holed line is a torn tail for a live writer only at or past its
    durable mark. Before the mark it was synced: a loss, whether or not the writer is alive
    (it read as a torn tail while the writer lived, and sync waited on it without a word)."""
    builder = RunBuilder(tmp_path, "live-hole")
    writer = builder.open_segment()
    builder.add(3, size=100)
    lines = _lines(writer.path)
    start = writer.durable_bytes - len(lines[-1])
    _write_at(writer.path, _holed(lines[-1], 10, 30), start)
    info = scan_segment(writer.path)
    assert info.live and info.corrupt_offset == start and info.torn_offset is None
    builder.abandon()


def test_a_seal_after_a_flush_too_large_to_pad_is_not_padded(tmp_path: Path, monkeypatch) -> None:
    """A flush too large to pay for padding leaves none (the padding ends where its lines
    do), so the seal after it found nothing to cut and, growing the file, was padded: the
    seal was durable with padding after it until close cut it off (unsynced), so a reader
    meanwhile, or a crash or power cut then, found bytes after the seal: corruption.
    A large episode right before the end of a run is common (a long transcript)."""
    writer = SegmentWriter.create(tmp_path, "big-then-seal")
    writer.append("episode", {"text": "y" * (2 * PADDING_BYTES)})  # past the padding, too large to pad
    assert writer.path.stat().st_size == writer.durable_bytes
    at_sync: list[bytes] = []
    real_sync = durable_file._fdatasync
    monkeypatch.setattr(durable_file, "_fdatasync",
                        lambda fd: real_sync(fd) or at_sync.append(writer.path.read_bytes()))
    split_synced_writes(monkeypatch)
    writer.seal("completed")
    assert at_sync, "the seal was synced"
    assert at_sync[-1].endswith(b"}\n"), "padding after the seal at the instant it became durable"
    writer.path.write_bytes(at_sync[-1])  # a crash right after the seal's sync, before close
    assert read_run(tmp_path).status == "completed"


def test_the_viewer_reads_a_dead_writers_padding_once_not_on_every_refresh(tmp_path: Path, monkeypatch) -> None:
    """Up to 1 MiB of padding sits after a killed writer's lines; whether it is padding or a
    torn tail does not change while the file does not, so a dashboard refreshing many
    crashed runs does not read it again each time."""
    import prime_runs_spool.viewer.index as viewer_index
    from prime_runs_spool.viewer.app import wait_indexed
    from prime_runs_spool.viewer.index import SpoolIndex

    builder = RunBuilder(tmp_path, "viewed")
    writer = builder.open_segment()
    builder.add(3, size=100)
    path = writer.path
    builder.abandon()
    with open(path, "ab") as f:
        f.write(bytes(PADDING_BYTES))  # as a SIGKILLed writer leaves it
    reads: list[int] = []
    real = viewer_index.torn_after
    monkeypatch.setattr(viewer_index, "torn_after", lambda segment, offset: reads.append(offset) or real(segment, offset))
    index = SpoolIndex("run", tmp_path)
    for _ in range(3):
        index._refreshed_at = -1.0  # noqa: SLF001 - skip the poll throttle
        wait_indexed(index, 10)
    assert index.status == "crashed" and len(index.rows) == 3
    assert len(reads) == 1
    with open(path, "r+b") as f:  # the file changes (a partial line in the padding): asked again
        f.seek(writer.durable_bytes)
        f.write(b'{"data":')
    index._refreshed_at = -1.0  # noqa: SLF001
    wait_indexed(index, 10)
    assert index.status == "torn" and len(reads) == 2


def test_a_state_from_before_segment_versions_is_still_up_to_date_by_its_size(tmp_path: Path) -> None:
    """A crashed run's state written before ``terminal_version`` existed: the size alone
    decides, as it did then (docs/sync.md), so an unchanged run is answered without a pass."""
    import orjson

    from prime_runs_spool.sync.state import CHECKSUM_KEY, sync_dir

    build_run(tmp_path / "runs" / "old", "old-state", 2, status=None)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            first, = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions())
            assert (first.state, first.pushed_now) == ("crashed", 2)
            state_file, = sync_dir(tmp_path / "runs" / "old").glob("*.json")
            state = orjson.loads(state_file.read_bytes())
            assert state["terminal_version"] is not None
            del state["terminal_version"], state[CHECKSUM_KEY]  # neither was kept then
            state_file.write_bytes(orjson.dumps(state))
            assert RunSync(tmp_path / "runs" / "old", client, DEST, SyncOptions()).probe() is not None
            again, = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions())
            assert (again.state, again.pushed_now) == ("up_to_date", 0)


def test_a_synced_write_short_in_its_padding_keeps_the_part_written_and_syncs(tmp_path: Path, monkeypatch) -> None:
    """The one synced pwritev that carries a flush's lines and its padding comes back with
    the lines whole and only part of the padding: the writer counts what padding it has,
    syncs, and its next lines go into that padding (the file does not grow)."""
    if not durable_file._RWF_DSYNC:
        pytest.skip("this kernel or Python has no RWF_DSYNC")
    real_pwritev, real_sync = durable_file._pwritev, durable_file._fdatasync
    short: list[int] = []
    syncs: list[int] = []

    def half_the_padding(fd: int, parts, offset: int, flags: int = 0) -> int:
        if parts and parts[-1] is durable_file._PADDING and not short:
            lines = list(parts[:-1])
            short.append(sum(map(len, lines)))
            return real_pwritev(fd, lines + [bytes(PADDING_BYTES // 2)], offset)  # no flag: the sync must follow
        return real_pwritev(fd, parts, offset, flags)

    monkeypatch.setattr(durable_file, "_pwritev", half_the_padding)
    monkeypatch.setattr(durable_file, "_fdatasync", lambda fd: syncs.append(fd) or real_sync(fd))
    writer = SegmentWriter.create(tmp_path, "short-pad")
    assert short and len(syncs) == 1  # the header's flush came back short, then was synced
    size = writer.path.stat().st_size
    assert size == writer.durable_bytes + PADDING_BYTES // 2
    writer.append("episode", {"n": 1, "text": "x" * 1000})
    assert writer.path.stat().st_size == size  # into the padding that was written
    writer.seal("completed")
    assert [r.data["n"] for r in iter_records(tmp_path) if r.type == "episode"] == [1]
    assert read_run(tmp_path).status == "completed"
