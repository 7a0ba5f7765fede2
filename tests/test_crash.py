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


def _run_and_kill(run_dir: Path, delay: float, *, once_writing: bool = True) -> list[tuple[int, str]]:
    """Start a writer and SIGKILL it ``delay`` seconds later; with ``once_writing``, seconds
    after its first report (at most 10 s on): counted from the start, a machine so loaded
    that the interpreter took longer than the longest delay to start killed every writer
    before it wrote (0 reports in 30 kills), and the test proved nothing of the appends."""
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(run_dir), "4"], stdout=subprocess.PIPE, env=child_env()
    )
    lines: list[bytes] = []
    assert child.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(child.stdout))  # type: ignore[union-attr]
    reader.start()
    started = time.monotonic()
    while once_writing and not lines and child.poll() is None and time.monotonic() - started < 10:
        time.sleep(0.005)
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
        writing = loop % 5 != 0  # every fifth dies while starting
        delay = rng.uniform(0.05, 0.6) if writing else rng.uniform(0.0, 0.2)
        for seq, record_id in _run_and_kill(tmp_path, delay, once_writing=writing):
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


LONE_APPENDER = """
import sys
from prime_runs_spool import open_run

run = open_run(sys.argv[1], name="lone", environments=["gsm8k"], model="m")
n = 0
while True:
    episode_id = f"{sys.argv[2]}-{n}"  # ids stay apart across the writers that resume the run
    run.log_episodes([{"id": episode_id, "ok": True, "pad": "z" * (50 * (n % 40)), "traces": [
        {"agent": {"trainable": True}, "task": {"data": {"idx": n % 3}},
         "rewards": {"r": {"score": 1.0, "weight": 1.0}}}]}])
    sys.stdout.write(episode_id + "\\n")
    sys.stdout.flush()
    n += 1
"""


@pytest.mark.slow
def test_a_lone_appender_sigkilled_right_after_log_episodes_returns_loses_nothing(tmp_path: Path):
    """One thread through ``Run.log_episodes`` (the path with nobody to group with), killed
    at once after a random count of returned appends: each one it reported is on disk once,
    numbered in order by its rollout key, and every resumed writer goes on from there."""
    rng = random.Random(20261207)
    run_dir = tmp_path / "run"
    reported: list[str] = []
    for loop in range(6):
        child = subprocess.Popen([sys.executable, "-c", LONE_APPENDER, str(run_dir), str(loop)], stdout=subprocess.PIPE,
                                 env=child_env())
        assert child.stdout is not None
        wanted = rng.randint(1, 40)
        seen = 0
        deadline = time.monotonic() + 60
        while seen < wanted and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported.append(line.decode().strip())
            seen += 1
        child.send_signal(signal.SIGKILL)  # right after an append returned: its line was just read
        rest = child.communicate(timeout=30)[0]
        reported += [line.decode() for line in rest.splitlines(keepends=True) if line.endswith(b"\n")]
        reported = [entry.strip() for entry in reported]
        assert seen == wanted, f"the writer reported {seen} appends of {wanted} in 60 s"

        found = [record for record in iter_records(run_dir) if record.type == "episode"]
        ids = [record.data["id"] for record in found]
        assert len(ids) == len(set(ids)), "a record appears twice"
        missing = sorted(set(reported) - set(ids))
        assert not missing, f"reported durable but lost: {missing[:5]}"
        numbers: dict[int, int] = {}
        for record in found:  # rollout numbers 1, 2, 3... per idx, across the resumed writers
            idx = record.data["traces"][0]["task"]["data"]["idx"]
            numbers[idx] = numbers.get(idx, 0) + 1
            assert record.meta["rollout_number"] == numbers[idx], record.meta
    assert read_run(run_dir).status in ("crashed", "torn")
