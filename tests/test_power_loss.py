"""Simulated power loss: every byte no completed fdatasync covered is lost or garbled.

A fault-injecting layer wraps the writer's system calls (a synced pwritev is played as
its write, then its sync: tests/support/disk.py). It records, per file, how many
bytes the last *completed* fdatasync covered (where the lines ended: the file position,
not the size, which counts the padding ahead of them). At the "power cut" it makes every
later call fail (the machine is off), then rewrites each segment the way a disk may come
back: cut at the synced length, followed by nothing, zeros, a prefix of the unsynced bytes,
that prefix and zeros, or, since lines are written into padding already on disk, the
unsynced bytes with any of their 4 KiB pages back to the padding's zeros. What the writer
reported durable must all still be read; corruption may be reported only in bytes no sync
covered (docs/spool-format.md, section 4: the safe mistake).
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from support.disk import BOTH_PATHS, choose_path, split_synced_writes
from prime_runs_spool.spool import durable_file
from prime_runs_spool.errors import CorruptSpoolError, SpoolWriteError, WriterClosedError
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.spool.writer import SegmentWriter

#: A page of the page cache: what a disk may write back, or not, on its own.
PAGE = 4096


class PowerLossDisk:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._guard = threading.Lock()
        self.off = False
        self.synced: dict[int, int] = {}  # inode -> bytes covered by a completed fdatasync
        real_writev, real_sync = durable_file._writev, durable_file._fdatasync

        def writev(fd: int, parts) -> int:
            with self._guard:
                if self.off:
                    raise OSError(errno.EIO, "power is off")
            return real_writev(fd, parts)

        def fdatasync(fd: int) -> None:
            size = self._split.lines_end(fd)  # where the lines end: the file also holds padding
            with self._guard:  # the sync and its bookkeeping are one step w.r.t. the cut
                if self.off:
                    raise OSError(errno.EIO, "power is off")
                real_sync(fd)
                self.synced[os.fstat(fd).st_ino] = size

        def before_write(fd: int) -> None:
            with self._guard:
                if self.off:
                    raise OSError(errno.EIO, "power is off")

        monkeypatch.setattr(durable_file, "_writev", writev)
        monkeypatch.setattr(durable_file, "_fdatasync", fdatasync)
        # A flagged pwritev played as the write, then this fdatasync: a cut in between loses it.
        self._split = split_synced_writes(monkeypatch, before_write)

    def cut_power(self, run_dir: Path, rng: random.Random) -> None:
        with self._guard:
            self.off = True
        for _, path in list_segments(run_dir):
            content = path.read_bytes()
            keep = self.synced.get(path.stat().st_ino, 0)
            lost = content[keep:]
            prefix = lost[: rng.randint(0, len(lost))]
            holed = bytearray(lost)
            for page in range(-(keep % PAGE), len(lost), PAGE):  # pages of the file, not of the tail
                if rng.random() < 0.5:
                    start = max(page, 0)
                    holed[start : page + PAGE] = bytes(len(holed[start : page + PAGE]))
            tail = rng.choice([b"", b"\0" * len(lost), prefix, prefix + b"\0" * (len(lost) - len(prefix)),
                               bytes(holed)])
            path.write_bytes(content[:keep] + tail)  # never longer than it was: only written bytes can return


@BOTH_PATHS
@pytest.mark.parametrize("seed", range(12))
def test_what_was_reported_durable_survives_a_power_cut(tmp_path: Path, monkeypatch, seed: int, path: str):
    rng = random.Random(seed)
    choose_path(monkeypatch, path)
    disk = PowerLossDisk(monkeypatch)
    durable: list[tuple[int, int, dict]] = []
    lock = threading.Lock()
    stop = threading.Event()

    writer = SegmentWriter.create(tmp_path, "r")
    if seed % 3 == 0:  # a resumed run: an earlier, sealed segment
        writer.append("episode", {"t": -1, "n": 0})
        writer.seal("completed")
        durable.append((1, 1, {"t": -1, "n": 0}))
        writer = SegmentWriter.create(tmp_path, "r")

    def work(t: int) -> None:
        n = 0
        while not stop.is_set():
            record = {"t": t, "n": n, "pad": "p" * rng.randint(0, 3000)}
            try:
                seq = writer.append("episode", record)
            except (SpoolWriteError, WriterClosedError):
                return
            with lock:
                durable.append((writer.index, seq, record))
            n += 1

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.01, 0.15))
    deadline = time.monotonic() + 60  # a loaded machine: the cut waits for appends to cut across
    while len(durable) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    disk.cut_power(tmp_path, rng)
    stop.set()
    for t in threads:
        t.join()
    try:  # every thread may have stopped between appends: one more meets the dead disk
        writer.append("episode", {"after": "the cut"})
    except (SpoolWriteError, WriterClosedError):
        pass
    else:
        pytest.fail("an append after the power cut was reported durable")

    found = {}
    try:
        for r in iter_records(tmp_path):
            found[(r.segment_index, r.seq)] = r.data
    except CorruptSpoolError as exc:  # only where no sync reached: a page of a later line came back
        assert exc.offset >= disk.synced.get(Path(exc.path).stat().st_ino, 0)
        assert read_run(tmp_path).status == "corrupt"
    else:
        assert read_run(tmp_path).status in ("torn", "crashed")
    for index, seq, record in durable:
        assert found.get((index, seq)) == record
    assert len(durable) > 1
