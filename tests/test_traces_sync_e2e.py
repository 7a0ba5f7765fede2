"""Sync to Prime Traces end to end: the real ``prime-runs sync --to traces`` against a real
``prime-runs platform serve --traces`` process, through the fault proxy and under repeated
SIGKILLs; and ``--to auto`` against a platform that answers ``service_not_enabled``.

"Exactly once" for traces: one evaluation, finalized once, holding no samples; each episode
of the spool in Prime Traces under the evaluation's run id, as its first and only copy
(``generation`` 1: an episode uploaded twice, under another key, would be a second copy)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from fixtures.fault_proxy import AFTER_FAULTS, FAULTS, FaultProxy
from support import platform_process
from support.env import CLI, child_env
from support.runs import RunBuilder, build_run
from support.sync_e2e import TOKEN, evaluations_of, kill_syncs_at_random, sync_cmd

KILLS = int(os.environ.get("PRIME_RUNS_SYNC_KILLS", "20"))
FAULT_SEED = int(os.environ.get("PRIME_RUNS_FAULT_SEED", "1129"))


@pytest.fixture(scope="module")
def traces_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[platform_process.PlatformProcess, Path]]:
    db = tmp_path_factory.mktemp("traces-platform") / "platform.db"
    with platform_process.running(db, "--token", TOKEN, "--traces", "--request-deadline", "0.4") as proc:
        yield proc, db


@pytest.fixture(scope="module")
def server(traces_server):
    return traces_server[0]


@pytest.fixture(scope="module")
def api(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
        yield client


def traces_sync(base_url: str, *args: str, to: str = "traces", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sync_cmd(base_url, "--to", to, *args), capture_output=True, text=True, timeout=timeout,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root")))


def episodes_in_traces(api: httpx.Client, run_id: str) -> list[dict]:
    items, cursor = [], None
    while True:
        page = api.get("/episodes", params={"run_id": run_id, "limit": 100, **({"cursor": cursor} if cursor else {})})
        page.raise_for_status()
        body = page.json()
        items += body["items"]
        cursor = body["next_cursor"]
        if not cursor:
            return items


def state_of(builder: RunBuilder) -> dict:
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    return json.loads(path.read_text())


def assert_traces_exactly_once(api: httpx.Client, builder: RunBuilder) -> dict:
    evaluations = evaluations_of(api, builder.run_id)
    assert len(evaluations) == 1, f"{len(evaluations)} evaluations for run {builder.run_id}"
    evaluation = api.get(f"/evaluations/{evaluations[0]['evaluation_id']}").json()
    assert (evaluation["finalize_count"], evaluation["status"], evaluation["total_samples"]) == (1, "COMPLETED", 0)
    items = episodes_in_traces(api, evaluation["evaluation_id"])
    assert sorted(item["episode_id"] for item in items) == sorted(builder.ids)
    copies = [item for item in items if item["generation"] != 1]
    assert copies == [], f"{len(copies)} episodes were uploaded more than once"
    state = state_of(builder)
    assert state["store"] == "traces" and state["in_flight"] is None
    assert {item["upload_id"] for item in items} == set(state["uploads"])
    assert state["episodes_pushed"] == len(builder.ids)
    return evaluation


@pytest.mark.slow
def test_sync_to_traces_twice_stores_each_episode_once(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "run", "traces-twice", 30)
    first = traces_sync(server.base_url, str(tmp_path), "--json", "--traces-batch-bytes", "9000")
    assert first.returncode == 0, first.stderr + first.stdout
    (report,) = json.loads(first.stdout)["runs"]
    assert (report["state"], report["store"], report["pushed_now"]) == ("synced", "traces", 30)
    second = traces_sync(server.base_url, str(tmp_path), "--json", to="auto")
    assert json.loads(second.stdout)["runs"][0]["state"] == "up_to_date"
    evaluation = assert_traces_exactly_once(api, builder)
    uploads = len(state_of(builder)["uploads"])
    assert uploads > 5
    assert report["evaluation_id"] == evaluation["evaluation_id"]
    # status says where the run went and what that store holds, offline
    shown = subprocess.run(CLI + ["status", str(tmp_path), "--json"], capture_output=True, text=True, env=child_env())
    (dest,) = json.loads(shown.stdout)["runs"][0]["destinations"]
    assert (dest["store"], dest["episodes_pushed"], dest["traces_pushed"], dest["uploads"], dest["samples_pushed"]) \
        == ("traces", 30, 30, uploads, 0)
    text = subprocess.run(CLI + ["status", str(tmp_path)], capture_output=True, text=True, env=child_env()).stdout
    assert f"to traces: 30 episodes (30 traces) in {uploads} uploads, 0 episodes pending, finalized" in text


@pytest.mark.slow
def test_a_failed_run_is_recorded_and_never_finalized(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "run", "traces-failed", 5, status="failed")
    result = traces_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(result.stdout)["runs"][0]["state"] == "failed", result.stdout
    (evaluation,) = evaluations_of(api, builder.run_id)
    assert evaluation["finalize_count"] == 0 and evaluation["metadata"]["prime_runs"]["status"] == "failed"
    assert len(episodes_in_traces(api, evaluation["evaluation_id"])) == 5


def traces_so_far(api: httpx.Client, run_id: str) -> int:
    """How many of the run's episodes Prime Traces holds now (0 before its evaluation exists)."""
    evaluations = evaluations_of(api, run_id)
    if not evaluations:
        return 0
    run = api.get(f"/runs/{evaluations[0]['evaluation_id']}")
    return run.json()["episode_count"] if run.status_code == 200 else 0


