"""``az://`` tested as ``s3://`` is: against Azurite, Azure's blob API on loopback.

First the conditional writes the lease and the state rely on (create-only, replace only if
unchanged, ranged reads refused once the object was replaced), through the same library
calls the code makes; then ``mirror``, ``sync`` (twice, and two syncers at once), ``status``
and ``verify`` over an ``az://`` URL, as real commands against the real local platform.
Azurite is installed by tests/setup.sh (npm, into ``.cache/azurite``); without it these
tests are skipped and say so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.errors import StoreConflict
from prime_runs_spool.store.objects import ObjectStore
from support import azurite_server
from support.env import CLI, child_env
from support.runs import build_run
from support.store_runs import check_two_syncers_push_each_episode_once, live_run, mirror_once, start_sync_from_store
from support.sync_e2e import api, assert_exactly_once, server  # noqa: F401

azurite = azurite_server.module_fixture()


@pytest.fixture
def container_url(azurite: azurite_server.AzuriteServer) -> str:
    return f"az://{azurite.new_container()}/outputs"


@pytest.mark.slow
def test_create_only_and_replace_if_unchanged_are_refused_as_relied_on(container_url: str) -> None:
    store = ObjectStore(container_url)
    first = store.create("lease.json", b"v1")
    with pytest.raises(StoreConflict):
        store.create("lease.json", b"other")
    second = store.replace("lease.json", b"v2", first)
    with pytest.raises(StoreConflict):
        store.replace("lease.json", b"v3", first)  # a stale etag
    assert store.read("lease.json") == (b"v2", second)
    assert store.create("lease.json", b"v2") == second  # a refused write holding our bytes is ours
    # The listing's etag is the one writes and reads give (Azure lists it without quotes).
    assert [(info.key, info.etag) for info in store.list()] == [("lease.json", second)]


@pytest.mark.slow
def test_a_ranged_read_is_refused_once_the_object_was_replaced(container_url: str) -> None:
    store = ObjectStore(container_url)
    etag = store.create("seg", b"0123456789")
    [listed] = store.list()
    assert store.read_range("seg", 2, 5, listed.etag) == b"234"
    store.replace("seg", b"abcdefghij", etag)
    with pytest.raises(StoreConflict):
        store.read_range("seg", 2, 5, listed.etag)


def _sync(base_url: str, azurite: azurite_server.AzuriteServer, home: Path, *args: str) -> subprocess.Popen[str]:
    return start_sync_from_store(base_url, home, *args, store_env=azurite.env())


def _runs(proc: subprocess.Popen[str]) -> list[dict]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)["runs"]


@pytest.mark.slow
def test_mirror_then_sync_status_and_verify_over_az(tmp_path: Path, server, api, azurite, container_url: str) -> None:
    outputs = tmp_path / "outputs"
    live, _ = live_run(outputs / "eval-live", "az-live", 5)
    done = build_run(outputs / "eval-done", "az-done", 7)
    env = child_env(**azurite.env())
    assert mirror_once(outputs, container_url, azurite.env()).returncode == 0
    first = _runs(_sync(server.base_url, azurite, tmp_path / "m1", container_url, "--json"))
    assert sorted((r["state"], r["pushed_now"]) for r in first) == [("live", 5), ("synced", 7)]
    live.add(3)
    live.seal()
    assert mirror_once(outputs, container_url, azurite.env()).returncode == 0
    # Another machine (its own cache) finds the state in the container: only what is new.
    second = _runs(_sync(server.base_url, azurite, tmp_path / "m2", container_url, "--json"))
    assert sorted((r["state"], r["pushed_now"]) for r in second) == [("synced", 3), ("up_to_date", 0)]
    for builder in (live, done):
        assert_exactly_once(api, builder)
    status = subprocess.run([*CLI, "status", container_url, "--json"], capture_output=True, text=True, env=env)
    assert status.returncode == 0, status.stderr
    pushed = sorted(run["destinations"][0]["samples_pushed"] for run in json.loads(status.stdout)["runs"])
    assert pushed == [7, 8]
    verify = subprocess.run([*CLI, "verify", container_url, "--json"], capture_output=True, text=True, env=env)
    assert verify.returncode == 0, verify.stderr
    assert sorted(r["status"] for r in json.loads(verify.stdout)["runs"]) == ["completed", "completed"]


@pytest.mark.slow
def test_two_syncers_on_one_container_push_each_episode_once(tmp_path: Path, server, api, azurite,
                                                             container_url: str) -> None:
    check_two_syncers_push_each_episode_once(tmp_path, server.base_url, api, container_url, "az-pair", azurite.env())


@pytest.mark.slow
def test_sync_of_a_folder_under_the_container_and_of_one_run_url(tmp_path: Path, server, api, azurite) -> None:
    """``az://`` URLs naming a folder below the container (two levels), the folder above
    it, and one run's own URL (the one a mirrored folder's note names): each finds the runs
    under it and no others, and a run is pushed once whichever URL it was synced through."""
    container = azurite.new_container()
    base = f"az://{container}/team/outputs"
    outputs = tmp_path / "outputs"
    builders = [build_run(outputs / name, f"az-folder-{name}", 3) for name in ("eval-1", "eval-10")]
    assert mirror_once(outputs, base, azurite.env()).returncode == 0
    one = _runs(_sync(server.base_url, azurite, tmp_path / "m1", f"{base}/eval-1", "--json"))
    assert [(r["path"], r["state"], r["pushed_now"]) for r in one] == [(f"{base}/eval-1", "synced", 3)]
    above = _runs(_sync(server.base_url, azurite, tmp_path / "m2", f"az://{container}/team", "--json"))
    assert sorted((r["path"], r["state"]) for r in above) == [
        (f"az://{container}/team/outputs/eval-1", "up_to_date"), (f"az://{container}/team/outputs/eval-10", "synced")]
    again = _runs(_sync(server.base_url, azurite, tmp_path / "m1", f"{base}/", "--json"))
    assert sorted(r["state"] for r in again) == ["up_to_date", "up_to_date"]
    for builder in builders:
        assert_exactly_once(api, builder)
