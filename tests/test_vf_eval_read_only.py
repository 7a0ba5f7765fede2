"""``prime-runs eval`` when a folder it writes cannot be written: the real verifiers eval with
its output folder, or the run's spool folder, on a read-only tmpfs.

A read-only folder is no bug in anyone's code, so it gets one line (no traceback) naming the
path and the way on, as a full disk does (tests/test_vf_eval_disk_full.py); once the folder
can be written, the resume command, as printed, completes the run with nothing lost.
Permission refused is told the same way on the run's own folder only: elsewhere it is the
environment's code at work, and its traceback is what its author needs.
"""

from __future__ import annotations

import errno
import shlex
import subprocess
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from fixtures.vf_launch import launch_file_text  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from support.mounts import tmpfs  # noqa: E402
from prime_runs_spool.runner.verifiers_eval import EvalSession, unwritable_error  # noqa: E402
from support.vf_eval import (  # noqa: E402
    HEADER_SECRET, KEY_VAR, RUN_NAME, TASKS, launch_file, resolved_config, run_dir, run_eval, traces,
)

ROLLOUTS = 1


def read_only_tmpfs(mount_point: Path) -> AbstractContextManager[Path]:
    """A read-only tmpfs on ``mount_point`` (root only, else the test is skipped), unmounted after."""
    return tmpfs(mount_point, "ro,size=1m")


def last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


@pytest.mark.slow  # a real vf-eval start
def test_an_output_folder_on_a_read_only_file_system_is_one_line_naming_it(tmp_path: Path) -> None:
    with FakeChatServer() as server, read_only_tmpfs(tmp_path / "ro") as read_only:
        outputs = read_only / "outputs"
        (tmp_path / "eval.toml").write_text(launch_file_text(
            run_name=RUN_NAME, base_url=server.base_url, model="fake/model", rollouts=ROLLOUTS, max_concurrent=8,
            key_var=KEY_VAR, header_name="CF-Access-Client-Secret", header_secret=HEADER_SECRET,
            output_dir=str(outputs)))
        done = run_eval(tmp_path, "@", "eval.toml", "--no-rich")

    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line(done.stderr) == (
        f"prime-runs: cannot write {outputs}: read-only file system (file system {read_only}); "
        "make it writable or set another output_dir, then run the eval again")


@pytest.mark.slow  # two real vf-eval runs
def test_a_read_only_spool_folder_names_it_and_the_printed_resume_command_completes_the_run(tmp_path: Path) -> None:
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        spool = run_dir(tmp_path) / "spool"
        with read_only_tmpfs(spool):
            done = run_eval(tmp_path, "@", launch.name, "--no-rich")
        assert done.returncode == 1, done.stderr[-3000:]
        command = f"prime-runs eval @ {resolved_config(tmp_path)} --resume"
        assert last_line(done.stderr) == (
            f"prime-runs: cannot write {spool / 'run.lock'}: read-only file system (file system {spool}); "
            f"make it writable or set another output_dir, then resume with: {command}")

        resumed = run_eval(tmp_path, *shlex.split(command)[2:])  # as printed, after "prime-runs eval"
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(traces(tmp_path)) == TASKS * ROLLOUTS
    run = read_run(run_dir(tmp_path))
    assert run.status == "completed" and run.episodes_count == TASKS * ROLLOUTS


def test_permission_refused_is_told_in_one_line_on_the_runs_folder_only(tmp_path: Path) -> None:
    session = EvalSession(argv=["@", "eval.toml"], opening=tmp_path / "outputs" / RUN_NAME)

    def refused(path: Path) -> BaseException:
        try:
            raise RuntimeError("while writing") from PermissionError(errno.EACCES, "Permission denied", str(path))
        except RuntimeError as wrapped:
            return wrapped

    for ours in (tmp_path / "outputs", tmp_path / "outputs" / RUN_NAME / "spool" / "run.lock"):
        found = unwritable_error(refused(ours), session)
        assert found is not None and found.filename == str(ours)
    assert unwritable_error(refused(tmp_path / "elsewhere" / "cache.db"), session) is None  # the env's own code
    assert unwritable_error(refused(tmp_path / "outputs"), EvalSession(argv=[])) is None  # no run known yet
    read_only = OSError(errno.EROFS, "Read-only file system", "/anywhere/at/all")
    assert unwritable_error(read_only, EvalSession(argv=[])) is read_only


