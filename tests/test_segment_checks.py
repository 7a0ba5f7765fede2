"""What a reader refuses (docs/spool-format.md, sections 4 and 4.1): a complete line that fails
its check, CRLF line endings, segments that disagree with their run or their names, gaps,
and truncated segments. Each one must be corruption with the file and byte offset named,
never a torn tail, an empty segment or a smaller run."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool import open_run
from prime_runs_spool.errors import CorruptSpoolError
from prime_runs_spool.spool.format import encode_line, parse_line
from prime_runs_spool.spool.layout import segment_path
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.scan import read_run, scan_segment
from prime_runs_spool.spool.verify import check_run
from support.env import CLI, child_env
from support.episodes import small_episode
from support.runs import RunBuilder
from support.segments import build_segment, header, write_segment

small_episodes = st.lists(st.dictionaries(st.text(max_size=4), st.integers(-100, 100) | st.text(max_size=6),
                                          max_size=3), min_size=0, max_size=4)
fs_settings = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _corruption(run_dir: Path) -> CorruptSpoolError:
    with pytest.raises(CorruptSpoolError) as info:
        list(iter_records(run_dir))
    return info.value


# -- lines: a complete line is never a torn tail ------------------------------------------


@fs_settings
@given(small_episodes, st.booleans())
def test_crlf_line_endings_are_corruption_at_byte_0_never_empty(tmp_path: Path, episodes, sealed):
    data, _ = build_segment(episodes, seal="completed" if sealed else None)
    run = tmp_path / f"crlf-{random.random()}"
    write_segment(run, data.replace(b"\n", b"\r\n"))
    info = scan_segment(segment_path(run, 1))
    assert not info.empty
    assert (info.corrupt_offset, "CR LF" in (info.corrupt_reason or "")) == (0, True)
    assert read_run(run).status == "corrupt"
    assert _corruption(run).offset == 0


@fs_settings
@given(small_episodes, st.booleans(), st.data())
def test_any_line_converted_to_crlf_is_corruption_at_that_line(tmp_path: Path, episodes, sealed, data):
    original, written = build_segment(episodes, seal="completed" if sealed else None)
    starts = [0] + [start for start, *_ in written]
    ends = [written[0][0] if written else len(original)] + [end for _, end, *_ in written]
    chosen = sorted(data.draw(st.sets(st.integers(0, len(starts) - 1), min_size=1)))
    converted = bytearray(original)
    for k in reversed(chosen):  # from the end, so earlier offsets stay put
        converted[ends[k] - 1:ends[k]] = b"\r\n"
    run = tmp_path / f"crlf-some-{random.random()}"
    write_segment(run, bytes(converted))
    info = scan_segment(segment_path(run, 1))
    assert (info.corrupt_offset, info.torn_offset, info.empty) == (starts[chosen[0]], None, False)
    assert "CR LF" in (info.corrupt_reason or "")


@fs_settings
@given(small_episodes, st.data())
def test_a_complete_line_failing_its_checksum_is_corruption_even_when_last(tmp_path: Path, episodes, data):
    original, written = build_segment(episodes, seal=data.draw(st.sampled_from([None, "completed"])))
    lines = [(0, len(original) - sum(end - start for start, end, *_ in written))] + [(s, e) for s, e, *_ in written]
    start, end = data.draw(st.sampled_from(lines))
    last = data.draw(st.booleans())
    damaged = bytearray(original[:end] if last else original)  # with or without the lines after it
    bit = data.draw(st.integers(start * 8, (end - 1) * 8 - 1))  # any bit but the line feed's
    damaged[bit // 8] ^= 1 << (bit % 8)
    assert parse_line(bytes(damaged[start:end])) is None
    run = tmp_path / f"flip-{random.random()}"
    write_segment(run, bytes(damaged))
    info = scan_segment(segment_path(run, 1))
    assert (info.corrupt_offset, info.torn_offset, info.empty) == (start, None, False)
    assert read_run(run).status == "corrupt"


@fs_settings
@given(small_episodes, st.data())
def test_only_a_line_without_its_line_feed_is_torn(tmp_path: Path, episodes, data):
    original, written = build_segment(episodes, seal=None)
    cut = data.draw(st.integers(0, len(original) - 1))
    damaged = bytearray(original[:cut])
    if damaged and damaged[-1:] != b"\n" and data.draw(st.booleans()):
        # Garble the unfinished line too: still torn, it has no line feed (never make one).
        damaged[-1] ^= 0x20 if damaged[-1] ^ 0x20 != 0x0A else 0x01
    run = tmp_path / f"cut-{random.random()}"
    write_segment(run, bytes(damaged))
    info = scan_segment(segment_path(run, 1))
    assert info.corrupt_offset is None
    complete = damaged.endswith(b"\n") or not damaged
    assert (info.torn_offset is None) == complete
    if info.format_version is None:
        assert info.empty and b"\n" not in damaged  # "empty": no complete line at all


# -- segments against each other and their names ------------------------------------------


def _three_segment_run(run_dir: Path) -> RunBuilder:
    builder = RunBuilder(run_dir, "run-x")
    for _ in range(3):
        builder.open_segment()
        builder.add(4)
        builder.seal()
    return builder


def test_a_segment_copied_under_a_later_index_is_corruption(tmp_path: Path):
    _three_segment_run(tmp_path)
    shutil.copy(segment_path(tmp_path, 2), segment_path(tmp_path, 4))
    error = _corruption(tmp_path)
    assert (error.path.name, error.offset) == ("seg-000004.jsonl", 0)
    assert "segment 2" in error.reason and "seg-000004.jsonl" in error.reason
    verdict = check_run(tmp_path)
    assert not verdict["ok"] and verdict["status"] == "corrupt"
    assert "seg-000004.jsonl: corrupt at byte 0" in verdict["error"]


def test_a_header_naming_another_run_is_corruption(tmp_path: Path):
    first, _ = build_segment([{"i": 1}], index=1)
    other = encode_line(header(run_id="run-2", index=2), 0, "header")
    write_segment(tmp_path, first, 1)
    write_segment(tmp_path, other, 2)
    error = _corruption(tmp_path)
    assert (error.path.name, error.offset) == ("seg-000002.jsonl", 0) and "run-2" in error.reason


def test_the_same_episode_id_in_two_segments_is_corruption_at_its_line(tmp_path: Path):
    builder = RunBuilder(tmp_path, "run-d")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    writer = builder.open_segment()
    episode = small_episode(builder.ids[1], run_id="run-d")
    writer.append("episode", episode, {"episode_id": episode["id"], "rollout_number": 9})
    offset = writer.durable_bytes - len(encode_line(episode, 2, "episode",
                                                          {"episode_id": episode["id"], "rollout_number": 9}))
    writer.seal("completed")
    error = _corruption(tmp_path)
    assert (error.path.name, error.offset) == ("seg-000002.jsonl", offset)
    assert builder.ids[1] in error.reason


def test_a_missing_segment_is_corruption_not_a_smaller_run(tmp_path: Path):
    _three_segment_run(tmp_path)
    segment_path(tmp_path, 2).unlink()
    error = _corruption(tmp_path)
    assert (error.path.name, error.offset) == ("seg-000003.jsonl", 0) and "seg-000002.jsonl is missing" in error.reason
    assert read_run(tmp_path).status == "corrupt"
    other = tmp_path / "no-first"
    _three_segment_run(other)
    segment_path(other, 1).unlink()
    assert "seg-000001.jsonl is missing" in _corruption(other).reason


def _resumed_run(run_dir: Path, first: int = 5, second: int = 3, *, seal_second: bool = True) -> Any:
    """Two processes' segments through the runner API (its header and seal carry the counts)."""
    with open_run(run_dir, name="t", run_id="run-t") as run:
        run.log_episodes([small_episode(f"e{i}", run_id="run-t") for i in range(first)])
    run = open_run(run_dir, name="t")
    run.log_episodes([small_episode(f"e{first + i}", run_id="run-t") for i in range(second)])
    if seal_second:
        run.finish()
    return run


