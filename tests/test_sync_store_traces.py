"""``prime-runs sync s3://bucket/prefix --to traces``: runs read where they lie in a real S3
API (moto's server mode), shipped to Prime Traces on the real platform process, each
episode once, with the state and the lease in the bucket as for samples."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.store.objects import ObjectStore

from support import moto_server, platform_process

from fixtures.fault_proxy import NO_FAULT, FaultProxy
from support.children import all_succeed
from support.env import child_env
from support.runs import build_run
from support.store_runs import get_object, machine_env, start_sync_from_store, stored_run
from support.sync_e2e import TOKEN, evaluations_of, kill_on_progress, sync_cmd
from test_traces_sync_e2e import episodes_in_traces


moto = moto_server.module_fixture()
server, api = platform_process.module_fixtures(TOKEN, "api", "--traces")


def machine(moto: moto_server.MotoServer, home: Path) -> dict[str, str]:
    """The environment of one machine: its own cache, the bucket's endpoint."""
    return machine_env(home, moto.env())


def assert_once_in_traces(api: httpx.Client, run_id: str, ids: list[str]) -> None:
    (evaluation,) = evaluations_of(api, run_id)
    items = episodes_in_traces(api, evaluation["evaluation_id"])
    assert sorted(item["episode_id"] for item in items) == sorted(ids)
    assert [item for item in items if item["generation"] != 1] == [], "an episode was uploaded twice"
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["finalize_count"] == 1


@pytest.mark.slow
def test_a_bucket_synced_to_traces_twice_and_from_another_machine_stores_each_episode_once(
        tmp_path: Path, server, api, moto) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/outputs"
    builders = [stored_run(bucket_url, tmp_path / f"run-{n}", f"store-traces-{n}", 14) for n in range(2)]
    cmd = sync_cmd(server.base_url, bucket_url, "--to", "traces", "--json", "--traces-batch-bytes", "6000")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=machine(moto, tmp_path / "m1"))
    assert first.returncode == 0, first.stderr + first.stdout
    assert [(r["state"], r["store"], r["pushed_now"]) for r in json.loads(first.stdout)["runs"]] \
        == [("synced", "traces", 14)] * 2
    auto = sync_cmd(server.base_url, bucket_url, "--json")  # --to auto finds where each run went
    for home, again_cmd in (("m1", cmd), ("m2", auto)):  # again here, then on a machine with no cached state
        again = subprocess.run(again_cmd, capture_output=True, text=True, timeout=120,
                               env=machine(moto, tmp_path / home))
        assert [(r["state"], r["pushed_now"]) for r in json.loads(again.stdout)["runs"]] == [("up_to_date", 0)] * 2
    keys = [info.key for info in ObjectStore(bucket_url).list()]
    for n, builder in enumerate(builders):
        assert_once_in_traces(api, builder.run_id, builder.ids)
        (key,) = [k for k in keys if k.startswith(f"run-{n}/spool/sync/") and k.endswith(".json")]
        state = json.loads(get_object(bucket_url, key))  # the state lives in the bucket
        assert (state["store"], state["episodes_pushed"], state["in_flight"]) == ("traces", 14, None)


@pytest.mark.slow
def test_two_machines_syncing_a_bucket_to_traces_together_store_each_episode_once(
        tmp_path: Path, server, api, moto) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/outputs"
    builders = [stored_run(bucket_url, tmp_path / f"run-{n}", f"store-traces-pair-{n}", 10) for n in range(4)]
    args = (bucket_url, "--to", "traces", "--json", "--wait", "--jobs", "2", "--traces-batch-bytes", "5000")
    outs = all_succeed([start_sync_from_store(server.base_url, tmp_path / f"m{n}", *args, store_env=moto.env())
                        for n in range(2)])
    runs = [json.loads(out)["runs"] for out, _ in outs]
    for n in range(4):
        assert sorted(r[n]["pushed_now"] for r in runs) == [0, 10], runs  # one pushed it, one found it done
    for builder in builders:
        assert_once_in_traces(api, builder.run_id, builder.ids)


LEASE = {"PRIME_RUNS_LEASE_TTL": "2", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}
#: The request lifetime of the syncs that send a batch again: longer than a test's two
#: signals take on a loaded machine.
LIFETIME = 5.0


def leased_machine(moto, home: Path) -> dict[str, str]:
    return machine_env(home, moto.env(), **LEASE)


