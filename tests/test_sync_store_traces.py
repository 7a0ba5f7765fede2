"""``prime-runs sync s3://bucket/prefix --to traces``: runs read where they lie in a real S3
API (moto's server mode), shipped to Prime Traces on the real platform process, each
episode once, with the state and the lease in the bucket as for samples."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from prime_runs_spool.store.objects import ObjectStore
from support import moto_server, platform_process
from support.env import child_env
from support.runs import build_run
from support.store_runs import get_object, upload_run
from support.sync_e2e import TOKEN, evaluations_of, sync_cmd
from test_traces_sync_e2e import episodes_in_traces


moto = moto_server.module_fixture()
server, api = platform_process.module_fixtures(TOKEN, "api", "--traces")


def machine(moto: moto_server.MotoServer, home: Path) -> dict[str, str]:
    """The environment of one machine: its own cache, the bucket's endpoint."""
    return child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / "cache"), **moto.env())


def assert_once_in_traces(api: httpx.Client, run_id: str, ids: list[str]) -> None:
    (evaluation,) = evaluations_of(api, run_id)
    items = episodes_in_traces(api, evaluation["evaluation_id"])
    assert sorted(item["episode_id"] for item in items) == sorted(ids)
    assert [item for item in items if item["generation"] != 1] == [], "an episode was uploaded twice"
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["finalize_count"] == 1


def test_a_bucket_synced_to_traces_twice_and_from_another_machine_stores_each_episode_once(
        tmp_path: Path, server, api, moto) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/outputs"
    builders = [build_run(tmp_path / f"run-{n}", f"store-traces-{n}", 14) for n in range(2)]
    for n, builder in enumerate(builders):
        upload_run(bucket_url, builder.run_dir, f"run-{n}")
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


def test_two_machines_syncing_a_bucket_to_traces_together_store_each_episode_once(
        tmp_path: Path, server, api, moto) -> None:
    bucket_url = f"s3://{moto.new_bucket()}/outputs"
    builders = [build_run(tmp_path / f"run-{n}", f"store-traces-pair-{n}", 10) for n in range(4)]
    for n, builder in enumerate(builders):
        upload_run(bucket_url, builder.run_dir, f"run-{n}")
    cmd = sync_cmd(server.base_url, bucket_url, "--to", "traces", "--json", "--wait", "--jobs", "2",
                   "--traces-batch-bytes", "5000")
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=machine(moto, tmp_path / f"m{n}")) for n in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    runs = [json.loads(out)["runs"] for out, _ in outs]
    for n in range(4):
        assert sorted(r[n]["pushed_now"] for r in runs) == [0, 10], runs  # one pushed it, one found it done
    for builder in builders:
        assert_once_in_traces(api, builder.run_id, builder.ids)
