"""The durable mark: written at most every MARK_INTERVAL, never ahead of the disk, never
back, caught up within the interval and at close (spool/durable_mark.py, and
docs/spool-format.md, section 5)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from support.env import child_env
from support.disk import split_synced_writes
from prime_runs_spool.spool import durable_mark as mark_module
from prime_runs_spool.spool import durable_file
from prime_runs_spool.spool import guards
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


@dataclass
class HeldPublisher:
    """A mark publisher on a fresh mark file, every write of it counted (``writes``), its
    writes for later held in ``jobs`` (their due times) for the test to run, 0.01 s apart."""

    mark: mark_module.MarkPublisher
    writes: MarkWrites
    jobs: list[float]


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HeldPublisher:
    writes = MarkWrites(monkeypatch)
    jobs: list[float] = []
    monkeypatch.setattr(mark_module, "_publish_later", lambda mark, due: jobs.append(due) or True)
    fd = os.open(tmp_path / "seg-000001.durable", os.O_WRONLY | os.O_CREAT, 0o600)
    mark = mark_module.MarkPublisher(fd)
    mark.interval = 0.01
    return HeldPublisher(mark, writes, jobs)


class DurableAndWritten:
    """Each value the mark was written with, beside the most bytes an fdatasync had made
    durable by then; ``slow``: how long a write of the publisher thread sleeps first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, slow: Callable[[], float] | None = None) -> None:
        self.synced = 0
        self.written: list[tuple[int, int]] = []
        real_sync, real_pwrite = durable_file._fdatasync, mark_module._pwrite

        def fdatasync(fd: int) -> None:
            size = split.lines_end(fd)  # where the lines end: the file also holds padding
            real_sync(fd)
            self.synced = max(self.synced, size)

        def pwrite(fd: int, data: bytes, offset: int) -> int:
            self.written.append((int(data), self.synced))
            if slow is not None and threading.current_thread().name == "spool-durable-marks":
                time.sleep(slow())
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
        split = split_synced_writes(monkeypatch)
        monkeypatch.setattr(mark_module, "_pwrite", pwrite)

    def values(self) -> list[int]:
        """What was written, asserted never ahead of the disk."""
        assert all(value <= durable for value, durable in self.written), self.written
        return [value for value, _ in self.written]


def append_from_threads(writer: SegmentWriter, threads: int, deadline: float, *, pad: bool = False) -> None:
    """``threads`` threads appending small episodes (of a few sizes, with ``pad``) until
    ``deadline`` (``time.monotonic()``)."""

    def work(t: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            writer.append("episode", {"id": f"t{t}-{n}", **({"pad": "x" * (n % 7 * 100)} if pad else {})})
            n += 1

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def wait_until_caught_up(writer: SegmentWriter, timeout: float = 5.0) -> float:
    """Seconds until the mark says every byte of the segment is durable."""
    start = time.monotonic()
    while durable_mark(writer.path) != writer.durable_bytes:
        if time.monotonic() - start > timeout:
            raise AssertionError(f"the mark stayed at {durable_mark(writer.path)}, the segment has "
                                 f"{writer.durable_bytes} bytes")
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
        # At most once an interval (and at the burst's edges), whatever the appends' pace:
        # once per sync wrote it 300 times here. (A count against the appends, fewer than half,
        # failed on a machine so loaded that an append took over half an interval.)
        assert during <= elapsed / MARK_INTERVAL + 3, (during, appends, elapsed)
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
            assert durable_mark(writer.path) == writer.durable_bytes
        assert len(writes.values) == 4  # the header's sync, then each append's
    finally:
        writer.close()


def test_close_writes_the_mark_it_still_owes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync left owed (the interval not over, the publisher thread not yet there) is marked
    by close, so a closed writer's mark says everything it synced (section 5's check 5)."""
    monkeypatch.setattr(mark_module, "MARK_INTERVAL", 3600.0)
    monkeypatch.setattr(mark_module, "_publish_later", lambda mark, due: True)  # queued; the thread never comes
    writer = SegmentWriter.create(tmp_path, "run-1")
    for n in range(5):
        writer.append("episode", {"id": f"e{n}"})
    size = writer.durable_bytes
    assert durable_mark(writer.path) < size  # owed: the header's sync was marked, not these
    writer.close()
    assert int(durable_mark_path(tmp_path, 1).read_bytes()) == size


def test_the_mark_never_runs_ahead_of_the_disk_nor_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight appending threads, the flushes and the publisher thread all write the mark; every
    value written is a count some fdatasync had made durable when it was written, and none
    is lower than the one before."""
    marks = DurableAndWritten(monkeypatch)
    writer = SegmentWriter.create(tmp_path, "run-1")
    deadline = time.monotonic() + 0.5

    append_from_threads(writer, 8, deadline, pad=True)
    try:
        wait_until_caught_up(writer)
    finally:
        writer.close()
    values = marks.values()
    assert len(values) > 3
    assert values == sorted(values)
    assert values[-1] == writer.durable_bytes