def _cut_after_line(path: Path, keep_lines: int) -> None:
    data = path.read_bytes()
    cut = 0
    for _ in range(keep_lines):
        cut = data.index(b"\n", cut) + 1
    with open(path, "r+b") as f:
        f.truncate(cut)


def test_a_truncated_sealed_segment_followed_by_another_is_corruption(tmp_path: Path):
    _resumed_run(tmp_path)
    segment_path(tmp_path, 1).with_suffix(".durable").unlink()  # leave only the header to tell
    _cut_after_line(segment_path(tmp_path, 1), 4)  # header, manifest, 2 of its 5 episodes
    error = _corruption(tmp_path)
    assert (error.path.name, error.offset) == ("seg-000002.jsonl", 0)
    assert "hold 2" in error.reason and "5 episodes" in error.reason
    assert read_run(tmp_path).status == "corrupt"


def test_a_truncated_segment_with_its_durable_mark_is_corruption(tmp_path: Path):
    builder = RunBuilder(tmp_path, "run-m")
    builder.open_segment()
    builder.add(4)
    builder.abandon()  # as a SIGKILL leaves it: unsealed, lock released, durable mark in place
    path = segment_path(tmp_path, 1)
    _cut_after_line(path, 3)
    error = _corruption(tmp_path)
    assert (error.path.name, error.offset) == ("seg-000001.jsonl", path.stat().st_size)
    assert "truncated" in error.reason