@pytest.mark.slow
def test_a_traces_replay_killed_mid_push_then_continued_by_two_machines_is_one_replay(
        tmp_path: Path, server, api, moto) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/out"
    builder = stored_run(bucket_url, tmp_path / "run", "attack-store-replay", 40)
    first = subprocess.run(sync_cmd(server.base_url, bucket_url, "--to", "traces", "--json"), capture_output=True,
                           text=True, timeout=120, env=leased_machine(moto, tmp_path / "m1"))
    assert first.returncode == 0, first.stderr

    def replay_episodes() -> int:
        return sum(len(episodes_in_traces(api, e["evaluation_id"])) for e in evaluations_of(api, builder.run_id)
                   if (e.get("metadata") or {}).get("replay_id"))

    for kill in range(2):  # two kills, each after some progress
        proc = subprocess.Popen(sync_cmd(server.base_url, bucket_url, "--to", "traces", "--replay",
                                         "--traces-batch-bytes", "3000"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=leased_machine(moto, tmp_path / "m1"))
        if not kill_on_progress(proc, replay_episodes, 4 if kill == 0 else 3):
            break
    time.sleep(3)  # the killed syncer's lease (2 s) runs out
    args = (bucket_url, "--to", "traces", "--replay", "--json", "--traces-batch-bytes", "3000")
    outs = all_succeed([start_sync_from_store(server.base_url, tmp_path / f"m{n}", *args, store_env=moto.env(),
                                              **LEASE) for n in (1, 2)], timeout=180)
    states = sorted(json.loads(out)["runs"][0]["state"] for out, _ in outs)
    assert states == ["skipped", "synced"], outs  # one continues the killed replay, the other is kept off
    evaluations = evaluations_of(api, builder.run_id)
    replays = [e for e in evaluations if (e.get("metadata") or {}).get("replay_id")]
    assert len(replays) == 1, f"{len(replays)} replay evaluations after one interrupted replay: {outs}"
    items = episodes_in_traces(api, replays[0]["evaluation_id"])
    assert sorted(i["episode_id"] for i in items) == sorted(builder.ids)
    assert max(i["generation"] for i in items) == 2, "an episode was uploaded twice within the replay"


@pytest.mark.slow
def test_replay_dry_run_over_a_store_url_says_what_the_replay_would_push(tmp_path: Path, server, moto) -> None:
    """Locally, `sync --replay --dry-run` of a synced run reports `dry_run`, pushed N; over a
    store URL it reports the run's earlier evaluation as up to date (pushed 0)."""
    bucket_url = f"s3://{moto.new_bucket()}/out"
    builder = stored_run(bucket_url, tmp_path / "run", "attack-replay-dry", 5)
    env = leased_machine(moto, tmp_path / "m")
    run = lambda *a: subprocess.run(sync_cmd(server.base_url, *a, "--to", "traces", "--json"),  # noqa: E731
                                    capture_output=True, text=True, timeout=120, env=env)
    assert run(bucket_url).returncode == 0
    assert run(str(builder.run_dir)).returncode == 0  # the local copy, for comparison
    local = json.loads(run(str(builder.run_dir), "--replay", "--dry-run").stdout)["runs"][0]
    store = json.loads(run(bucket_url, "--replay", "--dry-run").stdout)["runs"][0]
    assert (local["state"], local["pushed_now"]) == ("dry_run", 5)
    assert (store["state"], store["pushed_now"]) == (local["state"], local["pushed_now"]), store


@pytest.mark.slow
def test_a_traces_sync_of_a_bucket_killed_twice_then_two_machines_stores_each_episode_once(
        tmp_path: Path, server, api, moto) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/out"
    builder = stored_run(bucket_url, tmp_path / "run", "attack-store-kill", 40)

    def held() -> int:
        return sum(len(episodes_in_traces(api, e["evaluation_id"])) for e in evaluations_of(api, builder.run_id))

    for kill, home in enumerate(("m1", "m2")):
        proc = subprocess.Popen(sync_cmd(server.base_url, bucket_url, "--to", "traces", "--wait",
                                         "--traces-batch-bytes", "3000"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=leased_machine(moto, tmp_path / home))
        assert kill_on_progress(proc, held, 4 if kill == 0 else 3 + 0 * kill), "the sync ended before the kill"
    time.sleep(3)
    args = (bucket_url, "--to", "traces", "--wait", "--json", "--traces-batch-bytes", "3000")
    all_succeed([start_sync_from_store(server.base_url, tmp_path / f"m{n}", *args, store_env=moto.env(), **LEASE)
                 for n in (1, 2)], timeout=180)
    (evaluation,) = evaluations_of(api, builder.run_id)
    items = episodes_in_traces(api, evaluation["evaluation_id"])
    assert sorted(i["episode_id"] for i in items) == sorted(builder.ids)
    assert [i for i in items if i["generation"] != 1] == [], "an episode was uploaded twice"
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["finalize_count"] == 1


@pytest.mark.slow
def test_an_up_to_date_traces_run_in_a_bucket_reports_its_total_as_a_local_one_does(
        tmp_path: Path, server, moto) -> None:
    """store_sync._up_to_date sets pushed_total from samples_pushed, so a run that went to
    traces reads `pushed 0 (total 0)` over a URL, `pushed 0 (total 5) to traces` locally."""
    bucket_url = f"s3://{moto.new_bucket()}/out"
    stored_run(bucket_url, tmp_path / "run", "attack-total", 5)
    env = leased_machine(moto, tmp_path / "m")
    run = lambda *a: json.loads(subprocess.run(sync_cmd(server.base_url, *a, "--to", "traces", "--json"),  # noqa: E731
                                               capture_output=True, text=True, timeout=120, env=env).stdout)["runs"][0]
    run(bucket_url)
    again = run(bucket_url)
    assert again["state"] == "up_to_date"
    assert (again["pushed_total"], again["store"]) == (5, "traces"), again


@pytest.mark.slow
def test_store_urls_get_the_same_option_checks_as_local_paths(tmp_path: Path, server, moto) -> None:
    """commands/sync.py hands a store URL to sync_urls before its own checks: --exit-when-idle
    without --follow is refused locally (exit 2) but accepted over a URL."""
    bucket_url = f"s3://{moto.new_bucket()}/out"
    builder = stored_run(bucket_url, tmp_path / "run", "attack-checks", 2)
    env = leased_machine(moto, tmp_path / "m")
    local = subprocess.run(sync_cmd(server.base_url, str(builder.run_dir), "--exit-when-idle"), capture_output=True,
                           text=True, timeout=120, env=env)
    store = subprocess.run(sync_cmd(server.base_url, bucket_url, "--exit-when-idle"), capture_output=True,
                           text=True, timeout=120, env=env)
    assert local.returncode == 2
    assert store.returncode == local.returncode, (store.returncode, store.stdout, store.stderr)


class HeldUpload(FaultProxy):
    """Forwards every request but the first two Prime Traces uploads, each held for up to
    30 s and then dropped, never passed on (``seen`` counts the uploads)."""

    seen = 0

    def _decide(self, request: object) -> str:
        if getattr(request, "method", "") != "POST" or not getattr(request, "target", "").endswith("/traces"):
            return NO_FAULT
        self.seen += 1
        return "held" if self.seen <= 2 else NO_FAULT

    async def _act(self, fault: str, request: object, writer: asyncio.StreamWriter, decision: object) -> None:
        if fault != "held":
            return await super()._act(fault, request, writer, decision)  # type: ignore[arg-type]
        await asyncio.sleep(30)
        writer.close()


def _upload_held(proc: subprocess.Popen[str], proxy: HeldUpload, upload: int) -> None:
    deadline = time.monotonic() + 60
    while proxy.seen < upload:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    time.sleep(0.3)  # the upload is on its way


@pytest.mark.slow
def test_a_batch_sent_again_after_its_lifetime_keeps_the_lease_while_it_may_land(tmp_path: Path, server, api) -> None:
    """A sync killed with a batch's upload out leaves it announced; a sync of the run more
    than a request lifetime later sends it again under its key. While that upload is out the
    lease says it may land until its own time plus the lifetime, so a second signal leaves
    the lease to expire (and says so). Before, the announcement kept the first upload's send
    time: the lease said the batch could no longer land, the second signal gave it up with
    the upload out, and another syncer keeping its own state could take the run at once,
    read the listing before that upload committed and cut its episodes into another batch."""
    bucket = tmp_path / "bucket"
    builder = build_run(bucket / "run", "traces-resent-late", 3)
    lease_file = bucket / "run" / "spool" / "sync.lease.json"
    env = child_env(PRIME_API_KEY=TOKEN, **LEASE)

    def start(proxy: HeldUpload) -> subprocess.Popen[str]:
        return subprocess.Popen(sync_cmd(proxy.base_url, f"file://{bucket}", "--to", "traces") + [
            "--request-lifetime", str(LIFETIME)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    with HeldUpload(server.base_url) as proxy:
        killed = start(proxy)  # announced, sent, then SIGKILLed before any answer
        _upload_held(killed, proxy, 1)
        killed.kill()
        killed.communicate(timeout=30)
        time.sleep(LIFETIME + 1)  # the first upload can no longer land; the killed syncer's lease has run out
        again = start(proxy)
        _upload_held(again, proxy, 2)
        lease = json.loads(lease_file.read_bytes())
        assert lease["in_flight_until"] > time.time(), lease  # the upload out may land until then
        again.send_signal(signal.SIGINT)
        time.sleep(0.3)
        again.send_signal(signal.SIGINT)
        _, err = again.communicate(timeout=30)
        assert again.returncode == 130, err
        assert "a request announced under it may still land" in err, err
        assert json.loads(lease_file.read_bytes())["released"] is False
        final = subprocess.run(sync_cmd(proxy.base_url, f"file://{bucket}", "--to", "traces", "--wait", "--json"),
                               capture_output=True, text=True, timeout=120, env=env)
    assert final.returncode == 0, final.stderr
    assert json.loads(final.stdout)["runs"][0]["state"] == "synced", final.stdout
    assert_once_in_traces(api, builder.run_id, builder.ids)
