"""The writer's contract: durable on return, grouped syncs, clean failures, locks, modes."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import read_run
from prime_runs_spool.spool import durable_file
from prime_runs_spool.errors import RecordNotSerializableError, SpoolWriteError, WriterClosedError
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.writer_state import writer_alive
from prime_runs_spool.spool.commit import GroupCommit
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.spool.format import episode_rest, prepare

from support.env import child_env
from support.loop_ticker import Ticker
from support.mounts import tmpfs
from support.threads import run_in_threads
from support.disk import BOTH_PATHS, choose_path, rewrite_writes, split_synced_writes


class SyncLedger:
    """Wraps fdatasync: remembers how many bytes of each file were synced, and how often."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay: float = 0.0) -> None:
        self.synced: dict[int, int] = {}
        self.calls = 0
        self.delay = delay
        real = durable_file._fdatasync

        def fdatasync(fd: int) -> None:
            if self.delay:
                time.sleep(self.delay)
            size = os.fstat(fd).st_size
            real(fd)
            self.synced[os.fstat(fd).st_ino] = size
            self.calls += 1

        monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
        split_synced_writes(monkeypatch)

    def synced_bytes(self, path: Path) -> int:
        return self.synced.get(path.stat().st_ino, 0)


def test_append_returns_only_after_its_line_is_synced(tmp_path: Path, monkeypatch):
    ledger = SyncLedger(monkeypatch)
    w = SegmentWriter.create(tmp_path, "r")
    assert ledger.synced_bytes(w.path) == w.path.stat().st_size  # the header is durable at once
    for i in range(20):
        w.append("episode", {"i": i})
        assert ledger.synced_bytes(w.path) == w.path.stat().st_size
    w.seal("completed")
    assert ledger.synced_bytes(w.path) == w.path.stat().st_size
    assert [r.data for r in iter_records(tmp_path)][:-1] == [{"i": i} for i in range(20)]


def test_64_threads_share_syncs_and_get_contiguous_seqs(tmp_path: Path, monkeypatch):
    ledger = SyncLedger(monkeypatch, delay=0.002)
    w = SegmentWriter.create(tmp_path, "r")
    synced_at_return: list[tuple[int, int]] = []
    seqs: list[int] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(20):
            seq = w.append("episode", {"t": t, "i": i})
            size = ledger.synced_bytes(w.path)
            with lock:
                seqs.append(seq)
                synced_at_return.append((seq, size))

    calls_before = ledger.calls
    run_in_threads(work, 64)
    assert sorted(seqs) == list(range(1, 64 * 20 + 1))
    assert ledger.calls - calls_before < 64 * 20 / 4, "appends were not grouped"
    records = {r.seq: r for r in iter_records(tmp_path)}
    for seq, size in synced_at_return:
        assert records[seq].end_offset <= size  # durable when append returned
    per_thread: dict[int, list[int]] = {}
    for r in sorted(records.values(), key=lambda r: r.seq):
        per_thread.setdefault(r.data["t"], []).append(r.data["i"])
    assert all(v == list(range(20)) for v in per_thread.values())
    w.close()


def test_async_appends_never_block_the_event_loop(tmp_path: Path, monkeypatch):
    SyncLedger(monkeypatch, delay=0.05)  # a slow disk: each sync takes 50 ms
    w = SegmentWriter.create(tmp_path, "r")

    async def main() -> tuple[list[int], Ticker, Ticker]:
        seqs = []
        async with Ticker(0.005) as ticker:
            for _ in range(3):  # three waves, each waiting on at least one slow sync
                seqs += await asyncio.gather(*(w.append_async("episode", {"i": i}) for i in range(50)))
        # The control: the same ticker on the same loop, as long, just after, with nothing
        # else to do. A loaded machine slows both alike; only a blocked loop slows one.
        async with Ticker(0.005) as control:
            await asyncio.sleep(ticker.elapsed)
        return seqs, ticker, control

    seqs, ticker, control = asyncio.run(main())
    assert sorted(seqs) == list(range(1, 151))
    assert ticker.elapsed >= 0.15
    rate, idle = ticker.ticks / ticker.elapsed, control.ticks / control.elapsed
    assert rate >= idle * 0.5, (f"the loop was blocked: {ticker.ticks} ticks in {ticker.elapsed:.2f}s while "
                                f"an idle loop ticked {control.ticks} in {control.elapsed:.2f}s")
    assert asyncio.run(w.append_many_async([("episode", {"x": 1}), ("episode", {"x": 2})])) == [151, 152]
    w.seal("completed")
    assert read_run(tmp_path).segments[0].episodes == 152