@pytest.mark.slow  # a real vf-eval start
def test_an_output_folder_root_may_not_write_is_one_line_naming_the_run_folder(tmp_path: Path) -> None:
    """Permission refused before any run is opened (verifiers making the run's folder for
    its logs) is told too: the run's folder is known from verifiers' own ``output_path``.
    ``chattr +i`` makes the folder refuse even root (EPERM), as a mode does another user."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    if subprocess.run(["chattr", "+i", str(outputs)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here")
    try:
        with FakeChatServer() as server:
            launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
            done = run_eval(tmp_path, "@", launch.name, "--no-rich")
    finally:
        subprocess.run(["chattr", "-i", str(outputs)], check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    line = last_line(done.stderr)
    assert line.startswith(f"prime-runs: cannot write outputs/{RUN_NAME}: permission denied (file system "), line
    assert line.endswith("); make it writable or set another output_dir, then run the eval again"), line


@pytest.mark.slow  # a real vf-eval start
def test_an_output_dir_that_is_a_file_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A path mistyped onto a file (``output_dir = "results.csv"``) stops verifiers making
    the run's log folder (``ENOTDIR``): one line naming the file, no traceback."""
    (tmp_path / "afile").write_text("not a folder\n")
    with FakeChatServer() as server:
        (tmp_path / "eval.toml").write_text(launch_file_text(
            run_name=RUN_NAME, base_url=server.base_url, model="fake/model", rollouts=ROLLOUTS, max_concurrent=8,
            key_var=KEY_VAR, header_name="CF-Access-Client-Secret", header_secret=HEADER_SECRET,
            output_dir="afile"))
        done = run_eval(tmp_path, "@", "eval.toml", "--no-rich")
    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line(done.stderr) == (
        f"prime-runs: cannot write afile/{RUN_NAME}/logs: afile is a file, not a folder; "
        "move it away or set another output_dir, then run the eval again")
    assert (tmp_path / "afile").read_text() == "not a folder\n"


def _refused_eval_line(tmp_path: Path) -> str:
    """The last line of a ``prime-runs eval`` of a launch file in ``tmp_path`` that must end
    in exit 1 without a traceback."""
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        done = run_eval(tmp_path, "@", launch.name, "--no-rich")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return last_line(done.stderr)


@pytest.mark.slow  # a real vf-eval start
def test_an_output_dir_that_is_a_dangling_symbolic_link_is_one_line_naming_the_link(tmp_path: Path) -> None:
    """``outputs`` a symbolic link to a folder not there (a scratch disk not mounted yet, a
    link copied from another machine): verifiers' ``mkdir`` of the run's log folder failed
    on 'File exists: outputs', shown as three tracebacks. One line naming the link and
    where it points, exit 1."""
    (tmp_path / "outputs").symlink_to(tmp_path / "scratch" / "outputs")
    assert _refused_eval_line(tmp_path) == (
        "prime-runs: cannot write outputs: it is a symbolic link to "
        f"{tmp_path / 'scratch' / 'outputs'}, which does not exist; make that folder or set another output_dir, "
        "then run the eval again")
    assert not (tmp_path / "scratch").exists()


@pytest.mark.slow  # a real vf-eval start
def test_an_output_dir_that_is_a_loop_of_symbolic_links_is_one_line_naming_the_link(tmp_path: Path) -> None:
    """``outputs`` a symbolic link into a loop (two links to each other, a link to itself
    after a move): verifiers' ``mkdir`` of the run's log folder failed on 'Too many levels of
    symbolic links', shown as a traceback. One line naming the link, exit 1."""
    (tmp_path / "outputs").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").symlink_to(tmp_path / "outputs")
    assert _refused_eval_line(tmp_path) == (
        f"prime-runs: cannot write outputs/{RUN_NAME}/logs: outputs is a loop of symbolic links; point it at a folder "
        "or set another output_dir, then run the eval again")


@pytest.mark.slow  # two real vf-eval runs
def test_a_file_named_spool_in_the_run_folder_is_one_line_and_the_printed_resume_completes_the_run(
        tmp_path: Path) -> None:
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        spool = run_dir(tmp_path) / "spool"
        spool.parent.mkdir(parents=True)
        spool.write_text("notes\n")
        done = run_eval(tmp_path, "@", launch.name, "--no-rich")
        assert done.returncode == 1, done.stderr[-3000:]
        command = f"prime-runs eval @ {resolved_config(tmp_path)} --resume"
        assert last_line(done.stderr) == (
            f"prime-runs: cannot write outputs/{RUN_NAME}/spool: it is a file, not a folder; "
            f"move it away or set another output_dir, then resume with: {command}")
        assert spool.read_text() == "notes\n"

        spool.unlink()
        resumed = run_eval(tmp_path, *shlex.split(command)[2:])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = read_run(run_dir(tmp_path))
    assert run.status == "completed" and run.episodes_count == TASKS * ROLLOUTS == len(traces(tmp_path))
