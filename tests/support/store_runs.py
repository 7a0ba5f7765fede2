"""Runs in a store, and the steps every store test takes with them: spools put into a
bucket (as ``aws s3 cp -r`` or a CI artifact step would), ``mirror``, ``sync`` and
``verify`` over the store's URL, and the checks that each episode arrived once.

Every helper takes the store's URL and ``store_env``, the settings that point the store
library at the server (``moto.env()``, ``azurite.env()``; none for ``file://``), so one
sequence is written once and run against every kind of store.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.content.remask import copy_masking
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import load_settings
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.layout import list_segments, segment_path
from prime_runs_spool.store.mirror import MirrorMemory, mirror_pass
from prime_runs_spool.store.object_info import ObjectInfo
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import remote_destination
from prime_runs_spool.sync.store_sync import sync_store
from support.children import all_succeed
from support.env import CLI, child_env
from support.runs import RunBuilder, build_run
from support.sync_e2e import TOKEN, assert_exactly_once, sync_cmd

#: How long the writer may take to publish its durable mark (it does within MARK_INTERVAL).
MARK_PATIENCE = 5.0


def raw_store(url: str):  # noqa: ANN201  (obstore's store type)
    from obstore.store import from_url

    return from_url(url)


def upload_run(url: str, run_dir: Path, relative: str) -> None:
    """Copy every segment of ``run_dir`` to ``<url>/<relative>/spool/`` (plain PUTs)."""
    import obstore

    store = raw_store(url)
    for _, path in list_segments(run_dir):
        obstore.put(store, f"{relative}/spool/{path.name}", path.read_bytes())


def stored_run(url: str, run_dir: Path, run_id: str, episodes: int, relative: str | None = None) -> RunBuilder:
    """A sealed run of ``episodes`` built at ``run_dir``, then put into the store ``url``
    under ``relative`` (its folder's name unless given)."""
    builder = build_run(run_dir, run_id, episodes)
    upload_run(url, builder.run_dir, run_dir.name if relative is None else relative)
    return builder


def put_object(url: str, key: str, data: bytes) -> None:
    import obstore

    obstore.put(raw_store(url), key, data)


def get_object(url: str, key: str) -> bytes | None:
    import obstore

    try:
        return bytes(obstore.get(raw_store(url), key).bytes())
    except FileNotFoundError:
        return None


def keys(url: str) -> list[str]:
    return [info.key for info in ObjectStore(url).list()]


def machine_env(home: Path, store_env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of one syncing machine: the platform's token, its own home and cache
    under ``home`` (so two "machines" share nothing but the store), the store's settings."""
    return child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / "cache"),
                     **(store_env or {}), **extra)


