"""A run synced to one sink, its sync state lost, is never pushed again through the other.

A sync that finds the run's evaluation again with no state of its own (the file deleted, or
another ``--state-dir``) asks the platform which sink holds the run (docs/sync.md, "Sinks"):
the real ``prime-runs sync`` against a real ``prime-runs platform serve --traces`` over HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fixtures.fault_proxy import NO_FAULT, FaultProxy
from support import platform_process
from support.env import CLI, child_env
from support.ports import closed_url
from support.runs import build_run
from support.sync_e2e import TOKEN, evaluations_of, sync_cmd


def sync(base_url: str, runs: Path, to: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # A cache of its own (the copy locks' notes): a fresh machine, which knows nothing of the run.
    return subprocess.run(sync_cmd(base_url, str(runs), "--json", "--to", to), capture_output=True, text=True,
                          timeout=120, env=child_env(PRIME_API_KEY=TOKEN, HOME=os.environ.get("HOME", "/root"),
                                                     XDG_CACHE_HOME=str(cache), **env))


def held(api: httpx.Client, evaluation_id: str) -> tuple[list[str], int]:
    """The episode ids Prime Traces holds for the evaluation, and its sample rows."""
    episodes = api.get("/episodes", params={"run_id": evaluation_id, "limit": 100}).json()["items"]
    samples = api.get(f"/evaluations/{evaluation_id}").json()["total_samples"]
    return sorted(item["episode_id"] for item in episodes), samples


def lose_state(builder) -> None:
    for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
        path.unlink()


def sample_rows(api: httpx.Client, evaluation_id: str) -> int:
    return api.get(f"/evaluations/{evaluation_id}").json()["total_samples"]


def refused(result: subprocess.CompletedProcess[str], said: str) -> dict:
    """The one run's report of a sync that stopped it: exit 1, state ``error``, one line
    naming what to do, and never a traceback."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    assert report["state"] == "error" and said in report["error"] and "\n" not in report["error"], report
    return report


def synced(result: subprocess.CompletedProcess[str]) -> dict:
    """The one run's report of a sync that ended well (exit 0)."""
    assert result.returncode == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    return report


def killed_with_its_first_upload_held(proxy: FaultProxy, runs: Path, cache: Path) -> None:
    """``sync --to auto`` of ``runs`` through ``proxy`` (which holds the first upload to
    Prime Traces), SIGKILLed once that upload is held: the evaluation created, naming traces,
    nothing in it."""
    proc = subprocess.Popen(sync_cmd(proxy.base_url, str(runs), "--to", "auto"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=child_env(PRIME_API_KEY=TOKEN, XDG_CACHE_HOME=str(cache)))
    deadline = time.monotonic() + 60
    while not proxy.holding() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.holding(), "the first upload never came"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


class ProbeUnanswered(FaultProxy):
    """A gateway in front of the platform: Prime Traces' probe meets its 503 (nothing said of
    the account), and the evaluation's create lands with its answer held back."""

    def _decide(self, request: object) -> str:
        method, path = request.method, request.target.split("?", 1)[0]  # type: ignore[attr-defined]
        if method == "GET" and path.endswith("/episodes"):
            return "status_503"
        return "delay_after" if method == "POST" and path.rstrip("/").endswith("/evaluations") else NO_FAULT


@pytest.mark.slow
@pytest.mark.parametrize("traces", [False, True], ids=["traces-off", "traces-on"])
def test_a_run_stopped_after_a_create_whose_probe_had_no_answer_is_synced_from_another_state(
        tmp_path: Path, traces: bool) -> None:
    """``auto``'s probe met a gateway's 503, so whether the account has Prime Traces was a
    guess: the create names samples, not traces. Named traces, the run stopped before any
    batch left was found again by another state (another address, a lost state) on an
    account without Prime Traces and refused for good ("went to traces"; only --replay
    helped). With Prime Traces on, the push names traces before its first batch goes there."""
    builder = build_run(tmp_path / "runs" / "run", f"probe-unanswered-{traces}", 6)
    runs = tmp_path / "runs"
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, *(["--traces"] if traces else [])) \
            as server, httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        with ProbeUnanswered(server.base_url, delay=3.0) as proxy:
            proc = subprocess.Popen(sync_cmd(proxy.base_url, str(runs), "--to", "auto"), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL,
                                    env=child_env(PRIME_API_KEY=TOKEN, XDG_CACHE_HOME=str(tmp_path / "cache1")))
            deadline = time.monotonic() + 60
            while not evaluations_of(api, builder.run_id) and time.monotonic() < deadline:
                assert proc.poll() is None, "the sync ended before its create landed"
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)  # the create landed, its answer not back
            proc.wait()
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert evaluation["metadata"]["prime_runs_sink"] == "samples"
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache2"))
        assert (report["store"], report["pushed_now"], report["evaluation_id"]) == (
            "samples", 6, evaluation["evaluation_id"]), report
        assert sample_rows(api, evaluation["evaluation_id"]) == 6

    fresh = build_run(tmp_path / "again" / "run", f"probe-unanswered-again-{traces}", 4)
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, *(["--traces"] if traces else [])) \
            as server, httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api, \
            ProbeUnanswered(server.base_url, delay=0.0) as proxy:
        report = synced(sync(proxy.base_url, tmp_path / "again", "auto", tmp_path / "cache3"))
        store = "traces" if traces else "samples"
        assert report["store"] == store, report
        (evaluation,) = evaluations_of(api, fresh.run_id)
        assert evaluation["metadata"]["prime_runs_sink"] == store
        if traces:
            assert held(api, evaluation["evaluation_id"]) == (sorted(fresh.ids), 0)
        assert sample_rows(api, evaluation["evaluation_id"]) == (0 if traces else 4)


