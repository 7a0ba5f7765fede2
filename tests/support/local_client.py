"""Platform clients that drive sync in-process against the embedded local platform."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings


def local_settings(platform: EmbeddedPlatform) -> Settings:
    """What a client of ``platform`` is made with: its address, and a key it does not check."""
    return Settings(platform.base_url, Secret("local"), None, platform.base_url)


class CountingClient(PlatformClient):
    """Counts what sync costs the platform: ``requests`` by method and route (ids left out),
    and ``listed``, the evaluations that listings handed back (the work a lookup costs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: Counter[str] = Counter()
        self.listed = 0

    def _request(self, method, path, **kwargs):  # noqa: ANN001, ANN202
        self.requests[f"{method} {re.sub(r'/evaluations/[^/]+', '/evaluations/ID', path)}"] += 1
        return super()._request(method, path, **kwargs)

    def list_evaluations(self, **kwargs):  # noqa: ANN003, ANN201
        page = super().list_evaluations(**kwargs)
        self.listed += len(page.get("evaluations") or [])
        return page
