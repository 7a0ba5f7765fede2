"""``prime-runs sync s3://... --follow``: following spools that lie in an object store.

A store tells nobody when an object changes, and no writer lock travels to it: a run is
*live* there only while ``prime-runs mirror`` keeps its live marker fresh
(store/source.py); a live run copied by any other tool reads as a crashed run between
uploads. So following a store is a sync pass over its URLs every ``interval`` seconds (sync/store_sync.py
does the pass, exactly once as ever; its state and lease say where the last pass got to),
reporting each run whose state changed or that had episodes pushed (a pass that reads a
segment while it is being uploaded again reports that run's ``error`` and the next pass
reads it whole: nothing is lost or sent twice).

*Idle* means here: a pass that pushed nothing, changed no run's state, found no run
another syncer holds and no run live (a mirrored writer still running), so
``exit_when_idle`` ends the follow once the mirrors' runs have ended and all is shipped:
what a CI job draining a bucket wants. The interval defaults to
:data:`STORE_POLL_INTERVAL`, not the local follower's 0.1 s: each pass lists the prefix and
reads each run's state, and a store bills every request (docs/sync.md, "Object stores").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from prime_runs_spool.errors import StoreError, StoreSetupError
from prime_runs_spool.signal_event import SignalEvent
from prime_runs_spool.spool.format import LIVE
from prime_runs_spool.sync.follow import DONE_STATES
from prime_runs_spool.sync.options import GONE, SKIPPED, UP_TO_DATE, RunReport

#: Seconds between two passes over a store when ``--poll-interval`` is not given.
STORE_POLL_INTERVAL = 10.0


def is_news(report: RunReport, seen: dict[str, tuple[str, int]], held: set[str]) -> bool:
    """Whether ``report`` tells of a change since the run's last one, noting it in ``seen``
    (each run's last state and total, a lease held elsewhere aside) and ``held`` (runs whose
    last report was ``skipped``). A run left ``synced`` or ``crashed`` (an upload still to
    come) reads ``up_to_date`` at the next pass: still what it was, no news, unless another
    machine pushed meanwhile (its total grew). ``skipped`` (another syncer's lease) is told
    once while it lasts, and the pass after it is judged against what the run was before."""
    path = report.path
    if report.state == SKIPPED:
        new = path not in held
        held.add(path)
        return new
    held.discard(path)
    before = seen.get(path)
    state = report.state
    if state == UP_TO_DATE and before is not None and before[0] in DONE_STATES:
        state = before[0]
    seen[path] = (state, report.pushed_total)
    return bool(report.pushed_now) or seen[path] != before


class StoreFollower:
    """Sync passes over ``urls`` until ``stop`` is set (or, with ``exit_when_idle``, until a
    pass finds nothing to do). The interface of sync/follow.py's ``Follower`` that
    ``sync.console.follow_until_stopped`` drives: ``stop`` and ``run``."""

    def __init__(self, urls: Sequence[str], sync_pass: Callable[[str], list[RunReport]], *,
                 interval: float = STORE_POLL_INTERVAL, exit_when_idle: bool = False,
                 on_report: Callable[[RunReport], None] = lambda report: None,
                 on_error: Callable[[str], None] = lambda message: None,
                 stop: threading.Event | None = None) -> None:
        self.urls = list(urls)
        self.sync_pass = sync_pass
        self.interval = interval
        self.exit_when_idle = exit_when_idle
        self.on_report = on_report
        self.on_error = on_error
        #: Set by SIGINT/SIGTERM; give the same event to ``sync_pass`` (sync_store's ``stop``)
        #: so that a pass under way ends at its next wait, not minutes later.
        self.stop = stop if stop is not None else SignalEvent()
        #: Per run, whether its last report left it with nothing to follow (``DONE_STATES``):
        #: what the line of a stopped follow counts, as a local follower's runs.
        self.finished: dict[str, bool] = {}

    def run(self) -> list[RunReport]:
        """Follow; returns the last pass's reports (their exit code is the follow's when it
        ends idle). A store that fails on the first pass raises, as a plain sync would; on a
        later one the error is told (``on_error``) and the next pass tries again."""
        seen: dict[str, tuple[str, int]] = {}
        held: set[str] = set()
        reports: list[RunReport] = []
        last: dict[str, dict[str, RunReport]] = {url: {} for url in self.urls}  # each URL's runs, as last reported
        first = True
        while not self.stop.is_set():
            reports, changed = [], first
            for url in self.urls:
                if self.stop.is_set():  # a stop during one URL's pass: not the next URL's
                    break
                try:
                    found = self.sync_pass(url)
                except StoreSetupError:
                    raise
                except StoreError as exc:
                    if first:
                        raise
                    self.on_error(f"{url}: {exc} (trying again in {self.interval:g} s)")
                    changed = True  # not idle: that pass found nothing, it did not look
                    continue
                for report in found:
                    self.finished[report.path] = report.state in DONE_STATES
                    if is_news(report, seen, held):
                        self.on_report(report)
                        changed = True
                if not self.stop.is_set():  # a pass a stop ended may not have reached every run
                    changed = self._gone(last[url], found, seen, held) or changed
                # Not idle while another syncer holds a run (it may be one killed mid-pass,
                # its lease still to expire): that run is not done, only not ours yet.
                # Nor while a mirrored writer is live: its run has more to come.
                changed = changed or any(report.state in (SKIPPED, LIVE) for report in found)
                reports += found
            first = False
            if self.exit_when_idle and not changed:
                break
            self.stop.wait(self.interval)
        return reports

    def _gone(self, last: dict[str, RunReport], found: list[RunReport], seen: dict[str, tuple[str, int]],
              held: set[str]) -> bool:
        """Say ``gone``, once, of each run an earlier pass over the URL found and this one did
        not (deleted from the store, or moved elsewhere in it: then found as a new path), as
        a local follower says it of a folder deleted or moved away; it was dropped without a
        word. ``last``: the URL's runs as last reported, updated to ``found``. Whether any went."""
        now = {report.path: report for report in found}
        went = [before for path, before in last.items() if path not in now]
        for before in went:
            seen.pop(before.path, None)
            held.discard(before.path)
            self.finished.pop(before.path, None)  # counted no more, as a local follower's
            self.on_report(RunReport(
                path=before.path, state=GONE, local_run_id=before.local_run_id, name=before.name,
                evaluation_id=before.evaluation_id, url=before.url, pushed_total=before.pushed_total,
                store=before.store, error="it is no longer in the store (deleted, or moved elsewhere in it); followed no "
                                          "more (what was pushed stays on the platform)"))
        last.clear()
        last.update(now)
        return bool(went)
