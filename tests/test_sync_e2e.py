"""Sync end to end: the real ``prime-runs sync`` command against the real local platform
process over loopback HTTP, with real SIGKILLs and a real fault-injecting proxy."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support import platform_process
from support.env import CLI, child_env
from fixtures.fault_proxy import AFTER_FAULTS, BEFORE_FAULTS, FAULTS, FaultProxy
from support.runs import RunBuilder, build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, evaluations_of, kill_syncs_at_random, run_sync, sample_ids, server, sync_cmd  # noqa: F401

#: Runs a command and reports its own peak RSS (see its docstring for why not wait4 here).
PEAK_RSS = Path(__file__).resolve().parent.parent / "fixtures" / "peak_rss.py"
KILLS = int(os.environ.get("PRIME_RUNS_SYNC_KILLS", "20"))
FAULT_SEED = int(os.environ.get("PRIME_RUNS_FAULT_SEED", "1129"))


@pytest.mark.slow
def test_sync_twice_pushes_each_episode_once(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "outputs" / "run-a", "e2e-twice", 30)
    first = run_sync(server.base_url, str(tmp_path / "outputs"), "--json", "--max-request-bytes", "40000")
    assert first.returncode == 0, first.stderr + first.stdout
    report = json.loads(first.stdout)["runs"][0]
    assert (report["state"], report["pushed_now"]) == ("synced", 30)
    second = run_sync(server.base_url, str(tmp_path / "outputs"), "--json")
    assert json.loads(second.stdout)["runs"][0]["state"] == "up_to_date"
    evaluation = assert_exactly_once(api, builder)
    assert report["evaluation_id"] == evaluation["evaluation_id"]
    assert report["url"].endswith(f"/dashboard/evaluations/{evaluation['evaluation_id']}")


@pytest.mark.slow
def test_resumed_run_in_two_segments_is_one_evaluation(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-resumed")
    builder.open_segment()
    builder.add(6)
    builder.abandon()
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    assert evaluations_of(api, builder.run_id)[0]["metadata"]["prime_runs"]["status"] == "crashed"
    builder.open_segment()
    builder.add(5)
    builder.seal()
    result = run_sync(server.base_url, str(tmp_path), "--json")
    report = json.loads(result.stdout)["runs"][0]
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("synced", 5, 11)
    evaluation = assert_exactly_once(api, builder)
    assert "prime_runs" not in evaluation["metadata"]
    assert evaluation["status"] == "COMPLETED"


@pytest.mark.slow
def test_a_cancelled_run_resumed_to_completion_keeps_no_error_message(tmp_path: Path, server, api) -> None:
    """Synced once cancelled (CANCELLED, ``interrupted``), then resumed and completed: the
    finalized evaluation says COMPLETED with no stale error message."""
    builder = RunBuilder(tmp_path / "run", "e2e-cancelled-resumed")
    builder.open_segment()
    builder.add(4)
    builder.seal("cancelled", error="interrupted")
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    closed = evaluations_of(api, builder.run_id)[0]
    assert (closed["status"], closed["error_message"]) == ("CANCELLED", "interrupted")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(result.stdout)["runs"][0]["state"] == "synced", result.stdout + result.stderr
    evaluation = assert_exactly_once(api, builder)
    assert (evaluation["status"], evaluation["error_message"]) == ("COMPLETED", None)
    assert "prime_runs" not in evaluation["metadata"]


def pushed_so_far(api: httpx.Client, run_id: str) -> int:
    """How many samples of the run the platform holds now (0 before its evaluation exists)."""
    evaluations = evaluations_of(api, run_id)
    return evaluations[0]["total_samples"] if evaluations else 0


@pytest.mark.slow
def test_sigkilled_syncs_then_a_full_sync_push_exactly_once(tmp_path: Path, server, api) -> None:
    """SIGKILL ``prime-runs sync`` (at least PRIME_RUNS_SYNC_KILLS times, default 20) at moments
    chosen by what it has done: during start-up, or after it pushed 1 to 12 more samples; then
    a sync runs to the end. Each kill consumes at most a few dozen of the run's 60 episodes per
    kill, so no sync can finish early and leave the loop without syncs to kill."""
    builder = build_run(tmp_path / "run", "e2e-sigkill", 60 * KILLS, size=1_800)
    rng = random.Random(20261129)
    env = child_env(PRIME_API_KEY=TOKEN)
    cmd = sync_cmd(server.base_url, str(tmp_path), "--max-request-bytes", "6000")
    kill_syncs_at_random(cmd, env, lambda: pushed_so_far(api, builder.run_id), KILLS, rng)
    final = run_sync(server.base_url, str(tmp_path), "--json", "--max-request-bytes", "6000")
    assert final.returncode == 0, final.stdout + final.stderr
    assert json.loads(final.stdout)["runs"][0]["state"] in ("synced", "up_to_date"), final.stdout
    try:
        assert_exactly_once(api, builder)
    except AssertionError as failure:  # say where it went wrong, not just that it did
        evaluations = evaluations_of(api, builder.run_id)
        ids = sample_ids(api, evaluations[0]["evaluation_id"]) if evaluations else []
        first_bad = next((n for n, (a, b) in enumerate(zip(ids, builder.ids)) if a != b), None)
        state = next((tmp_path / "run" / "spool" / "sync").glob("*.json")).read_text()
        raise AssertionError(f"{len(evaluations)} evaluation(s), {len(ids)} rows for {len(builder.ids)} "
                             f"episodes, first mismatch at row {first_bad}; state: {state}") from failure


@pytest.mark.slow
def test_thirty_percent_faults_of_every_kind_still_exactly_once(tmp_path: Path, server, api) -> None:
    builders = [build_run(tmp_path / f"run-{n}", f"e2e-faults-{n}", 40) for n in range(3)]
    rates = {fault: 0.3 / len(FAULTS) for fault in FAULTS}
    with FaultProxy(server.base_url, seed=FAULT_SEED, rates=rates, delay=3.0, retry_after=0) as proxy:
        for attempt in range(5):
            result = run_sync(proxy.base_url, str(tmp_path), "--json", "--max-request-bytes", "10000",
                              "--jobs", "1", "--timeout", "2", timeout=240)
            runs = json.loads(result.stdout)["runs"]
            if all(run["state"] == "synced" for run in runs):
                break
        seen = set(proxy.faults())
    assert result.returncode == 0, result.stdout
    for builder in builders:
        assert_exactly_once(api, builder)
    # The run met both kinds of failure: refused before the platform acted, lost after it did.
    assert len(seen & set(AFTER_FAULTS)) >= 3 and len(seen & set(BEFORE_FAULTS)) >= 3, seen


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [2, 4])
def test_concurrent_syncs_of_one_tree(tmp_path: Path, server, api, parallel: int) -> None:
    builders = [build_run(tmp_path / f"run-{n}", f"e2e-concurrent-{parallel}-{n}", 30) for n in range(3)]
    env = child_env(PRIME_API_KEY=TOKEN)
    procs = [subprocess.Popen(sync_cmd(server.base_url, str(tmp_path), "--max-request-bytes", "12000"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(parallel)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    final = run_sync(server.base_url, str(tmp_path), "--json")
    assert {run["state"] for run in json.loads(final.stdout)["runs"]} <= {"synced", "up_to_date"}
    for builder in builders:
        assert_exactly_once(api, builder)


def test_one_broken_run_does_not_stop_the_others(tmp_path: Path, server, api) -> None:
    good = build_run(tmp_path / "good", "e2e-good-neighbour", 4)
    bad = build_run(tmp_path / "bad", "e2e-bad-neighbour", 4)
    segment = bad.run_dir / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    third_line = [i for i, b in enumerate(data) if b == 0x0A][1] + 1
    data[third_line + 20] ^= 0x04
    segment.write_bytes(bytes(data))
    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert result.returncode == 1
    runs = {Path(run["path"]).name: run for run in json.loads(result.stdout)["runs"]}
    assert runs["good"]["state"] == "synced"
    assert runs["bad"]["state"] == "corrupt"
    assert f"corrupt at byte {third_line}" in runs["bad"]["error"]
    assert_exactly_once(api, good)


def test_corruption_says_which_episodes_before_it_wait_for_the_run_to_complete(tmp_path: Path, server, api) -> None:
    """Damage after two ok and two errored episodes: the ok ones are pushed, the errored
    ones held until the run completes (docs/sync.md). The line said "everything before it
    was pushed" all the same, a claim the platform's rows contradicted."""
    builder = RunBuilder(tmp_path / "run", "e2e-corrupt-held")
    builder.open_segment()
    builder.add(2)
    builder.add(2, ok=False)
    builder.add(2)
    builder.seal()
    segment = builder.run_dir / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    seventh_line = [i for i, b in enumerate(data) if b == 0x0A][5] + 1  # header, manifest, 4 episodes
    data[seventh_line + 20] ^= 0x04
    segment.write_bytes(bytes(data))
    result = run_sync(server.base_url, str(tmp_path), "--json")
    assert result.returncode == 1
    [run] = json.loads(result.stdout)["runs"]
    assert (run["state"], run["pushed_now"]) == ("corrupt", 2)
    assert run["error"].endswith(f"corrupt at byte {seventh_line}: a damaged line; a complete line that fails its "
                                 "check is never a torn tail; everything before it was pushed but 2 errored "
                                 "ones, held until the run completes; sync again with --skip-corrupt to push the "
                                 "intact records after it (each stretch skipped is named, and recorded in the "
                                 "evaluation)"), run["error"]
    assert sorted(sample_ids(api, run["evaluation_id"])) == sorted(builder.ids[:2])


