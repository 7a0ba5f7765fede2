"""A run plain vf-eval already pushed is synced into that evaluation, not a second one.

The real vf-eval (verifiers 0.4.0, prime-runs 0.1.4) pushes by default: pointed at the local
platform (``PRIME_API_BASE_URL``, ``PRIME_TRACES_URL``, ``PRIME_API_KEY``) it creates an
evaluation and stamps its id on every episode of ``traces.jsonl`` (``run.id``). ``prime-runs
sync`` of that folder adopts the evaluation: what it holds is reconciled, only the rest is
sent, and it is finalized once. ``disabled-<hex>`` ids (pushing off) name nothing.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from prime_runs_spool.sync.state import SYNC_DIRNAME  # noqa: E402
from support import platform_process  # noqa: E402
from support.env import CLI, child_env  # noqa: E402
from support.vf_eval import (  # noqa: E402
    TASKS, interrupt_eval, interrupt_plain, launch_file, resolved_config, run_dir, run_plain, traces,
)

TOKEN = "vf-eval-adopt-token"
ROLLOUTS = 2
SLOW = "Capital of France?"  # task 2: held by the fake server until released


@pytest.fixture
def platform(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[platform_process.PlatformProcess]:
    extra = ["--traces"] if getattr(request, "param", "traces") == "traces" else []
    with platform_process.running(tmp_path / "platform.db", "--token", TOKEN, *extra) as running:
        yield running


def pushing_env(platform: platform_process.PlatformProcess) -> dict[str, str]:
    """What verifiers 0.4.0 / prime-runs 0.1.4 read: the key, the platform, Prime Traces."""
    return {"PRIME_API_KEY": TOKEN, "PRIME_API_BASE_URL": platform.base_url, "PRIME_TRACES_URL": platform.base_url}


def sync(tmp_path: Path, platform: platform_process.PlatformProcess, to: str) -> dict[str, Any]:
    done = subprocess.run(CLI + ["sync", "--json", "--to", to, "outputs"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, env=child_env(HOME=str(tmp_path), **pushing_env(platform)))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def api(platform: platform_process.PlatformProcess) -> httpx.Client:
    return httpx.Client(base_url=platform.api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def evaluations(client: httpx.Client) -> list[dict[str, Any]]:
    return client.get("/evaluations/", params={"limit": 100}).json()["evaluations"]


def trace_episodes(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = client.get("/episodes", params={"run_id": run_id, "limit": 100, **({"cursor": cursor} if cursor else {})})
        page.raise_for_status()
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return items


def platform_ids(rows: list[dict[str, Any]]) -> set[str]:
    return {row["run"]["id"] for row in rows}


def pushed_by_vf_eval(tmp_path: Path, platform: platform_process.PlatformProcess) -> tuple[list[dict[str, Any]], str]:
    """A plain vf-eval (one rollout a task, the fake model) that pushed its episodes to
    ``platform`` itself: its ``traces.jsonl`` rows, and the one platform run they name."""
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=1)
        pushed = run_plain(tmp_path, "@", launch.name, "--no-rich", **pushing_env(platform))
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    final = traces(tmp_path)
    [platform_run] = platform_ids(final)
    return final, platform_run


@pytest.mark.slow
def test_a_run_vf_eval_pushed_to_prime_traces_is_adopted_not_uploaded_again(
        tmp_path: Path, platform: platform_process.PlatformProcess) -> None:
    final, platform_run = pushed_by_vf_eval(tmp_path, platform)
    assert not platform_run.startswith("disabled-")

    report = sync(tmp_path, platform, "auto")
    [run] = report["runs"]
    assert run["evaluation_id"] == platform_run and run["state"] == "synced"
    with api(platform) as client:
        [evaluation] = evaluations(client)
        evaluation = client.get(f"/evaluations/{platform_run}").json()
        assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)
        items = trace_episodes(client, platform_run)
    assert sorted(item["episode_id"] for item in items) == sorted(row["id"] for row in final)
    assert [item for item in items if item["generation"] != 1] == []  # nothing uploaded again
    assert run["pushed_now"] == 0
    again = sync(tmp_path, platform, "auto")
    assert [r["state"] for r in again["runs"]] == ["up_to_date"]
    # status said "nothing pushed yet" of a run whose every episode was there (vf-eval's)
    status = subprocess.run(CLI + ["status", "outputs"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env=child_env(HOME=str(tmp_path)))
    assert f"{len(final)} episodes vf-eval pushed there itself (adopted), 0 episodes pending, finalized" in (
        status.stdout), status.stdout


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["samples"], indirect=True)
def test_a_run_vf_eval_pushed_to_samples_is_adopted_and_reconciled(
        tmp_path: Path, platform: platform_process.PlatformProcess) -> None:
    """Without Prime Traces, vf-eval falls back to the samples table; sync finds them there."""
    final, platform_run = pushed_by_vf_eval(tmp_path, platform)

    report = sync(tmp_path, platform, "auto")
    [run] = report["runs"]
    assert (run["evaluation_id"], run["pushed_now"], run["pushed_total"]) == (platform_run, 0, len(final))
    with api(platform) as client:
        assert len(evaluations(client)) == 1
        evaluation = client.get(f"/evaluations/{platform_run}").json()
    assert (evaluation["total_samples"], evaluation["finalize_count"]) == (len(final), 1)


@pytest.mark.slow
def test_prime_runs_eval_then_a_pushing_plain_resume_ends_in_vf_evals_evaluation(
        tmp_path: Path, platform: platform_process.PlatformProcess) -> None:
    """``prime-runs eval`` (offline, never synced), Ctrl-C, then ``vf-eval ... --resume``
    with pushing on: vf-eval opens a platform run and pushes the whole run into it (the
    kept episodes too). Sync adopts that run: one evaluation, each episode once."""
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        interrupted = interrupt_eval(tmp_path, "@", launch.name, "--no-rich",
                                     when=lambda: _episodes(run_dir(tmp_path)) >= 2 * ROLLOUTS)
        assert interrupted.returncode == 130, interrupted.stderr[-3000:]
        server.release()
        resumed = run_plain(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich",
                            **pushing_env(platform))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    pushed_to = {row["run"]["id"] for row in final} - {read_run(run_dir(tmp_path)).run_id}
    [platform_run] = pushed_to

    report = sync(tmp_path, platform, "auto")
    assert [r["evaluation_id"] for r in report["runs"]] == [platform_run]
    with api(platform) as client:
        assert len(evaluations(client)) == 1
        evaluation = client.get(f"/evaluations/{platform_run}").json()
        items = trace_episodes(client, platform_run)
    assert evaluation["finalize_count"] == 1
    assert sorted(item["episode_id"] for item in items) == sorted(row["id"] for row in final)
    assert [item for item in items if item["generation"] != 1] == []


def _episodes(path: Path) -> int:
    try:
        return read_run(path).episodes_count
    except Exception:  # not there yet
        return 0


@pytest.mark.slow
def test_a_pushing_plain_vf_eval_then_prime_runs_eval_resume_ends_in_vf_evals_evaluation(
        tmp_path: Path, platform: platform_process.PlatformProcess) -> None:
    """Plain vf-eval pushing, Ctrl-C (its platform run holds what it wrote, CANCELLED), then
    ``prime-runs eval --resume``: the spool takes every kept episode and names vf-eval's run
    (``platform_runs``); sync adopts it and sends only the rest, finalized once."""
    from support.vf_eval import interrupt_plain, run_eval

    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        interrupted = interrupt_plain(tmp_path, "@", launch.name, "--no-rich", **pushing_env(platform),
                                      when=lambda: _lines(run_dir(tmp_path) / "traces.jsonl") >= 2 * ROLLOUTS)
        assert interrupted.returncode == 130, interrupted.stderr[-3000:]
        [platform_run] = platform_ids(traces(tmp_path))
        server.release()
        resumed = run_eval(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    spool = read_run(run_dir(tmp_path))
    assert sorted(e["id"] for e in spool.episodes()) == sorted(row["id"] for row in final)

    report = sync(tmp_path, platform, "auto")
    assert [r["evaluation_id"] for r in report["runs"]] == [platform_run]
    assert report["runs"][0]["pushed_now"] == TASKS * ROLLOUTS - 2 * ROLLOUTS
    with api(platform) as client:
        assert len(evaluations(client)) == 1
        evaluation = client.get(f"/evaluations/{platform_run}").json()
        items = trace_episodes(client, platform_run)
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)
    assert sorted(item["episode_id"] for item in items) == sorted(row["id"] for row in final)
    assert [item for item in items if item["generation"] != 1] == []


def _lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_bytes().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["samples"], indirect=True)
def test_a_sync_while_a_pushing_vf_eval_runs_sends_no_episode_twice(
        tmp_path: Path, platform: platform_process.PlatformProcess) -> None:
    """A sync run while a pushing vf-eval is still running (its upload of the first
    episodes held by a proxy, as a slow or retrying platform holds it) leaves the folder
    for later, and touches nothing of vf-eval's evaluation; once vf-eval has exited, sync
    adopts the evaluation: each episode once, finalized once. Spooled and adopted at
    once, the held upload landed after sync had sent the same rows (10 samples for 6
    episodes), and the evaluation was closed out as crashed under vf-eval's feet."""
    from fixtures.fault_proxy import FaultProxy
    from support.vf_eval import eval_env, plain_cmd

    with FaultProxy(platform.base_url, methods=["POST"], hold_first=r"/samples$") as proxy, \
            FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        through_proxy = {**pushing_env(platform), "PRIME_API_BASE_URL": proxy.base_url,
                         "PRIME_TRACES_URL": proxy.base_url}
        vf_eval = subprocess.Popen(plain_cmd("@", launch.name, "--no-rich"), cwd=tmp_path, text=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   env=eval_env(HOME=str(tmp_path), **through_proxy))
        try:
            deadline = time.monotonic() + 120
            while not (_lines(run_dir(tmp_path) / "traces.jsonl") >= 2 * ROLLOUTS and proxy.holding()):
                assert vf_eval.poll() is None and time.monotonic() < deadline, "vf-eval ended before the sync"
                time.sleep(0.1)
            while_running = sync(tmp_path, platform, "samples")
            assert proxy.release_held()  # vf-eval's own upload lands
            server.release()
            _, err = vf_eval.communicate(timeout=180)
            assert vf_eval.returncode == 0, err[-3000:]
        finally:
            if vf_eval.poll() is None:
                vf_eval.kill()
                vf_eval.wait()
    final = traces(tmp_path)
    [platform_run] = platform_ids(final)
    with api(platform) as client:
        landed = client.get(f"/evaluations/{platform_run}/samples", params={"limit": 1000}).json()["samples"]
    ids = [sample["sample_id"] for sample in landed]
    assert len(ids) == len(set(ids)), f"{len(ids)} samples for {len(set(ids))} episodes"
    assert while_running["runs"] == [] and [i["state"] for i in while_running["imports"]] == ["live"]

    report = sync(tmp_path, platform, "samples")
    [run] = report["runs"]
    assert (run["evaluation_id"], run["state"]) == (platform_run, "synced")
    with api(platform) as client:
        assert len(evaluations(client)) == 1
        evaluation = client.get(f"/evaluations/{platform_run}").json()
        samples = client.get(f"/evaluations/{platform_run}/samples", params={"limit": 1000}).json()["samples"]
    assert sorted(sample["sample_id"] for sample in samples) == sorted(row["id"] for row in final)
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["samples"], indirect=True)
def test_a_follower_started_while_a_pushing_vf_eval_runs_adopts_it_once_vf_eval_exits(
        tmp_path: Path, platform: platform_process.PlatformProcess) -> None:
    """``sync --follow --exit-when-idle`` started while a pushing vf-eval is still running
    leaves its folder ``live`` (as a one-shot sync does) and waits for it; once vf-eval has
    exited, the follower imports the folder on its next walk and adopts the evaluation: each
    episode once, finalized once, and then it exits."""
    from fixtures.fault_proxy import FaultProxy
    from support.vf_eval import eval_env, plain_cmd

    follow_cmd = CLI + ["sync", "--follow", "--exit-when-idle", "--json", "--to", "samples", "outputs"]
    with FaultProxy(platform.base_url, methods=["POST"], hold_first=r"/samples$") as proxy, \
            FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        through_proxy = {**pushing_env(platform), "PRIME_API_BASE_URL": proxy.base_url,
                         "PRIME_TRACES_URL": proxy.base_url}
        vf_eval = subprocess.Popen(plain_cmd("@", launch.name, "--no-rich"), cwd=tmp_path, text=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   env=eval_env(HOME=str(tmp_path), **through_proxy))
        follower = None
        try:
            deadline = time.monotonic() + 120
            while not (_lines(run_dir(tmp_path) / "traces.jsonl") >= 2 * ROLLOUTS and proxy.holding()):
                assert vf_eval.poll() is None and time.monotonic() < deadline, "vf-eval ended before the follower"
                time.sleep(0.1)
            follower = subprocess.Popen(follow_cmd, cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=child_env(HOME=str(tmp_path),
                                                                              **pushing_env(platform)))
            assert follower.stdout is not None
            said = follower.stdout.readline()
            assert said, f"the follower said nothing of the live folder and exited ({follower.wait()})"
            first = json.loads(said)
            assert (first.get("state"), "source" in first) == ("live", True), first
            assert follower.poll() is None, "the follower exited while vf-eval was still running"
            assert proxy.release_held()  # vf-eval's own upload lands
            server.release()
            _, err = vf_eval.communicate(timeout=180)
            assert vf_eval.returncode == 0, err[-3000:]
            out, err = follower.communicate(timeout=120)
        finally:
            for proc in (vf_eval, follower):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert follower.returncode == 0, err
    final = traces(tmp_path)
    [platform_run] = platform_ids(final)
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["state"] for e in events if "source" in e] == ["imported"]
    assert [(e["evaluation_id"], e["state"]) for e in events if "path" in e][-1] == (platform_run, "synced")
    with api(platform) as client:
        assert len(evaluations(client)) == 1
        evaluation = client.get(f"/evaluations/{platform_run}").json()
        samples = client.get(f"/evaluations/{platform_run}/samples", params={"limit": 1000}).json()["samples"]
    assert sorted(sample["sample_id"] for sample in samples) == sorted(row["id"] for row in final)
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)


