"""What the first sync of new runs costs in requests, against the local platform: the cost
per run that sets how long a sweep of thousands of small runs takes to sync
(benchmarks/sync_many.py; docs/benchmarks.md)."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import httpx

from support.runs import RunBuilder, build_run
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.many import sync_lock, sync_paths, sync_run
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import Destination

DEST = Destination(key="costs-dest", base_url="http://local")


class CountingClient(PlatformClient):
    """Counts requests by method and route (ids left out)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: Counter[str] = Counter()

    def _request(self, method, path, **kwargs):
        self.requests[f"{method} {re.sub(r'/evaluations/[^/]+', '/evaluations/ID', path)}"] += 1
        return super()._request(method, path, **kwargs)


def _evaluations(platform: EmbeddedPlatform) -> list[dict]:
    """Every evaluation on the platform, read without the client under test."""
    return httpx.get(f"{platform.base_url}/api/v1/evaluations/", params={"limit": 100}).json()["evaluations"]


def _sync(tmp_path: Path, platform: EmbeddedPlatform, paths: list[Path], *, jobs: int = 1,
          index: EvaluationIndex | None = None, run: Path | None = None) -> tuple[CountingClient, list]:
    settings = Settings(platform.base_url, Secret("local"), None, platform.base_url)
    with CountingClient(settings) as client:
        if run is not None:
            reports = [sync_run(run, client, DEST, SyncOptions(), index=index)]
        else:
            reports = sync_paths(paths, client, DEST, SyncOptions(), jobs=jobs)
    return client, reports


def test_a_new_run_costs_a_create_its_samples_and_a_finalize(tmp_path: Path) -> None:
    """Per new completed run of one request of samples: the create (carrying the metadata),
    the samples and the finalize (carrying the metrics), nothing else. The environment is
    listed once for all the runs (none of them was ever synced on this machine, so no
    evaluation can carry their ids but those listed), and resolved once; no metadata PUT, no
    read of the count before finalizing (this pass created the evaluation and had every
    answer). What the platform then holds is what the PUT gave it before."""
    runs = 6
    builders = [build_run(tmp_path / "runs" / f"run-{n}", f"costs-{n}", 3) for n in range(runs)]
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        client, reports = _sync(tmp_path, platform, [tmp_path / "runs"], jobs=3)
        evaluations = {e["metadata"]["local_run_id"]: e for e in _evaluations(platform)}
    assert [r.state for r in reports] == ["synced"] * runs
    assert client.requests == {
        "POST /environmentshub/resolve": 1,
        "GET /evaluations/": 1,
        "POST /evaluations/": runs,
        "POST /evaluations/ID/samples": runs,
        "POST /evaluations/ID/finalize": runs,
    }, client.requests
    for builder in builders:
        evaluation = evaluations[builder.run_id]
        summary = SummaryAccumulator()
        for record in iter_records(builder.run_dir):
            if record.type == EPISODE:
                summary.add(record.data)
        assert evaluation["status"] == "COMPLETED" and evaluation["metrics"] == summary.result(), evaluation
        assert evaluation["metadata"]["local_run_id"] == builder.run_id and "model" in evaluation["metadata"]


def test_a_copy_synced_by_another_sync_after_the_listing_is_found_not_created_again(tmp_path: Path) -> None:
    """The listing answers only for runs no copy on this machine ever synced: a copy of a
    run that another sync pushed after this sync listed the environment (its copy lock then
    has a note) is looked for at the head of the listing again, and its evaluation adopted."""
    build_run(tmp_path / "first" / "run", "costs-copied", 3)
    build_run(tmp_path / "other" / "run", "costs-other", 2)
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    index = EvaluationIndex(answers_new_runs=True)  # this sync's, listed before the copy was synced
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, (other,) = _sync(tmp_path, platform, [], run=tmp_path / "other" / "run", index=index)
        _, (first,) = _sync(tmp_path, platform, [tmp_path / "first"])  # another sync, its own listing
        client, (second,) = _sync(tmp_path, platform, [], run=tmp_path / "second" / "run", index=index)
        evaluations = _evaluations(platform)
    assert (other.state, first.state) == ("synced", "synced")
    assert (second.state, second.pushed_now) == ("synced", 0), (second.state, second.error, second.warnings)
    assert second.evaluation_id == first.evaluation_id
    assert len(evaluations) == 2
    assert client.requests["GET /evaluations/"] >= 1 and "POST /evaluations/" not in client.requests


def test_a_run_whose_metadata_changed_since_its_create_is_sent_it_again(tmp_path: Path) -> None:
    """A run synced while live, then crashed and resumed to completion: its end is recorded
    with a PUT (the crash), and the completion's metadata, which no longer says it crashed,
    goes with one more PUT before the finalize; a run finished with nothing changed since its
    create sends none (the test above)."""
    builder = RunBuilder(tmp_path / "runs" / "run", "costs-resumed")
    builder.open_segment()
    builder.add(2)
    builder.abandon()
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        crashed_client, (crashed,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        builder.open_segment()
        builder.add(2)
        builder.seal()
        client, (completed,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{completed.evaluation_id}").json()
    assert (crashed.state, completed.state) == ("crashed", "synced")
    assert crashed_client.requests["PUT /evaluations/ID"] == 2  # the run's end, then its status
    assert client.requests["PUT /evaluations/ID"] == 1 and client.requests["POST /evaluations/ID/finalize"] == 1
    assert "prime_runs" not in evaluation["metadata"] and evaluation["status"] == "COMPLETED"


def test_a_run_already_synced_is_answered_without_its_lock_and_without_a_request(tmp_path: Path) -> None:
    """A no-op re-sync answers an up-to-date run in the discovering thread from its state and
    the first lines of its spool (RunSync.probe): held by another sync, it is still
    ``up_to_date``, not ``skipped``, and the platform is asked nothing."""
    build_run(tmp_path / "runs" / "run", "costs-noop", 3)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, (first,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        lock = sync_lock(tmp_path / "runs" / "run")
        lock.acquire()
        try:
            client, (again,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        finally:
            lock.release()
    assert first.state == "synced"
    assert (again.state, again.local_run_id, again.evaluation_id) == ("up_to_date", "costs-noop", first.evaluation_id)
    assert not client.requests