@pytest.mark.slow
def test_a_run_in_traces_with_its_state_lost_is_never_pushed_to_samples(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "in-traces", 6)
    runs = tmp_path / "runs"
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        synced(sync(server.base_url, runs, "traces", tmp_path / "cache1"))
        (evaluation,) = evaluations_of(api, builder.run_id)
        evaluation_id = evaluation["evaluation_id"]
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)

        lose_state(builder)
        refused(sync(server.base_url, runs, "samples", tmp_path / "cache2"), "went to traces")
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)

        lose_state(builder)
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache3"))
        assert (report["store"], report["pushed_now"], report["evaluation_id"]) == ("traces", 0, evaluation_id)
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)
        assert len(evaluations_of(api, builder.run_id)) == 1


@pytest.mark.slow
def test_a_run_in_traces_found_again_where_traces_is_off_is_never_pushed_to_samples(tmp_path: Path) -> None:
    """The evaluation names its sink (docs/sync.md, "Sinks"): a platform whose Prime Traces
    is off cannot say what it holds, and is not asked."""
    builder = build_run(tmp_path / "runs" / "run", "traces-then-off", 6)
    runs, db = tmp_path / "runs", tmp_path / "platform.db"
    with platform_process.running(db, "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        first = sync(server.base_url, runs, "auto", tmp_path / "cache1")
        assert first.returncode == 0, first.stdout + first.stderr
        (evaluation,) = evaluations_of(api, builder.run_id)
        evaluation_id = evaluation["evaluation_id"]
        assert evaluation["metadata"]["prime_runs_sink"] == "traces"
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)

    lose_state(builder)
    with platform_process.running(db, "--token", TOKEN) as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        # Lost, then kept from the refused pass: each time, nothing goes to samples.
        for attempt in range(2):
            report = refused(sync(server.base_url, runs, "auto", tmp_path / f"auto{attempt}"),
                             "went to traces on this destination")
            assert "--replay" in report["error"] and report["evaluation_id"] == evaluation_id
            assert sample_rows(api, evaluation_id) == 0
        lose_state(builder)
        for attempt in range(2):
            refused(sync(server.base_url, runs, "samples", tmp_path / f"samples{attempt}"), "--to traces (or auto)")
            assert sample_rows(api, evaluation_id) == 0
        assert len(evaluations_of(api, builder.run_id)) == 1

    with platform_process.running(db, "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "back"))
        assert (report["store"], report["pushed_now"], report["evaluation_id"]) == ("traces", 0, evaluation_id)
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)