def test_unserializable_record_writes_nothing_and_leaves_the_writer_usable(tmp_path: Path):
    w = SegmentWriter.create(tmp_path, "r")
    w.append("episode", {"ok": 1})
    before = w.path.read_bytes()
    with pytest.raises(RecordNotSerializableError, match=r"field payload\.when"):
        w.append("episode", {"payload": {"when": object()}})
    with pytest.raises(RecordNotSerializableError):
        w.append_many([("episode", {"fine": 1}), ("episode", {1: "non-string key"})])
    with pytest.raises(RecordNotSerializableError):
        w.append("episode", {"ok": 2}, meta={"bad": object()})
    assert w.path.read_bytes() == before
    assert w.append("episode", {"ok": 3}) == 2
    w.seal("completed")
    assert [r.seq for r in iter_records(tmp_path)] == [1, 2, 3]


@pytest.mark.parametrize("call, code, path", [
    ("_pwritev", errno.ENOSPC, "one call"), ("_fdatasync", errno.EIO, "one call"),
    ("_writev", errno.ENOSPC, "position writes"), ("_fdatasync", errno.EIO, "position writes")])
def test_a_disk_error_fails_the_group_and_breaks_the_writer(tmp_path: Path, monkeypatch, call, code, path):
    choose_path(monkeypatch, path)
    split_synced_writes(monkeypatch)  # an fdatasync that fails fails the synced pwritev
    w = SegmentWriter.create(tmp_path, "r")
    w.append("episode", {"i": 0})

    def fail(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(durable_file, call, fail)
    with pytest.raises(SpoolWriteError, match=os.strerror(code)) as info:
        w.append("episode", {"i": 1})
    assert info.value.errno == code
    monkeypatch.undo()
    with pytest.raises(WriterClosedError, match="broken"):
        w.append("episode", {"i": 2})  # never retried, even once the disk is fine again
    with pytest.raises(WriterClosedError):
        w.seal("completed")
    assert not writer_alive(w.path)  # the segment is given up at once
    w.close()
    assert [r.data for r in iter_records(tmp_path)][-1] in ({"i": 0}, {"i": 1})
    w2 = SegmentWriter.create(tmp_path, "r")
    assert w2.index == 2
    w2.close()


def test_concurrent_appends_around_a_failed_sync_report_only_durable_records(tmp_path: Path, monkeypatch):
    real = durable_file._fdatasync
    calls = 0
    durable_size = 0

    def flaky(fd: int) -> None:
        nonlocal calls, durable_size
        calls += 1
        time.sleep(0.001)
        if calls >= 6:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)
        durable_size = os.fstat(fd).st_size

    w = SegmentWriter.create(tmp_path, "r")
    monkeypatch.setattr(durable_file, "_fdatasync", flaky)
    split_synced_writes(monkeypatch)
    ok: list[int] = []
    failed: list[BaseException] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(30):
            try:
                seq = w.append("episode", {"t": t, "i": i})
            except (SpoolWriteError, WriterClosedError) as exc:
                with lock:
                    failed.append(exc)
                return
            with lock:
                ok.append(seq)

    run_in_threads(work, 16)
    assert len(failed) == 16
    assert any(isinstance(e, SpoolWriteError) for e in failed)
    ends = {r.seq: r.end_offset for r in iter_records(tmp_path)}
    assert all(ends[seq] <= durable_size for seq in ok)