def sync_from_store(base_url: str, home: Path, *args: str, store_env: dict[str, str] | None = None,
                    timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    """``prime-runs sync *args`` run to its end by the machine whose home is ``home``."""
    return subprocess.run(sync_cmd(base_url, *args), capture_output=True, text=True, timeout=timeout,
                          env=machine_env(home, store_env, **extra))


def start_sync_from_store(base_url: str, home: Path, *args: str, store_env: dict[str, str] | None = None,
                          **extra: str) -> subprocess.Popen[str]:
    """``prime-runs sync *args`` started (not waited for) by the machine whose home is ``home``."""
    return subprocess.Popen(sync_cmd(base_url, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=machine_env(home, store_env, **extra))


def reports(result: subprocess.CompletedProcess[str]) -> list[dict]:
    """The run reports of a ``sync --json`` (its stderr shown if it printed none)."""
    assert result.stdout, result.stderr
    return json.loads(result.stdout)["runs"]


def mirror_once(outputs: Path, url: str, store_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``prime-runs mirror --once --json OUTPUTS URL``."""
    return subprocess.run(CLI + ["mirror", "--once", "--json", str(outputs), url], capture_output=True, text=True,
                          timeout=60, env=child_env(**(store_env or {})))


def live_run(run_dir: Path, run_id: str, episodes: int) -> tuple[RunBuilder, Path]:
    """A run whose writer is still open, ``episodes`` in its first segment, returned once the
    writer has published that all of them are durable (what ``mirror`` copies up to)."""
    builder = RunBuilder(run_dir, run_id)
    builder.open_segment()
    builder.add(episodes)
    segment = segment_path(builder.run_dir, 1)
    deadline = time.monotonic() + MARK_PATIENCE
    while durable_mark(segment) != builder.writer.durable_bytes and time.monotonic() < deadline:
        time.sleep(0.005)
    assert durable_mark(segment) == builder.writer.durable_bytes
    return builder, segment


def check_live_then_sealed(base_url: str, api: httpx.Client, url: str, home: Path, outputs: Path,
                           builder: RunBuilder, segment: Path, more: int,
                           store_env: dict[str, str] | None = None) -> None:
    """The second half of a mirrored live run's life, ``outputs/eval-1`` mirrored once into
    ``url``: a sync finds it ``live`` (the mirror's marker beside the segment) and pushes what
    it holds; the writer adds ``more`` and seals; a mirror copies the whole segment and
    leaves no writer file behind; a sync ships the rest. Each episode is on the platform once."""
    stored = f"eval-1/spool/{segment.name}"
    before = len(builder.ids)
    synced = sync_from_store(base_url, home, url, "--json", store_env=store_env)
    assert [(r["state"], r["pushed_now"]) for r in reports(synced)] == [("live", before)]
    assert get_object(url, f"{stored}.live") is not None
    builder.add(more)
    builder.seal()
    again = mirror_once(outputs, url, store_env)
    assert again.returncode == 0, again.stderr
    assert get_object(url, stored) == segment.read_bytes()
    assert not [k for k in keys(url) if k.endswith((".lock", ".durable", ".live"))]  # the writer is gone
    synced = sync_from_store(base_url, home, url, "--json", store_env=store_env)
    assert [(r["state"], r["pushed_now"]) for r in reports(synced)] == [("synced", more)]
    assert_exactly_once(api, builder)


def check_synced_once_then_up_to_date(tmp_path: Path, base_url: str, api: httpx.Client, url: str, name: str,
                                      episodes: int, machines: tuple[str, ...],
                                      store_env: dict[str, str] | None = None) -> list[RunBuilder]:
    """Two runs put into the store under ``node-N/run-N``: the first of ``machines`` syncs
    them (small requests), each next one (the same machine, or another with no cached state)
    finds them up to date; each episode is on the platform once and each lease is released."""
    builders = [stored_run(url, tmp_path / f"run-{n}", f"{name}-{n}", episodes, f"node-{n}/run-{n}")
                for n in range(2)]
    first, *later = machines
    synced = sync_from_store(base_url, tmp_path / first, url, "--json", "--max-request-bytes", "20000",
                             store_env=store_env)
    assert synced.returncode == 0, synced.stderr
    assert sorted((r["state"], r["pushed_now"]) for r in reports(synced)) == [("synced", episodes)] * 2
    assert reports(synced)[0]["path"] == f"{url}/node-0/run-0"
    for machine in later:
        again = sync_from_store(base_url, tmp_path / machine, url, "--json", store_env=store_env)
        assert again.returncode == 0, again.stderr
        assert [(r["state"], r["pushed_now"]) for r in reports(again)] == [("up_to_date", 0)] * 2, again.stderr
    for builder in builders:
        assert_exactly_once(api, builder)
    for n in range(2):
        lease = json.loads(ObjectStore(url).read(f"node-{n}/run-{n}/spool/sync.lease.json")[0])
        assert lease["released"] is True and lease["generation"] >= 1
    return builders


def check_two_syncers_push_each_episode_once(tmp_path: Path, base_url: str, api: httpx.Client, url: str,
                                             name: str, store_env: dict[str, str] | None = None,
                                             runs: int = 3) -> None:
    """``runs`` runs in the store, two machines syncing them at once (``--wait``, two jobs
    each, small requests): for every run one of them pushed all of it, the other found it done."""
    builders = [stored_run(url, tmp_path / f"run-{n}", f"{name}-{n}", 8) for n in range(runs)]
    outs = all_succeed([start_sync_from_store(base_url, tmp_path / f"m{n}", url, "--json", "--wait", "--jobs", "2",
                                              "--max-request-bytes", "8000", store_env=store_env) for n in range(2)])
    reported = [json.loads(out)["runs"] for out, _ in outs]
    for n in range(runs):
        assert sorted(r[n]["pushed_now"] for r in reported) == [0, 8], reported
    for builder in builders:
        assert_exactly_once(api, builder)


def check_verify_gives_the_local_verdict(tmp_path: Path, url: str, name: str,
                                         store_env: dict[str, str] | None = None) -> None:
    """``prime-runs verify URL`` over a good run and one with a flipped bit, both put into the
    store: the same verdict, exit code and corrupt offsets as ``verify`` of the local copy,
    and the error names the object by its URL."""
    good = build_run(tmp_path / "good", f"{name}-good", 4)
    bad = build_run(tmp_path / "bad", f"{name}-bad", 4)
    segment = next((bad.run_dir / "spool").glob("seg-*.jsonl"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    upload_run(url, good.run_dir, "good")
    upload_run(url, bad.run_dir, "bad")
    env = child_env(**(store_env or {}))
    local = subprocess.run(CLI + ["verify", str(tmp_path / "bad"), "--json"], capture_output=True, text=True, env=env)
    remote = subprocess.run(CLI + ["verify", url, "--json"], capture_output=True, text=True, env=env)
    assert remote.returncode == local.returncode == 1, remote.stderr
    runs = {Path(r["run_dir"]).name: r for r in json.loads(remote.stdout)["runs"]}
    assert runs["good"]["ok"] and runs["good"]["status"] == "completed"
    [expected] = json.loads(local.stdout)["runs"]
    assert runs["bad"]["status"] == expected["status"] == "corrupt"
    assert [s["corrupt_offset"] for s in runs["bad"]["segments"]] == [s["corrupt_offset"] for s in expected["segments"]]
    assert runs["bad"]["error"].startswith(f"{url}/bad/spool/seg-000001.jsonl: corrupt at byte")


class ListedBefore(ObjectStore):
    """The store as a syncer sees it whose listing of the whole prefix was taken earlier
    (``listing``); every other request, a listing of one run's folder included, is today's."""

    def __init__(self, url: str, listing: list[ObjectInfo]) -> None:
        super().__init__(url)
        self._listing = listing

    def list(self, under: str = "") -> list[ObjectInfo]:
        return list(self._listing) if not under else super().list(under)


class Fleet:
    """One run's eval machine (its spool, its mirror into a ``file://`` bucket) and the
    machines syncing the bucket, each with its own cache (``home``)."""

    def __init__(self, tmp_path: Path, base_url: str, monkeypatch: pytest.MonkeyPatch,
                 state_dir: Path | None = None) -> None:
        (tmp_path / "bucket").mkdir()
        self.url, self.outputs, self.tmp_path = f"file://{tmp_path}/bucket", tmp_path / "outputs", tmp_path
        self.base_url, self.monkeypatch, self.state_dir = base_url, monkeypatch, state_dir
        self.memory = MirrorMemory()

    def mirror(self) -> None:
        [report] = mirror_pass([self.outputs], ObjectStore(self.url), self.memory, masking=copy_masking)
        assert report.error is None, report.error

    def crashed_run(self, run_id: str, home: str, episodes: int = 3):  # noqa: ANN201
        """A run (``outputs/eval-1``) whose writer died after ``episodes`` episodes, mirrored
        whole and synced once from ``home``: the run and that sync's report. A store test of
        a resumed run begins here, then :meth:`resume`."""
        builder = RunBuilder(self.outputs / "eval-1", run_id)
        builder.open_segment()
        builder.add(episodes)
        builder.abandon()  # crashed: its mirror uploads all of it
        self.mirror()
        return builder, self.sync(home)

    def resume(self, builder: RunBuilder, episodes: int) -> None:
        """The run resumed: its next segment, live, with ``episodes`` more, mirrored."""
        builder.open_segment(counted=True)
        builder.add(episodes)
        self.mirror()

    def listing(self) -> list[ObjectInfo]:
        return ObjectStore(self.url).list()

    def sync(self, home: str, listed: list[ObjectInfo] | None = None):  # noqa: ANN201
        env = {"PRIME_API_KEY": TOKEN}
        self.monkeypatch.setenv("XDG_CACHE_HOME", str(self.tmp_path / home / "cache"))
        settings = load_settings(base_url=self.base_url, env=env)
        options = SyncOptions(request_lifetime=1.0, backoff=Backoff(base=0.05, cap=0.2, max_attempts=10))
        store = ObjectStore(self.url) if listed is None else ListedBefore(self.url, listed)
        with PlatformClient(settings, timeout=5) as client:
            [report] = sync_store(self.url, client, remote_destination(settings.base_url, None), options,
                                  store=store, state_dir=self.state_dir)
        return report