@pytest.mark.slow
def test_sigkilled_syncs_then_a_full_sync_store_each_episode_once(tmp_path: Path, traces_server, api) -> None:
    """SIGKILL ``prime-runs sync --to traces`` at least PRIME_RUNS_SYNC_KILLS times (default 20)
    on observed progress: during start-up, or once 1 to 12 more episodes were committed;
    then a sync to the end. Every killed sync left at most one batch announced, whose key the
    next one re-sends: the platform must have replayed receipts, and stored nothing twice."""
    server, db = traces_server
    builder = build_run(tmp_path / "run", "traces-sigkill", 60 * KILLS, size=1_800)
    rng = random.Random(20261201)
    env = child_env(PRIME_API_KEY=TOKEN)
    cmd = sync_cmd(server.base_url, str(tmp_path), "--to", "traces", "--traces-batch-bytes", "6000")
    kill_syncs_at_random(cmd, env, lambda: traces_so_far(api, builder.run_id), KILLS, rng)
    final = traces_sync(server.base_url, str(tmp_path), "--json", "--traces-batch-bytes", "6000")
    assert final.returncode == 0, final.stdout + final.stderr
    assert json.loads(final.stdout)["runs"][0]["state"] in ("synced", "up_to_date"), final.stdout
    assert_traces_exactly_once(api, builder)


def upload_replays(db: Path, upload_ids: list[str]) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        marks = ",".join("?" * len(upload_ids))
        (replays,) = conn.execute(f"SELECT COALESCE(SUM(replays), 0) FROM trace_uploads WHERE upload_id IN ({marks})",
                                  upload_ids).fetchone()
    return replays


@pytest.mark.slow
def test_thirty_percent_faults_of_every_kind_still_exactly_once(tmp_path: Path, traces_server, api) -> None:
    server, db = traces_server
    builders = [build_run(tmp_path / f"run-{n}", f"traces-faults-{n}", 40) for n in range(3)]
    # Two proxies in a row: 30% faults of every kind on every request (the evaluation's too),
    # then 50% more on the uploads alone, so each kind meets an upload in a few dozen.
    rates = {fault: 0.3 / len(FAULTS) for fault in FAULTS}
    upload_rates = {fault: 0.5 / len(FAULTS) for fault in FAULTS}
    with FaultProxy(server.base_url, seed=FAULT_SEED, rates=upload_rates, methods=["POST"], paths=r"/traces$",
                    delay=1.5, retry_after=0) as inner, \
            FaultProxy(inner.base_url, seed=FAULT_SEED + 1, rates=rates, delay=1.5, retry_after=0) as proxy:
        for _ in range(5):
            result = traces_sync(proxy.base_url, str(tmp_path), "--json", "--traces-batch-bytes", "5000",
                                 "--jobs", "1", "--timeout", "1", timeout=240)
            runs = json.loads(result.stdout)["runs"]
            if all(run["state"] == "synced" for run in runs):
                break
        inner_faults = [entry.fault for entry in inner.log]  # the uploads' second proxy (after the first)
        uploads = [entry.fault for log in (inner.log, proxy.log) for entry in log
                   if entry.method == "POST" and entry.path.endswith("/traces")]
    assert result.returncode == 0, result.stdout
    for builder in builders:
        assert_traces_exactly_once(api, builder)
    # Uploads met both kinds of failure: refused before the platform acted, lost after it did
    # (then re-sent under the same key, which the platform answered with the stored receipt).
    assert set(uploads) >= set(FAULTS), set(FAULTS) - set(uploads)
    committed = [u for b in builders for u in state_of(b)["uploads"]]
    assert upload_replays(db, committed) >= sum(f in AFTER_FAULTS for f in inner_faults) > 0