def test_a_seal_that_disagrees_with_its_segment_is_corruption(tmp_path: Path):
    data, written = build_segment([{"i": 1}, {"i": 2}], seal=None)
    seal = {"status": "completed", "last_seq": 3, "episodes": 5, "finished_at": "x", "summary": None, "error": None}
    write_segment(tmp_path, data + encode_line(seal, 4, "seal"))
    error = _corruption(tmp_path)
    assert error.offset == len(data) and "counts 5 episodes" in error.reason


def test_resumed_runs_written_by_the_runner_pass_every_check(tmp_path: Path):
    _resumed_run(tmp_path / "a")
    live = _resumed_run(tmp_path / "b", seal_second=False)
    for name in ("a", "b"):
        spool = read_run(tmp_path / name)
        assert spool.corrupt is None and spool.episodes_count == 8
    live.finish()
    assert read_run(tmp_path / "b").corrupt is None
    assert len(list(iter_records(tmp_path / "a"))) == 1 + 5 + 1 + 1 + 3 + 1


def test_verify_names_the_file_and_offset_and_exits_1(tmp_path: Path):
    _three_segment_run(tmp_path / "run")
    shutil.copy(segment_path(tmp_path / "run", 2), segment_path(tmp_path / "run", 4))
    done = subprocess.run([*CLI, "verify", str(tmp_path)], capture_output=True, text=True, env=child_env(),
                          timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "seg-000004.jsonl: CORRUPT at byte 0" in done.stdout
    assert "Traceback" not in done.stderr


def _verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "verify", *args], capture_output=True, text=True, env=child_env(), timeout=60)


@pytest.mark.slow
def test_verify_given_a_segment_file_verifies_that_segments_run(tmp_path: Path):
    _three_segment_run(tmp_path / "run")
    done = _verify("--json", str(segment_path(tmp_path / "run", 2)))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [run["run_dir"] for run in report["runs"]] == [str(tmp_path / "run")]
    assert report["runs"][0]["episodes"] == 12 and report["paths_without_runs"] == []
    shutil.copy(segment_path(tmp_path / "run", 2), segment_path(tmp_path / "run", 4))
    done = _verify(str(segment_path(tmp_path / "run", 1)))
    assert done.returncode == 1 and "seg-000004.jsonl: CORRUPT at byte 0" in done.stdout


@pytest.mark.slow
def test_verify_given_another_file_says_what_it_expects_and_exits_2(tmp_path: Path):
    _three_segment_run(tmp_path / "run")
    for path in (tmp_path / "notes.txt", tmp_path / "run" / "spool" / "seg-000001.lock"):
        path.touch()
        done = _verify(str(path))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is a file, not a run" in done.stderr and "no runs found" not in done.stdout
        assert "Traceback" not in done.stderr


def test_verify_calls_a_crlf_segment_corrupt_not_empty(tmp_path: Path):
    builder = _three_segment_run(tmp_path / "run")
    second = segment_path(tmp_path / "run", 2)
    second.write_bytes(second.read_bytes().replace(b"\n", b"\r\n"))
    done = _verify(str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "seg-000002.jsonl: CORRUPT at byte 0" in done.stdout and "empty" not in done.stdout
    assert builder.count == 12
