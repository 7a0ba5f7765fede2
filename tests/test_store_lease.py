"""The lease a syncer holds on a run in a store: what counts as a lease, and the settings
that tune it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from support.cli import last_line, run_cli


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
