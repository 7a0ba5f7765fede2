"""A disk that fills up under ``prime-runs sync``: the run's report is one line naming the
file it could not write (its sync state, or its copy lock in the user's cache) and what to
do (exit 1, the others go on), never a traceback or an internal error; once space is freed
the next sync carries on, each episode once.

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
from prime_runs_spool.sync.copies import COPY_LOCKS_DIRNAME
from support.env import child_env
from support.mounts import tmpfs
from support.sync_e2e import TOKEN, api, assert_exactly_once, server, sync_cmd  # noqa: F401


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "size=16m") as mount_point:
        yield mount_point


def fill(disk: Path, leave_blocks: int) -> Path:
    """A file taking all of ``disk``'s free space but ``leave_blocks`` blocks."""
    info = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as out:  # noqa: PTH123 - the test's own file, not the package's
        out.write(b"x" * ((info.f_bavail - leave_blocks) * info.f_frsize))
    left = os.statvfs(disk).f_bavail
    assert left == leave_blocks, f"{left} blocks left, not {leave_blocks}"
    return filler


#: (blocks left free, the user's cache on the full disk too, whose file the line names)
CASES = {
    "no room for the first state": (0, False, "state"),
    "room for one state only": (1, False, "state"),
    "the cache on the full disk too": (0, True, "copy lock"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_full_disk_is_one_line_naming_the_file_and_the_next_sync_carries_on(small_disk: Path, server, api,
                                                                             case: str) -> None:
    leave_blocks, cache_on_disk, named = CASES[case]
    run_dir = small_disk / "outputs" / "run"
    builder = build_run(run_dir, f"disk-full-{'-'.join(case.split())}", 5)
    cache = small_disk / "cache" if cache_on_disk else small_disk.parent / "cache"
    env = child_env(PRIME_API_KEY=TOKEN, HOME=str(small_disk.parent), XDG_CACHE_HOME=str(cache))
    command = sync_cmd(server.base_url, str(small_disk / "outputs"))
    filler = fill(small_disk, leave_blocks)
    full = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    said = full.stdout + full.stderr
    assert full.returncode == 1, said
    assert "Traceback" not in said and "internal error" not in said, said
    (line,) = [line for line in said.splitlines() if "error:" in line]
    folder = sync_dir(run_dir) if named == "state" else cache / "prime-runs" / COPY_LOCKS_DIRNAME
    assert f"error: {folder}/" in line and "the disk is full (No space left on device)" in line, line
    assert "free space on it, then sync again" in line, line
    assert not [name for name in os.listdir(spool_dir(run_dir)) if name.endswith(".tmp")]

    filler.unlink()
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_exactly_once(api, builder)