@pytest.mark.slow
def test_a_run_on_a_platform_without_traces_names_samples_and_is_followed_there(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "samples-named", 5)
    runs, db = tmp_path / "runs", tmp_path / "platform.db"
    with platform_process.running(db, "--token", TOKEN) as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache1"))
        assert (report["state"], report["store"], report["pushed_total"]) == ("synced", "samples", 5)
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert evaluation["metadata"]["prime_runs_sink"] == "samples"
        assert sample_rows(api, evaluation["evaluation_id"]) == 5
    lose_state(builder)
    with platform_process.running(db, "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache2"))
        assert (report["store"], report["pushed_now"]) == ("samples", 0), report
        assert held(api, evaluation["evaluation_id"]) == ([], 5)
        assert len(evaluations_of(api, builder.run_id)) == 1


@pytest.mark.slow
def test_a_sync_killed_between_the_create_and_its_first_batch_still_stores_each_episode_once(tmp_path: Path) -> None:
    """SIGKILLed while its first upload is held (the evaluation created, naming traces,
    nothing in it): with the state lost, the next sync finds the evaluation and follows it."""
    builder = build_run(tmp_path / "runs" / "run", "killed-after-create", 7)
    runs = tmp_path / "runs"
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        with FaultProxy(server.base_url, methods=["POST"], hold_first=r"/traces$") as proxy:
            killed_with_its_first_upload_held(proxy, runs, tmp_path / "cache1")
        (evaluation,) = evaluations_of(api, builder.run_id)
        evaluation_id = evaluation["evaluation_id"]
        assert evaluation["metadata"]["prime_runs_sink"] == "traces"
        assert held(api, evaluation_id) == ([], 0)

        lose_state(builder)
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache2"))
        assert (report["state"], report["store"], report["evaluation_id"]) == ("synced", "traces", evaluation_id)
        episodes = api.get("/episodes", params={"run_id": evaluation_id, "limit": 100}).json()["items"]
        assert sorted(item["episode_id"] for item in episodes) == sorted(builder.ids)
        assert all(item["generation"] == 1 for item in episodes)
        final = api.get(f"/evaluations/{evaluation_id}").json()
        assert (final["status"], final["finalize_count"], final["total_samples"]) == ("COMPLETED", 1, 0)
        assert len(evaluations_of(api, builder.run_id)) == 1


@pytest.mark.slow
def test_a_run_killed_with_its_first_upload_out_stays_in_traces_where_traces_is_off(tmp_path: Path) -> None:
    """Killed while its first upload is held (announced, and in doubt: nothing in the state
    tells whether it reached the platform), then synced with its state where Prime Traces is
    off (the same destination: the proxy's address, kept): neither ``auto`` nor ``--to
    samples`` moves the run to samples; with Prime Traces back on, the batch is sent again
    under its key and each episode is there once."""
    builder = build_run(tmp_path / "runs" / "run", "in-doubt-killed", 6)
    runs, db = tmp_path / "runs", tmp_path / "platform.db"
    with platform_process.running(db, "--token", TOKEN, "--traces") as server, \
            FaultProxy(server.base_url, methods=["POST"], hold_first=r"/traces$") as proxy:
        port = int(proxy.base_url.rsplit(":", 1)[1])
        killed_with_its_first_upload_held(proxy, runs, tmp_path / "cache1")
    with platform_process.running(db, "--token", TOKEN) as server, FaultProxy(server.base_url, port=port) as proxy, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        (evaluation,) = evaluations_of(api, builder.run_id)
        refused(sync(proxy.base_url, runs, "auto", tmp_path / "cache1"), "may have been committed")
        refused(sync(proxy.base_url, runs, "samples", tmp_path / "cache1"), "went to traces")
        assert sample_rows(api, evaluation["evaluation_id"]) == 0
    with platform_process.running(db, "--token", TOKEN, "--traces") as server, \
            FaultProxy(server.base_url, port=port) as proxy, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        report = synced(sync(proxy.base_url, runs, "auto", tmp_path / "cache1"))
        assert (report["store"], report["pushed_total"]) == ("traces", 6), report
        assert held(api, evaluation["evaluation_id"]) == (sorted(builder.ids), 0)


