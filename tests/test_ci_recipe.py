"""docs/ci.md's recipe, as the CI jobs run it: an eval writes runs offline, the spools travel
as an artifact, ``docs/ci/sync-artifacts.sh`` (as ``prime-runs ci-script`` writes it out)
syncs them (exit codes as documented), a second job syncing the same artifact adds nothing,
and a replay job makes new evaluations."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prime_runs_spool import read_run

from support.env import CLI, REPO_ROOT, child_env
from support.sync_e2e import TOKEN, api, server  # noqa: F401

SCRIPT = REPO_ROOT / "docs" / "ci" / "sync-artifacts.sh"


def job(tmp_path: Path, base_url: str, *args: str, key: str | None = TOKEN) -> tuple[subprocess.CompletedProcess[str], dict]:
    """One CI job: the script ``prime-runs ci-script`` writes out, in a fresh working
    directory, as the workflow calls it."""
    workdir = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}"
    workdir.mkdir()
    env = child_env(PRIME_RUNS=f"{sys.executable} -m commands", PRIME_API_BASE_URL=base_url,
                    PRIME_RUNS_REQUEST_LIFETIME="0.5", HOME=str(tmp_path))
    if key:
        env["PRIME_API_KEY"] = key
    (workdir / "sync-artifacts.sh").write_bytes(written_out())
    result = subprocess.run(["bash", "sync-artifacts.sh", *args], cwd=workdir, capture_output=True, text=True,
                            env=env, timeout=120)
    report_path = workdir / "sync-report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() and report_path.stat().st_size else {}
    return result, report


def written_out() -> bytes:
    printed = subprocess.run(CLI + ["ci-script"], capture_output=True, env=child_env(), timeout=60)
    assert printed.returncode == 0 and printed.stderr == b"", printed.stderr
    return printed.stdout


def test_ci_script_prints_the_ci_sync_step_byte_for_byte() -> None:
    """What a CI job without a clone runs (docs/ci.md): the script, as the repository holds it."""
    assert written_out() == SCRIPT.read_bytes()


def download(artifact: Path, where: Path) -> Path:
    """What actions/download-artifact gives a job: a fresh copy, no sync state of any job."""
    shutil.copytree(artifact, where)
    return where


@pytest.mark.slow
def test_ci_recipe_syncs_artifacts_once_and_replays_them(tmp_path: Path, server, api) -> None:
    artifact = tmp_path / "artifact" / "outputs"
    subprocess.run([sys.executable, "-m", "fixtures.make_outputs", str(artifact)], check=True,
                   cwd=REPO_ROOT, env=child_env(), capture_output=True, timeout=60)

    first, report = job(tmp_path, server.base_url, str(download(artifact, tmp_path / "dl-1")))
    assert first.returncode == 0, first.stderr
    runs = {Path(run["path"]).name: run for run in report["runs"]}
    assert len(runs) == 6 and {run["state"] for run in runs.values()} <= {"synced", "failed", "crashed"}
    assert f"synced     {runs['gsm8k-completed']['path']}" in first.stdout

    second, again = job(tmp_path, server.base_url, str(download(artifact, tmp_path / "dl-2")))
    assert second.returncode == 0, second.stderr
    for run in again["runs"]:
        name = Path(run["path"]).name
        assert run["pushed_now"] == 0 and run["evaluation_id"] == runs[name]["evaluation_id"], run
        total = api.get(f"/evaluations/{run['evaluation_id']}").json()["total_samples"]
        assert total == read_run(artifact / name).episodes_count

    replay, replayed = job(tmp_path, server.base_url, "--replay", str(download(artifact, tmp_path / "dl-3")),
                           "--tag", "replayed")
    assert replay.returncode == 0, replay.stderr
    for run in replayed["runs"]:
        name = Path(run["path"]).name
        assert run["replay_id"] and run["evaluation_id"] != runs[name]["evaluation_id"]
        evaluation = api.get(f"/evaluations/{run['evaluation_id']}").json()
        assert evaluation["total_samples"] == read_run(artifact / name).episodes_count
        assert "replayed" in evaluation["tags"]


@pytest.mark.slow
def test_ci_recipe_exit_codes(tmp_path: Path, server) -> None:
    artifact = tmp_path / "outputs"
    subprocess.run([sys.executable, "-m", "fixtures.make_outputs", str(artifact)], check=True,
                   cwd=REPO_ROOT, env=child_env(), capture_output=True, timeout=60)
    no_key, _ = job(tmp_path, server.base_url, str(artifact), key=None)
    assert no_key.returncode == 2 and "PRIME_API_KEY" in no_key.stderr
    segment = artifact / "gsm8k-failed" / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    data[data.index(b"\n", data.index(b'"episode"')) - 30] ^= 0x04  # damage the first episode
    segment.write_bytes(bytes(data))
    broken, report = job(tmp_path, server.base_url, str(artifact))
    assert broken.returncode == 1
    assert f"FAILED {artifact / 'gsm8k-failed'}: " in broken.stderr and "corrupt at byte" in broken.stderr
    assert {run["state"] for run in report["runs"] if "gsm8k-failed" not in run["path"]} <= {"synced", "failed", "crashed"}


@pytest.mark.slow
def test_ci_recipe_says_nothing_was_imported_where_the_eval_wrote_its_own_spool(tmp_path: Path, server) -> None:
    """An artifact of prime-runs eval holds the eval's spool beside its traces.jsonl. The
    sync's import step finds them agreeing ('spooled': nothing imported), and the script
    printed 'spooled ... (eval outputs imported into ...)' above the run's line, as if it had
    imported the run into its own folder."""
    from prime_runs_spool import open_run

    artifact = tmp_path / "artifact" / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", artifact / "vf040-completed")
    run_dir = artifact / "vf040-completed"
    episodes = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    with open_run(run_dir, name="live", run_id=episodes[0]["run"]["id"]) as run:
        run.log_episodes(episodes)  # as prime-runs eval spools each one
    done, report = job(tmp_path, server.base_url, str(download(artifact, tmp_path / "dl")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [i["state"] for i in report["imports"]] == ["spooled"]  # the report still has it
    assert done.stdout.splitlines()[0].startswith("synced ") and "imported into" not in done.stdout, done.stdout


@pytest.mark.slow
def test_ci_recipe_says_why_an_import_failed_on_its_line(tmp_path: Path, server) -> None:
    """An artifact of plain vf-eval's outputs, read-only (as a CI download may leave it),
    synced without --state-dir: the import fails. The script's line for it printed the
    outcome's reason, 'error ... (all 2x2 rollouts written)', where its error says what is
    wrong and what to do (read-only: --state-dir); only the FAILED line on stderr said it."""
    artifact = tmp_path / "artifact" / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", artifact / "vf040-completed")
    for path in [artifact, *artifact.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o555)
    try:
        done, report = job(tmp_path, server.base_url, str(artifact))
    finally:
        for path in [artifact, *artifact.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert done.returncode == 1, done.stdout + done.stderr
    [imported] = report["imports"]
    assert imported["state"] == "error" and "read-only" in imported["error"], imported
    [line] = [line for line in done.stdout.splitlines() if line.startswith("error")]
    assert "is read-only" in line and "--state-dir" in line, line


@pytest.mark.slow
def test_ci_recipe_prints_each_runs_warnings_under_its_line(tmp_path: Path, server) -> None:
    """An artifact unpacked with its modes dropped (docs/ci.md, "Modes"): the sync makes the
    spool private again and says so in a warning. The script printed each run's state line
    only, so the job's log never said it (the warning was in sync-report.json alone); nor
    that a spool it may not change is open to others, with the chmod that closes it."""
    from support.runs import build_run

    artifact = tmp_path / "artifact" / "outputs"
    build_run(artifact / "opened", "ci-warnings-opened", 2)
    build_run(artifact / "kept", "ci-warnings-kept", 2)
    for path in [artifact, *artifact.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    kept = artifact / "kept" / "spool"
    for path in [kept, *kept.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o555)
    try:
        done, report = job(tmp_path, server.base_url, str(artifact), "--state-dir", str(tmp_path / "state"))
    finally:
        for path in [kept, *kept.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for run in report["runs"]:
        assert run["warnings"], run
        line = next(number for number, text in enumerate(lines) if text.startswith("synced") and run["path"] in text)
        assert lines[line + 1:line + 1 + len(run["warnings"])] == [f"  warning: {w}" for w in run["warnings"]], lines
    assert "made private" in done.stdout and f"chmod -R go= {kept}" in done.stdout, done.stdout


@pytest.mark.slow
def test_ci_recipe_says_why_a_run_was_skipped(tmp_path: Path, server) -> None:
    """Two jobs at once on one artifact folder: the second skips each run the first holds,
    exit 0 as documented, and its log said 'skipped  <run>  pushed 0 (total 0)' alone; why
    (another sync holds it, --wait to wait) was in sync-report.json only. As prime-runs sync
    prints it, it is under the run's line now."""
    from prime_runs_spool.sync.many import sync_lock
    from support.runs import build_run

    artifact = tmp_path / "artifact" / "outputs"
    build_run(artifact / "held", "ci-skipped-held", 2)
    lock = sync_lock(artifact / "held")
    assert lock.acquire()
    try:
        done, report = job(tmp_path, server.base_url, str(artifact))
    finally:
        lock.release()
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = report["runs"]
    assert run["state"] == "skipped" and run["error"], run
    lines = done.stdout.splitlines()
    assert lines[0].startswith("skipped ") and lines[1] == f"  error: {run['error']}", lines
    assert "--wait" in lines[1]


