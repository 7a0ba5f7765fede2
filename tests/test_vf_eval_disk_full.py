"""``prime-runs eval`` when the disk fills up: the real verifiers eval writing onto a small
tmpfs that a filler file fills while the eval runs.

One line says which path is full and the exact command that resumes; after freeing space,
that command, as printed, completes the run.
"""

from __future__ import annotations

import errno
import shlex
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from prime_runs_spool.content.supersede import superseded_in_run  # noqa: E402
from support.mounts import tmpfs  # noqa: E402
from support.vf_eval import (  # noqa: E402
    TASKS, eval_cmd, eval_env, launch_file, resolved_config, run_dir, run_eval, traces,
)

pytestmark = pytest.mark.slow  # two real vf-eval runs

ROLLOUTS = 2
#: Room for the run's configs, logs and first episodes; the filler takes the rest.
DISK_BYTES = 8 * 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path):
    """A tmpfs of DISK_BYTES mounted under ``tmp_path`` (root only), unmounted afterwards."""
    with tmpfs(tmp_path / "disk", f"size={DISK_BYTES}") as mount_point:
        yield mount_point


def episodes_in_spool(path: Path) -> int:
    try:
        return read_run(path).episodes_count
    except Exception:  # not there yet
        return 0


def fill(filler: Path) -> None:
    """Write ``filler`` until the file system says it is full."""
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                chunk = chunk[: len(chunk) // 2]
                if not chunk:
                    return


def test_a_full_disk_names_the_path_and_the_resume_command_that_completes_the_run(small_disk: Path) -> None:
    slow = "Capital of France?"  # task 2: held until the disk is full
    with FakeChatServer(delay=120, slow_prompts=(slow,)) as server:
        launch = launch_file(small_disk, server.base_url, rollouts=ROLLOUTS)
        proc = subprocess.Popen(eval_cmd("@", launch.name, "--no-rich"), cwd=small_disk, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=eval_env())
        deadline = time.monotonic() + 180
        while episodes_in_spool(run_dir(small_disk)) < 2 * ROLLOUTS:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        filler = small_disk / "filler"
        fill(filler)
        server.release()
        _, stderr = proc.communicate(timeout=180)

        assert proc.returncode == 1, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]
        command = f"prime-runs eval @ {resolved_config(small_disk)} --resume"
        assert last.startswith("prime-runs: no space left on the device holding "), last
        assert f"(file system {small_disk})" in last and last.endswith(f"; free space, then resume with: {command}")

        filler.unlink()
        resumed = run_eval(small_disk, *shlex.split(command)[2:])  # as printed, after "prime-runs eval"
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(small_disk)
    assert len(final) == TASKS * ROLLOUTS and all(row["ok"] for row in final)
    assert read_run(run_dir(small_disk)).status == "completed"


#: Bytes any one file of the run may reach (``RLIMIT_FSIZE``): its configs and first
#: episodes fit, ``traces.jsonl`` (about 3.5 KB an episode) does not hold them all.
FILE_LIMIT = 12 * 1024


def test_a_file_size_limit_names_it_and_the_resume_command_that_completes_the_run(tmp_path: Path) -> None:
    """``ulimit -f`` (a quota on one file's size): the write fails with ``EFBIG``, which the
    full-disk line did not know, so the eval ended in verifiers' traceback, exit 1."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        done = subprocess.run(eval_cmd("@", launch.name, "--no-rich"), cwd=tmp_path, capture_output=True, text=True,
                              env=eval_env(), timeout=180, preexec_fn=limit)
        assert done.returncode == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        command = f"prime-runs eval @ {resolved_config(tmp_path)} --resume"
        assert last.startswith("prime-runs: "), last
        assert "cannot grow: it reached the largest file this process may write (a file size limit: ulimit -f" in last
        assert last.endswith(f"; raise the limit, then resume with: {command}"), last

        resumed = run_eval(tmp_path, *shlex.split(command)[2:])  # as printed, without the limit
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS and all(row["ok"] for row in final)
    run, superseded = read_run(run_dir(tmp_path)), superseded_in_run(run_dir(tmp_path))
    assert run.status == "completed" and run.episodes_count - len(superseded) == len(final)