@BOTH_PATHS
def test_short_writes_and_more_parts_than_iov_max(tmp_path: Path, monkeypatch, path):
    choose_path(monkeypatch, path)
    w = SegmentWriter.create(tmp_path, "r")
    seqs = w.append_many([("episode", {"i": i}) for i in range(700)])  # 2100 iovecs
    rewrite_writes(monkeypatch, lambda _call, parts: [bytes(parts[0])[:7]])  # a write(2) may write less than asked
    seqs += w.append_many([("episode", {"j": i, "pad": "x" * 30}) for i in range(5)])
    monkeypatch.undo()
    w.seal("completed")
    assert seqs == list(range(1, 706))
    spool = read_run(tmp_path)
    assert spool.status == "completed" and spool.segments[0].episodes == 705


def test_real_disk_full_on_a_tiny_tmpfs(tmp_path: Path):
    with tmpfs(tmp_path / "tiny", "size=64k") as mount_point:
        w = SegmentWriter.create(mount_point / "run", "r")
        durable = []
        with pytest.raises(SpoolWriteError, match="No space left"):
            for i in range(1000):
                durable.append(w.append("episode", {"i": i, "pad": "y" * 1000}))
        got = [r.seq for r in iter_records(mount_point / "run")]
        assert got[: len(durable)] == durable
        assert read_run(mount_point / "run").status in ("torn", "crashed")