@pytest.mark.slow
def test_a_run_moved_to_samples_after_its_create_named_traces_is_named_samples_first(tmp_path: Path) -> None:
    """``--to traces`` whose Prime Traces cannot be reached (its port closed: the probe has
    no answer, so the create names traces) and every upload is refused a connection (nothing
    stored); then, Prime Traces off for the account, ``auto`` falls back to samples, and the
    evaluation is told so before the first row, so a sync that loses the state later follows
    the run there instead of stopping."""
    builder = build_run(tmp_path / "runs" / "run", "named-samples-after", 6)
    runs, db = tmp_path / "runs", tmp_path / "platform.db"
    with platform_process.running(db, "--token", TOKEN) as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        refused(sync(server.base_url, runs, "traces", tmp_path / "cache1", PRIME_TRACES_URL=closed_url()),
                "connection refused")
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert evaluation["metadata"]["prime_runs_sink"] == "traces"
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache1"))
        assert (report["state"], report["store"], report["pushed_now"]) == ("synced", "samples", 6), report
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert evaluation["metadata"]["prime_runs_sink"] == "samples"
        lose_state(builder)
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache2"))
        assert (report["store"], report["pushed_now"]) == ("samples", 0), report
        assert sample_rows(api, evaluation["evaluation_id"]) == 6
        assert len(evaluations_of(api, builder.run_id)) == 1


@pytest.mark.slow
def test_auto_whose_prime_traces_cannot_be_reached_leaves_the_evaluation_naming_samples(tmp_path: Path) -> None:
    """``auto`` on an account without Prime Traces, its URL unreachable (a closed port): the
    probe has no answer, the create names samples, the push renames it traces before its
    first batch, and every upload is refused a connection (nothing left: the batch is
    withdrawn). The evaluation is named samples again, so a sync that lost the state, Prime
    Traces reachable now, pushes the run there; before, it stayed named traces and that sync
    stopped for good ('not enabled ... went to traces', --replay only)."""
    builder = build_run(tmp_path / "runs" / "run", "traces-unreachable", 6)
    runs, db = tmp_path / "runs", tmp_path / "platform.db"
    with platform_process.running(db, "--token", TOKEN) as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        refused(sync(server.base_url, runs, "auto", tmp_path / "cache1", PRIME_TRACES_URL=closed_url()),
                "connection refused")
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert evaluation["metadata"]["prime_runs_sink"] == "samples"
        lose_state(builder)
        report = synced(sync(server.base_url, runs, "auto", tmp_path / "cache2"))
        assert (report["store"], report["pushed_now"], report["evaluation_id"]) == (
            "samples", 6, evaluation["evaluation_id"]), report
        assert sample_rows(api, evaluation["evaluation_id"]) == 6
        assert len(evaluations_of(api, builder.run_id)) == 1


