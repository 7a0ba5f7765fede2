"""A disk that fills up under ``prime-runs sync``: the run's report is one line naming the
state file it could not write and what to do (exit 1, the others go on), never a traceback
or an internal error; once space is freed the next sync carries on, each episode once.

A real full file system: a small tmpfs (mounting one needs root; skipped elsewhere), the
real platform process over HTTP.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_runs_spool.spool.layout import spool_dir
from prime_runs_spool.sync.state import sync_dir
from support.runs import build_run
from support.sync_e2e import api, assert_exactly_once, run_sync, server  # noqa: F401


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def fill(disk: Path, leave_blocks: int) -> Path:
    """A file taking all of ``disk``'s free space but ``leave_blocks`` blocks."""
    info = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as out:  # noqa: PTH123 - the test's own file, not the package's
        out.write(b"x" * ((info.f_bavail - leave_blocks) * info.f_frsize))
    left = os.statvfs(disk).f_bavail
    assert left == leave_blocks, f"{left} blocks left, not {leave_blocks}"
    return filler


@pytest.mark.slow
@pytest.mark.parametrize("leave_blocks", [0, 1], ids=["no room for the first state", "room for one state only"])
def test_a_full_disk_is_one_line_naming_the_state_file_and_the_next_sync_carries_on(small_disk: Path, server, api,
                                                                                    leave_blocks: int) -> None:
    run_dir = small_disk / "outputs" / "run"
    builder = build_run(run_dir, f"disk-full-{leave_blocks}", 5)
    filler = fill(small_disk, leave_blocks)
    full = run_sync(server.base_url, str(small_disk / "outputs"))
    said = full.stdout + full.stderr
    assert full.returncode == 1, said
    assert "Traceback" not in said and "internal error" not in said, said
    (line,) = [line for line in said.splitlines() if "error:" in line]
    assert f"{sync_dir(run_dir)}/" in line and "the disk is full (No space left on device)" in line, line
    assert "free space on it, then sync again" in line, line
    assert not [name for name in os.listdir(spool_dir(run_dir) / "sync") if name.endswith(".tmp")]

    filler.unlink()
    again = run_sync(server.base_url, str(small_disk / "outputs"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert_exactly_once(api, builder)
