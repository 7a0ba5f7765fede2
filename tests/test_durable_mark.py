"""The durable mark: written at most every MARK_INTERVAL, never ahead of the disk, never
back, caught up within the interval and at close (spool/durable_mark.py, and
docs/spool-format.md, section 5)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from support.env import child_env
from prime_runs_spool.spool import durable_mark as mark_module
from prime_runs_spool.spool import writer as writer_module
from prime_runs_spool.spool.durable_mark import MARK_INTERVAL, durable_mark
from prime_runs_spool.spool.layout import durable_mark_path
from prime_runs_spool.spool.writer import SegmentWriter


class MarkWrites:
    """Counts the mark's writes, and what each one wrote."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.values: list[int] = []
        real = mark_module._pwrite

        def pwrite(fd: int, data: bytes, offset: int) -> int:
            self.values.append(int(data))
            return real(fd, data, offset)

        monkeypatch.setattr(mark_module, "_pwrite", pwrite)


def wait_until_caught_up(writer: SegmentWriter, timeout: float = 5.0) -> float:
    """Seconds until the mark says every byte of the segment is durable."""
    start = time.monotonic()
    while durable_mark(writer.path) != writer.path.stat().st_size:
        if time.monotonic() - start > timeout:
            raise AssertionError(f"the mark stayed at {durable_mark(writer.path)}, the segment has "
                                 f"{writer.path.stat().st_size} bytes")
        time.sleep(0.001)
    return time.monotonic() - start


def test_a_burst_of_syncs_writes_the_mark_once_an_interval_then_catches_up(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of fsync'd appends within a few intervals write the mark a few times, not
    once per sync (each write costs the next sync a journal entry); once the burst ends, the
    mark says all of it within the interval."""
    writes = MarkWrites(monkeypatch)
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        start = time.monotonic()
        appends = 0
        while appends < 300 or time.monotonic() - start < 3 * MARK_INTERVAL:
            writer.append("episode", {"id": f"e{appends}", "n": appends})
            appends += 1
        elapsed = time.monotonic() - start
        during = len(writes.values)
        assert during <= elapsed / MARK_INTERVAL + 3, (during, appends, elapsed)
        assert during < appends / 2
        assert wait_until_caught_up(writer) < MARK_INTERVAL + 1.0
        assert writes.values == sorted(writes.values)
    finally:
        writer.close()


def test_a_lone_sync_is_marked_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that syncs less often than the interval (an eval waiting on its model) has
    every sync marked by the flush itself, not later."""
    writes = MarkWrites(monkeypatch)
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        for n in range(3):
            time.sleep(MARK_INTERVAL * 1.5)
            writer.append("episode", {"id": f"e{n}"})
            assert durable_mark(writer.path) == writer.path.stat().st_size
        assert len(writes.values) == 4  # the header's sync, then each append's
    finally:
        writer.close()


def test_close_writes_the_mark_it_still_owes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync left owed (the interval not over, the publisher thread not yet there) is marked
    by close, so a closed writer's mark says everything it synced (section 5's check 5)."""
    monkeypatch.setattr(mark_module, "MARK_INTERVAL", 3600.0)
    monkeypatch.setattr(mark_module, "_publish_later", lambda mark, due: None)  # the thread never comes
    writer = SegmentWriter.create(tmp_path, "run-1")
    for n in range(5):
        writer.append("episode", {"id": f"e{n}"})
    size = writer.path.stat().st_size
    assert durable_mark(writer.path) < size  # owed: the header's sync was marked, not these
    writer.close()
    assert int(durable_mark_path(tmp_path, 1).read_bytes()) == size


def test_the_mark_never_runs_ahead_of_the_disk_nor_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight appending threads, the flushes and the publisher thread all write the mark; every
    value written is a count some fdatasync had made durable when it was written, and none
    is lower than the one before."""
    synced = [0]
    real = writer_module._fdatasync

    def fdatasync(fd: int) -> None:
        size = os.fstat(fd).st_size
        real(fd)
        synced[0] = max(synced[0], size)

    monkeypatch.setattr(writer_module, "_fdatasync", fdatasync)
    written: list[tuple[int, int]] = []
    real_pwrite = mark_module._pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        written.append((int(data), synced[0]))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(mark_module, "_pwrite", pwrite)
    writer = SegmentWriter.create(tmp_path, "run-1")
    deadline = time.monotonic() + 0.5

    def work(t: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            writer.append("episode", {"id": f"t{t}-{n}", "pad": "x" * (n % 7 * 100)})
            n += 1

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        wait_until_caught_up(writer)
    finally:
        writer.close()
    values = [value for value, _ in written]
    assert len(written) > 3
    assert values == sorted(values)
    assert all(value <= durable for value, durable in written)
    assert values[-1] == writer.path.stat().st_size


def test_a_forked_child_marks_its_own_segment_and_never_its_parents(tmp_path: Path) -> None:
    """The publisher thread is not forked: a child that opens a writer of its own gets a new
    one, and its copy of the parent's writer never writes the parent's mark."""
    script = tmp_path / "fork_marks.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from pathlib import Path
        from prime_runs_spool.spool.durable_mark import durable_mark
        from prime_runs_spool.spool.writer import SegmentWriter

        base = Path(sys.argv[1])
        parent = SegmentWriter.create(base / "parent", "parent")
        for n in range(50):
            parent.append("episode", {"id": f"p{n}"})  # a burst: the last sync is likely owed
        pid = os.fork()
        if pid == 0:
            child = SegmentWriter.create(base / "child", "child")
            for n in range(50):
                child.append("episode", {"id": f"c{n}"})
            deadline = time.monotonic() + 5
            while durable_mark(child.path) != child.path.stat().st_size and time.monotonic() < deadline:
                time.sleep(0.001)
            ok = durable_mark(child.path) == child.path.stat().st_size
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        deadline = time.monotonic() + 5
        while durable_mark(parent.path) != parent.path.stat().st_size and time.monotonic() < deadline:
            time.sleep(0.001)
        assert durable_mark(parent.path) == parent.path.stat().st_size
        parent.close()
        print("ok")
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_fifo_left_at_the_marks_name_never_hangs_the_opener(tmp_path: Path) -> None:
    """Whatever holds a new segment's mark name is garbage (the segment did not exist and its
    lock is ours): a FIFO there held ``create`` in its open forever (no reader), and a
    symbolic link had it truncate the file the link points to."""
    script = tmp_path / "fifo_mark.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        from pathlib import Path
        from prime_runs_spool.spool.layout import durable_mark_path, ensure_spool_dir
        from prime_runs_spool.spool.writer import SegmentWriter

        run = Path(sys.argv[1]) / "run"
        ensure_spool_dir(run)
        os.mkfifo(durable_mark_path(run, 1))
        victim = Path(sys.argv[1]) / "victim"
        victim.write_text("keep me")
        os.symlink(victim, durable_mark_path(run, 2))
        for _ in range(2):
            writer = SegmentWriter.create(run, "r")
            writer.append("episode", {"id": "e"})
            writer.close()
            mark = durable_mark_path(run, writer.index)
            assert not mark.is_symlink() and int(mark.read_bytes()) == writer.path.stat().st_size
        assert victim.read_text() == "keep me"
        print("ok")
    """))
    try:
        done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                              env=child_env(), timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("SegmentWriter.create hung opening a FIFO at the mark's name")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr

