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

A run that no copy on this machine ever synced (its copy lock has no note, sync/copies.py)
is looked for in the listing alone, with no read of the head: an evaluation carrying its id
made since the listing began would have been made by a pass holding that lock, which leaves
a note. So the first sync of many new runs lists each environment once and makes no request
per run to find them (``answers_new_runs``). A one-shot sync sets it for as long as it runs:
its listing is as old as the sync. A follower runs for hours, so its listing answers only
while it was brought current less than :data:`FOLLOWER_ANSWERS_FOR` seconds ago, about as long
as a one-shot sync of a few thousand runs takes; older, the head is read first, which brings
it current again. So a burst of new runs (a sweep starting) costs a follower one small read,
not one a run. In an object store the lease plays the copy lock's part: a run whose lease this
syncer made (no syncer ever held the run) is answered by the listing alike
(sync/store_sync.py), whatever machine the syncers run on.

What the count cannot see: an evaluation deleted while another was created in the same
window leaves the total unchanged. Deleting evaluations during a sync is outside what sync
promises (docs/sync.md, "What it assumes of the platform").
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

#: Reads one page of an environment's listing: ``(skip, limit) -> {evaluations, total}``.
PageReader = Callable[[int, int], Mapping[str, Any]]

#: What identifies the run an evaluation belongs to: ``(local run id, replay id or None)``.
RunKey = tuple[str, "str | None"]

#: Evaluations read per request when paging.
PAGE = 100

#: Seconds a follower's listing answers for a run no copy on this machine ever synced, after
#: it was last brought current (the module's docstring says why).
FOLLOWER_ANSWERS_FOR = 30.0


class _Environment:
    """What is known of one environment's evaluations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded = False
        #: evaluation id -> the listing's item for it (its ``metadata`` identifies the run).
        self.items: dict[str, Mapping[str, Any]] = {}
        #: The same items by the run they belong to (:func:`run_key`), so a lookup costs
        #: the same whatever the number of evaluations: scanning them all for each new
        #: run made the first sync of 2,000 runs quadratic again (about 1,000 items scanned a
        #: new run, Dec 2).
        self.by_run: dict[RunKey, dict[str, Mapping[str, Any]]] = {}
        #: Creates of this sync sent and not yet added: the head of the listing may hold
        #: as many evaluations this index does not know yet.
        self.creating = 0
        #: When (``time.monotonic``) the listing was last read whole or found caught up.
        self.current_at = -math.inf

    def put(self, item: Mapping[str, Any]) -> None:
        item_id = _item_id(item)
        old = self.items.get(item_id)
        if old is not None:
            self.by_run.get(run_key(old), {}).pop(item_id, None)
        self.items[item_id] = item
        key = run_key(item)
        if key is not None:
            self.by_run.setdefault(key, {})[item_id] = item


def _item_id(item: Mapping[str, Any]) -> str:
    return str(item.get("evaluation_id") or item.get("id"))


def run_key(item: Mapping[str, Any]) -> RunKey | None:
    """The run an evaluation of the listing belongs to, from its metadata (sync/evaluation.py
    writes ``local_run_id``, and ``replay_id`` for a replay); None for one that names no run."""
    metadata = item.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    local_run_id, replay_id = metadata.get("local_run_id"), metadata.get("replay_id")
    if not isinstance(local_run_id, str) or not (replay_id is None or isinstance(replay_id, str)):
        return None
    return (local_run_id, replay_id)


class EvaluationIndex:
    """Evaluations by environment, shared by the runs of one sync; thread-safe.
    ``answers_new_runs``: a run no copy on this machine ever synced is found in the listing
    as read once (the module's docstring says why that is enough), not read again;
    ``answers_for``: only while the listing was brought current less than that many seconds
    ago (a follower's), else the head is read first."""

    def __init__(self, *, answers_new_runs: bool = False, answers_for: float = math.inf,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.answers_new_runs = answers_new_runs
        self.answers_for = answers_for
        self._clock = clock
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

    def find(self, environment: str, read_page: PageReader, run: RunKey, *,
             never_held: bool = False) -> list[Mapping[str, Any]]:
        """Every evaluation of ``environment`` that belongs to ``run`` (:func:`run_key`), as
        of now, in listing order. ``never_held``: no copy of the run on this machine ever
        held its copy lock, so with ``answers_new_runs`` the listing already read answers."""
        known = self._environment(environment)
        with known.lock:
            if (known.loaded and never_held and self.answers_new_runs
                    and self._clock() - known.current_at < self.answers_for):
                pass  # the listing as read (and this sync's own creates) answers
            else:
                started = self._clock()
                if not known.loaded or not self._caught_up(known, read_page):
                    self._reload(known, read_page)
                known.current_at = started
            return list(known.by_run.get(run, {}).values())

    @contextmanager
    def creating(self, environment: str) -> Iterator[None]:
        """Around a create of this sync, from before it is sent until :meth:`add` (or its
        failure): while it lasts, lookups read that many more items at the head at first."""
        known = self._environment(environment)
        with self._lock:
            known.creating += 1
        try:
            yield
        finally:
            with self._lock:
                known.creating -= 1

    def add(self, environment: str, item: Mapping[str, Any]) -> None:
        """An evaluation this sync just created: known without reading it back."""
        known = self._environment(environment)
        with known.lock:
            if known.loaded:
                known.put(item)

    @staticmethod
    def _reload(known: _Environment, read_page: PageReader) -> None:
        fresh = _Environment()
        skip = 0
        while True:
            page = read_page(skip, PAGE)
            batch = page.get("evaluations") or []
            for item in batch:
                fresh.put(item)
            skip += len(batch)
            if not batch or skip >= int(page.get("total") or 0):
                break
        known.items, known.by_run = fresh.items, fresh.by_run
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
        lookup sees every evaluation created before its last read began.

        The first read is one item (usually nothing is new), plus one for each create of
        this sync in flight: those may have landed at the head before their answers were
        added here, and with 8 jobs a read of one item met one of them often enough to
        make a lookup 1.6-1.7 reads (8 jobs, Dec 2, benchmarks/sync_many_cpu.py)."""
        limit = min(PAGE, 1 + known.creating)
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
                for item in fresh.values():
                    known.put(item)
                return len(known.items) == total
            if limit >= PAGE:
                return False  # more than a page is new: list everything again
            limit = min(PAGE, 2 * limit)
