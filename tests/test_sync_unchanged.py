"""What sync/unchanged.py keeps answers only while the run's files stay as they were: any
change to a segment or to the state file, a segment added or removed, makes the next sync
read the run (the probe decides), however the change hides its size or modification time.
Real spools on disk, real ``stat`` calls; the probe's answer is what a sync kept."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.runs import RunBuilder
from prime_runs_spool.spool.layout import list_segments, segment_path, spool_dir
from prime_runs_spool.sync import unchanged
from prime_runs_spool.sync.options import AUTO, UP_TO_DATE, RunReport
from prime_runs_spool.sync.state import Destination, sync_dir, sync_state_path
from prime_runs_spool.sync.unchanged import Unchanged, look

DEST = Destination(key="unchanged-dest", base_url="http://local")
#: Longer than the coarsest tick of the kernel's file clock (jiffies): a change made after it
#: gets times of its own.
TICK = 0.02


def _template(folder: Path, segments: int) -> Path:
    """A finished run of ``segments`` segments (a crash, a resume, ..., a seal) and a state file."""
    builder = RunBuilder(folder, f"unchanged-{segments}")
    for index in range(segments):
        builder.open_segment(counted=index > 0)
        builder.add(2, size=300)
        if index < segments - 1:
            builder.abandon()
        else:
            builder.seal()
    sync_dir(folder).mkdir(mode=0o700)
    sync_state_path(folder, DEST.key).write_bytes(b'{"a state": "its bytes do not matter here"}')
    return folder


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("templates")
    return {n: _template(root / f"run-{n}", n) for n in (1, 2, 3)}


def _kept(run_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Unchanged:
    """The answer a probe gave for ``run_dir``, kept as a sync keeps it, files settled at once."""
    monkeypatch.setattr(unchanged, "SETTLED", 0.0)
    before = look(run_dir, run_dir, DEST)
    assert before is not None
    time.sleep(TICK)
    known = Unchanged(DEST, cache)
    known.learn(before, RunReport(path=str(run_dir), state=UP_TO_DATE, local_run_id="r", pushed_total=2), None)
    known.save()
    return Unchanged(DEST, cache)  # read back, as the next sync reads it


def _same_size_other_bytes(path: Path, *, by_rename: bool) -> None:
    """Rewrite ``path`` with other bytes of the same size and put its modification time back:
    only its change time (or its inode) can tell."""
    info = path.stat()
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    if by_rename:
        other = path.with_name(path.name + ".new")
        other.write_bytes(bytes(data))
        os.utime(other, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.replace(other, path)
    else:
        with open(path, "r+b") as f:
            f.write(bytes(data))
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _change(run_dir: Path, change: str, which: str) -> None:
    segments = list_segments(run_dir)
    segment = (segments[0] if which == "first" else segments[-1])[1]
    state = sync_state_path(run_dir, DEST.key)
    if change == "append to a segment":
        with open(segment, "ab") as f:
            f.write(b"\n")
    elif change == "same size in place, mtime put back":
        _same_size_other_bytes(segment, by_rename=False)
    elif change == "same size by rename, mtime put back":
        _same_size_other_bytes(segment, by_rename=True)
    elif change == "a segment added":
        shutil.copy(segments[-1][1], segment_path(run_dir, len(segments) + 1))
    elif change == "the last segment removed":
        segments[-1][1].unlink()
    elif change == "a segment renamed away and back":
        moved = segment.with_name("moved")
        os.rename(segment, moved)
        os.rename(moved, segment)
    elif change == "the state replaced, same bytes":
        (spool_dir(run_dir) / "sync" / "new").write_bytes(state.read_bytes())
        os.replace(spool_dir(run_dir) / "sync" / "new", state)
    elif change == "the state touched":
        os.utime(state)
    elif change == "the state changed in place, mtime put back":
        _same_size_other_bytes(state, by_rename=False)
    else:
        raise AssertionError(change)


CHANGES = ["append to a segment", "same size in place, mtime put back", "same size by rename, mtime put back",
           "a segment added", "the last segment removed", "a segment renamed away and back",
           "the state replaced, same bytes", "the state touched", "the state changed in place, mtime put back"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.sampled_from([1, 2, 3]), change=st.sampled_from(CHANGES),
       which=st.sampled_from(["first", "last"]))
def test_a_run_whose_files_changed_is_never_answered_from_the_kept_answer(
        templates: dict[int, Path], tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        segments: int, change: str, which: str) -> None:
    work = tmp_path_factory.mktemp("example")
    run_dir = work / "run"
    shutil.copytree(templates[segments], run_dir)
    known = _kept(run_dir, work / "cache", monkeypatch)
    assert known.answer(run_dir, run_dir, AUTO) is not None  # untouched: answered
    time.sleep(TICK)
    _change(run_dir, change, which)
    assert known.answer(run_dir, run_dir, AUTO) is None, (segments, change, which)


def test_a_file_outside_the_spool_changes_nothing(templates: dict[int, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What the answer rests on is the spool: the eval's other outputs beside it may come and go."""
    run_dir = tmp_path / "run"
    shutil.copytree(templates[2], run_dir)
    known = _kept(run_dir, tmp_path / "cache", monkeypatch)
    time.sleep(TICK)
    (run_dir / "results.jsonl").write_bytes(b"{}\n")
    report = known.answer(run_dir, run_dir, AUTO)
    assert report is not None and (report.state, report.local_run_id, report.pushed_total) == (UP_TO_DATE, "r", 2)


@pytest.mark.parametrize("fresh", [None, "the spool folder", "the state file", "the first segment",
                                   "the last segment"])
def test_an_answer_resting_on_a_file_changed_just_now_is_not_kept(templates: dict[int, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   fresh: str | None) -> None:
    """A change in the same tick of the file system's clock as the look could hide from the
    times; so files (and the spool folder, whose times say its listing is the same) changed
    less than SETTLED seconds before the look are not kept, and the next sync reads them."""
    monkeypatch.setattr(unchanged, "SETTLED", 0.2)
    run_dir = tmp_path / "run"
    shutil.copytree(templates[2], run_dir)
    time.sleep(0.25)
    segments = list_segments(run_dir)
    if fresh == "the spool folder":
        (spool_dir(run_dir) / "import.lock").write_bytes(b"")  # any entry: the folder's times move
    elif fresh is not None:
        os.utime({"the state file": sync_state_path(run_dir, DEST.key), "the first segment": segments[0][1],
                  "the last segment": segments[-1][1]}[fresh])
    before = look(run_dir, run_dir, DEST)
    assert before is not None and before.settled(time.time()) == (fresh is None)
    known = Unchanged(DEST, tmp_path / "cache")
    known.learn(before, RunReport(path=str(run_dir), state=UP_TO_DATE), None)
    known.save()
    answered = Unchanged(DEST, tmp_path / "cache").answer(run_dir, run_dir, AUTO)
    assert (answered is not None) == (fresh is None)
