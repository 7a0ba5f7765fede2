"""``file://`` stores: the conditional writes the lease and the state rely on, made real on a
local folder (store/local_files.py), and ``sync``, ``status``, ``verify`` and ``mirror`` over
``file://`` end to end, as tests/test_sync_store.py runs them over moto's S3."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from prime_runs_spool.content.remask import copy_masking

from prime_runs_spool.errors import StoreConflict, StoreError
from prime_runs_spool.store.mirror import mirror_note_path, mirrored_to
from prime_runs_spool.store.objects import ObjectStore

from support.children import all_succeed
from support.env import CLI, child_env
from support.runs import build_run
from support.store_runs import (check_live_then_sealed, check_synced_once_then_up_to_date,
                                check_two_syncers_push_each_episode_once, check_verify_gives_the_local_verdict,
                                live_run, mirror_once)
from support.sync_e2e import TOKEN, api, server  # noqa: F401  (fixtures)
from support.cli import run_cli


@pytest.fixture
def folder_url(tmp_path: Path) -> str:
    (tmp_path / "bucket" / "outputs").mkdir(parents=True)  # the library's local store writes under it
    return f"file://{tmp_path}/bucket/outputs"


def test_create_only_is_refused_when_the_file_exists(folder_url: str) -> None:
    store = ObjectStore(folder_url)
    store.create("run/spool/sync.lease.json", b"first")
    with pytest.raises(StoreConflict):
        store.create("run/spool/sync.lease.json", b"second")
    assert store.read("run/spool/sync.lease.json")[0] == b"first"


def test_replace_is_refused_once_the_file_changed(folder_url: str) -> None:
    store = ObjectStore(folder_url)
    first = store.create("state.json", b"v1")
    second = store.replace("state.json", b"v2", first)
    assert second != first
    with pytest.raises(StoreConflict):
        store.replace("state.json", b"v3", first)  # a stale etag
    assert store.read("state.json") == (b"v2", second)
    assert [(o.key, o.etag) for o in store.list()] == [("state.json", second)]  # the listing agrees
    store.replace("state.json", b"v3", second)
    assert store.read("state.json")[0] == b"v3"


def test_a_same_size_rewrite_in_the_same_instant_gets_a_new_etag(folder_url: str) -> None:
    """Inode numbers are reused and the kernel's file times are coarse: without a time of
    our own an old etag could come back, and a stale replace would then succeed."""
    store = ObjectStore(folder_url)
    etag = store.create("lease.json", b"gen-0")
    seen = {etag}
    for n in range(1, 200):
        etag = store.replace("lease.json", f"gen-{n % 10}".encode(), etag)
        assert etag not in seen
        seen.add(etag)


def test_ranged_reads_are_refused_for_a_replaced_file(folder_url: str) -> None:
    store = ObjectStore(folder_url)
    etag = store.create("seg", b"0123456789")
    assert store.read_range("seg", 2, 5, etag) == b"234"
    store.replace("seg", b"abcdefghij", etag)
    with pytest.raises(StoreConflict):
        store.read_range("seg", 2, 5, etag)


INCREMENTS = textwrap.dedent("""
    import sys
    from prime_runs_spool.errors import StoreConflict
    from prime_runs_spool.store.objects import ObjectStore

    store, wins, refused = ObjectStore(sys.argv[1]), 0, 0
    while wins < int(sys.argv[2]):
        data, etag = store.read("counter")
        try:
            store.replace("counter", str(int(data) + 1).encode(), etag)
            wins += 1
        except StoreConflict:
            refused += 1
    print(refused)
