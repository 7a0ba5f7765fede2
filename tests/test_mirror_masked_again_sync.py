"""A run written under older masking rules, mirrored into a store (as a copy masked again by
today's rules: store/mirror.py, docs/masking.md), then synced: from the store, and from its
own folder, which takes the store copy's lease (docs/deploy.md). Each episode lands once on
the real local platform, whichever syncs first, and no credential of the old spool reaches
the platform or the store. A copy of a segment still growing (an older package's writer
still running) is made again as it grows, and a sync of the store that read the smaller
copy goes on from where it stopped.

The real ``prime-runs mirror`` and ``sync`` commands, the real local platform over HTTP, a
real ``file://`` store and moto's S3 server; each "machine" has its own home and cache.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.layout import segment_path
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.writer import SegmentWriter
from support import moto_server
from support.files import all_bytes_under
from support.leaky import LEAKED, leaky_items
from support.store_runs import MARK_PATIENCE, get_object, keys, mirror_once, reports, sync_from_store
from support.sync_e2e import api, assert_exactly_once, evaluations_of, server  # noqa: F401  (fixtures)
from test_mirror_masking import store_bytes
from test_remask_e2e import SECRETS, old_manifest, write_old_spool

pytestmark = pytest.mark.slow  # mirrors and syncs as subprocesses, against the platform process

moto = moto_server.module_fixture()


def episodes_of(run_dir: Path) -> SimpleNamespace:
    """What the platform must hold of the run: its id and its episodes' ids, in order."""
    ids = [record.meta["episode_id"] for record in iter_records(run_dir) if record.type == "episode"]
    return SimpleNamespace(run_id=next(iter_records(run_dir)).data["run_id"], ids=ids)


def assert_no_secret_on_the_platform(api: httpx.Client, run_id: str) -> None:
    [evaluation] = evaluations_of(api, run_id)
    seen = json.dumps(api.get(f"/evaluations/{evaluation['evaluation_id']}").json())
    seen += json.dumps(api.get(f"/evaluations/{evaluation['evaluation_id']}/samples",
                               params={"limit": 100}).json())
    assert not [secret for secret in SECRETS if secret in seen]


def assert_no_secret_in_the_store(url: str, folder: Path | None, store_env: dict[str, str] | None) -> None:
    stored = store_bytes(url.split("/outputs")[0], store_env) if folder is None else {"": all_bytes_under(folder)}
    assert stored and not [secret for secret in SECRETS for data in stored.values() if secret.encode() in data]


def test_an_old_run_mirrored_masked_again_lands_once_from_the_store_and_its_folder(tmp_path: Path, server, api,
                                                                                    moto) -> None:
    """Into a ``file://`` store the store's sync goes first and the folder's finds it done;
    into S3 the folder's goes first (under the store copy's lease) and the store's finds it
    done. Before, the mirror refused the run: nothing reached the store."""
    bucket = moto.new_bucket()
    (tmp_path / "folder" / "outputs").mkdir(parents=True)
    stores = [(f"file://{tmp_path}/folder/outputs", None, tmp_path / "folder", "store-first"),
              (f"s3://{bucket}/outputs", moto.env(), None, "folder-first")]
    for url, store_env, folder, order in stores:
        outputs = tmp_path / order / "outputs"
        write_old_spool(outputs / "old-run", f"old-mirrored-{order}", 5)
        expected = episodes_of(outputs / "old-run")
        mirrored = mirror_once(outputs, url, store_env)
        assert mirrored.returncode == 0, mirrored.stdout + mirrored.stderr
        assert json.loads(mirrored.stdout)["masked_again"] == ["seg-000001.jsonl"]
        assert_no_secret_in_the_store(url, folder, store_env)
        from_store = lambda: sync_from_store(server.base_url, tmp_path / "sync-machine", url, "--json",  # noqa: E731
                                             "--max-request-bytes", "6000", store_env=store_env)
        from_folder = lambda: sync_from_store(server.base_url, tmp_path / "eval-machine", str(outputs),  # noqa: E731
                                              "--json", "--max-request-bytes", "6000", store_env=store_env)
        first, second = (from_store, from_folder) if order == "store-first" else (from_folder, from_store)
        pushed = first()
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        assert [(r["state"], r["pushed_now"]) for r in reports(pushed)] == [("synced", 5)], pushed.stdout
        again = second()
        assert again.returncode == 0, again.stdout + again.stderr
        assert [r["pushed_now"] for r in reports(again)] == [0], again.stdout
        assert_exactly_once(api, expected)
        assert_no_secret_on_the_platform(api, expected.run_id)
        assert not [secret for secret in SECRETS for out in (mirrored, pushed, again)
                    if secret in out.stdout + out.stderr]