@pytest.mark.slow
def test_sync_local_to_traces_then_plain_on_one_database_sends_no_samples(tmp_path: Path) -> None:
    """``sync --local --db --to traces``, then (the state lost) a plain ``--local``, whose
    ``auto`` means samples for a run with no sink: the evaluation names traces, so it is
    followed there, nothing sent as samples; ``--to samples`` is refused."""
    builder = build_run(tmp_path / "runs" / "run", "local-on-off", 4)
    db = tmp_path / "local.db"

    def local(to: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--json", "--to", to],
                              capture_output=True, text=True, timeout=120,
                              env=child_env(XDG_CACHE_HOME=str(tmp_path / "cache")))

    first = local("traces")
    assert first.returncode == 0, first.stdout + first.stderr
    lose_state(builder)
    refused(local("samples"), "went to traces on this destination")
    lose_state(builder)
    report = synced(local("auto"))
    assert (report["store"], report["pushed_now"], report["pushed_total"]) == ("traces", 0, 4), report
    with platform_process.running(db, "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert held(api, evaluation["evaluation_id"]) == (sorted(builder.ids), 0)


@pytest.mark.slow
def test_a_run_whose_first_traces_batch_is_in_doubt_is_never_sent_to_samples(tmp_path: Path) -> None:
    """Killed with its first batch announced and on its way (committed later, its answer
    lost): the state names no committed batch, yet ``--to samples`` must not send the run a
    second time; ``auto`` sends the batch again under its key and finishes in traces."""
    builder = build_run(tmp_path / "runs" / "run", "batch-in-doubt", 5)
    runs = tmp_path / "runs"
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, "--traces") as server, \
            FaultProxy(server.base_url, methods=["POST"], hold_first=r"/traces$") as proxy, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        killed_with_its_first_upload_held(proxy, runs, tmp_path / "cache1")
        assert proxy.release_held()  # the batch lands after all; its answer is lost
        (evaluation,) = evaluations_of(api, builder.run_id)
        assert held(api, evaluation["evaluation_id"]) == (sorted(builder.ids), 0)

        refused(sync(proxy.base_url, runs, "samples", tmp_path / "cache1"), "went to traces on this destination")
        assert held(api, evaluation["evaluation_id"]) == (sorted(builder.ids), 0)
        report = synced(sync(proxy.base_url, runs, "auto", tmp_path / "cache1"))
        assert (report["state"], report["store"]) == ("synced", "traces"), report
        assert held(api, evaluation["evaluation_id"]) == (sorted(builder.ids), 0)


@pytest.mark.slow
def test_a_run_named_samples_with_nothing_there_goes_to_traces_when_asked(tmp_path: Path) -> None:
    """``--to samples`` SIGKILLed with its first samples request held, never passed on: the
    evaluation names samples and holds nothing. Its state lost, ``--to traces`` was refused
    for good ("went to samples on this destination, not traces"; only ``--replay``), though
    ``auto`` pushed the run to samples. The samples table counts nothing of the run, and the
    request the killed sync left was waited out first (its copy lock's note), so nothing of
    the run can land there: the person's ``--to traces`` takes it, the evaluation renamed
    before the first batch. A run with rows in samples is still refused."""
    builder = build_run(tmp_path / "runs" / "run", "named-samples-empty", 5)
    full = build_run(tmp_path / "full" / "run", "named-samples-full", 3)
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, "--traces") as server, \
            httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        with FaultProxy(server.base_url, methods=["POST"], hold_first=r"/samples$") as proxy:
            proc = subprocess.Popen(sync_cmd(proxy.base_url, str(runs), "--to", "samples"),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=child_env(PRIME_API_KEY=TOKEN, XDG_CACHE_HOME=str(cache)))
            deadline = time.monotonic() + 60
            while not proxy.holding() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert proxy.holding(), "the first samples request never came"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        (evaluation,) = evaluations_of(api, builder.run_id)
        evaluation_id = evaluation["evaluation_id"]
        assert evaluation["metadata"]["prime_runs_sink"] == "samples"
        assert held(api, evaluation_id) == ([], 0)

        lose_state(builder)
        report = synced(sync(server.base_url, runs, "traces", cache))
        assert (report["state"], report["store"], report["evaluation_id"], report["pushed_now"]) == (
            "synced", "traces", evaluation_id, 5), report
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)
        assert api.get(f"/evaluations/{evaluation_id}").json()["metadata"]["prime_runs_sink"] == "traces"
        assert len(evaluations_of(api, builder.run_id)) == 1
        lose_state(builder)  # found again, it is followed into traces: never to samples
        refused(sync(server.base_url, runs, "samples", tmp_path / "cache2"), "went to traces")
        assert held(api, evaluation_id) == (sorted(builder.ids), 0)

        assert synced(sync(server.base_url, tmp_path / "full", "samples", cache))["pushed_now"] == 3
        lose_state(full)
        refused(sync(server.base_url, tmp_path / "full", "traces", cache), "went to samples on this destination")
        (other,) = evaluations_of(api, full.run_id)
        assert held(api, other["evaluation_id"]) == ([], 3)