def test_modes_are_private(tmp_path: Path):
    old = os.umask(0o022)
    try:
        w = SegmentWriter.create(tmp_path / "new-run", "r")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new-run").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new-run" / "spool").stat().st_mode) == 0o700
    assert stat.S_IMODE(w.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(w.path.with_suffix(".lock").stat().st_mode) == 0o600
    w.close()


def test_lock_is_held_while_open_and_freed_by_seal_and_close(tmp_path: Path):
    w = SegmentWriter.create(tmp_path, "r")
    assert writer_alive(w.path) and read_run(tmp_path).status == "live"
    w.seal("failed", error="boom")
    assert not writer_alive(w.path)
    spool = read_run(tmp_path)
    assert spool.status == "failed"
    w2 = SegmentWriter.create(tmp_path, "r")
    assert writer_alive(w2.path)
    w2.close()
    assert not writer_alive(w2.path) and read_run(tmp_path).status == "crashed"
    with pytest.raises(WriterClosedError):
        w2.append("episode", {})


@pytest.mark.slow
def test_lock_frees_itself_when_the_writer_process_is_killed(tmp_path: Path):
    script = (
        "import sys, time\n"
        "from prime_runs_spool import SegmentWriter\n"
        "w = SegmentWriter.create(sys.argv[1], 'r')\n"
        "w.append('episode', {'i': 1})\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                             env=child_env(), text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert read_run(tmp_path).status == "live"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
    assert read_run(tmp_path).status == "crashed"
    w = SegmentWriter.create(tmp_path, "r")
    assert w.index == 2
    w.close()


def test_a_second_writer_on_a_live_run_takes_a_new_segment(tmp_path: Path):
    first = SegmentWriter.create(tmp_path, "r")
    second = SegmentWriter.create(tmp_path, "r")
    assert (first.index, second.index) == (1, 2)
    first.append("episode", {"w": 1})
    second.append("episode", {"w": 2})
    first.seal("completed")
    second.seal("completed")
    assert [e for e in read_run(tmp_path).episodes()] == [{"w": 1}, {"w": 2}]


def test_seal_records_what_the_segment_holds(tmp_path: Path):
    w = SegmentWriter.create(tmp_path, "r")
    w.append("manifest", {"name": "m"})
    w.append_many([("episode", {"i": i}) for i in range(3)])
    with pytest.raises(ValueError):
        w.seal("done")
    with pytest.raises(ValueError):
        w.append("seal", {})
    assert w.seal("completed", summary={"reward": 0.5}) == 5
    seal = list(iter_records(tmp_path))[-1]
    assert seal.type == "seal"
    assert {k: seal.data[k] for k in ("status", "last_seq", "episodes", "summary", "error")} == {
        "status": "completed", "last_seq": 4, "episodes": 3, "summary": {"reward": 0.5}, "error": None,
    }
    with pytest.raises(WriterClosedError):
        w.append("episode", {})
    w.close()


class SyscallCounter:
    """Counts the writer's line writes (writev, or pwritev) and syncs (fdatasync, or the
    flag of a synced pwritev, played as one: tests/support/disk.py)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay: float = 0.0) -> None:
        self.writev = self.fdatasync = 0
        real_writev, real_sync = durable_file._writev, durable_file._fdatasync

        def writev(fd: int, parts) -> int:
            self.writev += 1
            return real_writev(fd, parts)

        def fdatasync(fd: int) -> None:
            self.fdatasync += 1
            if delay:
                time.sleep(delay)
            real_sync(fd)

        def pwritev(fd: int) -> None:
            self.writev += 1

        monkeypatch.setattr(durable_file, "_writev", writev)
        monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
        split_synced_writes(monkeypatch, pwritev)


def test_a_flush_is_one_system_call_where_pwritev_can_sync(tmp_path: Path, monkeypatch):
    """Where the kernel has RWF_DSYNC, a lone append is one pwritev that carries it, and
    no fdatasync: the leader takes the GIL back once a flush, not twice (docs/benchmarks.md,
    "64 asyncio tasks"). The real calls, not the split test double."""
    if not durable_file._RWF_DSYNC:
        pytest.skip("this kernel or Python has no RWF_DSYNC")
    flagged: list[int] = []
    syncs: list[int] = []
    real_pwritev, real_sync = durable_file._pwritev, durable_file._fdatasync

    def pwritev(fd: int, parts, offset: int, flags: int = 0) -> int:
        flagged.append(flags)
        return real_pwritev(fd, parts, offset, flags)

    monkeypatch.setattr(durable_file, "_pwritev", pwritev)
    monkeypatch.setattr(durable_file, "_fdatasync", lambda fd: syncs.append(fd) or real_sync(fd))
    w = SegmentWriter.create(tmp_path, "r")
    for i in range(10):
        w.append("episode", {"i": i})
    assert flagged == [durable_file._RWF_DSYNC] * 11 and syncs == []  # the header's and ten appends
    w.seal("completed")
    assert len(syncs) == 1  # the cut of the padding, made durable before the seal (DurableFile._unpad)
    assert [r.data["i"] for r in iter_records(tmp_path) if r.type == "episode"] == list(range(10))


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_a_filesystem_that_refuses_the_sync_flag_gets_writes_and_fdatasyncs(tmp_path: Path, monkeypatch, code):
    if not durable_file._RWF_DSYNC:
        pytest.skip("this kernel or Python has no RWF_DSYNC")
    real_pwritev, real_sync = durable_file._pwritev, durable_file._fdatasync
    refused: list[int] = []
    syncs: list[int] = []

    def pwritev(fd: int, parts, offset: int, flags: int = 0) -> int:
        if flags:
            refused.append(flags)
            raise OSError(code, os.strerror(code))
        return real_pwritev(fd, parts, offset)

    def fdatasync(fd: int) -> None:
        syncs.append(os.lseek(fd, 0, os.SEEK_CUR))
        real_sync(fd)

    monkeypatch.setattr(durable_file, "_pwritev", pwritev)
    monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
    w = SegmentWriter.create(tmp_path, "r")
    for i in range(5):
        w.append("episode", {"i": i, "text": "x" * 100})
        assert syncs[-1] == w.durable_bytes  # synced, and the file position is where lines end
    assert refused == [durable_file._RWF_DSYNC]  # asked once, then never again
    assert len(syncs) == 6
    w.seal("completed")
    spool = read_run(tmp_path)
    assert spool.status == "completed" and spool.segments[0].episodes == 5


def test_a_lone_appender_makes_one_writev_and_one_fdatasync_per_append_inline(tmp_path: Path, monkeypatch):
    w = SegmentWriter.create(tmp_path, "r")
    calls = SyscallCounter(monkeypatch)
    def threads() -> int:
        # Not the process's durable-mark thread (spool/durable_mark.py): the first mark a burst
        # leaves owed starts it, here when this test runs first; it never takes an append.
        return sum(thread.name != "spool-durable-marks" for thread in threading.enumerate())

    threads_before = threads()
    for i in range(50):
        assert w.append("episode", {"i": i}) == i + 1
        assert (calls.writev, calls.fdatasync) == (i + 1, i + 1)
    assert w.append_many([("episode", {"j": j}) for j in range(5)]) == [51, 52, 53, 54, 55]
    assert (calls.writev, calls.fdatasync) == (51, 51)  # a group of five: one of each
    assert threads() == threads_before  # no helper thread, no hand-off
    w.seal("completed")
    # The seal's, and one before it that makes the cut of the padding durable (DurableFile._unpad).
    assert (calls.writev, calls.fdatasync) == (52, 53)


def test_concurrent_appenders_make_fewer_syncs_than_appends(tmp_path: Path, monkeypatch):
    w = SegmentWriter.create(tmp_path, "r")
    calls = SyscallCounter(monkeypatch, delay=0.001)
    barrier = threading.Barrier(16)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(25):
            w.append("episode", {"t": t, "i": i})

    run_in_threads(work, 16)
    assert calls.fdatasync < 16 * 25 / 2
    assert calls.writev == calls.fdatasync  # one write per group (no short writes here)
    w.seal("completed")
    assert [r.seq for r in iter_records(tmp_path)] == list(range(1, 16 * 25 + 2))


def test_threads_and_async_tasks_share_groups_and_close_waits_for_them(tmp_path: Path, monkeypatch):
    SyncLedger(monkeypatch, delay=0.002)
    w = SegmentWriter.create(tmp_path, "r")
    results: list[int] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(10):
            seq = w.append("episode", {"t": t, "i": i})
            with lock:
                results.append(seq)

    async def tasks() -> list[int]:
        return await asyncio.gather(*(w.append_async("episode", {"a": i}) for i in range(40)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    results += asyncio.run(tasks())
    for t in threads:
        t.join()
    w.close()
    assert sorted(results) == list(range(1, 8 * 10 + 40 + 1))
    assert [r.seq for r in iter_records(tmp_path)] == list(range(1, 8 * 10 + 40 + 1))


def test_an_unexpected_exception_in_a_flush_fails_its_group_without_hanging_the_others(tmp_path: Path, monkeypatch):
    real = durable_file._fdatasync
    calls = 0

    def odd(fd: int) -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.002)
        if calls == 3:
            raise RuntimeError("not a disk error")
        real(fd)

    w = SegmentWriter.create(tmp_path, "r")
    monkeypatch.setattr(durable_file, "_fdatasync", odd)
    split_synced_writes(monkeypatch)
    outcomes: list[object] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(20):
            try:
                w.append("episode", {"t": t, "i": i})
            except (RuntimeError, SpoolWriteError, WriterClosedError) as exc:
                with lock:
                    outcomes.append(type(exc))
                return
        with lock:
            outcomes.append("done")

    run_in_threads(work, 8, timeout=10, hung="appenders hung after a failed flush")
    assert RuntimeError in outcomes and "done" not in outcomes
    with pytest.raises(WriterClosedError, match="broken"):
        w.append("episode", {})
    w.close()


def test_async_tasks_that_append_before_the_helper_starts_share_its_sync(tmp_path: Path, monkeypatch):
    """An async leader's batch stays open until the helper thread starts writing.

    The tasks a loop runs before it next waits join that group: 32 tasks gathered at once
    make one group, not a group of one (the first task) and then the rest.
    """
    w = SegmentWriter.create(tmp_path, "r")
    groups: list[int] = []
    syncs = SyscallCounter(monkeypatch)

    def count_group(_call: int, parts: list[Any]) -> list[Any]:
        groups.append(len(parts) // 3)  # three parts per line (and perhaps the padding)
        return parts

    rewrite_writes(monkeypatch, count_group)

    async def main() -> list[int]:
        return await asyncio.gather(*(w.append_async("episode", {"i": i}) for i in range(32)))

    assert asyncio.run(main()) == list(range(1, 33))
    assert groups[0] > 1, f"the first task was synced alone: groups {groups}"
    assert syncs.fdatasync <= 2, f"{syncs.fdatasync} syncs for 32 tasks appending at once: groups {groups}"
    w.close()


def test_async_flushes_run_on_one_helper_thread_that_ends_with_the_writer(tmp_path: Path, monkeypatch):
    w = SegmentWriter.create(tmp_path, "r")
    flushers: list[threading.Thread] = []
    real = durable_file._fdatasync

    def fdatasync(fd: int) -> None:
        flushers.append(threading.current_thread())
        real(fd)

    monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
    split_synced_writes(monkeypatch)

    async def main() -> None:
        for i in range(20):  # one at a time: every append makes the helper lead a flush
            await w.append_async("episode", {"i": i})

    asyncio.run(main())
    assert len(flushers) == 20
    helper = flushers[0]
    assert helper is not threading.main_thread()
    assert all(thread is helper for thread in flushers), "a new thread for every flush"
    w.seal("completed")
    helper.join(5)
    assert not helper.is_alive(), "the helper thread outlived its writer"


def test_tasks_on_two_event_loops_append_to_one_writer(tmp_path: Path, monkeypatch):
    SyncLedger(monkeypatch, delay=0.001)
    w = SegmentWriter.create(tmp_path, "r")
    results: list[list[int]] = [[], []]

    def loop_thread(n: int) -> None:
        async def main() -> list[int]:
            seqs: list[int] = []
            for _ in range(5):
                seqs += await asyncio.gather(*(w.append_async("episode", {"loop": n, "i": i}) for i in range(20)))
            return seqs

        results[n] = asyncio.run(main())

    run_in_threads(loop_thread, 2, timeout=20, hung="a loop's tasks were never settled")
    w.seal("completed")
    assert sorted(results[0] + results[1]) == list(range(1, 201))
    by_seq = {r.seq: r.data for r in iter_records(tmp_path) if r.type == "episode"}
    for n in range(2):
        assert [by_seq[seq]["loop"] for seq in results[n]] == [n] * 100


@pytest.mark.slow
def test_the_helper_thread_does_not_keep_a_dropped_writer_alive(tmp_path: Path):
    import gc
    import weakref

    w = SegmentWriter.create(tmp_path, "r")
    before = set(threading.enumerate())
    asyncio.run(w.append_async("episode", {"i": 1}))  # the helper thread led that flush
    helpers = [t for t in set(threading.enumerate()) - before if t.name.startswith("spool-seg-")]
    assert len(helpers) == 1
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None, "the idle helper thread still holds the writer"
    helpers[0].join(5)
    assert not helpers[0].is_alive(), "the helper thread of a dropped writer never ends"


def test_append_episodes_writes_the_lines_append_many_writes(tmp_path: Path):
    """The run's path (payloads and ``episode_rest`` built outside the writer) makes the same
    bytes, sequence numbers and episode count as ``append_many`` with each meta mapping."""
    from prime_runs_spool.spool.format import episode_rest, prepare

    records = [({"i": i, "text": "é\n" * i}, {"episode_id": f"e{i}" if i % 3 else None, "rollout_number": i or None})
               for i in range(6)]
    many = SegmentWriter.create(tmp_path / "many", "r")
    assert many.append_many([("episode", record, meta) for record, meta in records[:2]]) == [1, 2]
    assert many.append_many([("episode", record, meta) for record, meta in records[2:]]) == [3, 4, 5, 6]
    lines = SegmentWriter.create(tmp_path / "lines", "r")
    as_lines = [(prepare(record), episode_rest(meta["episode_id"], meta["rollout_number"])) for record, meta in records]
    assert lines.append_episodes(as_lines[:2]) == 1
    assert lines.append_episodes([]) == 3
    assert asyncio.run(lines.append_episodes_async(as_lines[2:])) == 3
    for w in (many, lines):
        assert w.episodes == 6
        w.close()
    body = [path.read_bytes().split(b"\n")[1:] for path in (many.path, lines.path)]  # after the headers
    assert body[0] == body[1] and len(body[0]) == 7  # six lines and the empty rest after the last


def test_an_interrupt_as_the_lone_appender_starts_its_flush_fails_the_writer_instead_of_hanging_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt landing between an append taking the flushing job and the flush's
    own error handling (at ``_lead``'s first line: Python checks for signals on entering a
    function) left the job taken: every later append queued behind a flush that never came
    and waited forever. Now the writer fails as after a failed flush (the interrupted lines
    were numbered but never written), later appends raise at once, and the file reads clean."""
    writer = SegmentWriter.create(tmp_path, "run-1")
    writer.append("episode", {"id": "e0"})
    real_lead = GroupCommit._lead
    calls = []

    def interrupted_lead(self, batch, parts):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # as a signal delivered on entering _lead
        return real_lead(self, batch, parts)

    monkeypatch.setattr(GroupCommit, "_lead", interrupted_lead)
    with pytest.raises(KeyboardInterrupt):
        writer.append("episode", {"id": "e1"})
    outcome: list[BaseException | int] = []
    later = threading.Thread(target=lambda: outcome.append(_append_or_error(writer, {"id": "e2"})), daemon=True)
    later.start()
    later.join(10)
    assert not later.is_alive(), "an append after the interrupt waited forever for the flushing job"
    assert isinstance(outcome[0], WriterClosedError), outcome
    assert [r.data["id"] for r in iter_records(tmp_path) if r.type == "episode"] == ["e0"]
    writer.close()


def _append_or_error(writer: SegmentWriter, record: dict) -> BaseException | int:
    try:
        return writer.append("episode", record)
    except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
        return exc


def _lines(tag: str, n: int) -> list[Any]:
    return [(prepare({"tag": tag, "i": i}), episode_rest(f"{tag}-{i}", i)) for i in range(n)]


@pytest.mark.parametrize("fails", [False, True])
def test_appenders_arriving_while_a_lone_appender_flushes_inline_share_its_fate_or_the_next_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool):
    """A lone appender writes and syncs inline; threads and async tasks that arrive during
    that sync queue behind it. A failed sync fails every one of them (nothing queued behind
    a broken segment can be written); a good one hands them the next sync. Nobody hangs,
    and what is reported durable is on disk with contiguous numbers."""
    w = SegmentWriter.create(tmp_path, "r")
    real = durable_file._fdatasync
    entered, release = threading.Event(), threading.Event()
    calls = 0
    synced_size = 0

    def gated(fd: int) -> None:
        nonlocal calls, synced_size
        calls += 1
        if calls == 1:
            entered.set()
            assert release.wait(10)
            if fails:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)
        synced_size = os.fstat(fd).st_size

    monkeypatch.setattr(durable_file, "_fdatasync", gated)
    split_synced_writes(monkeypatch)
    outcomes: dict[str, Any] = {}

    def append(name: str, n: int) -> None:
        try:
            outcomes[name] = ("ok", w.append_episodes(_lines(name, n)), n)
        except (SpoolWriteError, WriterClosedError) as exc:
            outcomes[name] = ("error", type(exc).__name__)

    lead = threading.Thread(target=append, args=("lead", 2))
    lead.start()
    assert entered.wait(10)
    assert w._group._flushing  # the lone appender is mid-flush, inline
    threads = [threading.Thread(target=append, args=(f"t{i}", 3)) for i in range(4)]
    for t in threads:
        t.start()

    async def tasks() -> None:
        async def one(name: str) -> None:
            try:
                outcomes[name] = ("ok", await w.append_episodes_async(_lines(name, 2)), 2)
            except (SpoolWriteError, WriterClosedError) as exc:
                outcomes[name] = ("error", type(exc).__name__)
        await asyncio.gather(*(one(f"a{i}") for i in range(4)))

    loop_thread = threading.Thread(target=asyncio.run, args=(tasks(),))
    loop_thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # every late comer queued behind the flush
        batch = w._group._open
        if batch is not None and len(batch.waiters) == 4 and len(batch.futures) == 4:
            break
        time.sleep(0.005)
    else:
        pytest.fail("the late appenders never queued")
    release.set()
    for t in (lead, *threads, loop_thread):
        t.join(10)
        assert not t.is_alive(), "an appender hung"
    assert len(outcomes) == 9
    if fails:
        assert all(o[0] == "error" for o in outcomes.values()), outcomes
        assert outcomes["lead"] == ("error", "SpoolWriteError")
        with pytest.raises(WriterClosedError):
            w.append_episodes(_lines("after", 1))
    else:
        assert all(o[0] == "ok" for o in outcomes.values()), outcomes
        firsts = sorted((o[1], o[2]) for o in outcomes.values())
        seq = 1
        for first, n in firsts:  # contiguous, each call's lines together
            assert first == seq
            seq += n
        assert w.next_seq == seq
        ends = {r.seq: r.end_offset for r in iter_records(tmp_path)}
        assert max(ends[s] for s in range(1, seq)) <= synced_size
        w.seal("completed")
    w.close()
    if not fails:
        assert len([r for r in iter_records(tmp_path) if r.type == "episode"]) == 2 + 4 * 3 + 4 * 2


