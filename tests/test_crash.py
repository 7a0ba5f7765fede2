"""SIGKILL a writer at random moments: every record it reported durable survives, once, in order.

Runs ``PRIME_RUNS_CRASH_LOOPS`` kills (default 30), all on one run directory, so each new
writer must also start cleanly after the previous one died.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.env import child_env
from prime_runs_spool import read_run
from prime_runs_spool.spool.reader import iter_records

SCRIPT = Path(__file__).parent / "support" / "crash_writer.py"
LOOPS = int(os.environ.get("PRIME_RUNS_CRASH_LOOPS", "30"))


def _run_and_kill(run_dir: Path, delay: float) -> list[tuple[int, str]]:
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(run_dir), "4"], stdout=subprocess.PIPE, env=child_env()
    )
    lines: list[bytes] = []
    assert child.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(child.stdout))  # type: ignore[union-attr]
    reader.start()
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    reader.join(10)
    reported = []
    for line in lines:
        if line.endswith(b"\n"):  # a line cut by the kill was never fully reported
            seq, record_id = line.decode().split()
            reported.append((int(seq), record_id))
    return reported


@pytest.mark.slow
def test_sigkilled_writers_lose_nothing_they_reported(tmp_path: Path):
    rng = random.Random(20260101)
    reported: list[tuple[int, int, str]] = []  # (segment, seq, id)
    segments_before = 0
    for loop in range(1, LOOPS + 1):
        delay = rng.uniform(0.05, 0.6) if loop % 5 else rng.uniform(0.0, 0.2)  # some die while starting
        for seq, record_id in _run_and_kill(tmp_path, delay):
            reported.append((int(record_id.split(".")[0]), seq, record_id))

        if not (tmp_path / "spool").exists() or not any((tmp_path / "spool").glob("seg-*.jsonl")):
            continue  # killed before it created its segment
        spool = read_run(tmp_path)
        assert spool.status in ("crashed", "torn"), (loop, spool.segments[-1])
        # Each writer took its own new segment, the next index, never reusing a dead one's.
        assert len(spool.segments) in (segments_before, segments_before + 1)
        assert [s.index for s in spool.segments] == list(range(1, len(spool.segments) + 1))
        assert not spool.segments[-1].live
        segments_before = len(spool.segments)

        found = [(r.segment_index, r.seq, r.data["id"]) for r in iter_records(tmp_path) if r.type == "episode"]
        ids = [record_id for _, _, record_id in found]
        assert len(ids) == len(set(ids)), "a record appears twice"
        position = {entry: i for i, entry in enumerate(found)}
        missing = [entry for entry in reported if entry not in position]
        assert not missing, f"reported durable but lost: {missing[:5]}"
        # In order: each writer thread's records appear in the order it appended them.
        last_n: dict[str, int] = {}
        for _, _, record_id in found:
            thread, n = record_id.rsplit("-", 1)
            assert last_n.get(thread, -1) < int(n)
            last_n[thread] = int(n)
    assert len(reported) > LOOPS, "the writer hardly ever got to report anything"
