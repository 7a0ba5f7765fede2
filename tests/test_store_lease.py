"""The lease a syncer holds on a run in a store: what counts as a lease, and the settings
that tune it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from support import moto_server
from support.cli import last_line, run_cli
from support.sync_e2e import api, server  # noqa: F401  (fixtures)


@pytest.mark.parametrize("lease", [
    {"expires_at": 1e308},           # "held" forever: every syncer skipped the run, always
    {"expires_at": 1000.0 + 2 * 86400},  # more than a day ahead: no syncer writes one
    {"expires_at": float("nan")},    # likewise: NaN is never past
    {"expires_at": 1000.0, "generation": 1e300},  # an internal error ended the whole sync
    {"expires_at": 1000.0, "generation": True},
])
def test_a_lease_no_syncer_writes_is_no_lease(lease: dict) -> None:
    import uuid

    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    body = {"owner": "elsewhere", "generation": 3, "released": False, "written_at": 1000.0, "nonce": "n", **lease}
    store.create("run/spool/sync.lease.json", json.dumps(body).encode())
    taker = Lease(store, "run/spool/sync.lease.json", owner="me", ttl=60, clock_skew=5, clock=lambda: 1000.0)
    assert taker.try_take()
    assert type(taker.generation) is int and taker.generation < 1 << 62
    taker.release()


@pytest.mark.parametrize("expires_at", [1000.0 + 60 + 5,      # its clock 5 s ahead of ours, as the skew allows
                                        1000.0 + 3600,        # its TTL an hour, ours a minute (set per machine)
                                        1000.0 + 86400])      # a day: the longest a lease may claim
def test_a_lease_another_syncer_may_hold_is_still_held(expires_at: float) -> None:
    """The check above must not take over a lease a syncer wrote: one renewed after this
    syncer read its clock (two machines continuing one replay meet exactly that), or one from a machine whose PRIME_RUNS_LEASE_TTL is longer than ours."""
    import uuid

    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    held = {"owner": "elsewhere", "generation": 3, "released": False, "written_at": 1000.0, "nonce": "n",
            "expires_at": expires_at}
    store.create("run/spool/sync.lease.json", json.dumps(held).encode())
    assert not Lease(store, "run/spool/sync.lease.json", owner="me", ttl=60, clock_skew=5,
                     clock=lambda: 1000.0).try_take()


@pytest.mark.parametrize(("name", "value", "said"), [
    ("PRIME_RUNS_LEASE_TTL", "nan", "finite"),        # NaN expiry: every other syncer took it for no lease
    ("PRIME_RUNS_LEASE_TTL", "inf", "finite"),
    ("PRIME_RUNS_LEASE_TTL", "-5", "below"),          # expired as it was written
    ("PRIME_RUNS_LEASE_TTL", "172800", "more than"),  # past every syncer's horizon: no lease to them
    ("PRIME_RUNS_LEASE_TTL", "soon", "not a number"),  # was an internal error per run
    ("PRIME_RUNS_LEASE_CLOCK_SKEW", "nan", "finite"),
    ("PRIME_RUNS_LEASE_CLOCK_SKEW", "-1", "below"),
])
@pytest.mark.slow
def test_lease_settings_that_are_not_usable_are_a_usage_error(tmp_path: Path, name: str, value: str,
                                                              said: str) -> None:
    result = run_cli("sync", "--local", "--db", str(tmp_path / "local.db"), f"memory:///{uuid.uuid4().hex}",
                  timeout=60, **{name: value})
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert last_line(result).startswith(f"prime-runs: {name}") and said in last_line(result), result.stderr


def test_a_lease_ttl_of_a_few_seconds_is_still_taken(tmp_path: Path) -> None:
    from prime_runs_spool.sync.store_sync import lease_problem

    for ttl, skew in (("1.5", "0"), ("2", ""), ("", ""), ("86400", "5")):
        env = {"PRIME_RUNS_LEASE_TTL": ttl, "PRIME_RUNS_LEASE_CLOCK_SKEW": skew}
        with pytest.MonkeyPatch.context() as patch:
            for key, text in env.items():
                patch.setenv(key, text)
            assert lease_problem() is None, env


class _Clocks:
    """This machine's wall clock and its monotonic one, moved by the sync's sleeps; at the
    first nap the wall clock is set back ``back`` seconds (NTP, or a person, correcting it)."""

    def __init__(self, back: float) -> None:
        self.wall, self.mono, self.slept, self.back = 1000.0, 50.0, 0.0, back

    def sleep(self, seconds: float) -> None:
        self.wall, self.mono, self.slept = self.wall + seconds, self.mono + seconds, self.slept + seconds
        self.wall, self.back = self.wall - self.back, 0.0


def _lease(clocks: _Clocks, ttl: float = 60):
    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    lease = Lease(ObjectStore(f"memory:///{uuid.uuid4().hex}"), "run/spool/sync.lease.json", owner="me", ttl=ttl,
                  clock_skew=0, clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
    assert lease.try_take()
    return lease


def test_a_wait_under_the_lease_lasts_what_it_was_asked_whatever_the_wall_clock_does() -> None:
    """Every wait of a sync under a lease (its backoffs, its fences' naps) slept to a
    wall-clock deadline: the clock set back 25 s mid-wait made a 30 s wait last 55 s. How
    long a fence lasts its caller counts between naps (Protocol.fence_age): a nap only sleeps."""
    clocks = _Clocks(back=25.0)
    lease = _lease(clocks, ttl=9)
    renewed, renew = [], lease.renew
    lease.renew = lambda: (renewed.append(clocks.mono), renew())  # type: ignore[method-assign]
    lease.sleeper(clocks.sleep)(30)
    assert clocks.slept == 30
    # Renewed every third of the lease all along, the 25 s the wall clock went back included.
    assert all(b - a <= 9 / 3 + 9 / 4 for a, b in zip([50.0, *renewed], [*renewed, clocks.mono])), renewed


def test_the_wait_for_a_request_another_machine_announced_is_never_longer_than_a_lifetime() -> None:
    """The previous holder's request may land until its time (the other machine's clock, so
    compared with this one's wall clock, asked again after each nap); never later than a
    request lifetime after this sync took the lease. The wall clock set back 25 s mid-wait
    stretched a 10 s wait to 35 s, past that lifetime (30 s)."""
    from prime_runs_spool.sync.leased import wait_out_inherited_request
    from prime_runs_spool.sync.options import SyncOptions

    clocks = _Clocks(back=25.0)
    lease = _lease(clocks)
    lease.wait_until = clocks.wall + 10
    waited = wait_out_inherited_request(lease, SyncOptions(request_lifetime=30.0), clocks.sleep)
    assert clocks.slept == waited == 30.0
    clocks = _Clocks(back=0.0)  # the clock left alone: what the other machine's time says, 10 s
    lease = _lease(clocks)
    lease.wait_until = clocks.wall + 10
    assert wait_out_inherited_request(lease, SyncOptions(request_lifetime=30.0), clocks.sleep) == clocks.slept == 10
    lease.wait_until = 0.0
    assert wait_out_inherited_request(lease, SyncOptions(request_lifetime=30.0), clocks.sleep) == 0.0


@pytest.mark.parametrize("ends", ["released", "killed"])
def test_a_request_a_holder_still_waits_out_is_announced_to_whoever_takes_the_lease_next(ends: str) -> None:
    """A holder syncing with --state-dir killed with a request out: the lease announces it
    (``in_flight_until``), and a taker keeping its state in the store waits it out, since it
    cannot read it. Stopped during that wait (Ctrl-C: its lease released) or killed after a
    renewal, that taker wrote the lease as one whose announcements are all in the state
    object (``state_in_store``), which does not hold that request: the next taker keeping
    its state in the store waited for nothing, and could push the rows it carries again."""
    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    store, key, now = ObjectStore(f"memory:///{uuid.uuid4().hex}"), "run/spool/sync.lease.json", [1000.0]

    def lease(owner: str, state_in_store: bool) -> Lease:
        return Lease(store, key, owner=owner, ttl=60, clock_skew=5, clock=lambda: now[0], state_in_store=state_in_store)

    first = lease("state-dir", state_in_store=False)
    assert first.try_take()
    first.in_flight_until = 1000.0 + 600  # its request's lifetime
    first.renew()
    now[0] += 100  # killed: its lease ran out
    second = lease("in-store", state_in_store=True)
    assert second.try_take() and second.wait_until == 1600.0
    now[0] += 30  # waiting it out
    if ends == "released":
        second.release()
    else:
        second.renew()
        now[0] += 100
    third = lease("in-store-too", state_in_store=True)
    assert third.try_take() and third.wait_until == 1600.0
    now[0] = 1700.0  # once it can no longer land, the lease is as any other
    third.renew()
    now[0] += 100
    fourth = lease("in-store-at-last", state_in_store=True)
    assert fourth.try_take() and fourth.wait_until == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_lease_object_lost_under_a_run_synced_before_holds_no_sync_up(tmp_path: Path, server, api,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          damage: str) -> None:
    """The lease object of a run synced several times (generation 4) deleted (a cleanup, a
    lifecycle rule) or overwritten: the next syncer makes or takes one at generation 1, below
    the state's fence. Every sync of the run was then 'taken over by another syncer', one
    generation more each, until the count caught up: a live run followed for an hour, some
    hundreds of passes. Its lease still the one it wrote, no one took the run since it did,
    so it outranks the fence, and a holder of the old generation stops at its next renewal."""
    from support.store_runs import Fleet, live_run
    from support.sync_e2e import assert_exactly_once

    fleet = Fleet(tmp_path, server.base_url, monkeypatch)
    builder, _ = live_run(fleet.outputs / "eval-1", f"lease-{damage}", 1)
    fleet.mirror()
    assert fleet.sync("m").pushed_now == 1
    for _ in range(3):
        builder.add(1)
        fleet.mirror()
        assert fleet.sync("m").pushed_now == 1
    lease = tmp_path / "bucket" / "eval-1" / "spool" / "sync.lease.json"
    assert json.loads(lease.read_bytes())["generation"] == 4
    if damage == "deleted":
        lease.unlink()
    else:
        lease.write_bytes(b"{not a lease")
    builder.add(1)
    builder.seal()
    fleet.mirror()
    last = fleet.sync("m")
    assert (last.state, last.pushed_now) == ("synced", 1), last.error
    assert json.loads(lease.read_bytes())["generation"] == 5
    assert_exactly_once(api, builder)


moto = moto_server.module_fixture()


@pytest.mark.slow
def test_a_renewal_whose_answer_was_lost_after_the_retries_still_holds_the_lease(moto, monkeypatch) -> None:
    """A renewal S3 applied whose answer was lost on the way back (a proxy drops it), the
    store's retries spent. Its read back lost too, the renewal fails; the next one, refused
    for the etag it no longer has, read the object back, found a lease it did not recognise
    and said "taken over by another syncer": the holder gave up a run it still held, and
    the lease object, renewed, kept every other syncer off for a lease lifetime. The object
    holds this holder's own owner and generation, which no other syncer writes: it is still
    held, and renewed over. With only the write's answer lost, the renewal reads the object
    back before giving up and finds its own bytes: renewed (it failed, stopping the pass)."""
    from fixtures.fault_proxy import FaultProxy
    from prime_runs_spool.errors import StoreError
    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    bucket, key = moto.new_bucket(), "run/spool/sync.lease.json"
    with FaultProxy(moto.endpoint, paths=r"sync\.lease\.json$") as proxy:
        for name, value in moto.env(proxy.base_url).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("PRIME_RUNS_STORE_RETRIES", "0")
        store = ObjectStore(f"s3://{bucket}/p")
        lease = Lease(store, key, ttl=60, clock_skew=5)
        assert lease.try_take()
        proxy.set_rates({"drop_after": 1.0})  # every answer, the read back's too
        with pytest.raises(StoreError):
            lease.renew()
        proxy.set_rates({})
        assert "drop_after" in proxy.faults(), proxy.faults()
        lease.renew()  # LeaseLost before
        proxy.methods = frozenset({"PUT"})  # only the write's answer lost
        proxy.set_rates({"drop_after": 1.0})
        lease.renew()  # StoreError before
        proxy.set_rates({})
        held = json.loads(store.read(key)[0])
        assert (held["owner"], held["generation"], held["released"]) == (lease.owner, 1, False), held
        lease.renew()
        lease.release()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    other = Lease(ObjectStore(f"s3://{bucket}/p"), key, ttl=60, clock_skew=5)
    assert other.try_take() and other.generation == 2  # released: not held for a lease lifetime
    other.release()
