"""The evaluations of an environment, listed once per sync and kept current cheaply; and
the environments' ids, resolved once per sync.

A run whose state is new or lost must find out whether an evaluation already carries its
local run id before it creates one (sync/evaluation.py). Listing every evaluation of the
environment for every such run made the first sync of many new runs quadratic: each of
2,000 runs paged through the up to 2,000 evaluations the runs before it had made.

One index serves every run of a ``sync_paths`` call (and of a follower). It pages through
the environment's evaluations once; after that, each lookup first asks the platform how
many there are and reads from the head of the listing (newest first) only what it has not
seen. The count is what makes this safe whatever the platform's order: when what is known
plus what was just read does not add up to the platform's total, the index lists the whole
environment again. A lookup therefore sees every evaluation that existed when it started,
as a full listing would, at the cost of one small request when nothing new appeared.

Resolving an environment by name is a get-or-create that answers the same id every time, so
the runs of one sync resolve each name once (a request per new run saved).

What the count cannot see: an evaluation deleted while another was created in the same
window leaves the total unchanged. Deleting evaluations during a sync is outside what sync
promises (docs/sync.md, "Assumptions").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

#: Reads one page of an environment's listing: ``(skip, limit) -> {evaluations, total}``.
PageReader = Callable[[int, int], Mapping[str, Any]]

#: Evaluations read per request when paging.
PAGE = 100


class _Environment:
    """What is known of one environment's evaluations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded = False
        #: evaluation id -> the listing's item for it (its ``metadata`` identifies the run).
        self.items: dict[str, Mapping[str, Any]] = {}


def _item_id(item: Mapping[str, Any]) -> str:
    return str(item.get("evaluation_id") or item.get("id"))


class EvaluationIndex:
    """Evaluations by environment, shared by the runs of one sync; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._environments: dict[str, _Environment] = {}
        self._environment_ids: dict[str, str] = {}
        self._resolving = threading.Lock()

    def environment_id(self, name: str, resolve: Callable[[], str]) -> str:
        """The id of environment ``name``: ``resolve()`` the first time, remembered after."""
        with self._resolving:  # one resolution at a time: each name is asked for once
            known = self._environment_ids.get(name)
            if known is None:
                known = self._environment_ids[name] = resolve()
            return known

    def _environment(self, name: str) -> _Environment:
        with self._lock:
            return self._environments.setdefault(name, _Environment())

    def find(self, environment: str, read_page: PageReader, match: Callable[[Mapping[str, Any]], bool]
             ) -> list[Mapping[str, Any]]:
        """Every evaluation of ``environment`` that ``match`` accepts, as of now."""
        known = self._environment(environment)
        with known.lock:
            if not known.loaded or not self._caught_up(known, read_page):
                self._reload(known, read_page)
            return [item for item in known.items.values() if match(item)]

    def add(self, environment: str, item: Mapping[str, Any]) -> None:
        """An evaluation this sync just created: known without reading it back."""
        known = self._environment(environment)
        with known.lock:
            if known.loaded:
                known.items[_item_id(item)] = item

    @staticmethod
    def _reload(known: _Environment, read_page: PageReader) -> None:
        items: dict[str, Mapping[str, Any]] = {}
        skip = 0
        while True:
            page = read_page(skip, PAGE)
            batch = page.get("evaluations") or []
            for item in batch:
                items[_item_id(item)] = item
            skip += len(batch)
            if not batch or skip >= int(page.get("total") or 0):
                break
        known.items = items
        known.loaded = True

    @staticmethod
    def _caught_up(known: _Environment, read_page: PageReader) -> bool:
        """Read the head of the listing until a known evaluation; True when the counts then
        agree with the platform's total (else the caller lists everything again).

        Each read starts at the head, twice as long as the one before (1, 2, 4... up to
        PAGE items), rather than at the offset where the last one stopped: evaluations
        created meanwhile (by this sync's other jobs, say) push the older ones down the
        listing, so a read at an offset would skip the new ones and the count would not add
        up, costing a listing of the whole environment. With 8 jobs on 2,000 new runs that
        happened for most lookups (7,385 listing reads, quadratic); read from the head, a
        lookup sees every evaluation created before its last read began."""
        limit = 1  # the first look is one item: usually nothing is new
        while True:
            page = read_page(0, limit)
            batch = page.get("evaluations") or []
            total = int(page.get("total") or 0)
            fresh: dict[str, Mapping[str, Any]] = {}
            reached_known = False
            for item in batch:
                if _item_id(item) in known.items:
                    reached_known = True
                    break
                fresh[_item_id(item)] = item
            if reached_known or len(batch) < limit:  # a known one, or the listing's end
                known.items.update(fresh)
                return len(known.items) == total
            if limit >= PAGE:
                return False  # more than a page is new: list everything again
            limit = min(PAGE, 2 * limit)
