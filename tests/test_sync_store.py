"""``prime-runs sync s3://bucket/prefix`` end to end: the real command, the real local
platform process, and a real S3 API (moto's server mode) on loopback."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import load_settings
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import remote_destination
from prime_runs_spool.sync.store_sync import sync_store

from support import moto_server
from support.env import CLI, child_env
from support.runs import RunBuilder, build_run
from support.store_runs import (check_live_then_sealed, check_synced_once_then_up_to_date,
                                check_two_syncers_push_each_episode_once, check_verify_gives_the_local_verdict,
                                get_object, keys, live_run, machine_env, mirror_once, reports, stored_run,
                                sync_from_store, upload_run)
from support.sync_e2e import TOKEN, api, assert_exactly_once, evaluations_of, server, sync_cmd  # noqa: F401
from support.children import interrupted, reaped
from support.cli import last_line, run_cli


moto = moto_server.module_fixture()


@pytest.fixture
def bucket_url(moto: moto_server.MotoServer) -> str:
    return f"s3://{moto.new_bucket()}/outputs"


def store_sync(base_url: str, moto: moto_server.MotoServer, home: Path, *args: str,
               endpoint: str | None = None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``prime-runs sync`` with this machine's cache under ``home`` (each "machine" its own)."""
    return sync_from_store(base_url, home, *args, store_env=moto.env(endpoint), timeout=timeout, **env)


@pytest.mark.slow
def test_sync_from_the_bucket_twice_pushes_each_episode_once(tmp_path: Path, server, api, moto,
                                                               bucket_url: str) -> None:
    # Again on this machine, then on another (no cache) that finds the state in the bucket.
    check_synced_once_then_up_to_date(tmp_path, server.base_url, api, bucket_url, "store-twice", 12,
                                      ("m1", "m1", "m2"), moto.env())


def in_process_sync(base_url: str, url: str, home: Path, store: ObjectStore, **kwargs: object) -> list:
    """The library's sync_store in this process (so the test can count the store's requests)."""
    env = {"PRIME_API_KEY": TOKEN, "XDG_CACHE_HOME": str(home / "cache")}
    with moto_server.environment(env):
        settings = load_settings(base_url=base_url, env=env)
        options = SyncOptions(request_lifetime=1.0, backoff=Backoff(base=0.05, cap=0.2, max_attempts=10))
        with PlatformClient(settings, timeout=5) as client:
            return sync_store(url, client, remote_destination(settings.base_url, None), options,
                              store=store, **kwargs)