@pytest.mark.slow
def test_every_upload_lost_after_commit_once_is_replayed_not_stored_twice(tmp_path: Path, traces_server, api) -> None:
    """The worst case for an append and the easy one for a content address: each upload
    commits and its answer is lost, alternately, for the whole run."""
    server, db = traces_server
    builder = build_run(tmp_path / "run", "traces-lost-answers", 24)
    with FaultProxy(server.base_url, seed=5, rates={"drop_after": 0.5}, methods=["POST"], paths=r"/traces$") as proxy:
        result = traces_sync(proxy.base_url, str(tmp_path), "--json", "--traces-batch-bytes", "5000")
        lost = sum(entry.fault == "drop_after" for entry in proxy.log)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_traces_exactly_once(api, builder)
    assert lost >= 3 and upload_replays(db, state_of(builder)["uploads"]) == lost


@pytest.mark.slow
def test_auto_on_a_platform_without_traces_sends_the_whole_run_to_samples_once(tmp_path: Path) -> None:
    from support.sync_e2e import assert_exactly_once

    builder = build_run(tmp_path / "runs" / "run", "traces-fallback", 25)
    with platform_process.running(tmp_path / "off.db", "--token", TOKEN) as off, \
            httpx.Client(base_url=off.api, headers={"Authorization": f"Bearer {TOKEN}"}) as off_api:
        with FaultProxy(off.base_url, seed=3, rates={"drop_after": 0.2, "status_503": 0.2},
                        methods=["POST"]) as proxy:
            result = traces_sync(proxy.base_url, str(tmp_path / "runs"), "--json", "--max-request-bytes", "9000",
                                 to="auto")
        assert result.returncode == 0, result.stdout + result.stderr
        (report,) = json.loads(result.stdout)["runs"]
        assert (report["state"], report["store"], report["pushed_total"]) == ("synced", "samples", 25)
        assert any("not enabled" in warning for warning in report["warnings"])
        assert_exactly_once(off_api, builder)
        assert state_of(builder)["store"] == "samples" and state_of(builder)["uploads"] == []
        text = subprocess.run(CLI + ["status", str(tmp_path / "runs")], capture_output=True, text=True,
                              env=child_env()).stdout
        assert "to samples: 25 samples pushed, 0 episodes pending, finalized" in text
        strict = traces_sync(off.base_url, str(tmp_path / "runs"), "--json")
        assert strict.returncode == 1 and "went to samples" in json.loads(strict.stdout)["runs"][0]["error"]


@pytest.mark.slow
def test_auto_says_once_per_sync_that_the_account_has_no_prime_traces(tmp_path: Path) -> None:
    """Three runs, ``auto``, an account without Prime Traces: the command's text says so in one
    line, not one under each run (each run's line says "to samples"); ``--json`` still gives
    each run's warning, for a script reading one run."""
    for tree in ("text", "json"):
        for i in range(3):
            build_run(tmp_path / tree / f"run{i}", f"traces-off-{tree}-{i}", 2)
    with platform_process.running(tmp_path / "off.db", "--token", TOKEN) as off:
        text = traces_sync(off.base_url, str(tmp_path / "text"), to="auto")
        as_json = traces_sync(off.base_url, str(tmp_path / "json"), "--json", to="auto")
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert sum("to samples" in line for line in lines) == 3, text.stdout
    assert sum("Prime Traces is not enabled" in line for line in lines) == 1, text.stdout
    assert "Prime Traces" not in text.stderr, text.stderr
    runs = json.loads(as_json.stdout)["runs"]
    assert [any("not enabled" in w for w in run["warnings"]) for run in runs] == [True] * 3, as_json.stdout


