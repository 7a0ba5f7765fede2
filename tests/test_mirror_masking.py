"""``prime-runs mirror`` of a spool written under older masking rules uploads a copy masked
again by today's rules, never the spool's own bytes (docs/masking.md, "Spools written under
older rules"; store/mirror.py).

Masking happens at append, so such a spool holds in clear text what today's rules mask.
The store must never hold those: every byte of it is searched for each credential. The
copy must be a spool in its own right (``prime-runs verify`` of the store's URL accepts
it), say today's masking version, and leave the local spool byte for byte as it was.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.content.mask_locations import MASK, MASKING_VERSION
from prime_runs_spool.spool.format import parse_line
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.spool.writer import SegmentWriter
from support import azurite_server, moto_server
from support.env import CLI, child_env
from support.files import all_bytes_under
from support.store_runs import get_object, keys, mirror_once, raw_store
from test_remask_e2e import SECRETS as OLD_SPOOL_SECRETS, old_manifest, write_old_spool

moto = moto_server.module_fixture()
azurite = azurite_server.module_fixture()
SECRET = "sk-OLD-MIRRORED-KEY-4242"
FIXTURE_OUTPUTS = Path(__file__).resolve().parent.parent / "fixtures" / "outputs"
#: What fixtures/outputs/gsm8k-clean-source's launch file says in a comment: a comment never
#: travels (docs/masking.md, "config_source"), so its copy in the store must not hold it.
FIXTURE_COMMENT = b"no credential table is set"
#: Every credential the old spools below hold in clear text.
ALL_SECRETS = [SECRET, *OLD_SPOOL_SECRETS]


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


def old_outputs(outputs: Path) -> list[str]:
    """Old spools under ``outputs`` (the names of those written under older rules): two of
    ``_old_run``, one holding a credential at every location sync masks again, and every
    example run committed in fixtures/outputs (masking version 0: one with a comment in its
    launch file, one with a torn tail, one resumed into a second segment); and one of today."""
    _old_run(outputs / "before-versions", None)
    _old_run(outputs / "version-4", 4)
    write_old_spool(outputs / "leaky", "old-leaky")
    for fixture in FIXTURE_OUTPUTS.iterdir():
        shutil.copytree(fixture, outputs / fixture.name)
    with open_run(outputs / "today", name="today", config={"client": {"api_key": SECRET}}) as run:
        run.log_episodes([make_episode(0, run_id="today")])
        run.finish()
    return sorted(path.name for path in outputs.iterdir() if path.name != "today")


def store_bytes(url: str, store_env: dict[str, str] | None) -> dict[str, bytes]:
    """Every object in the store, by key, read whole (the test's runs are small)."""
    import obstore

    store = raw_store(url)
    return {meta["path"]: bytes(obstore.get(store, meta["path"]).bytes())
            for batch in obstore.list(store) for meta in batch}


@pytest.mark.slow
def test_mirror_uploads_an_old_spool_masked_again_and_leaves_the_local_one(tmp_path: Path, moto) -> None:
    outputs = tmp_path / "outputs"
    old = old_outputs(outputs)
    before = {path: path.read_bytes() for path in outputs.rglob("seg-*.jsonl")}
    assert all(secret.encode() in all_bytes_under(outputs) for secret in ALL_SECRETS)  # they do hold them
    assert FIXTURE_COMMENT in all_bytes_under(outputs)
    bucket = moto.new_bucket()
    (tmp_path / "folder" / "outputs").mkdir(parents=True)
    for url, env in ((f"s3://{bucket}/outputs", moto.env()), (f"file://{tmp_path}/folder/outputs", None)):
        result = mirror_once(outputs, url, env)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = {Path(line["path"]).name: line for line in map(json.loads, result.stdout.splitlines())}
        assert lines["today"]["error"] is None and lines["today"]["masked_again"] == []
        for name in old:
            segments = [path.name for _, path in list_segments(outputs / name)]
            assert lines[name]["error"] is None and lines[name]["uploaded"] == lines[name]["masked_again"] == segments
        assert not any(secret in result.stdout + result.stderr for secret in ALL_SECRETS)
        stored = store_bytes(f"s3://{bucket}", env) if env else \
            {str(p.relative_to(tmp_path / "folder")): p.read_bytes() for p in (tmp_path / "folder").rglob("*")
             if p.is_file()}
        assert stored and all(secret.encode() not in data for data in stored.values() for secret in ALL_SECRETS)
        assert all(FIXTURE_COMMENT not in data for data in stored.values())
        if env is None:  # every byte of the store's folder, whatever its file
            assert not any(secret.encode() in all_bytes_under(tmp_path / "folder") for secret in ALL_SECRETS)
        for key, data in stored.items():  # every copy says today's version
            manifest = parse_line(data.split(b"\n")[1] + b"\n")
            assert manifest is not None and manifest.data["masking_version"] == MASKING_VERSION, key
        verified = subprocess.run(CLI + ["verify", url, "--json"], capture_output=True, text=True, timeout=60,
                                  env=child_env(**(env or {})))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        statuses = {Path(r["run_dir"]).name: r["status"] for r in json.loads(verified.stdout)["runs"]}
        assert statuses["gsm8k-resumed"] == "completed" and statuses["gsm8k-crashed-torn"] == "crashed", statuses
        again = mirror_once(outputs, url, env)  # up to date: nothing uploaded again
        assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr
    assert {path: path.read_bytes() for path in outputs.rglob("seg-*.jsonl")} == before


@pytest.mark.slow
def test_mirror_into_azure_uploads_an_old_spool_masked_again(tmp_path: Path, azurite) -> None:
    outputs = tmp_path / "outputs"
    _old_run(outputs / "version-3", 3)
    url = f"az://{azurite.new_container()}/outputs"
    result = mirror_once(outputs, url, azurite.env())
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = map(json.loads, result.stdout.splitlines())
    assert line["masked_again"] == ["seg-000001.jsonl"], line
    assert keys(url) == ["version-3/spool/seg-000001.jsonl"]
    stored = get_object(url, "version-3/spool/seg-000001.jsonl")
    assert stored is not None and SECRET.encode() not in stored and b'"api_key":"***"' in stored


@pytest.mark.slow
def test_an_older_mirrors_byte_copy_of_equal_length_is_replaced(tmp_path: Path) -> None:
    """A segment an older package mirrored as it was (its rules were that day's) stays in the
    store; today's mirror must replace it even when the copy it makes is exactly as long
    (the version gains digits, 9 to 10, and a ``Headers`` value version 9 left in clear, as
    many characters longer than ``***``, is masked)."""
    left_in_clear = "a" * (len(MASK) + len(str(MASKING_VERSION)) - 1)
    outputs = tmp_path / "outputs"
    run_dir = outputs / "version-9"
    manifest = {**old_manifest("version-9"), "config": {"model": "m", "Headers": left_in_clear}, "masking_version": 9}
    manifest.pop("config_source")
    writer = SegmentWriter.create(run_dir, "version-9")
    writer.append("manifest", manifest)
    episode = make_episode(0, run_id="version-9")
    for trace in episode["traces"]:
        trace["agent"]["config"] = {"model": "m"}  # nothing today's rules mask
    writer.append_many([("episode", episode, {"episode_id": "e0", "rollout_number": 0})])
    writer.seal("completed")
    [(_, segment)] = list_segments(run_dir)
    store = tmp_path / "folder" / "version-9" / "spool"
    store.mkdir(parents=True)
    (store / segment.name).write_bytes(segment.read_bytes())  # as the older mirror left it
    result = mirror_once(outputs, f"file://{tmp_path}/folder")
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = map(json.loads, result.stdout.splitlines())
    assert line["masked_again"] == [segment.name], line
    copied = (store / segment.name).read_bytes()
    assert len(copied) == len(segment.read_bytes()) and f'"masking_version":{MASKING_VERSION}'.encode() in copied


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


@pytest.mark.slow
def test_mirror_refuses_an_old_segment_damaged_after_its_manifest_in_one_line(tmp_path: Path) -> None:
    """Damage in an old segment: what the damaged line holds cannot be masked, so the
    segment is not copied; one line names the byte and what to do, no traceback."""
    outputs = tmp_path / "outputs"
    _old_run(outputs / "old", None)
    segment = outputs / "old" / "spool" / "seg-000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"id"', b'"iD"', 1)  # the episode's checksum no longer holds
    segment.write_bytes(b"\n".join(lines))
    (tmp_path / "folder").mkdir()
    result = subprocess.run(CLI + ["mirror", "--once", str(outputs), f"file://{tmp_path}/folder"],
                            capture_output=True, text=True, timeout=60, env=child_env())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("error ") and "corrupt at byte" in line and "prime-runs verify" in line, line
    assert SECRET.encode() not in all_bytes_under(tmp_path / "folder")