@pytest.mark.slow
def test_a_noop_resync_costs_one_listing_and_no_download(tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    builders = [build_run(tmp_path / f"run-{n}", f"store-noop-{n}", 5) for n in range(3)]
    for n, builder in enumerate(builders):
        upload_run(bucket_url, builder.run_dir, f"run-{n}")
    first = in_process_sync(server.base_url, bucket_url, tmp_path / "m", ObjectStore(bucket_url))
    assert [r.state for r in first] == ["synced"] * 3
    store = ObjectStore(bucket_url)
    again = in_process_sync(server.base_url, bucket_url, tmp_path / "m", store)
    assert [(r.state, r.pushed_now) for r in again] == [("up_to_date", 0)] * 3
    assert dict(store.stats) == {"list": 1}  # no GET, no PUT: not a segment, not a state


@pytest.mark.slow
def test_a_segment_reuploaded_after_it_grew_pushes_only_the_new_episodes(tmp_path: Path, server, api, moto,
                                                                        bucket_url: str) -> None:
    builder = RunBuilder(tmp_path / "run", "store-grows")
    builder.open_segment()
    builder.add(10)
    upload_run(bucket_url, builder.run_dir, "run")
    first = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json")
    assert [(r["state"], r["pushed_now"]) for r in reports(first)] == [("crashed", 10)]  # no seal yet
    builder.add(7)
    builder.seal()
    upload_run(bucket_url, builder.run_dir, "run")  # the whole segment again, grown
    second = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json")
    assert [(r["state"], r["pushed_now"], r["pushed_total"]) for r in reports(second)] == [("synced", 7, 17)]
    assert_exactly_once(api, builder)


def _store_run(url: str, relative: str, tmp: Path):
    from prime_runs_spool.store.source import find_store_runs

    store = ObjectStore(url)
    return next(r for r in find_store_runs(store, store.list(), tmp) if r.relative == relative)


def _verdicts(spool) -> list[dict]:
    import dataclasses

    # Every stretch of damage but the first may differ: a store's copy has no durable mark,
    # so the local file's check against its mark (docs/spool-format.md, 4.1, check 5) adds one.
    return [{**{f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in ("path", "damage_count")},
             "damage": s.damage[:1]} for s in spool.segments]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flip", "torn", "torn_complete_line"])
def test_corrupt_and_torn_objects_get_the_verdicts_of_local_files(tmp_path: Path, server, api, moto,
                                                                   bucket_url: str, damage: str) -> None:
    from prime_runs_spool.spool.layout import durable_mark_path_of, segment_path
    from prime_runs_spool.spool.scan import read_run

    builder = build_run(tmp_path / "run", f"store-{damage}", 9, status=None)
    segment = segment_path(builder.run_dir, 1)
    data = bytearray(segment.read_bytes())
    lines = data.splitlines(keepends=True)
    middle = sum(len(line) for line in lines[:5])  # the start of the 4th episode's line
    if damage == "flip":
        data[middle + 30] ^= 0x01  # a damaged line with intact lines after it: corruption
    elif damage == "torn":
        data = data[: middle + 30]  # the last line cut short: a torn tail
        # A real torn tail is never below the writer's durable mark (it was never synced);
        # cutting durable bytes is truncation, which the local reader would call corrupt.
        durable_mark_path_of(segment).unlink()
    else:
        # A complete last line that fails its check: corruption too (docs/spool-format.md,
        # section 4: an interrupted append never leaves a line feed behind).
        data = data[:middle] + data[middle:middle + len(lines[5]) - 1] .replace(b"e", b"E", 1) + b"\n"
    segment.write_bytes(bytes(data))
    upload_run(bucket_url, builder.run_dir, "run")
    local, remote = read_run(builder.run_dir), read_run(_store_run(bucket_url, "run", tmp_path / "c"))
    assert _verdicts(remote) == _verdicts(local)
    assert remote.status == local.status == ("torn" if damage == "torn" else "corrupt")
    result = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json")
    [report] = reports(result)
    if damage != "torn":
        assert report["state"] == "corrupt" and result.returncode == 1
        assert f"{bucket_url}/run/spool/seg-000001.jsonl: corrupt at byte {middle}" in report["error"]
    else:
        assert report["state"] == "crashed"
    assert report["pushed_now"] == 3  # everything before the damage, nothing after


@pytest.mark.slow
def test_two_syncers_on_two_machines_started_together_push_each_episode_once(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    check_two_syncers_push_each_episode_once(tmp_path, server.base_url, api, bucket_url, "store-pair", moto.env(),
                                             runs=4)


@pytest.mark.slow
def test_a_syncer_paused_past_its_lease_stops_when_another_took_over(tmp_path: Path, server, api, moto,
                                                                    bucket_url: str) -> None:
    builder = build_run(tmp_path / "run", "store-paused", 100)  # about 50 requests: time to pause it
    upload_run(bucket_url, builder.run_dir, "run")
    env = {"PRIME_RUNS_LEASE_TTL": "1.5", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}
    args = (bucket_url, "--json", "--max-request-bytes", "5000")
    first = subprocess.Popen(sync_cmd(server.base_url, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=machine_env(tmp_path / "a", moto.env(), **env))
    # paused mid-sync, lease and all
    _stopped_while_another_takes_over(first, lambda: _pushed(api, builder.run_id), server, moto, tmp_path, args, env,
                                      taken=(1, 99))
    assert_exactly_once(api, builder)
    lease = json.loads(get_object(bucket_url, "run/spool/sync.lease.json"))
    assert lease["generation"] == 2


#: ``prime-runs sync`` that, once its $PAUSE_NTH request of the kind $PAUSE_AT (the state's
#: ``in_flight.kind``: create, samples, finalize) is announced (the lease renewed), touches
#: $PAUSING and waits a second before the gate its body passes (``Protocol._in_time``, where its
#: age is checked) and before any byte of it goes out (a small request's head leaves with its
#: body, after the gate): the test stops it there (SIGSTOP), between the announcement and the
#: send. With $HELD "suspended" the pause is a suspend of the whole machine, as CLOCK_MONOTONIC
#: sees one: it does not count the time the machine was asleep (clock_gettime(2)), while the
#: wall clock, which every fence of the request counts in, does (sync/protocol.py's clock is the
#: real one but for that: its monotonic reading leaves out the time the process was stopped).
_HOLDING = """
import os, runpy, sys, time
from pathlib import Path
from prime_runs_spool.sync import protocol


class SuspendAware:
    asleep = 0.0

    def monotonic(self):
        return time.monotonic() - self.asleep

    def __getattr__(self, name):
        return getattr(time, name)


clock, suspended = SuspendAware(), os.environ["HELD"] == "suspended"
if suspended:
    protocol.time = clock
real, seen = protocol.Protocol._in_time, []

def _in_time(self, durable, sent_at, started):
    gate, kind = real(self, durable, sent_at, started), self.state.in_flight.kind

    def paused_first():
        if kind == os.environ["PAUSE_AT"]:
            seen.append(1)
            if len(seen) == int(os.environ["PAUSE_NTH"]):
                before = time.time()
                Path(os.environ["PAUSING"]).touch()
                time.sleep(1.0)
                if suspended:
                    clock.asleep += time.time() - before  # the machine was asleep all along
        gate()
    return paused_first

protocol.Protocol._in_time = _in_time
sys.argv = ["prime-runs", *sys.argv[1:]]
runpy.run_module("commands", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("held", ["paused", "suspended"])
def test_a_syncer_held_between_announcing_and_sending_past_its_lease_never_sends_that_request(
        held: str, tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """The same handover, the pause where it hurt: after the announcement, before the send,
    by a SIGSTOP or by a suspend of the whole machine (which Linux's monotonic clock does not
    count). Woken after the taker had fenced that request, found it not landed and pushed
    its rows, it sent the request, and the platform (counting from arrival) committed it:
    those rows twice. Now its last byte goes out only within half a lifetime of its
    announced send time, counted on the wall clock too (sync/protocol.py,
    ``Protocol._in_time``): announced afresh instead, which renews the lease, and the
    syncer finds itself taken over."""
    from support.sync_e2e import sample_ids

    builder = build_run(tmp_path / "run", f"store-{held}-send", 20)
    _held_while_another_takes_over(held, "samples", 3, builder, tmp_path, server, moto, bucket_url, taken=(1, 19))
    (evaluation,) = evaluations_of(api, builder.run_id)
    rows = sample_ids(api, evaluation["evaluation_id"])
    twice = sorted({i for i in rows if rows.count(i) > 1})
    assert not twice and sorted(rows) == sorted(builder.ids), f"{len(rows)} rows for 20 episodes, twice: {twice}"
    assert_exactly_once(api, builder)


@pytest.mark.slow
@pytest.mark.parametrize("request_kind", ["create", "finalize"])
def test_a_syncer_held_before_creating_or_finalizing_past_its_lease_never_sends_that_request(
        request_kind: str, tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """The same handover, the syncer SIGSTOPped after announcing the evaluation's creation
    (or its finalize) and before sending it. Woken after the taker had fenced that request,
    found it not landed and sent it itself, it sent it too, and the platform acted on it:
    a second evaluation carrying the run's id, empty and never finalized (or a second
    finalize, which runs the platform's statistics job again: ``finalize_count`` 2).
    Now those bodies pass the samples requests' gate (sync/protocol.py,
    ``Protocol._in_time``): announced afresh, which renews the lease, and the syncer
    finds itself taken over."""
    builder = build_run(tmp_path / "run", f"store-held-{request_kind}", 6)
    taken = (6, 6) if request_kind == "create" else (0, 0)
    _held_while_another_takes_over("paused", request_kind, 1, builder, tmp_path, server, moto, bucket_url, taken=taken)
    assert_exactly_once(api, builder)  # one evaluation, each row once, finalized once


def _held_while_another_takes_over(held: str, kind: str, nth: int, builder: RunBuilder, tmp_path: Path, server,
                                   moto, bucket_url: str, *, taken: tuple[int, int]) -> None:
    """Sync ``builder``'s run from the bucket with a first syncer held (``held``: paused or
    suspended) after announcing its ``nth`` request of ``kind`` (create, samples, finalize),
    before the gate its body passes and any byte of it goes out, while a second syncer takes the run over and pushes ``taken`` rows (the
    least, the most)."""
    import sys

    upload_run(bucket_url, builder.run_dir, "run")
    pausing, wrapper = tmp_path / "pausing", tmp_path / f"{held}_sync.py"
    wrapper.write_text(_HOLDING)
    env = {"PRIME_RUNS_LEASE_TTL": "1.5", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}
    args = (bucket_url, "--json", "--max-request-bytes", "5000")
    command = sync_cmd(server.base_url, *args)
    first = subprocess.Popen([sys.executable, str(wrapper), *command[len(CLI):]], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=machine_env(tmp_path / "a", moto.env(), PAUSING=str(pausing), PAUSE_AT=kind, HELD=held,
                                             PAUSE_NTH=str(nth), **env))
    _stopped_while_another_takes_over(first, pausing.exists, server, moto, tmp_path, args, env, taken=taken)


def _stopped_while_another_takes_over(first: subprocess.Popen, ready, server, moto, tmp_path: Path,
                                      args: tuple, env: dict, *, taken: tuple[int, int]) -> None:
    """Stop ``first`` (SIGSTOP) once ``ready()``, sync the run to its end from a second
    machine (``--wait``: past the first's lease), pushing ``taken`` rows (the least, the
    most), wake ``first``: it must end in an error saying it was taken over."""
    import signal

    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.01)
        first.send_signal(signal.SIGSTOP)
        second = store_sync(server.base_url, moto, tmp_path / "b", *args, "--wait", **env)
        assert second.returncode == 0, second.stderr
        [report] = reports(second)
        assert report["state"] == "synced" and taken[0] <= report["pushed_now"] <= taken[1], report
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=60)
    [stopped] = json.loads(out)["runs"]
    assert first.returncode == 1 and stopped["state"] == "error" and "taken over" in stopped["error"], (out, err)


def _pushed(api, local_run_id: str) -> int:
    from support.sync_e2e import evaluations_of

    found = evaluations_of(api, local_run_id)
    return found[0]["total_samples"] if found else 0


@pytest.mark.slow
def test_store_errors_and_dropped_connections_lose_nothing_and_duplicate_nothing(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """A fault proxy in front of the S3 API: 5xx, 429, resets before the request, and
    answers lost *after* the store applied a write (a conditional PUT retried then meets its
    own write). Sync is run until it says done; every episode is on the platform once."""
    from fixtures.fault_proxy import FaultProxy, spread

    builders = [build_run(tmp_path / f"run-{n}", f"store-faults-{n}", 10) for n in range(3)]
    for n, builder in enumerate(builders):
        upload_run(bucket_url, builder.run_dir, f"run-{n}")
    kinds = ("status_500", "status_503", "rate_limit", "reset_before", "drop_after", "reset_after")
    with FaultProxy(moto.endpoint, seed=17, rates=spread(0.25, kinds), retry_after=0) as proxy:
        for attempt in range(6):
            result = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json",
                                "--max-request-bytes", "8000", "--wait", endpoint=proxy.base_url,
                                PRIME_RUNS_STORE_RETRIES="4", PRIME_RUNS_LEASE_TTL="2",
                                PRIME_RUNS_LEASE_CLOCK_SKEW="0")
            # A lease whose release was lost to a fault is waited out (--wait): it expires.
            if result.returncode == 0 and {r["state"] for r in reports(result)} <= {"synced", "up_to_date"}:
                break
        assert result.returncode == 0, result.stdout + result.stderr
        faults = proxy.faults()
    assert {"drop_after", "reset_after"} & set(faults), faults  # writes that landed unanswered
    for builder in builders:
        assert_exactly_once(api, builder)


@pytest.mark.slow
def test_verify_over_a_store_url_gives_the_local_verdict(tmp_path: Path, moto, bucket_url: str) -> None:
    check_verify_gives_the_local_verdict(tmp_path, bucket_url, "store-verify", moto.env())


@pytest.mark.slow
def test_status_over_a_store_url_shows_the_states_in_the_store(tmp_path: Path, server, api, moto,
                                                                 bucket_url: str) -> None:
    from support.env import CLI

    builder = build_run(tmp_path / "run", "store-status", 6)
    upload_run(bucket_url, builder.run_dir, "run")
    before = subprocess.run(CLI + ["status", bucket_url, "--json"], capture_output=True, text=True,
                            env=child_env(**moto.env()))
    [run] = json.loads(before.stdout)["runs"]
    assert (run["state"], run["episodes"], run["destinations"]) == ("completed", 6, [])
    assert store_sync(server.base_url, moto, tmp_path / "m", bucket_url).returncode == 0
    after = subprocess.run(CLI + ["status", bucket_url, "--json"], capture_output=True, text=True,
                           env=child_env(**moto.env()))
    [run] = json.loads(after.stdout)["runs"]
    [dest] = run["destinations"]
    assert (dest["samples_pushed"], dest["pending"], dest["finalized"]) == (6, 0, True)
    assert run["path"] == f"{bucket_url}/run"


@pytest.mark.slow
def test_with_a_state_dir_the_state_stays_local_and_the_lease_in_the_store(tmp_path: Path, server, api, moto,
                                                                          bucket_url: str) -> None:
    builder = build_run(tmp_path / "run", "store-state-dir", 5)
    upload_run(bucket_url, builder.run_dir, "run")
    state_dir = tmp_path / "state"
    for expected in (("synced", 5), ("up_to_date", 0)):
        result = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json",
                            PRIME_RUNS_STATE_DIR=str(state_dir))
        assert [(r["state"], r["pushed_now"]) for r in reports(result)] == [expected], result.stderr
    [state_file] = state_dir.glob("store/*/run/spool/sync/*.json")
    assert json.loads(state_file.read_text())["samples_pushed"] == 5
    assert oct(state_file.stat().st_mode & 0o777) == "0o600"
    assert get_object(bucket_url, f"run/spool/sync/{state_file.name}") is None  # not in the bucket
    assert json.loads(get_object(bucket_url, "run/spool/sync.lease.json"))["released"] is True
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_bad_store_urls_are_one_line_not_a_traceback(tmp_path: Path, server, moto) -> None:
    missing = store_sync(server.base_url, moto, tmp_path / "m", "s3://no-such-bucket-here/x")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.count("\n") == 1 and "s3://no-such-bucket-here/x: cannot list" in missing.stderr
    mixed = store_sync(server.base_url, moto, tmp_path / "m", "s3://bucket/x", str(tmp_path))
    assert mixed.returncode == 2 and "not both" in mixed.stderr


@pytest.mark.slow
def test_mirror_uploads_only_durable_bytes_and_sync_ships_the_run_once(tmp_path: Path, server, api, moto,
                                                                        bucket_url: str) -> None:
    """The writer side: ``prime-runs mirror`` copies a live run's segment up to the durable
    mark (bytes past it, a write in progress, stay local), then the sealed rest; a sync from
    the bucket after each pass ships each episode once."""
    outputs = tmp_path / "outputs"
    builder, segment = live_run(outputs / "eval-1", "store-mirror", 6)
    durable = builder.writer.durable_bytes  # all fsync'd, and the mark says so
    on_its_way = b'{"not yet durable'
    fd = os.open(segment, os.O_WRONLY)
    try:  # a line on its way: in the file (written into the padding), not fsync'd
        os.pwrite(fd, on_its_way, durable)
    finally:
        os.close(fd)
    first = mirror_once(outputs, bucket_url, moto.env())
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["url"] == f"{bucket_url}/eval-1"
    assert get_object(bucket_url, "eval-1/spool/seg-000001.jsonl") == segment.read_bytes()[:durable]
    fd = os.open(segment, os.O_WRONLY)
    try:  # the write in progress, undone: padding again, where the writer writes its next line
        os.pwrite(fd, bytes(len(on_its_way)), durable)
    finally:
        os.close(fd)
    assert mirror_once(outputs, bucket_url, moto.env()).stdout == ""  # nothing changed: nothing sent
    check_live_then_sealed(server.base_url, api, bucket_url, tmp_path / "m", outputs, builder, segment, 4,
                           moto.env())
    assert {key.rsplit("/", 1)[-1] for key in keys(bucket_url)} >= {"seg-000001.jsonl"}


@pytest.mark.slow
def test_a_dry_run_from_the_bucket_writes_nothing_there(tmp_path: Path, server, moto, bucket_url: str) -> None:
    builder = build_run(tmp_path / "run", "store-dry", 5)
    upload_run(bucket_url, builder.run_dir, "run")
    result = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json", "--dry-run")
    assert [(r["state"], r["pushed_now"]) for r in reports(result)] == [("dry_run", 5)], result.stderr
    assert keys(bucket_url) == ["run/spool/seg-000001.jsonl"]  # no lease, no state


@pytest.mark.slow
def test_a_run_whose_lease_another_syncer_holds_is_skipped_or_waited_for(tmp_path: Path, server, api, moto,
                                                                        bucket_url: str) -> None:
    import threading
    import time

    from prime_runs_spool.store.lease import Lease

    builder = build_run(tmp_path / "run", "store-held", 4)
    upload_run(bucket_url, builder.run_dir, "run")
    other = Lease(ObjectStore(bucket_url), "run/spool/sync.lease.json", owner="elsewhere:1:x", ttl=60)
    assert other.try_take()
    skipped = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json")
    assert skipped.returncode == 0, skipped.stderr
    [report] = reports(skipped)
    assert report["state"] == "skipped" and "elsewhere:1:x" in report["error"] and "--wait" in report["error"]
    threading.Timer(1.0, other.release).start()  # the other syncer finishes a second later
    start = time.monotonic()
    waited = store_sync(server.base_url, moto, tmp_path / "m", bucket_url, "--json", "--wait")
    assert [(r["state"], r["pushed_now"]) for r in reports(waited)] == [("synced", 4)]
    assert time.monotonic() - start >= 1.0
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_replay_from_the_bucket_continues_an_interrupted_replay_then_starts_anew(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """``--replay`` over a store URL: a replay SIGKILLed mid-push is continued (the same
    replay id, found among the states in the bucket), not doubled; once it finished, the
    next ``--replay`` is a new evaluation. Every evaluation holds each row once."""
    from support.sync_e2e import kill_on_progress, sample_ids

    builder = build_run(tmp_path / "run", "store-replay", 60)
    upload_run(bucket_url, builder.run_dir, "run")
    home = tmp_path / "m"
    first = store_sync(server.base_url, moto, home, bucket_url, "--json")
    assert [(r["state"], r["pushed_now"]) for r in reports(first)] == [("synced", 60)], first.stderr

    def rows_held() -> int:
        return sum(e["total_samples"] for e in evaluations_of(api, builder.run_id))

    lease = {"PRIME_RUNS_LEASE_TTL": "2", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}  # the killed one's expires soon
    env = machine_env(home, moto.env(), **lease)
    proc = subprocess.Popen(sync_cmd(server.base_url, bucket_url, "--replay", "--max-request-bytes", "6000"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    assert kill_on_progress(proc, rows_held, 5), "the replay ended before it was killed"
    proc.wait()
    again = store_sync(server.base_url, moto, home, bucket_url, "--replay", "--json", "--wait", **lease)
    (report,) = reports(again)
    assert report["state"] == "synced" and report["replay_id"], again.stderr
    evaluations = evaluations_of(api, builder.run_id)
    assert len(evaluations) == 2, f"{len(evaluations)} evaluations: the killed replay was not continued"
    replay_ids = {(e.get("metadata") or {}).get("replay_id") for e in evaluations}
    assert replay_ids == {None, report["replay_id"]}
    assert report["pushed_now"] < 60  # it went on from where the killed one stopped
    for evaluation in evaluations:
        assert sample_ids(api, evaluation["evaluation_id"]) == builder.ids
    newer = store_sync(server.base_url, moto, home, bucket_url, "--replay", "--json")
    (fresh,) = reports(newer)
    assert (fresh["state"], fresh["pushed_now"]) == ("synced", 60) and fresh["replay_id"] != report["replay_id"]
    assert len(evaluations_of(api, builder.run_id)) == 3


@pytest.mark.slow
def test_follow_over_a_bucket_pushes_what_each_upload_adds_once_and_stops_on_sigint(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """``--follow`` over a store URL: a pass every ``--poll-interval``; each upload of the
    growing segment is pushed once, a run uploaded later is found, a changed run is reported
    as one line; SIGINT ends it with exit 0. With ``--exit-when-idle`` it ends after a pass
    with nothing to do."""

    builder = RunBuilder(tmp_path / "run", "store-follow")
    builder.open_segment()
    builder.add(5)
    upload_run(bucket_url, builder.run_dir, "run")
    home = tmp_path / "m"
    follower = _follow_process(sync_cmd(server.base_url, bucket_url, "--follow", "--json", "--poll-interval", "0.2"),
                               moto, home)
    with reaped(follower):
        deadline = time.monotonic() + 60
        while _pushed(api, "store-follow") < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pushed(api, "store-follow") == 5
        builder.add(4)
        builder.seal()
        upload_run(bucket_url, builder.run_dir, "run")
        late = build_run(tmp_path / "late", "store-follow-late", 3)
        upload_run(bucket_url, late.run_dir, "late")
        while (_pushed(api, "store-follow") < 9 or _pushed(api, "store-follow-late") < 3) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.6)  # passes with nothing new: nothing more is sent, nothing is reported
        out, err, _ = interrupted(follower, timeout=30)
    assert follower.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    pushed: dict[str, int] = {}
    for report in lines:
        pushed[report["path"].rsplit("/", 1)[1]] = pushed.get(report["path"].rsplit("/", 1)[1], 0) + report["pushed_now"]
        assert report["state"] in ("crashed", "synced") or "changed while it was read" in report["error"], report
    assert pushed == {"run": 9, "late": 3}, out
    assert [r["state"] for r in lines if r["path"].endswith("/run")][-1] == "synced"
    assert len(lines) <= 5, out  # one line a change: no line for a pass that found nothing new
    assert "Traceback" not in err
    assert_exactly_once(api, builder)
    assert_exactly_once(api, late)
    # As a local follow's: its last line says what it left, and hands on a command that,
    # pasted, carries on from the same bucket to the same platform.
    last = err.strip().splitlines()[-1]
    assert last == ("prime-runs: stopped following: 2 runs finished, 0 not yet; the state is saved, carry on with "
                    f"(or add --follow): prime-runs sync {bucket_url} --base-url {server.base_url}"), err
    command = last[last.index("prime-runs sync "):]
    idle = subprocess.run(["sh", "-c", shlex.join(CLI) + command.removeprefix("prime-runs")
                           + " --follow --exit-when-idle --json --poll-interval 0.1"],
                          capture_output=True, text=True, timeout=60, env=machine_env(home, moto.env()))
    assert idle.returncode == 0, idle.stderr
    assert sorted(r["state"] for r in map(json.loads, idle.stdout.splitlines())) == ["up_to_date", "up_to_date"]


def _follow_process(cmd: list[str], moto: moto_server.MotoServer, home: Path) -> subprocess.Popen[str]:
    """``cmd`` (a ``prime-runs sync --follow``) started with this machine's cache under ``home``."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=machine_env(home, moto.env()))


def _follower_holding_the_lease(bucket_url: str, moto: moto_server.MotoServer, home: Path,
                                *args: str) -> subprocess.Popen[str]:
    """``prime-runs sync BUCKET --follow *args``, returned once its pass holds the lease of the
    bucket's run ``run`` (within 30 s)."""
    follower = _follow_process(CLI + ["sync", bucket_url, "--follow", *args], moto, home)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if json.loads(get_object(bucket_url, "run/spool/sync.lease.json"))["released"] is False:
                break
        except Exception:  # noqa: BLE001 - not written yet
            pass
        time.sleep(0.1)
    return follower


@pytest.mark.slow
def test_sigint_ends_a_follow_whose_pass_is_backing_off_at_once_and_releases_the_lease(
        tmp_path: Path, moto, bucket_url: str) -> None:
    """The platform down: a pass backs off for minutes (10 attempts, up to 30 s apart). A
    SIGINT must end the follow at the next wait, as a local follow's, not after the pass;
    the lease is released so the next sync need not wait for it to expire."""
    from support.ports import closed_url

    build = build_run(tmp_path / "run", "store-follow-down", 3)
    upload_run(bucket_url, build.run_dir, "run")
    down = closed_url()  # every request is refused
    follower = _follower_holding_the_lease(bucket_url, moto, tmp_path / "m", "--base-url", down,
                                           "--backoff-cap", "30", "--max-attempts", "10", "--timeout", "5")
    with reaped(follower):
        time.sleep(2.0)  # the pass holds the lease: it is backing off
        out, err, took = interrupted(follower, timeout=60)
    assert follower.returncode == 0, err
    assert took < 10, f"SIGINT took {took:.1f} s to end the follow"
    assert "Traceback" not in err
    assert json.loads(get_object(bucket_url, "run/spool/sync.lease.json"))["released"] is True


@pytest.mark.slow
def test_follow_reports_a_run_uploaded_piece_by_piece_once_per_upload(tmp_path: Path, server, api, moto,
                                                                      bucket_url: str) -> None:
    """Each pass after an upload pushes and reads ``crashed`` (no seal yet); the pass after
    it finds nothing new: no line for it (it was an ``up_to_date`` line per upload)."""

    builder = RunBuilder(tmp_path / "run", "store-pieces")
    builder.open_segment()
    builder.add(3)
    upload_run(bucket_url, builder.run_dir, "run")
    home = tmp_path / "m"
    follower = _follow_process(sync_cmd(server.base_url, bucket_url, "--follow", "--json", "--poll-interval", "0.1"),
                               moto, home)
    with reaped(follower):
        for total in (3, 5):
            deadline = time.monotonic() + 60
            while _pushed(api, "store-pieces") < total and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # several passes with nothing new
            if total == 3:
                builder.add(2)
                upload_run(bucket_url, builder.run_dir, "run")
        out, err, _ = interrupted(follower, timeout=30)
    assert follower.returncode == 0, err
    assert [(r["state"], r["pushed_now"]) for r in map(json.loads, out.splitlines())] == [("crashed", 3), ("crashed", 2)]
    assert_exactly_once(api, builder, finalized=False)


@pytest.mark.slow
def test_a_follower_killed_mid_pass_then_one_ending_when_idle_finishes_the_run_once(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """SIGKILL a follower while it pushes: its lease outlives it (for its TTL). The next one,
    with ``--exit-when-idle``, finds the run ``skipped``: that is not idle (it ended there,
    exit 0, the run half pushed); it carries on once the lease expires, exactly once."""
    builder = RunBuilder(tmp_path / "run", "store-follow-killed")
    builder.open_segment()
    builder.add(300)
    builder.seal()
    upload_run(bucket_url, builder.run_dir, "run")
    home = tmp_path / "m"
    env = machine_env(home, moto.env(), PRIME_RUNS_LEASE_TTL="3")
    cmd = sync_cmd(server.base_url, bucket_url, "--follow", "--json", "--poll-interval", "0.2",
                   "--max-request-bytes", "20000")
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while _pushed(api, "store-follow-killed") < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        first.kill()
        first.communicate()
    assert 40 <= _pushed(api, "store-follow-killed") < 300
    second = subprocess.run(cmd + ["--exit-when-idle"], capture_output=True, text=True, env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    lines = [json.loads(line) for line in second.stdout.splitlines()]
    assert lines[0]["state"] == "skipped" and lines[-1]["state"] == "synced", second.stdout
    assert "Traceback" not in second.stderr
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_second_sigint_ends_a_follow_whose_pass_waits_on_an_unanswered_request(
        tmp_path: Path, moto, bucket_url: str) -> None:
    """The platform takes the connection and never answers: the pass waits a whole
    ``--timeout`` for it. The first SIGINT stops the follow when that request ends; a second
    stops it at once (safe as a SIGKILL: the state is consistent at every instant), as a
    second SIGINT stops a local follow; the lease, which no request in doubt needs, given up
    on the way out (it was left to expire: the next sync skipped the run for 65 s)."""
    import signal
    import socket

    build = build_run(tmp_path / "run", "store-follow-mute", 3)
    upload_run(bucket_url, build.run_dir, "run")
    with socket.socket() as mute:  # listens, never accepts: a request's answer never comes
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        follower = _follower_holding_the_lease(bucket_url, moto, tmp_path / "m", "--base-url",
                                               f"http://127.0.0.1:{mute.getsockname()[1]}", "--timeout", "120")
        with reaped(follower):
            time.sleep(1.0)  # the pass holds the lease: its request is out
            follower.send_signal(signal.SIGINT)
            time.sleep(1.0)
            assert follower.poll() is None  # the first waits for the request
            out, err, took = interrupted(follower, timeout=60)  # the second
    assert follower.returncode == 0, err
    assert took < 10, f"the second SIGINT took {took:.1f} s to end the follow"
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert json.loads(get_object(bucket_url, "run/spool/sync.lease.json"))["released"] is True


def test_a_store_run_whose_pass_fails_unexpectedly_does_not_stop_the_others(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A local sync reports a bug met on one run as that run's error (sync/many.py); over a
    store URL the exception went through the pool and the whole command ended in "internal
    error" (a lease of generation 1e300 did it), every other run's report lost."""
    import uuid

    from prime_runs_spool.spool.layout import list_segments
    from prime_runs_spool.store.objects import ObjectStore
    from prime_runs_spool.sync import store_sync
    from prime_runs_spool.sync.options import RunReport, SyncOptions
    from prime_runs_spool.sync.state import remote_destination

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    for name in ("a", "b"):
        builder = build_run(tmp_path / name, f"store-isolation-{name}", 1)
        for _, path in list_segments(builder.run_dir):
            store.create(f"{name}/spool/{path.name}", path.read_bytes())

    def sync(self: store_sync.StoreRunSync) -> RunReport:
        if str(self.run).endswith("/a"):
            raise RuntimeError("a bug met on run a")
        return RunReport(path=str(self.run), state="up_to_date")

    monkeypatch.setattr(store_sync.StoreRunSync, "sync", sync)
    reports = store_sync.sync_store(store.url, None, remote_destination("http://platform.invalid", None),
                                    SyncOptions(), store=store)
    assert [(r.path.rsplit("/", 1)[-1], r.state) for r in reports] == [("a", "error"), ("b", "up_to_date")]
    assert "a bug met on run a" in (reports[0].error or "")


def _memory_store_with(tmp_path: Path, *names: str):  # noqa: ANN202
    """A memory:// store holding one small sealed run per name, at ``<name>/spool/``."""
    from prime_runs_spool.spool.layout import list_segments
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    for name in names:
        builder = build_run(tmp_path / "src" / name, f"r4-{name}-{uuid.uuid4().hex[:6]}", 2)
        for _, path in list_segments(builder.run_dir):
            store.create(f"{name}/spool/{path.name}", path.read_bytes())
    return store


def _store_sync_local(tmp_path: Path, store) -> list:  # noqa: ANN001
    """``sync_store`` in this process against the embedded local platform."""
    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.state import local_destination
    from prime_runs_spool.sync.store_sync import sync_store

    db = tmp_path / "local.db"
    with EmbeddedPlatform(db) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url="http://frontend.invalid")
        with PlatformClient(settings, timeout=10) as client:
            return sync_store(store.url, client, local_destination(db, None),
                              SyncOptions(request_lifetime=1.0, to=SAMPLES), store=store)


def test_a_damaged_state_in_a_store_is_named_by_its_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning named ~/.cache/prime-runs/store/<hash>/...: a file the user never made
    and cannot find the object from."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = _memory_store_with(tmp_path, "a")
    (first,) = _store_sync_local(tmp_path, store)
    assert first.state == "synced", first
    (key,) = [k for k in (info.key for info in store.list()) if k.startswith("a/spool/sync/") and k.endswith(".json")]
    store.replace(key, b"{not json", store.read(key)[1])
    (again,) = _store_sync_local(tmp_path, store)
    assert again.state == "synced" and again.pushed_total == 2, again
    (warning,) = [w for w in again.warnings if "damaged" in w]
    assert warning.startswith(f"{store.url}/{key} is damaged"), warning
    assert str(tmp_path / "cache") not in warning, warning


@pytest.mark.slow
@pytest.mark.parametrize("url", ["s3://AKIAEXAMPLE:pw-s3cret@bucket/runs", "s3://bucket/runs?aws_secret_access_key=pw-s3cret",
                                 "memory:///runs#pw-s3cret"])
@pytest.mark.parametrize("command", [["sync", "--local", "--db", "{db}"], ["status"], ["verify"], ["mirror", "{runs}"]])
def test_a_store_url_carrying_a_secret_is_a_usage_error_that_does_not_show_it(tmp_path: Path, url: str,
                                                                              command: list[str]) -> None:
    """obstore drops a URL's user:password@, ?query and #fragment without a word: a key
    pasted there was not used, and every report line (and --json's paths) printed it back,
    into the CI log."""
    build_run(tmp_path / "runs" / "r", "url-secret", 1)
    argv = [a.replace("{db}", str(tmp_path / "local.db")).replace("{runs}", str(tmp_path / "runs")) for a in command]
    result = run_cli(*argv, url, timeout=60, AWS_EC2_METADATA_DISABLED="true", PRIME_RUNS_STORE_RETRIES="0")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "pw-s3cret" not in result.stdout + result.stderr
    assert "a store URL takes no" in last_line(result), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("value", ["abc", "-1", "1000000"])
def test_store_retries_that_are_not_a_small_whole_number_are_a_usage_error(value: str) -> None:
    """`status s3://...` with PRIME_RUNS_STORE_RETRIES=abc ended in a ValueError traceback."""
    result = run_cli("status", f"memory:///{uuid.uuid4().hex}", timeout=30, PRIME_RUNS_STORE_RETRIES=value)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert last_line(result).startswith("prime-runs: PRIME_RUNS_STORE_RETRIES="), result.stderr


def test_a_huge_object_where_a_state_goes_is_not_read_into_memory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """store.read fetched an object whole: a received bucket with gigabytes at a run's
    sync/<dest>.json (or its lease) was read into memory, run by run."""
    from prime_runs_spool.store import objects

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(objects, "MAX_SMALL_OBJECT_BYTES", 4096)
    store = _memory_store_with(tmp_path, "a", "b")
    reports = _store_sync_local(tmp_path, store)
    assert [r.state for r in reports] == ["synced", "synced"], reports
    (key,) = [i.key for i in store.list() if i.key.startswith("a/spool/sync/") and i.key.endswith(".json")]
    store.replace(key, b"{" + b" " * 10_000 + b"}", store.read(key)[1])
    fetched = store.stats["bytes_read"]
    (first, second) = _store_sync_local(tmp_path, store)
    assert first.state == "error" and "more than a sync state or lease ever holds" in (first.error or ""), first
    assert second.state == "up_to_date", second
    assert store.stats["bytes_read"] - fetched < 10_000


@pytest.mark.slow
def test_a_listing_of_more_than_one_page_finds_every_run_and_every_object_of_a_run(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """S3 answers a listing 1,000 keys a page (moto as AWS): 999 other objects sort before
    the runs, so one run's first segment ends the first page and its second segment, its
    lease and its state are on the next, and another run is wholly there. ``sync`` finds
    both runs whole (each episode once), and syncs again, here and on another machine,
    find them up to date from the state on the second page."""
    import obstore

    from support.store_runs import raw_store

    store = raw_store(bucket_url)
    for n in range(999):
        obstore.put(store, f"a-other/{n:04d}", b"x")
    straddling = RunBuilder(tmp_path / "m-run", "store-pages-straddling")
    straddling.open_segment()
    straddling.add(3)
    straddling.abandon()
    straddling.open_segment(counted=True)
    straddling.add(2)
    straddling.seal()
    upload_run(bucket_url, straddling.run_dir, "m-run")
    after = stored_run(bucket_url, tmp_path / "z-run", "store-pages-after", 4)
    listed = keys(bucket_url)
    assert len(listed) == 1002 and listed.index("m-run/spool/seg-000001.jsonl") == 999, listed[995:]
    for home, states in (("m1", ["synced", "synced"]), ("m1", ["up_to_date"] * 2), ("m2", ["up_to_date"] * 2)):
        result = store_sync(server.base_url, moto, tmp_path / home, bucket_url, "--json")
        assert result.returncode == 0, result.stderr
        assert [(r["path"].rsplit("/", 1)[-1], r["state"]) for r in reports(result)] == [
            ("m-run", states[0]), ("z-run", states[1])], result.stdout
    for builder in (straddling, after):
        assert_exactly_once(api, builder)