@pytest.mark.slow
def test_cli_errors_are_one_line_with_documented_exit_codes(tmp_path: Path, server) -> None:
    build_run(tmp_path / "run", "e2e-errors", 2)
    env = child_env(HOME=str(tmp_path))
    no_key = subprocess.run(CLI + ["sync", str(tmp_path)], capture_output=True, text=True, env=env)
    assert no_key.returncode == 2
    assert no_key.stderr.strip().count("\n") == 0 and "PRIME_API_KEY" in no_key.stderr
    assert "Traceback" not in no_key.stderr
    missing = run_sync(server.base_url, str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    wrong_key = run_sync(server.base_url, str(tmp_path), key="wrong-key-value")
    assert wrong_key.returncode == 2  # a configuration error, told once, before any run is touched
    assert wrong_key.stderr.strip().count("\n") == 0 and wrong_key.stdout == ""
    assert "401" in wrong_key.stderr and "PRIME_API_KEY" in wrong_key.stderr
    assert "wrong-key-value" not in wrong_key.stdout + wrong_key.stderr
    assert "Traceback" not in wrong_key.stdout + wrong_key.stderr
    (tmp_path / "empty").mkdir()
    empty = run_sync(server.base_url, str(tmp_path / "empty"), "--json")
    assert empty.returncode == 1 and json.loads(empty.stdout)["runs"] == []  # nothing found is not success
    assert "nothing found" in empty.stderr
    allowed = run_sync(server.base_url, str(tmp_path / "empty"), "--json", "--allow-empty")
    assert allowed.returncode == 0 and json.loads(allowed.stdout)["ok"] is True


@pytest.mark.slow
def test_local_mode_runs_the_embedded_platform(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "outputs" / "run", "e2e-local", 5)
    db = tmp_path / "local.db"
    cmd = CLI + ["sync", str(tmp_path / "outputs"), "--local", "--db", str(db)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=60)
    assert first.returncode == 0, first.stderr
    assert "synced" in first.stdout and f"--db {db} --port 8765" in first.stdout
    assert "http://127.0.0.1:8765/dashboard/evaluations/" in first.stdout
    second = subprocess.run(cmd + ["--json"], capture_output=True, text=True, env=child_env(), timeout=60)
    assert json.loads(second.stdout)["runs"][0]["state"] == "up_to_date"
    with platform_process.running(db) as proc, httpx.Client(base_url=proc.api) as api:
        assert_exactly_once(api, builder)


@pytest.mark.slow
def test_status_shows_pushed_and_pending_per_destination_offline(tmp_path: Path, server) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-status")
    builder.open_segment()
    builder.add(3)
    builder.abandon()

    def status() -> dict:
        out = subprocess.run(CLI + ["status", str(tmp_path), "--json"], capture_output=True, text=True,
                             env=child_env(), timeout=60)
        assert out.returncode == 0, out.stderr
        (run,) = json.loads(out.stdout)["runs"]
        return run

    before = status()
    assert (before["state"], before["episodes"], before["destinations"]) == ("crashed", 3, [])
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    builder.open_segment()
    builder.add(2)
    after = status()
    assert after["state"] == "live" and after["episodes"] == 5
    (dest,) = after["destinations"]
    assert (dest["samples_pushed"], dest["pending"], dest["terminal"]) == (3, 2, "crashed")
    assert dest["destination"] == server.base_url and dest["url"]
    builder.seal()
    text = subprocess.run(CLI + ["status", str(tmp_path)], capture_output=True, text=True, env=child_env())
    assert "2 episodes pending" in text.stdout and "completed" in text.stdout


@pytest.mark.slow
def test_a_run_held_by_another_sync_is_skipped_or_waited_for(tmp_path: Path, server, api) -> None:
    from filelock import FileLock

    builder = build_run(tmp_path / "run", "e2e-wait", 3)
    held = FileLock(str(builder.run_dir / "spool" / "sync.lock"))
    held.acquire()
    try:
        skipped = run_sync(server.base_url, str(tmp_path), "--json")
        assert skipped.returncode == 0
        (report,) = json.loads(skipped.stdout)["runs"]
        assert report["state"] == "skipped" and "--wait" in report["error"]
        assert evaluations_of(api, builder.run_id) == []
        waiting = subprocess.Popen(sync_cmd(server.base_url, str(tmp_path), "--json", "--wait"),
                                   stdout=subprocess.PIPE, text=True, env=child_env(PRIME_API_KEY=TOKEN))
        time.sleep(1.0)
        assert waiting.poll() is None, "--wait must wait for the lock"
    finally:
        held.release()
    out, _ = waiting.communicate(timeout=60)
    assert json.loads(out)["runs"][0]["state"] == "synced"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_four_large_runs_synced_by_four_jobs_stay_under_150_mb(tmp_path: Path) -> None:
    """Peak memory is bounded whatever ``--jobs``: each run needs several 25 MiB requests, and
    four at once would hold eight such bodies (250 MB and more) without the process-wide
    bound on large bodies and the allocator giving them back (docs/sync.md, "Memory").

    Its own platform, with a request deadline (and the sync a lifetime) long enough that a
    loaded machine committing 25 MiB bodies slowly does not turn into refused requests:
    this test is about memory, not about how fast the machine is."""
    salt = os.urandom(4).hex()
    builders = [build_run(tmp_path / "runs" / f"big{n}", f"big-{salt}-{n}", 1000, size=20_000) for n in range(4)]
    out_path, err_path, peak_path = tmp_path / "sync.out", tmp_path / "sync.err", tmp_path / "peak"
    with platform_process.running(tmp_path / "memory.db", "--token", TOKEN, "--request-deadline", "20") as own, \
            httpx.Client(base_url=own.api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as own_api:
        command = CLI + ["sync", str(tmp_path / "runs"), "--base-url", own.base_url, "--request-lifetime", "30",
                         "--backoff-cap", "0.2", "--timeout", "60", "--jobs", "4", "--json"]
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.run([sys.executable, str(PEAK_RSS), str(peak_path), *command],
                                  stdout=out, stderr=err, timeout=300,
                                  env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root")))
        report = json.loads(out_path.read_text())
        assert proc.returncode == 0, (err_path.read_text(), [r["error"] for r in report["runs"]])
        peak_mb = int(peak_path.read_text()) / 1024
        assert [r["state"] for r in report["runs"]] == ["synced"] * 4
        assert sum(r["bytes_sent"] for r in report["runs"]) > 4 * 2 * 25 * 2**20, "not large enough to prove a bound"
        for builder in builders:
            assert_exactly_once(own_api, builder)
    assert peak_mb < 150, f"sync of four large runs with --jobs 4 peaked at {peak_mb:.0f} MB"


#: What a ``prime-runs sync`` with nothing to send must not import: it answers from the state
#: file and the spool's sizes (benchmarks/startup.py, goal under 0.25 s). Each of these costs
#: 10-100 ms of start-up: pydantic (the state is checked by sync/typed_json.py), the HTTP
#: stack (imported on the first request), the writer and asyncio (only an import writes),
#: the importer (only when there are outputs to import), the local platform's server stack
#: and the viewer.
HEAVY_FOR_NO_OP_SYNC = (
    "pydantic", "httpx", "httpcore", "h11", "asyncio", "starlette", "uvicorn", "jinja2", "verifiers",
    "prime_traces", "obstore", "prime_runs_spool.runner.run", "prime_runs_spool.spool.writer",
    "prime_runs_spool.importer.outputs", "prime_runs_spool.local_platform.app", "prime_runs_spool.viewer.app",
)


@pytest.mark.slow
def test_a_sync_with_nothing_to_send_imports_no_http_stack(tmp_path: Path, server, api) -> None:
    """A re-sync of a synced run makes no request, so its start-up must not pay for httpx
    (and httpcore, trio, rich where installed), nor for anything else in
    HEAVY_FOR_NO_OP_SYNC: benchmarks/startup.py."""
    builder = build_run(tmp_path / "run", f"noop-imports-{os.urandom(3).hex()}", 3)
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    again = subprocess.run([sys.executable, "-X", "importtime", *sync_cmd(server.base_url, str(tmp_path), "--json")[1:]],
                           capture_output=True, text=True, timeout=60,
                           env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root")))
    assert again.returncode == 0, again.stderr
    assert [r["state"] for r in json.loads(again.stdout)["runs"]] == ["up_to_date"]
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time:")}
    assert [name for name in HEAVY_FOR_NO_OP_SYNC if name in imported] == []
    assert_exactly_once(api, builder)


def test_a_first_sync_to_an_account_without_prime_traces_imports_neither_its_client_nor_pydantic(
        tmp_path: Path, server, api) -> None:
    """``--to auto`` asks whether the account has Prime Traces on the platform client's own
    connection (platform_api/traces_probe.py): the prime-traces client and pydantic under
    it, about 0.14 s of CPU, are imported only to upload there."""
    builder = build_run(tmp_path / "run", f"probe-imports-{os.urandom(3).hex()}", 3)
    first = subprocess.run([sys.executable, "-X", "importtime", *sync_cmd(server.base_url, str(tmp_path), "--json")[1:]],
                           capture_output=True, text=True, timeout=60,
                           env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root")))
    assert first.returncode == 0, first.stderr
    assert [(r["state"], r["store"]) for r in json.loads(first.stdout)["runs"]] == [("synced", "samples")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in first.stderr.splitlines() if line.startswith("import time:")}
    assert "httpx" in imported  # it did send
    # nor what the HTTP stack imports only because it is installed (commands.output; an
    # import that fails is listed too, so the check names a module of each package)
    assert [name for name in ("prime_traces", "pydantic", "trio._core", "rich.console") if name in imported] == []
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_sync_local_with_the_default_store_goes_to_samples_without_a_warning_per_run(tmp_path: Path) -> None:
    """Locally auto means samples for a run with no sink recorded: not a probe of the embedded
    platform for every run (nor a fallback warning each)."""
    for n in range(2):
        build_run(tmp_path / "runs" / f"run-{n}", f"local-auto-{n}-{os.urandom(3).hex()}", 2)
    done = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(tmp_path / "local.db"),
                                 "--json"], capture_output=True, text=True, timeout=120,
                          env=child_env(HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [(r["state"], r["store"], r["warnings"]) for r in runs] == [("synced", "samples", [])] * 2