""")


def test_processes_racing_to_replace_lose_no_update(folder_url: str) -> None:
    """Four processes each add 1 to a counter 60 times by read-then-replace: every add that
    was accepted is in the final count, so no two replaces succeeded from one version."""
    ObjectStore(folder_url).create("counter", b"0")
    procs = [subprocess.Popen([sys.executable, "-c", INCREMENTS, folder_url, "60"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env()) for _ in range(4)]
    outs = all_succeed(procs)
    assert ObjectStore(folder_url).read("counter")[0] == b"240"
    assert sum(int(out) for out, _ in outs) > 0, "the processes never raced: the test proved nothing"
    assert [o.key for o in ObjectStore(folder_url).list()] == ["counter"]  # no temporary file left


@pytest.mark.slow
def test_sync_from_a_folder_url_twice_pushes_each_episode_once(tmp_path: Path, server, api,
                                                               folder_url: str) -> None:
    check_synced_once_then_up_to_date(tmp_path, server.base_url, api, folder_url, "file-twice", 9,
                                      ("m1", "m2"))  # the second, another machine
    status = subprocess.run(CLI + ["status", folder_url, "--json"], capture_output=True, text=True,
                            env=child_env())
    assert status.returncode == 0, status.stderr
    for run in json.loads(status.stdout)["runs"]:
        [dest] = run["destinations"]
        assert (dest["samples_pushed"], dest["pending"], dest["finalized"]) == (9, 0, True)


@pytest.mark.slow
def test_two_syncers_on_one_folder_url_push_each_episode_once(tmp_path: Path, server, api, folder_url: str) -> None:
    check_two_syncers_push_each_episode_once(tmp_path, server.base_url, api, folder_url, "file-pair")


def test_verify_over_a_folder_url_gives_the_local_verdict(tmp_path: Path, folder_url: str) -> None:
    check_verify_gives_the_local_verdict(tmp_path, folder_url, "file-verify")


@pytest.mark.slow
def test_mirror_into_a_folder_url_then_sync_ships_the_run_once(tmp_path: Path, server, api, folder_url: str) -> None:
    outputs = tmp_path / "outputs"
    builder, segment = live_run(outputs / "eval-1", "file-mirror", 5)
    first = mirror_once(outputs, folder_url)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["url"] == f"{folder_url}/eval-1"
    check_live_then_sealed(server.base_url, api, folder_url, tmp_path / "m", outputs, builder, segment, 4)
    stored = Path(folder_url.removeprefix("file://")) / "eval-1" / "spool" / segment.name
    assert oct(stored.stat().st_mode & 0o777) == "0o600"


@pytest.mark.slow
def test_status_and_verify_over_a_folder_url_holding_a_live_run_say_it_is_live(tmp_path: Path,
                                                                              folder_url: str) -> None:
    """A run mirrored while its eval still writes (the deployment's shape, docs/deploy.md):
    both ended in 'internal error: AttributeError' (a store's segment asked for its lock file)."""
    outputs = tmp_path / "outputs"
    builder, _ = live_run(outputs / "eval-1", "file-live-status", 3)
    assert mirror_once(outputs, folder_url).returncode == 0
    status = run_cli("status", folder_url, "--json")
    verify = run_cli("verify", folder_url, "--json")
    builder.seal()
    assert status.returncode == 0, status.stderr
    [run] = json.loads(status.stdout)["runs"]
    assert (run["state"], run["episodes"]) == ("live", 3)
    assert verify.returncode == 0, verify.stderr
    [run] = json.loads(verify.stdout)["runs"]
    assert run["status"] == "live" and run["ok"], run


def test_gs_and_az_urls_open_the_library_store_behind_the_same_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """No emulator for ``gs://`` runs here (docs/cli.md): what can be shown is that such a URL
    is opened by the store library, behind the same ObjectStore calls sync makes on S3 (only
    ``file://`` is served by the local folder code)."""
    from obstore.store import AzureStore, GCSStore, S3Store

    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")  # Azure names its account
    for url, kind in (("gs://bucket/outputs", GCSStore), ("az://container/outputs", AzureStore),
                      ("s3://bucket/outputs", S3Store)):
        store = ObjectStore(url)
        assert isinstance(store._store, kind) and store._local is None
    assert ObjectStore("file:///tmp/outputs")._local is not None


def test_a_fifo_put_where_an_object_was_listed_is_an_error_not_a_hang(folder_url: str, tmp_path: Path) -> None:
    import os
    import threading

    from prime_runs_spool.errors import StoreError

    store = ObjectStore(folder_url)
    etag = store.create("run/spool/seg-000001.jsonl", b"0123456789")
    path = tmp_path / "bucket" / "outputs" / "run" / "spool" / "seg-000001.jsonl"
    path.unlink()
    os.mkfifo(path)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            store.read_range("run/spool/seg-000001.jsonl", 0, 5, etag)
        except BaseException as exc:  # noqa: BLE001 (the test inspects it)
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # let the blocked open return, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError("a read of a FIFO blocked")
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError)
    with pytest.raises(StoreError):  # nor is it read as a small object (a state, a lease)
        store.read("run/spool/seg-000001.jsonl")


@pytest.mark.slow
def test_a_file_url_sync_ships_the_run_once_with_its_lease_and_state_in_the_folder(tmp_path: Path) -> None:
    """obstore's local file store has no If-Match replace: every run's sync failed on its
    lease ("PutMode::Update not yet implemented"). A file:// folder is now served by
    store/local_files.py, whose replace is real: the run is synced, its lease and state
    land beside its spool, and a second sync finds it up to date."""
    import json
    import shutil

    from prime_runs_spool.spool.layout import list_segments

    builder = build_run(tmp_path / "src" / "r", "file-url", 2)
    (tmp_path / "bucket" / "r" / "spool").mkdir(parents=True)
    for _, path in list_segments(builder.run_dir):
        shutil.copy(path, tmp_path / "bucket" / "r" / "spool" / path.name)
    for expected in ("synced", "up_to_date"):
        result = run_cli("sync", "--local", "--db", str(tmp_path / "local.db"), f"file://{tmp_path / 'bucket'}",
                      "--json", timeout=60, XDG_CACHE_HOME=str(tmp_path / "cache"))
        assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
        assert [r["state"] for r in json.loads(result.stdout)["runs"]] == [expected]
    lease = json.loads((tmp_path / "bucket" / "r" / "spool" / "sync.lease.json").read_text())
    assert lease["released"] is True
    assert [p.name for p in (tmp_path / "bucket" / "r" / "spool" / "sync").glob("*.json")]
    assert run_cli("verify", f"file://{tmp_path / 'bucket'}").returncode == 0  # reading works there


@pytest.mark.slow
def test_a_run_another_syncer_did_costs_this_machine_no_fsync(tmp_path: Path, server, folder_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A syncer meets every run the others did (one read of its state each) and keeps a copy
    of that state in its cache. The cache's folders were made durably, three fsyncs a run,
    on the disk the platform's database shares: with two syncers, every run paid them twice.
    Counted: a sync over runs another machine synced makes no fsync at all."""
    import os

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import load_settings
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import remote_destination
    from prime_runs_spool.sync.store_sync import sync_store
    from support.store_runs import reports, sync_from_store, upload_run

    for n in range(3):
        upload_run(folder_url, build_run(tmp_path / f"run-{n}", f"cached-{n}", 2).run_dir, f"run-{n}")
    first = sync_from_store(server.base_url, tmp_path / "m1", folder_url, "--json")
    assert first.returncode == 0, first.stderr
    assert [r["state"] for r in reports(first)] == ["synced"] * 3
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "m2" / "cache"))  # another machine: nothing cached
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    env = {"PRIME_API_KEY": TOKEN}
    settings = load_settings(base_url=server.base_url, env=env)
    with PlatformClient(settings, timeout=5) as client:
        again = sync_store(folder_url, client, remote_destination(settings.base_url, None), SyncOptions(), jobs=1)
    assert [r.state for r in again] == ["up_to_date"] * 3
    assert fsyncs == []
    assert list((tmp_path / "m2" / "cache").rglob("*.json.etag")), "no state was cached: the test proved nothing"


def test_mirror_fsyncs_a_dead_writers_segment_before_uploading_it(tmp_path: Path, folder_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed writer's last lines can be in the page cache only: uploaded as they are, a
    power cut on the node would take back lines a sync of the store already shipped. So the
    mirror makes a dead writer's segment durable first, as a shipping reader does
    (docs/spool-format.md, section 5); a live writer's is uploaded only up to its mark."""
    from prime_runs_spool.spool.layout import segment_path
    from prime_runs_spool.store.mirror import mirror_pass
    from support.disk import fsynced_files
    from support.runs import RunBuilder

    synced = fsynced_files(monkeypatch)
    builder = RunBuilder(tmp_path / "node" / "run", "mirror-dead-writer")
    builder.open_segment()
    builder.add(3)
    segment = segment_path(builder.run_dir, 1)
    identity = (segment.stat().st_dev, segment.stat().st_ino)
    mirror_pass([tmp_path / "node"], ObjectStore(folder_url), masking=copy_masking)
    assert identity not in synced  # live: only what its mark says is durable went up
    builder.add(2)
    builder.abandon()  # the writer is gone, its last lines in the file
    (report,) = mirror_pass([tmp_path / "node"], ObjectStore(folder_url), masking=copy_masking)
    assert report.uploaded and synced.count(identity) == 1, (report, synced)


def test_mirror_names_eval_outputs_it_cannot_copy_and_copies_the_spools(tmp_path: Path, folder_url: str) -> None:
    """Plain vf-eval's outputs have no spool, and the mirror copies spools only: their
    episodes never reached the store, and the mirror said nothing (exit 0)."""
    import shutil

    from support.env import REPO_ROOT

    outputs = tmp_path / "outputs"
    live_run(outputs / "eval-1", "file-mirror-plain", 2)
    shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", outputs / "plain", symlinks=True)
    done = mirror_once(outputs, folder_url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"prime-runs: {outputs / 'plain'}: eval outputs without a spool are not mirrored; spool them first "
            f"(prime-runs import {outputs / 'plain'})") in done.stderr, done.stderr
    assert json.loads(done.stdout)["url"] == f"{folder_url}/eval-1"  # the spool went all the same
    assert not (Path(folder_url.removeprefix("file://")) / "plain").exists()


def test_eval_outputs_with_no_episode_yet_leave_nothing_out_of_the_mirror(tmp_path: Path, folder_url: str) -> None:
    """A vf-eval that has just begun (or ended before its first rollout) leaves an empty
    ``traces.jsonl``: no episode to lose. ``mirror --once`` exited 1 over it, telling to
    import it first, an import that finds nothing to import."""
    outputs = tmp_path / "outputs"
    live_run(outputs / "eval-1", "file-mirror-empty-outputs", 2)
    (outputs / "starting" / "configs").mkdir(parents=True)
    (outputs / "starting" / "traces.jsonl").write_bytes(b"")
    done = mirror_once(outputs, folder_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["url"] == f"{folder_url}/eval-1"


def test_a_run_folder_renamed_after_its_first_upload_is_not_mirrored_a_second_time(tmp_path: Path,
                                                                                  folder_url: str) -> None:
    """The note (spool/mirror.json) names the run's copy, whose lease a sync of the folder
    takes. Renamed (or copied) and mirrored again, the run went up under its new name as well:
    two copies of one run in the store, one a sync of the store could push while a sync of
    the folder pushed the other under the first one's lease."""
    outputs = tmp_path / "outputs"
    builder, _ = live_run(outputs / "eval-1", "file-mirror-renamed", 2)
    first = mirror_once(outputs, folder_url)
    assert first.returncode == 0, first.stderr
    builder.seal()
    (outputs / "eval-1").rename(outputs / "eval-1-final")
    again = mirror_once(outputs, folder_url)
    assert again.returncode == 1, again.stdout + again.stderr
    report = json.loads(again.stdout)
    assert report["url"] == f"{folder_url}/eval-1-final"
    assert report["error"].startswith(f"this run was first mirrored to {folder_url}/eval-1 ("), report
    assert not (Path(folder_url.removeprefix("file://")) / "eval-1-final").exists()



@pytest.mark.slow
def test_a_mirror_that_keeps_running_says_a_refused_run_once_not_every_pass(tmp_path: Path, folder_url: str) -> None:
    """The refusal (its folder renamed after its first upload) was printed again at every
    pass, every --interval (5 s by default) for as long as the mirror ran, and each kept in
    a list that grew as long."""
    import signal
    import time

    outputs = tmp_path / "outputs"
    build_run(outputs / "eval-1", "file-mirror-refused-once", 2)
    assert mirror_once(outputs, folder_url).returncode == 0
    (outputs / "eval-1").rename(outputs / "eval-1-final")
    proc = subprocess.Popen(CLI + ["mirror", str(outputs), folder_url, "--interval", "0.05"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    time.sleep(2.0)  # dozens of passes
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert [line.split()[0] for line in out.splitlines()] == ["error"], out
    assert "this run was first mirrored to" in out


_NOTE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
_NOTE_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False)
                            | _NOTE_TEXT | _NOTE_TEXT.map(lambda tail: f"s3://{tail}"),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NOTE_TEXT, inner, max_size=3),
                            max_leaves=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(note=st.one_of(st.binary(max_size=48),
                      st.builds(lambda value: orjson.dumps({"run_url": value}) + b"\n", _NOTE_VALUES),
                      st.builds(lambda value: orjson.dumps(value), _NOTE_VALUES),
                      _NOTE_TEXT.map(lambda tail: orjson.dumps({"run_url": f"file:///{tail}"}))))
def test_a_mirror_note_is_read_as_its_store_url_or_refused_in_one_line(tmp_path: Path, note: bytes) -> None:
    """Whatever spool/mirror.json holds, reading it gives the URL it names (a str with a
    scheme) or a StoreError saying to mirror again or delete it: never another exception,
    which would stop the sync of every run, nor a URL the note does not name."""
    run_dir = tmp_path / "run"
    mirror_note_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    mirror_note_path(run_dir).write_bytes(note)
    try:
        named = orjson.loads(note)["run_url"]
    except (ValueError, KeyError, TypeError):
        named = None
    expected = named if isinstance(named, str) and "://" in named else None
    if expected is None:
        with pytest.raises(StoreError) as refused:
            mirrored_to(run_dir)
        assert "\n" not in str(refused.value) and "run prime-runs mirror again" in str(refused.value)
    else:
        assert mirrored_to(run_dir) == expected
    mirror_note_path(run_dir).unlink()
    assert mirrored_to(run_dir) is None

def _without_obstore(tmp_path: Path) -> str:
    """A PYTHONPATH entry under which ``import obstore`` fails as it does where the `s3`
    extra was never installed (the package is on this machine, so it is shadowed)."""
    shadow = tmp_path / "no-obstore"
    shadow.mkdir()
    (shadow / "obstore.py").write_text("raise ModuleNotFoundError(\"No module named 'obstore'\", name='obstore')\n")
    return str(shadow)


@pytest.mark.slow
def test_a_file_url_needs_no_obstore_and_an_s3_url_says_how_to_get_it(tmp_path: Path) -> None:
    """A file:// folder is served by store/local_files.py, so a clone installed without the
    `s3` extra mirrors, lists, verifies and syncs there; listing and reading imported the
    library first, and every command over file:// ended in 'internal error:
    ModuleNotFoundError: obstore' (exit 1). An s3:// URL still says what to install (exit 2)."""
    import os

    from support.env import REPO_ROOT

    hidden = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), _without_obstore(tmp_path)]),
              "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert "ModuleNotFoundError" in subprocess.run([sys.executable, "-c", "import obstore"], capture_output=True,
                                                   text=True, env=child_env(**hidden)).stderr
    build_run(tmp_path / "outputs" / "r", "no-obstore", 3)
    url = f"file://{tmp_path / 'bucket'}"
    steps = [("mirror", "--once", str(tmp_path / "outputs"), url), ("status", url), ("verify", url),
             ("sync", "--local", "--db", str(tmp_path / "local.db"), "--json", url)]
    for args in steps:
        result = run_cli(*args, timeout=60, **hidden)
        assert result.returncode == 0, (args, result.returncode, result.stderr)
        assert "internal error" not in result.stderr
    assert [r["state"] for r in json.loads(result.stdout)["runs"]] == ["synced"]
    s3 = run_cli("status", "s3://bucket/outputs", **hidden)
    assert s3.returncode == 2 and s3.stderr.strip().splitlines()[-1].endswith("pip install -e '.[s3]' does the same)")


