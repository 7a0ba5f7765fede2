"""A lease handed over between machines while a request is out (docs/sync.md, "Object stores").

Machine A syncs a bucket and is SIGKILLed while its samples request is held on the way to
the platform; machine B takes the expired lease and syncs the run; A's request then lands,
within its lifetime. Each episode must be on the platform once, whether the state lives in
the bucket or each machine keeps its own in ``--state-dir``: there B cannot read A's
state, so the lease itself announces the request. The real command, the local platform
over HTTP behind the fault proxy, and a real S3 API (moto's server mode).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.fault_proxy import FaultProxy
from prime_runs_spool.store.lease import Lease
from prime_runs_spool.store.objects import ObjectStore
from support import moto_server
from support.env import CLI, child_env
from support.runs import build_run
from support.store_runs import get_object, live_run, mirror_once, upload_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, server  # noqa: F401

moto = moto_server.module_fixture()
#: Long enough for B to take A's expired lease (1.5 s) and push, were it not held back.
LIFETIME = 8.0
LEASE = {"PRIME_RUNS_LEASE_TTL": "1.5", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}


@pytest.fixture
def bucket_url(moto: moto_server.MotoServer) -> str:
    return f"s3://{moto.new_bucket()}/outputs"


def _machine(tmp_path: Path, name: str, moto: moto_server.MotoServer, state_dir: bool) -> dict[str, str]:
    home = tmp_path / name
    extra = {"PRIME_RUNS_STATE_DIR": str(home / "state")} if state_dir else {}
    return child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / "cache"), **moto.env(),
                     **LEASE, **extra)


def _sync(bucket_url: str, base_url: str, *args: str) -> list[str]:
    return CLI + ["sync", bucket_url, "--json", "--base-url", base_url, "--request-lifetime", str(LIFETIME),
                  "--backoff-cap", "0.2", "--timeout", "30", *args]


@pytest.mark.slow
@pytest.mark.parametrize("state_dir", [True, False], ids=["state-dirs", "state-in-store"])
def test_a_request_in_flight_at_a_lease_handover_lands_once(tmp_path: Path, server, api, moto, bucket_url: str,
                                                            state_dir: bool) -> None:
    builder = build_run(tmp_path / "run", f"store-handover-{state_dir}", 5)
    upload_run(bucket_url, builder.run_dir, "run")
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/samples$") as proxy:
        first = subprocess.Popen(_sync(bucket_url, proxy.base_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=_machine(tmp_path, "a", moto, state_dir))
        deadline = time.monotonic() + 60
        while not proxy.holding():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.01)
        sent = time.monotonic()
        first.kill()  # A dies with its request out: the platform has not seen it yet
        first.communicate()
        second = subprocess.Popen(_sync(bucket_url, proxy.base_url, "--wait"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_machine(tmp_path, "b", moto, state_dir))
        time.sleep(max(0.0, sent + LIFETIME / 2 - time.monotonic()))
        proxy.release_held()  # A's request lands, late but within its lifetime
        out, err = second.communicate(timeout=120)
    assert_exactly_once(api, builder)  # 5 rows for 5 episodes, one evaluation, finalized once
    assert second.returncode == 0, err
    [report] = json.loads(out)["runs"]
    assert report["state"] == "synced", report
    lease = json.loads(get_object(bucket_url, "run/spool/sync.lease.json"))
    assert lease["generation"] == 2 and lease["released"] is True and lease["in_flight_until"] == 0.0
    if state_dir:
        assert any("waited" in warning for warning in report["warnings"]), report


@pytest.mark.slow
def test_the_lease_tells_the_next_holder_what_it_cannot_read(moto, bucket_url: str) -> None:
    """Who waits for the previous holder's request: whoever cannot read its announcement."""
    store = ObjectStore(bucket_url)
    now = [1000.0]

    def lease(key: str, in_store: bool, owner: str) -> Lease:
        return Lease(store, key, owner=owner, ttl=10, clock_skew=0, clock=lambda: now[0], state_in_store=in_store)

    cases = [(False, True, 1600.0), (True, False, 1600.0), (False, False, 1600.0), (True, True, 0.0)]
    for n, (holder_in_store, taker_in_store, expected_wait) in enumerate(cases):
        key = f"case-{n}/spool/sync.lease.json"
        now[0] = 1000.0
        holder = lease(key, holder_in_store, "a")
        assert holder.try_take()
        holder.in_flight_until = 1600.0  # the state announced a request sent at 1000, lifetime 600
        holder.renew()
        taker = lease(key, taker_in_store, "b")
        assert not taker.try_take() and taker.wait_until == 0.0  # held: not taken
        now[0] = 1011.0  # the holder died: its lease expired
        assert taker.try_take()
        assert taker.wait_until == expected_wait, (holder_in_store, taker_in_store)
        # The taker's own lease still announces the request, for whoever takes it next.
        assert json.loads(get_object(bucket_url, key))["in_flight_until"] == 1600.0
        taker.release()
        assert json.loads(get_object(bucket_url, key))["in_flight_until"] == 1600.0


@pytest.mark.slow
def test_a_syncer_killed_mid_pass_then_taken_over_does_not_wait_a_lifetime_when_it_syncs_again(
        tmp_path: Path, server, api, moto, bucket_url: str) -> None:
    """A is SIGKILLed with its request held, B (another home) takes the lease over, settles
    that request and pushes more, then A syncs the run again in its own home. Its copy lock
    still says A's pass died under way, and the state file it names, A's copy of the
    store's, now holds the state B wrote, with B's pass marks: taken for an older copy put
    back, A waited a whole request lifetime (and warned "waited"), though the lease had
    fenced A's request (sync/copies.py). Each episode lands once."""
    outputs = tmp_path / "outputs"
    builder, _ = live_run(outputs / "run", "store-handover-again", 5)
    mirrored = mirror_once(outputs, bucket_url, moto.env())
    assert mirrored.returncode == 0, mirrored.stderr
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/samples$") as proxy:
        first = subprocess.Popen(_sync(bucket_url, proxy.base_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=_machine(tmp_path, "a", moto, False))
        deadline = time.monotonic() + 60
        while not proxy.holding():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.01)
        first.kill()  # A dies mid-pass, its request out
        first.communicate()
        builder.add(2)  # B announces requests of its own: the state it writes bears its mark, not A's
        mirrored = mirror_once(outputs, bucket_url, moto.env())
        assert mirrored.returncode == 0, mirrored.stderr
        second = subprocess.Popen(_sync(bucket_url, proxy.base_url, "--wait"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_machine(tmp_path, "b", moto, False))
        time.sleep(1.0)
        proxy.release_held()  # A's request lands, within its lifetime
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        assert [r["state"] for r in json.loads(out)["runs"]] == ["live"], out
        builder.add(3)
        builder.seal()
        mirrored = mirror_once(outputs, bucket_url, moto.env())
        assert mirrored.returncode == 0, mirrored.stderr
        started = time.monotonic()  # A again, in its own home: the same copy lock, the same cached state
        again = subprocess.run(_sync(bucket_url, proxy.base_url), capture_output=True, text=True, timeout=120,
                               env=_machine(tmp_path, "a", moto, False))
    took = time.monotonic() - started
    assert again.returncode == 0, again.stderr
    [report] = json.loads(again.stdout)["runs"]
    assert (report["state"], report["pushed_now"]) == ("synced", 3), report
    assert not [w for w in report["warnings"] if "waited" in w], report
    assert took < LIFETIME, took
    assert_exactly_once(api, builder)