def test_a_growing_old_segment_is_masked_again_as_it_grows_and_synced_once(tmp_path: Path, server, api) -> None:
    """An older package's writer still running: the mirror uploads its durable lines masked
    again, a sync of the store pushes them (the run live); the writer adds more and seals,
    the mirror makes the copy again, which starts with the first copy byte for byte, and
    the next sync of the store pushes only the rest. Each episode once, no secret stored."""
    run_dir = tmp_path / "node" / "outputs" / "growing"
    url = f"file://{tmp_path}/bucket/outputs"
    (tmp_path / "bucket" / "outputs").mkdir(parents=True)
    run_id = "old-growing-mirrored"
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", old_manifest(run_id))
    writer.append_many(leaky_items(run_id, range(3)))
    segment = segment_path(run_dir, 1)
    deadline = time.monotonic() + MARK_PATIENCE
    while durable_mark(segment) != writer.durable_bytes and time.monotonic() < deadline:
        time.sleep(0.005)
    first = mirror_once(run_dir.parent, url)
    assert first.returncode == 0, first.stdout + first.stderr
    stored = f"growing/spool/{segment.name}"
    first_copy = get_object(url, stored)
    assert first_copy is not None and get_object(url, f"{stored}.live") is not None
    synced = sync_from_store(server.base_url, tmp_path / "sync-machine", url, "--json")
    assert [(r["state"], r["pushed_now"]) for r in reports(synced)] == [("live", 3)], synced.stdout + synced.stderr
    writer.append_many(leaky_items(run_id, range(3, 7)))
    writer.seal("completed")
    again = mirror_once(run_dir.parent, url)
    assert again.returncode == 0, again.stdout + again.stderr
    grown = get_object(url, stored)
    assert grown is not None and len(grown) > len(first_copy) and grown.startswith(first_copy)
    assert not [k for k in keys(url) if k.endswith(".live")]
    synced = sync_from_store(server.base_url, tmp_path / "sync-machine", url, "--json")
    assert [(r["state"], r["pushed_now"]) for r in reports(synced)] == [("synced", 4)], synced.stdout + synced.stderr
    assert_exactly_once(api, episodes_of(run_dir))
    assert not [secret for secret in LEAKED.values() if secret.encode() in all_bytes_under(tmp_path / "bucket")]


def test_an_older_mirrors_copy_a_sync_has_read_is_left_and_the_line_says_how_to_clear_it(tmp_path: Path, server,
                                                                                         api) -> None:
    """A segment an older package mirrored byte for byte (masked by the rules of its day,
    version 6: a plural ``access_tokens`` in clear text) and a sync of the store has read
    there: replacing it with the masked copy would leave that sync's place in it lost (the
    run reported ``lost``, exit 1, though all of it was pushed). The mirror leaves it and its
    line says to delete the run's copy and mirror again; done, the store holds the masked
    copy and a sync of it pushes nothing twice."""
    secret = "tok-V6-ACCESS-TOKEN-7777"
    run_dir = tmp_path / "node" / "outputs" / "v6run"
    manifest = {**old_manifest("v6-mirrored"), "config": {"model": "m", "env_args": {"access_tokens": [secret]}},
                "masking_version": 6}
    manifest.pop("config_source")
    writer = SegmentWriter.create(run_dir, "v6-mirrored")
    writer.append("manifest", manifest)
    items = leaky_items("v6-mirrored", range(3))
    for _, episode, _ in items:
        episode["traces"][0]["agent"]["config"] = {"model": "m", "env_args": {"access_tokens": [secret]}}
    writer.append_many(items)
    writer.seal("completed")
    writer.close()
    bucket = tmp_path / "bucket" / "outputs"
    url = f"file://{bucket}"
    (bucket / "v6run" / "spool").mkdir(parents=True)
    segment = segment_path(run_dir, 1)
    (bucket / "v6run" / "spool" / segment.name).write_bytes(segment.read_bytes())  # as the older mirror left it
    synced = sync_from_store(server.base_url, tmp_path / "sync-machine", url, "--json")
    assert [(r["state"], r["pushed_now"]) for r in reports(synced)] == [("synced", 3)], synced.stdout + synced.stderr
    refused = mirror_once(run_dir.parent, url)
    assert refused.returncode == 1 and "Traceback" not in refused.stdout + refused.stderr
    [line] = map(json.loads, refused.stdout.splitlines())
    assert line["uploaded"] == [] and "older mirror" in line["error"] and f"delete {url}/v6run" in line["error"], line
    assert (bucket / "v6run" / "spool" / segment.name).read_bytes() == segment.read_bytes()
    shutil.rmtree(bucket / "v6run")  # as the line says
    again = mirror_once(run_dir.parent, url)
    assert again.returncode == 0 and json.loads(again.stdout)["masked_again"] == [segment.name], again.stdout
    assert secret.encode() not in all_bytes_under(tmp_path / "bucket")
    synced = sync_from_store(server.base_url, tmp_path / "sync-machine", url, "--json")
    assert synced.returncode == 0 and [r["pushed_now"] for r in reports(synced)] == [0], synced.stdout + synced.stderr
    assert_exactly_once(api, episodes_of(run_dir))
