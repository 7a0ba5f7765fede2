"""A sync of a grown segment in an object store reads what is new, not the segment again;
and a dead writer's padding never reaches the store.

Counted at the store (moto's S3 server on loopback, every byte a ranged GET returned): a
live run is mirrored (``store/mirror.py``) and synced twice while it grows, and the second
sync reads at most 1.1 x the bytes the segment grew by, plus 256 KiB of look-back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prime_runs_spool.content.remask import copy_masking

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import load_settings
from prime_runs_spool.store.mirror import MirrorMemory, mirror_pass
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import remote_destination
from prime_runs_spool.sync.store_sync import sync_store
from support import moto_server
from support.runs import RunBuilder
from support.sync_e2e import TOKEN, api, assert_exactly_once, server  # noqa: F401

moto = moto_server.module_fixture()

#: The goal: bytes read <= SLACK x new bytes + LOOK_BACK.
SLACK, LOOK_BACK = 1.1, 256 * 1024


def _sync(base_url: str, url: str, home: Path, store: ObjectStore) -> list:
    env = {"PRIME_API_KEY": TOKEN, "XDG_CACHE_HOME": str(home / "cache")}
    with moto_server.environment(env):
        settings = load_settings(base_url=base_url, env=env)
        options = SyncOptions(request_lifetime=1.0, backoff=Backoff(base=0.05, cap=0.2, max_attempts=10))
        with PlatformClient(settings, timeout=5) as client:
            return sync_store(url, client, remote_destination(settings.base_url, None), options, store=store)


def _object_size(store: ObjectStore, suffix: str) -> int:
    return next(info.size for info in store.list() if info.key.endswith(suffix))


@pytest.mark.slow
def test_a_grown_live_segment_is_read_from_its_cursor(tmp_path: Path, server, api, moto) -> None:
    url = f"s3://{moto.new_bucket()}/outputs"
    with moto_server.environment(moto.env()):
        builder = RunBuilder(tmp_path / "node" / "run", "reads-new")
        builder.open_segment()
        builder.add(150, size=2_000)
        mirror_pass([tmp_path / "node"], ObjectStore(url), masking=copy_masking)
        size_before = _object_size(ObjectStore(url), "seg-000001.jsonl")
        first = _sync(server.base_url, url, tmp_path / "m", ObjectStore(url))
        assert [r.pushed_now for r in first] == [150]
        builder.add(80, size=2_000)
        mirror_pass([tmp_path / "node"], ObjectStore(url), masking=copy_masking)
        size_after = _object_size(ObjectStore(url), "seg-000001.jsonl")
        store = ObjectStore(url)
        second = _sync(server.base_url, url, tmp_path / "m", store)
        assert [r.pushed_now for r in second] == [80]
        assert store.stats["bytes_read"] <= SLACK * (size_after - size_before) + LOOK_BACK, dict(store.stats)
        # Read as live (the mirror's marker), not ended as crashed each time it grew.
        assert [r.state for r in first + second] == ["live", "live"]
        builder.seal()
        mirror_pass([tmp_path / "node"], ObjectStore(url), masking=copy_masking)  # sealed: its last bytes, no marker
        assert not any(info.key.endswith(".live") for info in ObjectStore(url).list())
        third = _sync(server.base_url, url, tmp_path / "m", ObjectStore(url))
        assert [(r.state, r.pushed_now) for r in third] == [("synced", 0)]
    assert_exactly_once(api, builder)
    assert size_after - size_before > 80 * 1_000


@pytest.mark.slow
def test_a_killed_writers_padding_is_not_uploaded(tmp_path: Path, moto) -> None:
    run_dir = tmp_path / "node" / "run"
    writer = subprocess.Popen([sys.executable, str(Path(__file__).parent / "support" / "crash_writer.py"),
                               str(run_dir), "1"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert writer.stdout is not None
        for _ in range(200):  # 200 appends it reported durable
            assert writer.stdout.readline()
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    segment = run_dir / "spool" / "seg-000001.jsonl"
    on_disk = segment.read_bytes()
    assert on_disk.endswith(b"\0" * 1024)  # the writer's padding, left by the kill
    url = f"s3://{moto.new_bucket()}/outputs"
    with moto_server.environment(moto.env()):
        store = ObjectStore(url)
        [report] = mirror_pass([tmp_path / "node"], store, masking=copy_masking)
        assert report.error is None and report.bytes_sent == len(on_disk.rstrip(b"\0"))
        [info] = [i for i in store.list() if i.key.endswith("seg-000001.jsonl")]
        assert store.read_range(info.key, 0, info.size, info.etag) == on_disk.rstrip(b"\0")
        assert mirror_pass([tmp_path / "node"], store, masking=copy_masking)[0].uploaded == []  # once


@pytest.mark.slow
def test_a_second_machine_mirroring_into_the_same_prefix_is_refused_not_overwriting(tmp_path: Path) -> None:
    """Run folders are named alike on every machine: a mirror whose ``run-000`` lands where
    another machine's ``run-000`` already is says so and uploads nothing there."""
    from support.runs import build_run

    url = f"file://{tmp_path / 'bucket'}"
    first = build_run(tmp_path / "a" / "run-000", "machine-a-run", 4)
    second = build_run(tmp_path / "b" / "run-000", "machine-b-run", 6)
    [mine] = mirror_pass([tmp_path / "a"], ObjectStore(url), masking=copy_masking)
    assert mine.error is None and mine.uploaded == ["seg-000001.jsonl"]
    stored = (tmp_path / "bucket" / "run-000" / "spool" / "seg-000001.jsonl")
    before = stored.read_bytes()
    [theirs] = mirror_pass([tmp_path / "b"], ObjectStore(url), masking=copy_masking)
    assert theirs.uploaded == [] and "holds another run's segment" in str(theirs.error), theirs
    assert stored.read_bytes() == before == (first.run_dir / "spool" / "seg-000001.jsonl").read_bytes()
    assert second.count == 6
    # The machine that owns it goes on uploading it as it changes.
    memory = MirrorMemory()
    assert mirror_pass([tmp_path / "a"], ObjectStore(url), memory, masking=copy_masking)[0].error is None
