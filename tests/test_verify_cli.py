"""``prime-runs verify``: verdicts, byte offsets, exit codes, one-line reasons."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.spool.writer import SegmentWriter

from support.env import CLI, child_env
from support.segments import build_segment, write_segment
from support.cli import last_line, run_cli


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + ["verify", *args], capture_output=True, text=True, env=child_env(), timeout=60)


def test_clean_runs_exit_0(tmp_path: Path):
    w = SegmentWriter.create(tmp_path / "a" / "run1", "r1")
    w.append("episode", {"i": 1})
    w.seal("completed")
    write_segment(tmp_path / "b" / "run2", build_segment([{"i": 1}], seal=None)[0])
    done = verify(str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "run1: completed" in done.stdout and "run2: crashed" in done.stdout
    assert "sealed completed" in done.stdout and "unsealed" in done.stdout
    assert done.stdout.index("run1") < done.stdout.index("run2")


def test_a_torn_tail_is_clean(tmp_path: Path):
    data, _ = build_segment([{"i": 1}, {"i": 2}], seal=None)
    write_segment(tmp_path, data[:-10])
    done = verify(str(tmp_path))
    assert done.returncode == 0
    assert "torn" in done.stdout and "torn tail at byte" in done.stdout


def test_corruption_exits_1_with_file_and_offset(tmp_path: Path):
    data, written = build_segment([{"i": 1}, {"i": 2}, {"i": 3}])
    damaged = bytearray(data)
    damaged[written[1][0] + 15] ^= 0x20
    path = write_segment(tmp_path / "run", bytes(damaged))
    done = verify(str(tmp_path))
    assert done.returncode == 1
    assert f"CORRUPT at byte {written[1][0]}" in done.stdout
    assert len(done.stderr.strip().splitlines()) == 1
    assert str(path) in done.stderr and f"byte {written[1][0]}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_newer_format_exits_1_naming_both_versions(tmp_path: Path):
    write_segment(tmp_path, build_segment([{"i": 1}], version=7)[0])
    done = verify(str(tmp_path))
    assert done.returncode == 1
    assert "version 7" in done.stdout and "version 1" in done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_missing_path_exits_2_with_one_line(tmp_path: Path):
    done = verify(str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_nothing_found_exits_1_unless_allow_empty(tmp_path: Path):
    done = verify(str(tmp_path))
    assert done.returncode == 1 and "nothing found" in done.stderr and "Traceback" not in done.stderr
    assert verify("--allow-empty", str(tmp_path)).returncode == 0


def test_json_report(tmp_path: Path):
    data, written = build_segment([{"i": 1}, {"i": 2}])
    damaged = data + b"garbage"
    write_segment(tmp_path / "good", data[: written[-1][0]] + b"{\"data\":")
    write_segment(tmp_path / "bad", damaged)
    done = verify("--json", str(tmp_path))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    by_name = {Path(run["run_dir"]).name: run for run in report["runs"]}
    assert report["ok"] is False
    assert by_name["good"]["status"] == "torn" and by_name["good"]["ok"] is True
    assert by_name["good"]["segments"][0]["torn_offset"] == written[-1][0]
    assert by_name["good"]["episodes"] == 2
    assert by_name["bad"]["status"] == "corrupt"
    assert by_name["bad"]["segments"][0]["corrupt_offset"] == len(data)  # bytes after the seal


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_verify_given_a_fifo_or_a_device_says_what_it_is(tmp_path: Path, kind: str) -> None:
    """verify said "nothing found: neither a spool nor eval outputs under it", as if the path
    were an empty folder; a regular file that is no segment was already a usage error."""
    path = tmp_path / "odd"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    result = run_cli("verify", str(path), timeout=20)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    expected = "a FIFO" if kind == "fifo" else "a device"
    assert f"is {expected}, not a regular file or folder" in last_line(result), result.stderr
    assert "Traceback" not in result.stderr


def test_a_run_reached_by_two_of_the_paths_is_verified_once(tmp_path: Path) -> None:
    """``verify outputs outputs/run/spool`` (a folder and a run inside it, as sync, status and
    export take them) listed the run twice and said 'ok: 2 runs verified': each path was
    walked alone, where the other commands verify, show and push each run once."""
    from support.runs import build_run

    build_run(tmp_path / "outputs" / "run", "verify-twice", 2)
    build_run(tmp_path / "outputs" / "other", "verify-twice-other", 1)
    for second in ("outputs/run", "outputs/run/spool", "outputs/run/spool/seg-000001.jsonl", "outputs"):
        done = subprocess.run(CLI + ["verify", "outputs", second], cwd=tmp_path, capture_output=True, text=True,
                              env=child_env(), timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1] == "ok: 2 runs verified, no corruption", (second, done.stdout)
        report = json.loads(subprocess.run(CLI + ["verify", "outputs", second, "--json"], cwd=tmp_path,
                                           capture_output=True, text=True, env=child_env(), timeout=60).stdout)
        assert sorted(Path(run["run_dir"]).name for run in report["runs"]) == ["other", "run"], second
        assert report["paths_without_runs"] == [], second
