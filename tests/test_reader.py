"""Reader verdicts on hand-built segments, positions, live reads, memory, and find_runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import tracemalloc
from pathlib import Path

import pytest

from prime_runs_spool.spool import reader as reader_module
from prime_runs_spool.errors import CorruptSpoolError, NoSuchPathError, UnsupportedFormatError
from prime_runs_spool.spool.format import encode_line
from prime_runs_spool.spool.layout import find_runs
from prime_runs_spool.spool.reader import Position, iter_records
from prime_runs_spool.spool.scan import read_run, scan_segment
from prime_runs_spool.spool.writer import SegmentWriter

from support.segments import build_segment, header, write_segment
from support.runs import build_run
from support.cli import run_cli
from support.env import CLI, VF040, child_env


def test_sequence_gap_second_header_and_data_after_seal_are_corruption(tmp_path: Path):
    data, written = build_segment([{"i": 1}], seal=None)
    cases = {
        "gap": (data + encode_line({"i": 9}, 9, "episode"), len(data), "sequence number 9, expected 3"),
        "header": (data + encode_line(header(), 3, "header"), len(data), "second header"),
        "first": (encode_line({"x": 1}, 0, "episode"), 0, "not the header"),
    }
    sealed, _ = build_segment([{"i": 1}])
    cases["after-seal"] = (sealed + encode_line({"i": 2}, 4, "episode"), len(sealed), "after the seal")
    for name, (content, offset, reason) in cases.items():
        path = write_segment(tmp_path / name, content)
        info = scan_segment(path)
        assert (info.corrupt_offset, reason in (info.corrupt_reason or "")) == (offset, True), name
        assert read_run(tmp_path / name).status == "corrupt"


def test_empty_and_torn_header_segments(tmp_path: Path):
    write_segment(tmp_path / "empty", b"")
    assert scan_segment(tmp_path / "empty" / "spool" / "seg-000001.jsonl").empty
    assert read_run(tmp_path / "empty").status == "crashed"
    write_segment(tmp_path / "torn", encode_line(header(), 0, "header")[:30])
    assert read_run(tmp_path / "torn").status == "torn"
    assert list(iter_records(tmp_path / "torn")) == []


def test_a_newer_format_is_refused_naming_both_versions(tmp_path: Path):
    write_segment(tmp_path, build_segment([{"i": 1}], version=2)[0])
    with pytest.raises(UnsupportedFormatError, match="version 2 is newer than this reader's version 1"):
        list(iter_records(tmp_path))
    with pytest.raises(UnsupportedFormatError):
        read_run(tmp_path)


def test_resume_from_a_position_across_segments(tmp_path: Path):
    first, _ = build_segment([{"i": 0}, {"i": 1}], index=1)
    second, _ = build_segment([{"i": 2}], seal=None, index=2)
    write_segment(tmp_path, first, 1)
    write_segment(tmp_path, second, 2)
    records = list(iter_records(tmp_path))
    for k, record in enumerate(records):
        assert [r.seq for r in iter_records(tmp_path, record.after)] == [r.seq for r in records[k + 1:]]
    with pytest.raises(CorruptSpoolError, match="missing"):
        list(iter_records(tmp_path, Position(5, 0, 0)))
    assert [e["i"] for e in read_run(tmp_path).episodes()] == [0, 1, 2]
    assert read_run(tmp_path).manifest == {"name": "test"}


def test_an_over_long_line_is_skipped_in_chunks(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(reader_module, "_LINE_LIMIT", 4096)
    monkeypatch.setattr(reader_module, "_SKIP_CHUNK", 512)
    data, written = build_segment([{"i": 1}], seal=None)
    write_segment(tmp_path / "tail", data + b"x" * 100_000)
    assert scan_segment(tmp_path / "tail" / "spool" / "seg-000001.jsonl").torn_offset == len(data)
    write_segment(tmp_path / "mid", data + b"x" * 100_000 + b"\n" + encode_line({"i": 2}, 3, "episode"))
    info = scan_segment(tmp_path / "mid" / "spool" / "seg-000001.jsonl")
    assert info.corrupt_offset == len(data)


def test_reading_uses_constant_memory(tmp_path: Path):
    w = SegmentWriter.create(tmp_path, "r")
    blob = "m" * 100_000
    for _ in range(20):
        w.append_many([("episode", {"blob": blob})] * 10)  # 20 MB in all
    w.seal("completed")
    tracemalloc.start()
    count = sum(1 for _ in iter_records(tmp_path))
    read_run(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 201
    assert peak < 2_000_000, peak


def test_reading_while_a_writer_appends_never_sees_corruption(tmp_path: Path):
    w = SegmentWriter.create(tmp_path, "r")
    done = threading.Event()

    def write() -> None:
        for i in range(300):
            w.append_many([("episode", {"i": i, "pad": "q" * (i * 37 % 5000)})] * 3)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    reads = 0
    while not done.is_set() or reads < 3:
        seqs = [r.seq for r in iter_records(tmp_path)]
        assert seqs == list(range(1, len(seqs) + 1))
        assert read_run(tmp_path).status == "live"
        reads += 1
    thread.join()
    w.seal("completed")
    assert read_run(tmp_path).status == "completed"


def test_find_runs_walks_in_order_without_following_symlinks(tmp_path: Path):
    data, _ = build_segment([])
    for name in ("b/run", "a/run2", "a/run1", "a/run1/nested"):
        write_segment(tmp_path / name, data)
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    write_segment(outside / "run", data)
    os.symlink(outside, tmp_path / "a" / "link")
    (tmp_path / "empty").mkdir()
    found = [p.relative_to(tmp_path).as_posix() for p in find_runs([tmp_path, tmp_path / "a"])]
    assert found == ["a/run1", "a/run1/nested", "a/run2", "b/run"]
    assert list(find_runs([tmp_path / "a" / "run1" / "spool"])) == [tmp_path / "a" / "run1"]
    assert list(find_runs([tmp_path / "empty"])) == []
    with pytest.raises(NoSuchPathError, match="does not exist"):
        list(find_runs([tmp_path / "missing"]))


def test_a_record_type_this_reader_does_not_know_is_passed_over_by_episode_readers(tmp_path: Path):
    """Spec section 3: new record types may be added without a version change; an old
    reader yields them as records but they are not episodes and break nothing."""
    w = SegmentWriter.create(tmp_path, "r")
    w.append("manifest", {"run_id": "r"})
    w.append("episode", {"id": "e1"})
    w.append("annotation", {"note": "from a future writer"})
    w.append("episode", {"id": "e2"})
    w.seal("completed")
    spool = read_run(tmp_path)
    assert spool.status == "completed" and spool.corrupt is None
    assert [e["id"] for e in spool.episodes()] == ["e1", "e2"]
    assert [r.type for r in iter_records(tmp_path)] == ["manifest", "episode", "annotation", "episode", "seal"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["verify", "status", "import"])
def test_a_tree_a_thousand_folders_deep_is_walked_not_a_recursion_error(tmp_path: Path, command: str) -> None:
    """The folder walk (files.walk_folders) recursed once per folder: 1,100 levels ended every command that looks
    for runs (verify, status, import, sync, view) in a RecursionError traceback."""
    deep = tmp_path / "tree" / Path(*["d"] * 1100)
    build_run(deep / "run", "deep-run", 1)
    shutil.copytree(VF040, deep / "outputs")
    try:
        result = run_cli(command, str(tmp_path / "tree"))
    finally:  # shutil.rmtree (pytest's clean-up of old tmp folders) recurses as deep: unwind it here
        shutil.rmtree(deep)
        while (deep := deep.parent) != tmp_path:
            deep.rmdir()
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-500:]
    assert ("deep-run" in result.stdout or "d/run" in result.stdout or "imported" in result.stdout), result.stdout[-500:]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["seg-000001.lock", "seg-000001.durable"])
@pytest.mark.parametrize("command", [["verify"], ["status"], ["sync", "--local", "--db", "{db}"], ["view", "--export", "{out}"]])
def test_a_segment_lock_or_durable_mark_that_is_a_fifo_does_not_hang_any_command(tmp_path: Path, name: str,
                                                                               command: list[str]) -> None:
    """The reader opened a segment's writer lock (to probe it) and its durable mark
    (before every walk of the segment) with a blocking open: a FIFO in either place, in a
    spool received from elsewhere, held verify, status, sync and view forever."""
    builder = build_run(tmp_path / "runs" / "r", "fifo-lock", 2, status=None)  # unsealed: its lock is probed
    target = builder.run_dir / "spool" / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    argv = [a.replace("{db}", str(tmp_path / "local.db")).replace("{out}", str(tmp_path / "site")) for a in command]
    try:
        result = subprocess.run(CLI + argv + [str(tmp_path / "runs")], capture_output=True, text=True, timeout=30,
                                env=child_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command)} still ran after 30 s with {name} a FIFO")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, (result.stdout, result.stderr)