@pytest.mark.slow
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
            while durable_mark(child.path) != child.durable_bytes and time.monotonic() < deadline:
                time.sleep(0.001)
            ok = durable_mark(child.path) == child.durable_bytes
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        deadline = time.monotonic() + 5
        while durable_mark(parent.path) != parent.durable_bytes and time.monotonic() < deadline:
            time.sleep(0.001)
        assert durable_mark(parent.path) == parent.durable_bytes
        parent.close()
        print("ok")
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


# -- attacks (round of 2026-12-02): each failed on 0d49555 ------------------------------


@pytest.fixture
def fresh_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A publisher thread of the test's own (started on first use): one a test breaks is
    never the one the other tests' writers use. And an interval long enough that a burst's
    syncs are owed even on a slow shared disk."""
    monkeypatch.setattr(mark_module, "_queue", None)
    monkeypatch.setattr(mark_module, "MARK_INTERVAL", 0.2)


def burst(writer: SegmentWriter, appends: int = 20) -> None:
    """Appends within one interval (:func:`fresh_thread`'s): they leave the mark owed."""
    for n in range(appends):
        writer.append("episode", {"id": f"b{n}-{time.monotonic_ns()}"})


def test_an_append_whose_mark_is_owed_never_fails_for_want_of_a_thread(tmp_path: Path, fresh_thread: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.12 refuses to start a thread once the interpreter is shutting down (an
    atexit handler: runner/ending.py seals the runs left open there) and any Python refuses
    one past the process's thread limit. The first owed mark starts the publisher thread; if
    it cannot, the append must still succeed (a flush that raises breaks the writer for good)
    and its flush writes the mark itself."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        burst(writer)
        assert durable_mark(writer.path) == writer.durable_bytes
        writer.seal("completed")
    finally:
        writer.close()
    assert int(durable_mark_path(tmp_path, 1).read_bytes()) == writer.durable_bytes


def test_the_publisher_thread_survives_an_error_in_one_write(tmp_path: Path, fresh_thread: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A MemoryError (or any error but OSError) in one of the thread's writes must not end
    the thread: every later owed mark of every writer in the process would stay stale
    (followers wait) until its writer happens to sync again after the interval."""
    failures = [1]
    real = mark_module._pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if failures and threading.current_thread().name == "spool-durable-marks":
            failures.pop()
            raise MemoryError
        return real(fd, data, offset)

    monkeypatch.setattr(mark_module, "_pwrite", pwrite)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the old thread's traceback
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        burst(writer)
        deadline = time.monotonic() + 5
        while failures and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not failures  # the thread met its error
        time.sleep(2 * mark_module.MARK_INTERVAL)
        burst(writer)
        assert wait_until_caught_up(writer, timeout=2.0) < 2.0
    finally:
        writer.close()


def test_an_append_never_waits_for_the_publisher_threads_write(tmp_path: Path, fresh_thread: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread's pwrite of a mark can be slow (it waits on a journal commit, or the spool
    is on a network filesystem): an append that syncs meanwhile must not wait for it, and the
    count it made durable is still published once the thread is done."""
    stall = 1.0
    in_write, stalled = threading.Event(), threading.Event()
    real = mark_module._pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if threading.current_thread().name == "spool-durable-marks" and not in_write.is_set():
            in_write.set()
            time.sleep(stall)
            stalled.set()
        return real(fd, data, offset)

    monkeypatch.setattr(mark_module, "_pwrite", pwrite)
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        burst(writer, 1)  # within the interval of the header's write: owed, the thread writes it
        assert in_write.wait(5)
        assert not stalled.is_set()
        start = time.monotonic()
        burst(writer, 3)
        took = time.monotonic() - start
        assert took < stall / 2, took
        assert wait_until_caught_up(writer) < 5
    finally:
        writer.close()


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
            assert not mark.is_symlink() and int(mark.read_bytes()) == writer.durable_bytes
        assert victim.read_text() == "keep me"
        print("ok")
    """))
    try:
        done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                              env=child_env(), timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("SegmentWriter.create hung opening a FIFO at the mark's name")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_a_job_overtaken_by_a_flushs_own_write_writes_nothing(tmp_path: Path, held: HeldPublisher) -> None:
    """The publisher thread late (the GIL, a busy machine) while a sync after the job's due
    time wrote the mark itself, and the next sync owed it again: the late job must not write
    it a second time within the interval (that write is what the interval saves); the job
    queued for what is owed now writes it."""
    mark, writes, jobs = held.mark, held.writes, held.jobs
    mark.synced(100, 1000.000)  # written at once
    mark.synced(200, 1000.005)  # owed: a job for 1000.010
    mark.synced(300, 1000.012)  # the job is late: this sync writes the mark itself
    mark.synced(400, 1000.015)  # owed again: a job of its own
    assert writes.values == [100, 300] and len(jobs) == 2
    mark.publish_owed(jobs[0])  # the late job, overtaken
    assert writes.values == [100, 300]
    mark.publish_owed(jobs[1])
    assert writes.values == [100, 300, 400]
    mark.close()
    assert writes.values == [100, 300, 400]
    assert int((tmp_path / "seg-000001.durable").read_bytes()) == 400


def test_syncs_while_a_write_is_owed_leave_their_count_to_it_without_the_lock(held: HeldPublisher) -> None:
    """A sync that finds a write already queued for later stores its count and returns
    (the mark's lock held elsewhere, as the publisher's write holds it): the queued write
    publishes the newest count, once. (A sync that finds the queued write late writes the
    mark itself: test_a_job_overtaken_by_a_flushs_own_write_writes_nothing.)"""
    mark, writes, jobs = held.mark, held.writes, held.jobs
    mark.synced(100, 1000.000)  # written at once
    mark.synced(200, 1000.002)  # owed: a job for 1000.010
    assert writes.values == [100] and jobs == [1000.010]
    assert mark._lock.acquire(False)  # taken elsewhere: a sync that waited for it would hang here
    try:
        mark.synced(300, 1000.004)
        mark.synced(400, 1000.006)
    finally:
        mark._lock.release()
    assert writes.values == [100] and len(jobs) == 1
    mark.publish_owed(jobs[0])
    assert writes.values == [100, 400]  # the newest count, once
    mark.close()
    assert writes.values == [100, 400]  # nothing owed any more


def test_a_writer_whose_segment_was_deleted_never_writes_its_successors_mark(tmp_path: Path, fresh_thread: None) -> None:
    """A live writer's segment and lock deleted (``rm seg-000001.*`` but the mark, say), and
    the run opened again: the new writer takes index 1 again. Opened with O_TRUNC, its mark
    was the old writer's file, and what the old one still owed (written by its close, or by
    the publisher thread) made the new segment's mark say more bytes than that segment has
    fsync'd: a follower ships what a power cut can take back, a reader calls it truncated."""
    old = SegmentWriter.create(tmp_path, "run-1")
    burst(old, 10)  # owed: the thread writes it only when fresh_thread's interval ends
    mark_path = durable_mark_path(tmp_path, 1)
    old.path.unlink()
    (tmp_path / "spool" / "seg-000001.lock").unlink()
    new = SegmentWriter.create(tmp_path, "run-1")
    try:
        assert new.path == old.path and mark_path.exists()
        with pytest.raises(Exception):
            old.append("episode", {"id": "x"})  # SegmentGoneError: its segment has no name
        old.close()
        time.sleep(2 * mark_module.MARK_INTERVAL)
        assert durable_mark(new.path) <= new.durable_bytes
    finally:
        new.close()
    assert int(mark_path.read_bytes()) == new.durable_bytes


def test_a_deleted_mark_is_put_back_so_a_follower_does_not_wait_for_the_writer_to_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mark deleted under its live writer (a cleanup of stray files, a hand) read as 0 for
    the rest of the run: a follower shipped nothing of the segment until its writer ended.
    The writer's file checks (every LOCK_CHECK_INTERVAL, with the lock file's) put it back,
    saying what is durable."""
    monkeypatch.setattr(guards, "LOCK_CHECK_INTERVAL", 0.0)  # check at every flush
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        writer.append("episode", {"id": "a"})
        mark = durable_mark_path(tmp_path, 1)
        mark.unlink()
        writer.append("episode", {"id": "b"})
        wait_until_caught_up(writer, timeout=2.0)
        mark.unlink()
        mark.write_text("99999999999999999999\n")  # replaced: another file under its name
        writer.append("episode", {"id": "c"})
        wait_until_caught_up(writer, timeout=2.0)
    finally:
        writer.close()
    assert int(mark.read_bytes()) == writer.durable_bytes


def test_a_mark_that_cannot_be_put_back_is_reported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A directory in the deleted mark's place: the writer says so once, not at every check
    (ten times a second), and its appends go on."""
    monkeypatch.setattr(guards, "LOCK_CHECK_INTERVAL", 0.0)
    writer = SegmentWriter.create(tmp_path, "run-1")
    try:
        mark = durable_mark_path(tmp_path, 1)
        mark.unlink()
        mark.mkdir()
        mark.joinpath("keep").write_text("x")
        with caplog.at_level("WARNING", logger="prime_runs_spool"):
            for n in range(5):
                writer.append("episode", {"id": f"e{n}"})
        assert sum("durable mark" in record.getMessage() for record in caplog.records) == 1
    finally:
        writer.close()


def test_slow_publisher_writes_never_lose_run_ahead_or_back(tmp_path: Path, fresh_thread: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Flushes that find the thread writing owe it their count instead of waiting (see
    test_an_append_never_waits_for_the_publisher_threads_write). With the thread's writes
    slow at random and four appending threads: every value written was durable, none is
    lower than the one before, the mark catches up while the writer lives, and close leaves
    it at the whole segment."""
    import random

    monkeypatch.setattr(mark_module, "MARK_INTERVAL", 0.001)
    rng = random.Random(7)
    marks = DurableAndWritten(monkeypatch, slow=lambda: rng.random() * 0.003)
    writer = SegmentWriter.create(tmp_path, "run-1")
    deadline = time.monotonic() + 0.5

    append_from_threads(writer, 4, deadline)
    try:
        wait_until_caught_up(writer)
        writer.append("episode", {"id": "last"})
    finally:
        writer.close()
    values = marks.values()
    assert values == sorted(values)
    assert int(durable_mark_path(tmp_path, 1).read_bytes()) == writer.durable_bytes


def test_ctrl_c_while_close_waits_for_the_publisher_thread_still_releases_the_writer_lock(
        tmp_path: Path, fresh_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """close waits for a mark write under way (the thread's pwrite can be slow) and a
    SIGINT there raises KeyboardInterrupt out of that wait: the writer lock must still be let
    go, or readers take the closed segment for a live one (and wait on its mark) until the
    process exits."""
    import signal

    from prime_runs_spool.spool.writer_state import writer_alive

    # Python's own SIGINT handler, whatever this process inherited: a pytest started in the
    # background by a shell script (`.ci/run &`) starts with SIGINT ignored (POSIX), so Python
    # installs none and the signal is dropped: DID NOT RAISE, in every such full run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    in_write = threading.Event()
    interrupted = threading.Event()  # the slow write lasts until the SIGINT is sent, not a set time
    real = mark_module._pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if threading.current_thread().name == "spool-durable-marks" and not in_write.is_set():
            in_write.set()
            interrupted.wait(30)
            time.sleep(0.2)  # the signal's handler runs in the wait, before the lock is free
        return real(fd, data, offset)

    monkeypatch.setattr(mark_module, "_pwrite", pwrite)
    writer = SegmentWriter.create(tmp_path, "run-1")
    burst(writer, 1)  # owed: the thread writes it, slowly
    assert in_write.wait(5)
    main = threading.get_ident()
    waiting = mark_module.MarkPublisher.close.__code__

    def interrupt_the_wait() -> None:  # only once close is in it: a stray SIGINT ends the session
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                frame = sys._current_frames().get(main)
                if frame is not None and frame.f_code is waiting:
                    time.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.001)
        finally:
            interrupted.set()

    interrupter = threading.Thread(target=interrupt_the_wait)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            writer.close()
    finally:
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert not writer_alive(writer.path)
    writer.close()  # and a second close is quiet
