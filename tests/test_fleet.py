"""A fleet, end to end: several eval machines mirroring into one bucket while they write,
several syncers draining it at once, the platform behind the fault proxy.

Each "machine" is its own processes with its own HOME and output folder: a writer
(fixtures/fleet_writer.py, the public runner API) and ``prime-runs mirror OUT s3://...``.
One writer is SIGKILLed mid-run, and one syncer is SIGKILLed mid-drain and started again.
The syncers (``prime-runs sync s3://... --follow``, each its own HOME and cache, the state
in the bucket) run while the machines write. Then, for every run on every machine: one
evaluation, the episodes of its spool each once and in order, finalized once if it
completed and never if it crashed. benchmarks/fleet.py runs the same at scale.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.fault_proxy import FaultProxy, spread
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.spool.reader import iter_records
from support import moto_server
from support.env import CLI, child_env
from support.sync_e2e import TOKEN, api, evaluations_of, sample_ids, server, sync_cmd  # noqa: F401

moto = moto_server.module_fixture()

WRITER = Path(__file__).resolve().parent.parent / "fixtures" / "fleet_writer.py"
MACHINES, RUNS_PER_MACHINE, EPISODES, SYNCERS = 3, 2, 12, 2
#: A short lease, so a SIGKILLed syncer's runs are taken over within the test.
LEASE_TTL = 3.0
DRAIN_TIMEOUT = 120.0


def _spool_ids(run_dir: Path) -> list[str]:
    return [str(r.data["id"]) for r in iter_records(run_dir) if r.type == EPISODE]


def _start(argv: list[str], home: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"), **env))


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.communicate(timeout=60)


@pytest.mark.slow
def test_machines_mirroring_and_syncers_draining_one_bucket_land_each_episode_once(tmp_path: Path, server, api,
                                                                                   moto) -> None:
    url = f"s3://{moto.new_bucket()}/fleet"
    store_env = {**moto.env(), "PRIME_RUNS_LEASE_TTL": str(LEASE_TTL), "PRIME_RUNS_LEASE_CLOCK_SKEW": "0.5"}
    with FaultProxy(server.base_url, seed=3407, rates=spread(0.08), delay=2.0, retry_after=0) as proxy:
        machines = []
        for n in range(MACHINES):
            home = tmp_path / f"machine-{n}"
            (home / "outputs").mkdir(parents=True)
            writer = _start([sys.executable, str(WRITER), str(home / "outputs"), f"m{n}", str(RUNS_PER_MACHINE),
                             str(EPISODES), "--batch", "2", "--pause", "0.05"], home)
            # Each machine into its own prefix: run folders are named alike on every machine.
            mirror = _start([*CLI, "mirror", str(home / "outputs"), f"{url}/m{n}", "--interval", "0.2"], home,
                            **store_env)
            machines.append((home, writer, mirror))
        follow = [*sync_cmd(proxy.base_url, url, "--follow", "--poll-interval", "0.3", "--json"), "--timeout", "2"]
        syncers = [_start(follow, tmp_path / f"syncer-{m}", PRIME_API_KEY=TOKEN, **store_env) for m in range(SYNCERS)]
        # One machine dies mid-run: its writer SIGKILLed after a few of its first run's episodes.
        killed = machines[0][1]
        assert killed.stdout is not None
        while int(killed.stdout.readline().split()[1]) < 6:
            pass
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        # One syncer dies mid-drain (its leases expire), and is started again on its machine.
        time.sleep(1.0)
        syncers[0].send_signal(signal.SIGKILL)
        syncers[0].wait()
        syncers[0] = _start(follow, tmp_path / "syncer-0", PRIME_API_KEY=TOKEN, **store_env)
        for home, writer, mirror in machines[1:]:
            assert writer.wait(timeout=120) == 0, writer.stderr.read() if writer.stderr else ""
        for n, (home, _, mirror) in enumerate(machines):  # each mirror's last pass: every writer is gone now
            _stop(mirror)
            last = subprocess.run([*CLI, "mirror", "--once", str(home / "outputs"), f"{url}/m{n}"], capture_output=True,
                                  text=True, timeout=60, env=child_env(HOME=str(home), **store_env))
            assert last.returncode == 0, last.stderr
        expected = {}
        for home, _, _ in machines:
            for run_dir in sorted((home / "outputs").iterdir()):
                expected[json.loads((run_dir / "spool" / "seg-000001.jsonl").open().readline())["data"]["run_id"]] = \
                    (_spool_ids(run_dir), run_dir)
        assert len(expected) == 1 + (MACHINES - 1) * RUNS_PER_MACHINE  # the killed machine's second never began
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while True:  # drained: every episode held, and every completed run finalized (the crashed one never is)
            held = {run_id: [(e["total_samples"], e["finalize_count"]) for e in evaluations_of(api, run_id)]
                    for run_id in expected}
            if all(held[run_id] == [(len(ids), 0 if run_id == "fleet-m0-000" else 1)]
                   for run_id, (ids, _) in expected.items()):
                break
            if time.monotonic() > deadline:
                told = [_stop(syncer) for syncer in syncers]
                raise AssertionError(f"not drained: {held}; the syncers said: {told}"[-6000:])
            time.sleep(0.5)
        time.sleep(2 * 0.3 + 1)  # a pass or two more: the ends recorded, nothing sent twice meanwhile
        outputs = [_stop(syncer) for syncer in syncers]
        assert [syncer.returncode for syncer in syncers] == [0] * SYNCERS, [err for _, err in outputs]
        faults = set(proxy.faults())
    for run_id, (ids, run_dir) in expected.items():
        [evaluation] = evaluations_of(api, run_id)
        found = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
        assert sample_ids(api, found["evaluation_id"]) == ids, run_id
        assert found["total_samples"] == len(ids)
        crashed = run_id == "fleet-m0-000"
        assert found["finalize_count"] == (0 if crashed else 1), (run_id, found)
    assert len(expected["fleet-m0-000"][0]) >= 6
    reports = [json.loads(line) for out, _ in outputs for line in out.splitlines() if line.startswith("{")]
    assert not [r for r in reports if any("waited" in w for w in r.get("warnings", []))]
    assert faults, "the proxy injected no fault: the test proved less than it says"


@pytest.mark.slow
def test_each_syncer_starts_at_its_own_place_in_the_listing(tmp_path: Path, server, api, moto,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Two syncers started together must not walk the runs in the same order (each meeting
    the runs the other holds, then reading again the runs it just did): a sync begins at a
    random run of the listing and wraps around; its reports stay in key order."""
    from prime_runs_spool.store.objects import ObjectStore
    from prime_runs_spool.sync import claims, store_sync
    from support.runs import build_run
    from support.store_runs import upload_run
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import load_settings
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import remote_destination

    url = f"s3://{moto.new_bucket()}/order"
    for n in range(5):
        upload_run(url, build_run(tmp_path / f"run-{n}", f"order-{n}", 2).run_dir, f"run-{n}")
    monkeypatch.setattr(claims.random, "randrange", lambda count: 3)
    began: list[str] = []
    env = {"PRIME_API_KEY": TOKEN, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    with moto_server.environment(env):
        settings = load_settings(base_url=server.base_url, env=env)
        with PlatformClient(settings, timeout=5) as client:
            reports = store_sync.sync_store(
                url, client, remote_destination(settings.base_url, None), SyncOptions(), store=ObjectStore(url),
                jobs=1, on_progress=lambda report: None if report.path in began else began.append(report.path))
    assert [r.path.rsplit("/", 1)[-1] for r in reports] == [f"run-{n}" for n in range(5)]
    assert [p.rsplit("/", 1)[-1] for p in began] == ["run-3", "run-4", "run-0", "run-1", "run-2"]


#: Runs in the bucket the two syncers below start on together, and each one's --jobs.
MET_RUNS, MET_JOBS = 48, 2
#: A syncer run with its start in the listing fixed at the first run (a syncer's start is
#: ``random.randrange`` of the module; the jumps have their own generator).
_FIRST_RUN_FIRST = ("import random, runpy, sys; random.randrange = lambda count, *rest: 0; "
                    "sys.argv[0] = 'prime-runs'; runpy.run_module('commands', run_name='__main__')")


@pytest.mark.slow
def test_two_syncers_that_start_together_part_instead_of_meeting_on_every_run(tmp_path: Path, server, api,
                                                                                moto) -> None:
    """Two syncers started at the same run of one bucket (the worst case of a random start)
    must not leapfrog through it, each finding about every other run held by the other
    (a lease write refused, a read, a skip: 22 of 24 runs met so before the claim order
    jumped; 2 to 11 of 48 since, in 150 simulated drains). Counted, not timed: the runs
    skipped as another's are at most a quarter, and each run was synced by exactly one of
    them, whole."""
    from support.runs import build_run
    from support.store_runs import upload_run

    url = f"s3://{moto.new_bucket()}/met"
    with moto_server.environment(moto.env()):
        for n in range(MET_RUNS):
            upload_run(url, build_run(tmp_path / f"run-{n}", f"met-{n:02d}", 2).run_dir, f"run-{n:02d}")
    argv = [sys.executable, "-c", _FIRST_RUN_FIRST, *sync_cmd(server.base_url, url, "--json", "--jobs",
                                                               str(MET_JOBS))[len(CLI):]]
    syncers = [_start(argv, tmp_path / f"syncer-{m}", PRIME_API_KEY=TOKEN, **moto.env()) for m in range(2)]
    outputs = [syncer.communicate(timeout=120) for syncer in syncers]
    assert [syncer.returncode for syncer in syncers] == [0, 0], [err for _, err in outputs]
    reports = [report for out, _ in outputs for report in json.loads(out)["runs"]]
    synced = sorted(r["local_run_id"] for r in reports if r["state"] == "synced")
    assert synced == [f"met-{n:02d}" for n in range(MET_RUNS)]  # each run by one syncer
    assert all(r["pushed_now"] == 2 for r in reports if r["state"] == "synced")
    skipped = [r for r in reports if r["state"] == "skipped"]
    assert len(skipped) <= MET_RUNS // 4, f"{len(skipped)} runs met held by the other syncer"
    for run_id in synced:
        [evaluation] = evaluations_of(api, run_id)
        assert evaluation["total_samples"] == 2