@pytest.mark.slow
def test_a_store_url_with_no_run_under_it_fails_sync_and_status_as_an_empty_folder_does(tmp_path: Path,
                                                                                       folder_url: str) -> None:
    """A CI job syncing a prefix its machines never mirrored into must fail, as one syncing an
    empty folder does (and as verify and export of the same URL did): sync and status said
    'no runs found' and exited 0, and ignored --allow-empty."""
    from support.cli import last_line

    sync = ["sync", "--local", "--db", str(tmp_path / "local.db")]
    for args in ([*sync, "--json", folder_url], ["status", folder_url]):
        empty = run_cli(*args, XDG_CACHE_HOME=str(tmp_path / "cache"))
        assert empty.returncode == 1, (args, empty.stdout, empty.stderr)
        assert last_line(empty) == f"prime-runs: {folder_url}: nothing found: neither a spool nor eval outputs " \
                                   "(traces.jsonl, or metadata.json + results.jsonl) under it"
        assert run_cli(*args, "--allow-empty", XDG_CACHE_HOME=str(tmp_path / "cache")).returncode == 0
    report = json.loads(run_cli(*sync, "--json", folder_url, XDG_CACHE_HOME=str(tmp_path / "cache")).stdout)
    assert (report["ok"], report["paths_without_runs"]) == (False, [folder_url])
