"""The state file overwritten in place (sync/state_file.py) against faults the kernel really
produces: a short write taken for a whole one, and a reader (the eval's view of its online
shipper) meeting a write part way."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest


def _state(run_id: str):  # noqa: ANN202
    from prime_runs_spool.sync.state import SyncState, remote_destination

    return SyncState(destination=remote_destination("http://platform.invalid", None), local_run_id=run_id)


_SHORT_WRITE = """
import resource, sys, uuid
from pathlib import Path
from prime_runs_spool.sync import state_file
from prime_runs_spool.sync.state import InFlight, SyncState, remote_destination, save_state

path = Path(sys.argv[1])
state = SyncState(destination=remote_destination("http://platform.invalid", None), local_run_id="short-write")
state.released = [str(uuid.UUID(int=i)) for i in range(90)]  # 3.6 KB of ids: two pages
state.in_flight = InFlight(kind="create", sent_at=1.0)
writer = state_file.Writer(str(path))
save_state(path, state, writer)  # the first: renamed into place, its twin made
assert path.stat().st_size == 2 * state_file.BLOCK
state.in_flight, state.evaluation_id = InFlight(kind="samples", sent_at=2.0, rows=3), "eval-1"
save_state(path, state, writer)  # in place, whole
state.in_flight = None  # the request landed: the pass's last write announces nothing
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (state_file.BLOCK, hard))  # the file may not grow past a page now
try:
    save_state(path, state, writer)
    print("written: no error")
except OSError as exc:
    print("failed:", exc)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
writer.end()
"""


@pytest.mark.slow
def test_a_short_overwrite_in_place_is_a_failed_write_not_a_torn_file(tmp_path: Path) -> None:
    """``os.pwrite`` on a regular file may write fewer bytes than asked and say so only by
    its return value, not by an error: the kernel stops a buffered write at the limit of
    RLIMIT_FSIZE (played here, for real, in a child process), and at a page boundary on
    ENOSPC or EDQUOT (an overwrite on a copy-on-write file system, btrfs, XFS reflinks,
    needs new blocks) or a fatal signal. A state past 3 KB is padded to two pages.
    ``_in_place`` drops pwrite's return value: a short write of the file is taken for a whole
    one, the pass ends "whole" and blanks the twin, and the file is left torn, first page
    new, second old, with nothing to read for it: the last state is lost, where a failed
    write must leave the last state (tests/test_sync_state.py)."""
    from prime_runs_spool.sync import state_file
    from prime_runs_spool.sync.state import StateProblem, load_state

    path = tmp_path / "sync" / "dest.json"
    child = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(path)], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == 0, child.stderr
    try:
        read = load_state(path, destination=_state("short-write").destination, local_run_id="short-write")
    except StateProblem as exc:
        pytest.fail(f"after a short overwrite ({child.stdout.strip()}): {exc}; its twin blank: "
                    f"{Path(state_file.twin_path(str(path))).read_bytes().isspace()}")
    assert read is not None and read.evaluation_id == "eval-1", read


_WRITER = """
import sys, time, uuid
from pathlib import Path
from prime_runs_spool.sync import state_file
from prime_runs_spool.sync.state import InFlight, SyncState, remote_destination, save_state

path, seconds = Path(sys.argv[1]), float(sys.argv[2])
state = SyncState(destination=remote_destination("http://platform.invalid", None), local_run_id="online")
state.in_flight = InFlight(kind="create", sent_at=1.0)
writer = state_file.Writer(str(path))
save_state(path, state, writer)  # renamed into place, its twin made: the writes after it go in place
print("ready", flush=True)
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:  # a shipper's pass: announcements and acknowledgements, in place
    n += 1
    state.released = [str(uuid.UUID(int=i)) for i in range(n % 60)]  # states of different lengths, all within the padding
    state.in_flight = InFlight(kind="samples", sent_at=float(n), rows=3) if n % 2 else None
    state.samples_pushed = state.episodes_pushed = n
    save_state(path, state, writer)
writer.end()
"""


@pytest.mark.slow
def test_the_eval_reads_the_shippers_progress_while_it_writes_in_place(tmp_path: Path) -> None:
    """The online mode's eval reads the shipper's progress from its state file with no lock
    (runner/online.py, ``Shipper.progress``: ``RunDriver.pushed``, ``evaluation_url``,
    ``pending`` for a dashboard), by ``SyncState.from_json(read_regular_file(...))``, not by
    ``read_state``. A rename gave it one whole file, old or new, at every instant; an
    overwrite in place is read half old, half new by a read that meets it (a buffered read
    takes no lock against a write), and progress is then None: pushed 0, every episode
    pending, the evaluation's URL gone. Played: a real child process writing states in place
    (state_file, as a pass does) while this one reads progress, up to 60 s (here a torn read
    came every 10-35 s of reading: read_state, reading the twin then, never failed)."""
    from types import SimpleNamespace

    from prime_runs_spool.runner.online import Shipper
    from prime_runs_spool.sync.state import remote_destination, sync_state_path

    run_dir = tmp_path / "run"
    (run_dir / "spool").mkdir(parents=True)  # the run's spool folder: a pass makes only its state folder in it
    destination = remote_destination("http://platform.invalid", None)
    path = sync_state_path(run_dir, destination.key)
    shipper = SimpleNamespace(_run_dir=run_dir, destination=destination)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "60"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        reads, lost = 0, 0
        while writer.poll() is None and lost == 0:
            reads += 1
            if Shipper.progress(shipper) is None:  # type: ignore[arg-type]
                lost += 1
    finally:
        writer.kill()
        writer.wait()
    assert lost == 0, f"progress read None (pushed 0) {lost} time(s) in {reads} reads while the shipper wrote"
