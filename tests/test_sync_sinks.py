"""The sink contract (prime_runs_spool/sync/sinks/): a destination is one module.

A third sink, in memory, registered from tests/support/memory_sink.py alone, syncs a run
exactly once through the fault proxy and through SIGKILLs of the syncing process: what the
pass gives a sink (sync/sinks/base.py) is enough for a destination it has never heard of."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.fault_proxy import AFTER_FAULTS, BEFORE_FAULTS, FAULTS, FaultProxy, spread
from support.env import REPO_ROOT, child_env
from support.memory_sink import URL_ENV, MemorySink
from support.memory_store import MemoryStore
from support.runs import RunBuilder
from support.sync_e2e import TOKEN, api, evaluations_of, kill_on_progress, server  # noqa: F401

KILLS = int(os.environ.get("PRIME_RUNS_SYNC_KILLS", "10"))
FAULT_SEED = int(os.environ.get("PRIME_RUNS_FAULT_SEED", "1129"))


def mixed_run(run_dir: Path, run_id: str, episodes: int) -> tuple[RunBuilder, list[str]]:
    """A completed run whose every fifth episode errored: those are held back until the
    seal and then released, so both of a sink's paths carry episodes. Returns the builder and
    the episode ids in the order the sink must hold them."""
    builder = RunBuilder(run_dir, run_id)
    builder.open_segment()
    errored: list[str] = []
    while builder.count < episodes:
        builder.add(4)
        builder.add(1, ok=False)
        errored.append(builder.ids[-1])
    builder.seal()
    return builder, [i for i in builder.ids if i not in errored] + errored


def sync_child(runs: Path, base_url: str, sink_url: str) -> tuple[list[str], dict[str, str]]:
    """The command syncing ``runs`` to the memory sink at ``sink_url`` in a child process, and its environment."""
    env = child_env(PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'tests'}", **{URL_ENV: sink_url})
    return [sys.executable, "-m", "support.memory_store", str(runs), base_url, TOKEN], env


def held_once(store: MemoryStore, api, builder: RunBuilder, expected: list[str]) -> None:  # noqa: F811
    """One evaluation, finalized once, holding no samples; the memory store holds each
    episode once, in the order sync sends them, stamped with that evaluation."""
    (evaluation,) = evaluations_of(api, builder.run_id)
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert evaluation["finalize_count"] == 1 and evaluation["total_samples"] == 0
    lines = store.lines(evaluation["evaluation_id"])
    assert [line["id"] for line in lines] == expected
    assert store.lines() == lines  # nothing under any other run id


@pytest.mark.slow
def test_a_sink_in_one_file_syncs_exactly_once_through_faults_and_sigkills(tmp_path: Path, server, api) -> None:  # noqa: F811
    """SIGKILL the syncing process (PRIME_RUNS_SYNC_KILLS times, default 10) on observed
    progress, every request to the memory store meeting a fault 30% of the time (every
    kind, those that lose the answer after the store kept the batch included); then sync
    until the run is synced. Each episode is in the store once."""
    builder, expected = mixed_run(tmp_path / "runs" / "run", "sink-memory-kills", 12 * KILLS)
    rng = random.Random(20261206)
    with MemoryStore() as store, FaultProxy(store.base_url, seed=FAULT_SEED, rates=spread(0.3), delay=3.0,
                                            retry_after=0) as proxy:
        cmd, env = sync_child(tmp_path / "runs", server.base_url, proxy.base_url)
        kills = runs = 0
        while kills < KILLS and runs < 3 * KILLS:
            runs += 1
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            kills += kill_on_progress(proc, lambda: len(store.lines()), rng.randint(1, 8))
            proc.wait()
        assert kills >= KILLS, f"only {kills} of {runs} syncs were still running when killed"
        for _ in range(5):
            final = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
            (report,) = json.loads(final.stdout)
            if report["state"] == "synced":
                break
        seen = set(proxy.faults())
    assert (report["state"], report["store"]) == ("synced", MemorySink.name), final.stdout + final.stderr
    held_once(store, api, builder, expected)
    assert seen & set(AFTER_FAULTS) and seen & set(BEFORE_FAULTS), seen


@pytest.mark.slow
def test_a_registered_sink_is_recorded_chosen_again_and_kept_to(tmp_path: Path, server, api) -> None:  # noqa: F811
    """In this process: the run goes to the memory sink through faults, a second sync has
    nothing to do, the state records the sink by name, and ``--to samples`` is refused for
    the run, as for the built-in sinks."""
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import remote_destination

    builder, expected = mixed_run(tmp_path / "runs" / "run", "sink-memory-here", 20)
    settings = Settings(base_url=server.base_url, api_key=Secret(TOKEN), team_id=None, frontend_url=server.base_url)
    backoff = Backoff(base=0.01, cap=0.05, max_attempts=50)
    destination = remote_destination(server.base_url, None)

    def sync(to: str) -> object:
        with PlatformClient(settings, timeout=5) as client:
            (report,) = sync_paths([tmp_path / "runs"], client, destination,
                                   SyncOptions(to=to, request_lifetime=1.0, backoff=backoff), jobs=1)
        return report

    with MemoryStore() as store, FaultProxy(store.base_url, seed=FAULT_SEED, rates=spread(0.3, FAULTS), delay=3.0,
                                            retry_after=0) as proxy:
        os.environ[URL_ENV] = proxy.base_url
        try:
            first, again = sync(MemorySink.name), sync(MemorySink.name)
            refused = sync(SAMPLES)
        finally:
            del os.environ[URL_ENV]
    assert (first.state, first.store, first.pushed_now) == ("synced", MemorySink.name, len(expected)), first
    assert (again.state, again.pushed_now) == ("up_to_date", 0)
    assert refused.state == "error" and "went to memory on this destination, not samples" in refused.error
    (state_file,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    assert json.loads(state_file.read_bytes())["store"] == MemorySink.name
    held_once(store, api, builder, expected)