@BOTH_PATHS
@pytest.mark.parametrize("first", [0, 5])
def test_a_short_first_writev_on_the_inline_path_is_written_out_or_fails_the_append(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: int, path: str):
    """The inline path writes with one call (a synced pwritev, or a writev) and only loops
    when it came back short: a first write of some bytes is completed; one of none is an
    error, not a success or a loop forever."""
    choose_path(monkeypatch, path)
    w = SegmentWriter.create(tmp_path, "r")

    def short(call: int, parts: list[Any]) -> list[Any]:  # nothing at all where first is 0
        return ([bytes(parts[0])[:first]] if first else []) if call == 1 else parts

    rewrite_writes(monkeypatch, short)
    if first:
        assert w.append_episodes(_lines("x", 3)) == 1
        monkeypatch.undo()
        w.seal("completed")
        assert [r.seq for r in iter_records(tmp_path)] == [1, 2, 3, 4]  # 3 episodes, the seal
        assert [r.data for r in iter_records(tmp_path) if r.type == "episode"] == [
            {"tag": "x", "i": i} for i in range(3)]
    else:
        with pytest.raises(SpoolWriteError):
            w.append_episodes(_lines("x", 3))
        with pytest.raises(WriterClosedError):
            w.append_episodes(_lines("y", 1))
    w.close()


@BOTH_PATHS
def test_a_short_first_writev_then_a_full_disk_on_the_inline_path_reports_nothing_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str):
    choose_path(monkeypatch, path)
    w = SegmentWriter.create(tmp_path, "r")
    assert w.append_episodes(_lines("before", 1)) == 1

    def short_then_full(call: int, parts: list[Any]) -> list[Any]:
        if call == 1:
            return [bytes(parts[0])[:3], bytes(parts[1])[:10]]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    rewrite_writes(monkeypatch, short_then_full)
    with pytest.raises(SpoolWriteError, match=os.strerror(errno.ENOSPC)):
        w.append_episodes(_lines("lost", 2))
    monkeypatch.undo()
    with pytest.raises(WriterClosedError):
        w.append_episodes(_lines("after", 1))
    w.close()
    assert [r.data for r in iter_records(tmp_path)] == [{"tag": "before", "i": 0}]  # the torn line is not read
