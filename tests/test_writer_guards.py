"""What the writer guards against besides disk errors (docs/spool-format.md, sections 1 and 5):
two processes opening one run at once, a run directory deleted under a live writer, and a
lock file deleted under one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prime_runs_spool import open_run
from prime_runs_spool.errors import RunInUseError, SegmentGoneError, SpoolWriteError
from prime_runs_spool.spool.format import parse_line
from prime_runs_spool.spool.layout import list_segments, lock_path, segment_path
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.spool.writer_state import writer_alive
from prime_runs_spool.spool.verify import check_run
from prime_runs_spool.spool import guards
from prime_runs_spool.spool.writer import SegmentWriter
from support.env import REPO_ROOT, child_env
from support.episodes import small_episode

RACER = REPO_ROOT / "tests" / "support" / "racing_opener.py"


def _race(run_dir: Path, processes: int) -> list[str]:
    go = run_dir.parent / f"{run_dir.name}.go"
    children = [subprocess.Popen([sys.executable, str(RACER), str(run_dir), str(go)], stdout=subprocess.PIPE,
                                 text=True, env=child_env()) for _ in range(processes)]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    go.touch()
    outcomes = []
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0, out
        outcomes.append(out.strip())
    return outcomes


@pytest.mark.slow
def test_processes_racing_to_open_an_empty_run_directory_make_one_run(tmp_path: Path):
    for trial in range(3):
        run_dir = tmp_path / f"run-{trial}"
        outcomes = _race(run_dir, 4)
        spool = read_run(run_dir)
        run_ids = set()
        for _, path in list_segments(run_dir):
            with open(path, "rb") as f:
                run_ids.add(parse_line(f.readline()).data["run_id"])
        assert len(run_ids) == 1, (trial, outcomes, run_ids)
        assert spool.corrupt is None and spool.episodes_count == 5, (trial, outcomes)
        assert "ok" in outcomes and set(outcomes) <= {"ok", "in-use"}, outcomes


def test_an_opener_that_finds_a_segment_added_since_its_scan_is_refused(tmp_path: Path):
    SegmentWriter.create(tmp_path, "r").seal("completed")
    with pytest.raises(RunInUseError, match="at the same time"):
        SegmentWriter.create(tmp_path, "r", expected_last=0)
    assert [index for index, _ in list_segments(tmp_path)] == [1]


def test_a_run_directory_deleted_under_a_live_writer_raises_at_the_next_append_and_the_seal(tmp_path: Path):
    run = open_run(tmp_path / "run", name="t")
    run.log_episodes([small_episode("a")])
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(SegmentGoneError, match="deleted or replaced"):
        run.log_episodes([small_episode("b")])
    assert isinstance(SegmentGoneError("x"), SpoolWriteError)
    run.abort("gone")  # quiet: the writer is already closed

    finishing = open_run(tmp_path / "finishing", name="t")
    finishing.log_episodes([small_episode("a")])
    shutil.rmtree(tmp_path / "finishing")
    with pytest.raises(SegmentGoneError):
        finishing.finish()  # the seal would land in a file no reader can find

    writer = SegmentWriter.create(tmp_path / "other", "r")
    writer.append("episode", {"id": "x"})
    shutil.rmtree(tmp_path / "other")
    with pytest.raises(SegmentGoneError):
        writer.seal("completed")


def test_a_segment_replaced_under_its_writer_is_detected(tmp_path: Path):
    writer = SegmentWriter.create(tmp_path, "r")
    path = writer.path
    copy = path.with_name("copy")
    shutil.copy(path, copy)
    copy.replace(path)  # same name, another file: what the writer appends is unreachable
    with pytest.raises(SegmentGoneError):
        writer.append("episode", {"id": "x"})


@pytest.mark.parametrize("asked", ["proc link", "link count"])
@pytest.mark.parametrize("loss", ["deleted", "replaced", "run directory deleted", "renamed away"])
def test_each_way_a_segment_loses_its_name_is_seen_by_both_checks(tmp_path: Path, asked: str, loss: str):
    """The name is asked of the descriptor's /proc link where the kernel has one, of the
    link count elsewhere: both see every way the name goes, and neither sees a run moved whole."""
    import os

    if asked == "proc link" and not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc/self/fd here")
    run_dir = tmp_path / "run"
    writer = SegmentWriter.create(run_dir, "r")
    if asked == "proc link":
        assert writer._file._link is not None  # the check this case is about is the one in use
    else:
        writer._file._link = None
    writer.append("episode", {"id": "a"})
    path = writer.path
    if loss == "deleted":
        path.unlink()
    elif loss == "replaced":
        shutil.copy(path, path.with_name("copy"))
        path.with_name("copy").replace(path)
    elif loss == "run directory deleted":
        shutil.rmtree(run_dir)
    else:  # the run moved whole keeps its segment's name: appends go on
        run_dir.rename(tmp_path / "moved")
        assert writer.append("episode", {"id": "b"}) == 2
        shutil.rmtree(tmp_path / "moved")
    with pytest.raises(SegmentGoneError, match="deleted or replaced"):
        writer.append("episode", {"id": "c"})
    writer.close()


def test_a_deleted_lock_file_is_put_back_by_its_writer_and_seen_by_readers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(guards, "LOCK_CHECK_INTERVAL", 0.0)  # check at every flush
    run = open_run(tmp_path, name="t")
    segment = segment_path(tmp_path, 1)
    lock_path(tmp_path, 1).unlink()
    # Before the writer notices: readers still see it live, from the header's process identity.
    assert writer_alive(segment)
    info = read_run(tmp_path).segments[0]
    assert (info.live, info.lock_missing) == (True, True)
    verdict = check_run(tmp_path)
    assert verdict["status"] == "live" and verdict["segments"][0]["lock_missing"]
    with pytest.raises(RunInUseError):
        open_run(tmp_path, name="t")  # a second writer is not admitted
    run.log_episodes([small_episode("a")])  # the next flush puts a locked file back
    assert lock_path(tmp_path, 1).exists() and writer_alive(segment)
    assert not read_run(tmp_path).segments[0].lock_missing
    run.finish()
    assert not writer_alive(segment)
    assert read_run(tmp_path).status == "completed"
    assert [r.type for r in iter_records(tmp_path)] == ["manifest", "episode", "seal"]
