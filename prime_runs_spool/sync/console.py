"""What a sync tells a person, and how a followed sync ends: shared by ``prime-runs sync``
(commands/sync.py) and ``python -m prime_runs_spool.sync`` (the online shipper's child),
so both print the same lines and exit with the same codes (docs/cli.md)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import orjson

from prime_runs_spool.errors import MESSAGE_PREFIX, Stopped
from prime_runs_spool.files import printable_data, shown
from prime_runs_spool.plural import episodes
from prime_runs_spool.store.lease import release_held
from prime_runs_spool.sync.options import DRY_RUN, FAILED_STATES, RunReport
from prime_runs_spool.sync.options import (  # noqa: F401  (re-exported: defined once, in options)
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_TIMEOUT,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
)

if TYPE_CHECKING:  # the follower (and its inotify watch) is imported only for --follow
    from prime_runs_spool.sync.follow import Follower


def json_report(document: object, *, indent: bool = False) -> str:
    """``document`` as the JSON text every ``--json`` report prints. A path under a folder
    whose name is not UTF-8 holds lone surrogates, which orjson refuses: then, and only
    then, every string is made printable first (``files.printable_data``), so such a
    folder is named in the report instead of the report ending in a traceback."""
    option = orjson.OPT_INDENT_2 if indent else 0
    try:
        return orjson.dumps(document, option=option).decode()
    except TypeError:
        return orjson.dumps(printable_data(document), option=option).decode()


def exit_code(reports: Iterable[RunReport]) -> int:
    """0 when every run got where it should, 1 when some run failed."""
    return EXIT_RUN_FAILED if any(r.state in FAILED_STATES for r in reports) else EXIT_OK


def report_lines(report: RunReport, told: set[str] | None = None, dry_run: bool = False) -> list[str]:
    """One run's report as the human-readable lines the commands print. ``told``: the
    notices (``RunReport.notices``, the destination's) said already by this sync, each said
    under the first run that has it, so a sync of many runs says it once. ``dry_run``: the
    sync sent nothing, so a run that ended otherwise than ``dry_run`` (damaged: ``corrupt``)
    says what it would push too, not "pushed 1 (total 0)"."""
    line = f"{report.state:<10} {shown(report.path)}"
    if report.evaluation_id:
        line += f"  evaluation {report.evaluation_id}"
    if report.state == DRY_RUN or dry_run:  # nothing was sent: what a sync would send, and what it sent before
        line += f"  would push {report.pushed_now} ({report.pushed_total} pushed before)"
    else:
        line += f"  pushed {report.pushed_now} (total {report.pushed_total})"
    if report.store:
        line += f" to {report.store}"
    if report.copy_of:
        line += f"  (a copy of {shown(report.copy_of)}, synced already)"
    if report.url:
        line += f"  {report.url}"
    lines = [line]
    if report.held_back:
        lines.append(f"  held back: {episodes(report.held_back)} that errored, kept for a --resume to retry; "
                     "sent once the run completes (docs/sync.md, \"Resumed runs\")")
    notices = [n for n in report.notices if told is None or n not in told]
    if told is not None:
        told.update(notices)
    lines += [f"  warning: {shown(warning)}" for warning in (*notices, *report.warnings)]
    if report.error:
        lines.append(f"  error: {shown(report.error)}")
    return lines


def event_printer(as_json: bool, echo: Callable[[str], None], flush: Callable[[], None]
                  ) -> Callable[[RunReport], None]:
    """While following: one line per change of a run's state (a JSON object with --json)."""
    told: set[str] = set()

    def emit(report: RunReport) -> None:
        if as_json:
            echo(json_report(report.as_json()))
        else:
            for line in report_lines(report, told):
                echo(line)
        flush()

    return emit


def follow_until_stopped(follower: Follower) -> int:
    """Follow until SIGINT/SIGTERM (exit 0) or, with ``exit_when_idle``, until idle (exit 1
    when a run ended in error); returns the exit code. The first signal stops at the next
    step boundary; a second one stops at once (still safe: the state is consistent at
    every instant)."""

    def on_signal(signum: int, frame: object) -> None:
        if follower.stop.is_set():
            raise Stopped
        follower.stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    try:
        reports = follower.run()
    except Stopped:  # the second: its passes not waited for, their leases given up unless in doubt
        reports = []
        for line in release_held():
            sys.stderr.write(f"{MESSAGE_PREFIX}{line}\n")
    if follower.stop.is_set():
        return EXIT_OK
    return exit_code(reports)
