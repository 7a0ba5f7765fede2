"""``prime-runs mirror`` never puts a spool written under older masking rules into a store.

Masking happens at append, so such a spool holds in clear text what today's rules mask
(docs/masking.md, "Spools written under older rules"). Sync masks it again on its way to
the platform; the mirror copies bytes, so it must not copy those.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.spool.writer import SegmentWriter
from support import azurite_server, moto_server
from support.files import all_bytes_under
from support.store_runs import keys, mirror_once
from test_remask_e2e import old_manifest

moto = moto_server.module_fixture()
azurite = azurite_server.module_fixture()
SECRET = "sk-OLD-MIRRORED-KEY-4242"


def _old_run(run_dir: Path, version: int | None) -> None:
    """A sealed run as an older package wrote it: a client's api_key and a seat's
    environment table in clear text."""
    manifest = {**old_manifest(run_dir.name), "config": {"model": "m", "client": {"api_key": SECRET}}}
    manifest.pop("config_source")
    if version is not None:
        manifest["masking_version"] = version
    writer = SegmentWriter.create(run_dir, run_dir.name)
    writer.append("manifest", manifest)
    episode = make_episode(0, run_id=run_dir.name)
    episode["traces"][0]["agent"]["config"]["sandbox"] = {"env": {"HF_TOKEN": SECRET}}
    writer.append_many([("episode", episode, {"episode_id": episode["id"], "rollout_number": 0})])
    writer.seal("completed")


@pytest.mark.slow
def test_mirror_refuses_a_spool_of_older_masking_and_copies_todays(tmp_path: Path, moto) -> None:
    outputs = tmp_path / "outputs"
    _old_run(outputs / "before-versions", None)
    _old_run(outputs / "version-4", 4)
    with open_run(outputs / "today", name="today", config={"client": {"api_key": SECRET}}) as run:
        run.log_episodes([make_episode(0, run_id="today")])
        run.finish()
    bucket = moto.new_bucket()
    for url, env in ((f"s3://{bucket}/outputs", moto.env()), (f"file://{tmp_path}/folder/outputs", None)):
        if env is None:
            (tmp_path / "folder" / "outputs").mkdir(parents=True)
        result = mirror_once(outputs, url, env)
        assert result.returncode == 1, result.stdout + result.stderr
        lines = {Path(line["path"]).name: line for line in map(json.loads, result.stdout.splitlines())}
        assert lines["today"]["error"] is None and lines["today"]["uploaded"] == ["seg-000001.jsonl"]
        for name in ("before-versions", "version-4"):
            assert lines[name]["uploaded"] == [] and "masking" in lines[name]["error"], lines[name]
        assert SECRET not in result.stdout + result.stderr
        stored = keys(url) if env is None else None
        if env is None:
            assert SECRET.encode() not in all_bytes_under(tmp_path / "folder")
            assert stored == ["today/spool/seg-000001.jsonl"], stored
    import obstore
    from support.store_runs import raw_store

    store = raw_store(f"s3://{bucket}")
    for batch in obstore.list(store):
        for meta in batch:
            assert SECRET.encode() not in bytes(obstore.get(store, meta["path"]).bytes()), meta["path"]


@pytest.mark.slow
def test_mirror_into_azure_refuses_a_spool_of_older_masking(tmp_path: Path, azurite) -> None:
    from support.store_runs import get_object

    outputs = tmp_path / "outputs"
    _old_run(outputs / "version-3", 3)
    url = f"az://{azurite.new_container()}/outputs"
    result = mirror_once(outputs, url, azurite.env())
    assert result.returncode == 1, result.stdout + result.stderr
    [line] = map(json.loads, result.stdout.splitlines())
    assert line["uploaded"] == [] and "masking rules version 3" in line["error"], line
    assert keys(url) == [] and get_object(url, "version-3/spool/seg-000001.jsonl") is None


@pytest.mark.slow
def test_mirror_refuses_a_segment_whose_manifest_is_damaged(tmp_path: Path) -> None:
    """A damaged manifest hides the version its episodes were masked under: not copied."""
    outputs = tmp_path / "outputs"
    _old_run(outputs / "old", None)
    segment = outputs / "old" / "spool" / "seg-000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"model"', b'"modeL"', 1)  # its checksum no longer holds
    segment.write_bytes(b"\n".join(lines))
    (tmp_path / "folder").mkdir()
    result = mirror_once(outputs, f"file://{tmp_path}/folder")
    assert result.returncode == 1, result.stdout + result.stderr
    [line] = map(json.loads, result.stdout.splitlines())
    assert line["uploaded"] == [] and "no intact manifest" in line["error"], line
    assert SECRET.encode() not in all_bytes_under(tmp_path / "folder")