def _rows_of(client: httpx.Client, evaluation_id: str, sink: str) -> list[str]:
    """The episode ids an evaluation holds on the local platform, one per row."""
    if sink == "traces":
        return [item["episode_id"] for item in trace_episodes(client, evaluation_id)]
    samples = client.get(f"/evaluations/{evaluation_id}/samples", params={"limit": 1000}).json()["samples"]
    return [sample["sample_id"] for sample in samples]


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["traces", "samples"], indirect=True)
def test_a_sync_between_a_pushing_vf_eval_and_its_pushing_resume_follows_the_resumed_run(
        tmp_path: Path, platform: platform_process.PlatformProcess, request: pytest.FixtureRequest) -> None:
    """Plain vf-eval pushing, Ctrl-C (platform run E1), a sync (adopts E1), then ``vf-eval
    --resume`` pushing: it opens E2 and pushes every episode there. The next sync adopts
    E2, which holds them all, and sends nothing more into E1. It sent the resumed episodes
    into E1 too: with samples both held 12 rows (7 twice); with Prime Traces they moved
    to E1, leaving E2 5 and E1 7, neither whole."""
    sink = request.node.callspec.params["platform"]
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        interrupted = interrupt_plain(tmp_path, "@", launch.name, "--no-rich", **pushing_env(platform),
                                      when=lambda: _lines(run_dir(tmp_path) / "traces.jsonl") >= 2 * ROLLOUTS)
        assert interrupted.returncode == 130, interrupted.stderr[-3000:]
        before = traces(tmp_path)
        [first] = platform_ids(before)
        report = sync(tmp_path, platform, sink)
        assert [r["evaluation_id"] for r in report["runs"]] == [first]
        server.release()
        resumed = run_plain(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich",
                            **pushing_env(platform))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    [newest] = platform_ids(final) - {first}

    report = sync(tmp_path, platform, sink)
    assert [(r["evaluation_id"], r["pushed_now"]) for r in report["runs"]] == [(newest, 0)]
    with api(platform) as client:
        assert len(evaluations(client)) == 2
        held = {evaluation_id: _rows_of(client, evaluation_id, sink) for evaluation_id in (first, newest)}
        status = client.get(f"/evaluations/{newest}").json()["status"]
    assert sorted(held[newest]) == sorted(row["id"] for row in final)  # whole, each once
    # E1 keeps at most what vf-eval itself pushed there before Ctrl-C: nothing of sync's
    assert set(held[first]) <= {row["id"] for row in before} and len(held[first]) == len(set(held[first]))
    if sink == "traces":  # an episode is in one run of Prime Traces
        assert not set(held[first]) & set(held[newest])
    assert status == "COMPLETED"
    again = sync(tmp_path, platform, sink)
    assert [r["state"] for r in again["runs"]] == ["up_to_date"]
    # The state lost: both evaluations carry the run's local id; the newer vf-eval run wins
    for state_file in [p for p in tmp_path.rglob("*") if p.parent.name == SYNC_DIRNAME and p.is_file()]:
        state_file.unlink()
    lost = sync(tmp_path, platform, sink)
    assert [(r["evaluation_id"], r["pushed_now"]) for r in lost["runs"]] == [(newest, 0)]
    with api(platform) as client:
        assert {evaluation_id: _rows_of(client, evaluation_id, sink) for evaluation_id in held} == held


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["traces", "samples"], indirect=True)
def test_a_synced_prime_runs_eval_then_a_pushing_plain_resume_follows_the_resumed_run(
        tmp_path: Path, platform: platform_process.PlatformProcess, request: pytest.FixtureRequest) -> None:
    """``prime-runs eval`` (offline), Ctrl-C, a sync (creates E0), then ``vf-eval --resume``
    pushing: it opens E2, created after E0, and pushes every episode there. The next sync
    adopts E2 and sends nothing more into E0: with Prime Traces the rest sent to E0 moved
    those episodes out of E2, neither whole."""
    sink = request.node.callspec.params["platform"]
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        interrupted = interrupt_eval(tmp_path, "@", launch.name, "--no-rich",
                                     when=lambda: _episodes(run_dir(tmp_path)) >= 2 * ROLLOUTS)
        assert interrupted.returncode == 130, interrupted.stderr[-3000:]
        [created] = [r["evaluation_id"] for r in sync(tmp_path, platform, sink)["runs"]]
        server.release()
        resumed = run_plain(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich",
                            **pushing_env(platform))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    [newest] = platform_ids(final) - {read_run(run_dir(tmp_path)).run_id}

    report = sync(tmp_path, platform, sink)
    assert [(r["evaluation_id"], r["pushed_now"]) for r in report["runs"]] == [(newest, 0)]
    with api(platform) as client:
        held = {evaluation_id: _rows_of(client, evaluation_id, sink) for evaluation_id in (created, newest)}
    assert sorted(held[newest]) == sorted(row["id"] for row in final)
    assert len(held[created]) < len(final)  # nothing sent there after vf-eval's push