@pytest.mark.slow
def test_follow_ships_a_live_run_to_traces_and_finishes_it(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "traces-follow")
    builder.open_segment()
    builder.add(5)
    proc = subprocess.Popen(sync_cmd(server.base_url, str(tmp_path), "--to", "traces", "--follow", "--exit-when-idle",
                                     "--json", "--poll-interval", "0.05"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN))
    try:
        deadline = time.monotonic() + 60
        while traces_so_far(api, builder.run_id) < 5:  # the live run's durable episodes, while it runs
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        builder.add(4)
        builder.seal()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["state"] == "synced"
    assert_traces_exactly_once(api, builder)


@pytest.mark.slow
def test_a_resumed_run_that_retried_an_errored_rollout_holds_each_slot_once(tmp_path: Path, server, api) -> None:
    """docs/sync.md, "Resumed runs": the errored attempt waits while the run has not completed,
    the resume supersedes it, and Prime Traces ends with the retry only."""
    builder = RunBuilder(tmp_path / "run", "traces-resumed")
    builder.open_segment()
    builder.add(4)
    builder.add(1, ok=False)
    builder.seal("cancelled", error="interrupted")
    first = traces_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(first.stdout)["runs"][0]["state"] == "cancelled", first.stderr + first.stdout
    (evaluation,) = evaluations_of(api, builder.run_id)
    assert len(episodes_in_traces(api, evaluation["evaluation_id"])) == 4  # the errored one is held back
    text = subprocess.run(CLI + ["status", str(tmp_path)], capture_output=True, text=True, env=child_env()).stdout
    assert "1 errored held back until the run completes" in text, text
    errored = builder.ids[4]
    builder.open_segment(supersedes=[errored])  # verifiers --resume re-ran its slot
    builder.add(1)
    builder.seal()
    second = traces_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(second.stdout)["runs"][0]["state"] == "synced", second.stderr + second.stdout
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert (evaluation["finalize_count"], evaluation["status"], evaluation["total_samples"]) == (1, "COMPLETED", 0)
    items = episodes_in_traces(api, evaluation["evaluation_id"])
    assert sorted(item["episode_id"] for item in items) == sorted(builder.ids[:4] + [builder.ids[5]])
    assert {item["generation"] for item in items} == {1}
    state = state_of(builder)
    assert (state["episodes_pushed"], state["held_back"], state["superseded_pushed"]) == (5, 0, [])


@pytest.mark.slow
def test_a_state_restored_from_before_the_finalize_does_not_finalize_again(tmp_path: Path, server, api) -> None:
    """A state file put back from an older copy (a backup, an artifact unpacked again) says
    "not finalized" of an evaluation a later sync finalized: the batches it sends again are
    answered by their keys, and the evaluation is not finalized a second time."""
    builder = RunBuilder(tmp_path / "run", "traces-restored-state")
    builder.open_segment()
    builder.add(4)  # the writer is live: synced, not finalized
    first = traces_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(first.stdout)["runs"][0]["state"] == "live", first.stdout + first.stderr
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    older = path.read_bytes()
    builder.add(3)
    builder.seal("completed")
    second = traces_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(second.stdout)["runs"][0]["state"] == "synced", second.stdout + second.stderr
    path.write_bytes(older)  # the state from before the finalize, back in its place
    third = traces_sync(server.base_url, str(tmp_path), "--json")
    assert json.loads(third.stdout)["runs"][0]["state"] == "synced", third.stdout + third.stderr
    assert_traces_exactly_once(api, builder)  # finalize_count 1
    assert state_of(builder)["finalized"] is True


