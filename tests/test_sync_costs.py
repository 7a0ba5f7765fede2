"""What the first sync of new runs costs in requests, against the local platform: the cost
per run that sets how long a sweep of thousands of small runs takes to sync
(benchmarks/sync_many.py; docs/benchmarks.md, "Where users feel it (issue 14)")."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from support.runs import build_run
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.many import sync_paths
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


def test_a_new_run_costs_a_lookup_a_create_its_samples_a_metadata_put_and_a_finalize(tmp_path: Path) -> None:
    """Per new completed run of one request of samples: the head of the listing, the create,
    the samples, the metadata PUT (whose answer is the count checked before finalizing: no
    GET of the evaluation) and the finalize; the environment is resolved once for all."""
    runs = 6
    for n in range(runs):
        build_run(tmp_path / "runs" / f"run-{n}", f"costs-{n}", 3)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        settings = Settings(platform.base_url, Secret("local"), None, platform.base_url)
        with CountingClient(settings) as client:
            reports = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions(), jobs=1)
    assert [r.state for r in reports] == ["synced"] * runs
    assert client.requests == {
        "POST /environmentshub/resolve": 1,
        "GET /evaluations/": runs,  # the first lists the environment, the others its head
        "POST /evaluations/": runs,
        "POST /evaluations/ID/samples": runs,
        "PUT /evaluations/ID": runs,
        "POST /evaluations/ID/finalize": runs,
    }, client.requests