def test_ci_recipe_prints_a_runs_odd_folder_name_on_its_one_line(tmp_path: Path, server) -> None:
    """A run folder whose name holds a line break, a carriage return and an escape sequence
    (an artifact from another machine): the script printed the JSON report's path as it is,
    so the name split the job's log into a forged line ('synced ... FAILED'), and drove the
    terminal; prime-runs sync itself prints such a name escaped. Each run is one line, the
    name escaped as prime-runs sync escapes it."""
    from prime_runs_spool.files import shown
    from support.runs import build_run

    artifact = tmp_path / "artifact" / "outputs"
    odd = "r\x1b]0;title\x07\nsynced     forged  pushed 9 (total 9)\rX"
    build_run(artifact / odd, "ci-odd-name", 2)
    build_run(artifact / "plain", "ci-plain-name", 2)
    done, report = job(tmp_path, server.base_url, str(artifact), "--to", "samples")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and not any(ch in done.stdout for ch in "\x1b\x07\r"), lines
    assert any(line.startswith("synced") and shown(str(artifact / odd)) in line for line in lines), lines


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_ci_recipe_says_a_report_it_cannot_write_is_a_configuration_error(tmp_path: Path, where: str) -> None:
    """bash skips a command whose redirection fails: the sync never ran, and the script said
    'some runs failed to sync (or nothing was found); re-run this job to carry on from the
    saved state', exit 1, which a re-run repeats. A report that is a folder was told as one
    whose folder 'is missing or not writable'."""
    (tmp_path / "sync-artifacts.sh").write_bytes(written_out())
    artifact = tmp_path / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "outputs", artifact)
    report = tmp_path / "no-such-folder" / "sync-report.json" if where == "missing folder" else tmp_path / "reports"
    if where == "a folder":
        report.mkdir()
    env = child_env(PRIME_RUNS=f"{sys.executable} -m commands", PRIME_API_KEY=TOKEN, SYNC_REPORT=str(report),
                    PRIME_API_BASE_URL="http://127.0.0.1:9", HOME=str(tmp_path))
    done = subprocess.run(["bash", "sync-artifacts.sh", str(artifact)], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    said = ("its folder is missing or not writable; point SYNC_REPORT at a file this job can write"
            if where == "missing folder" else
            f"it is a folder; point SYNC_REPORT at a file, e.g. {report}/sync-report.jsonl")
    assert done.stderr.splitlines() == [f"cannot write the sync report {report} (SYNC_REPORT): {said}"], done.stderr


@pytest.mark.slow
def test_ci_recipe_over_a_report_cut_short_by_a_full_disk_says_so_without_a_traceback(tmp_path: Path) -> None:
    """$SYNC_REPORT on a disk with room for part of it: the sync exited 0 over the cut report
    (PYTHONUNBUFFERED, as CI images set it), and the script's reading of it ended in a
    JSONDecodeError traceback in the job's log. Now the sync says its report is lost and
    exits 1, and the script says the report is not whole, in one line each."""
    from support.mounts import tmpfs
    from support.runs import build_run

    for n in range(8):
        build_run(tmp_path / "outputs" / f"a-run-with-a-long-enough-name-{n:02d}", f"ci-cut-{n}", 1)
    (tmp_path / "sync-artifacts.sh").write_bytes(written_out())
    with tmpfs(tmp_path / "small", "size=8k") as small:
        (small / "filler").write_bytes(b"\0" * 4096)
        env = child_env(PRIME_RUNS=f"{sys.executable} -m commands", PRIME_API_KEY=TOKEN, PYTHONUNBUFFERED="1",
                        SYNC_REPORT=str(small / "sync-report.json"), HOME=str(tmp_path))
        done = subprocess.run(["bash", "sync-artifacts.sh", str(tmp_path / "outputs"), "--local", "--db",
                               str(tmp_path / "local.db")], cwd=tmp_path, capture_output=True, text=True, env=env,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert (small / "sync-report.json").stat().st_size == 4096  # the test's premise: the report was cut
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("prime-runs: cannot write this command's output (No space left on device)"), lines
    assert lines[1] == f"the sync report {small / 'sync-report.json'} is not whole, so no run is listed: see the line above"


@pytest.mark.slow
def test_the_sync_report_is_0600_under_a_umask_of_022(tmp_path: Path) -> None:
    """The report names runs, evaluations and their errors: written by the script's own
    redirect, its mode would follow the job's umask (0644 under the usual 022), where every
    file prime-runs writes is 0600. One a job left behind loses its group/other bits too."""
    (tmp_path / "outputs").mkdir()
    (tmp_path / "sync-artifacts.sh").write_bytes(written_out())
    env = child_env(PRIME_RUNS=f"{sys.executable} -m commands", HOME=str(tmp_path))
    env.pop("PRIME_API_KEY", None)
    report = tmp_path / "sync-report.json"
    for left_behind in (False, True):
        if left_behind:
            report.write_text("{}")
            report.chmod(0o644)
        result = subprocess.run(["bash", "-c", "umask 022 && exec bash sync-artifacts.sh outputs"], cwd=tmp_path,
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode in (1, 2), result.stderr
        assert report.stat().st_mode & 0o777 == 0o600, (left_behind, oct(report.stat().st_mode))


@pytest.mark.slow
def test_ci_recipe_says_a_report_it_could_not_write_whole_as_that_not_as_runs_that_failed(tmp_path: Path) -> None:
    """A report on a full disk (here /dev/full): the sync did its work and said its output was
    lost, exit 1, and the script said 'some runs failed to sync (or nothing was found);
    re-run this job', of runs that were all synced."""
    (tmp_path / "sync-artifacts.sh").write_bytes(written_out())
    artifact = tmp_path / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "outputs", artifact)
    env = child_env(PRIME_RUNS=f"{sys.executable} -m commands", SYNC_REPORT="/dev/full", HOME=str(tmp_path))
    done = subprocess.run(["bash", "sync-artifacts.sh", str(artifact), "--local", "--db", str(tmp_path / "local.db")],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr
    assert "some runs failed" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "the sync report /dev/full is not whole, so no run is listed: see the line above"
    assert "cannot write this command's output (No space left on device)" in done.stderr.splitlines()[-2]
    again = subprocess.run(CLI + ["sync", str(artifact), "--local", "--db", str(tmp_path / "local.db"), "--json"],
                           capture_output=True, text=True, env=child_env(HOME=str(tmp_path)), timeout=120)
    assert again.returncode == 0 and {r["state"] for r in json.loads(again.stdout)["runs"]} == {"up_to_date"}, again