@pytest.mark.slow
def test_a_prime_traces_url_that_refuses_the_connection_is_told_as_the_platform_s_is(tmp_path: Path, server,
                                                                                      api) -> None:
    """A Prime Traces URL nothing listens on (PRIME_TRACES_URL mistyped, the service down):
    each retry and the run's error said 'POST /traces: no answer (Request failed: ConnectError
    at POST http://...: [Errno 111] Connection refused)', where a platform request says
    'cannot connect (connection refused by HOST:PORT)' (docs/cli.md, "Retries are never
    silent"); 'no answer' reads as a batch that may have landed."""
    build_run(tmp_path / "runs" / "r", "traces-url-refused", 2)
    done = subprocess.run(sync_cmd(server.base_url, str(tmp_path / "runs"), "--to", "traces", "--max-attempts", "2"),
                          capture_output=True, text=True, timeout=120,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root"),
                                        PRIME_TRACES_URL="http://127.0.0.1:9"))
    assert done.returncode == 1, done.stdout + done.stderr
    retry = [line for line in done.stderr.splitlines() if "try 2 in" in line]
    assert retry and "POST /traces: cannot connect (connection refused by 127.0.0.1:9)" in retry[0], done.stderr
    assert "no answer" not in done.stderr + done.stdout and "Request failed" not in done.stdout, done.stdout


class _RefusingTraces(BaseHTTPRequestHandler):
    """A Prime Traces host that refuses every key, as the service does one it does not know."""

    asked: list[tuple[str, str]] = []

    def _refuse(self) -> None:
        self.asked.append((self.command, self.path))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error": {"code": "unauthorized", "message": "unknown key"}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_traces() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    asked: list[tuple[str, str]] = []
    handler = type("Handler", (_RefusingTraces,), {"asked": asked})
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}", asked
    finally:
        http.shutdown()
        http.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("to", ["traces", "auto"])
def test_a_key_prime_traces_refuses_at_its_own_url_is_told_once_before_anything_is_written(
        tmp_path: Path, server, api, refusing_traces, to: str) -> None:
    """Prime Traces at a URL of its own (PRIME_TRACES_URL) refusing a key the platform
    accepts: the start-up check asked the platform only, so every run had an evaluation
    created and then its own error line ('POST /traces answered 401 ...'), exit 1. Now the
    check asks Prime Traces too: one line naming its URL and what to do, exit 2 (a refused
    key, docs/cli.md), nothing created, no run touched, nothing uploaded."""
    traces_url, asked = refusing_traces
    for number in range(3):
        build_run(tmp_path / "runs" / f"r{number}", f"traces-key-refused-{to}-{number}", 2)
    done = subprocess.run(sync_cmd(server.base_url, str(tmp_path / "runs"), "--to", to, "--max-attempts", "2"),
                          capture_output=True, text=True, timeout=120,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root"),
                                        PRIME_TRACES_URL=traces_url))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert traces_url in line and "refused the API key" in line and "PRIME_TRACES_URL" in line, line
    assert "--to samples" in line and TOKEN not in line, line
    assert done.stdout == "", done.stdout
    for number in range(3):
        assert evaluations_of(api, f"traces-key-refused-{to}-{number}") == []
        assert not (tmp_path / "runs" / f"r{number}" / "spool" / "sync").exists()
        assert not (tmp_path / "runs" / f"r{number}" / "spool" / "sync.lock").exists()
    assert [method for method, _ in asked] == ["GET"], asked  # one read, no upload


@pytest.mark.slow
def test_a_key_prime_traces_refuses_is_not_asked_about_for_samples(tmp_path: Path, server, api,
                                                                     refusing_traces) -> None:
    """``--to samples`` never sends to Prime Traces, so its refusal there stops nothing."""
    traces_url, asked = refusing_traces
    build_run(tmp_path / "runs" / "r", "traces-key-refused-samples", 2)
    done = subprocess.run(sync_cmd(server.base_url, str(tmp_path / "runs"), "--to", "samples"),
                          capture_output=True, text=True, timeout=120,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root"),
                                        PRIME_TRACES_URL=traces_url))
    assert done.returncode == 0, done.stdout + done.stderr
    assert asked == []
