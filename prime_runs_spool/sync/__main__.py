"""``python -m prime_runs_spool.sync``: sync (or follow) runs to the remote platform.

The library's own entry point, so the online shipper (runner/online.py) can start a sync
with nothing but this package and ``sys.executable``: the command line in ``commands/``
is not needed at run time. It takes the remote subset of ``prime-runs sync``'s options,
with the same defaults, environment variables, output lines and exit codes
(docs/cli.md); ``--local``, ``--replay`` and ``--dry-run`` stay with ``prime-runs sync``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


from prime_runs_spool.errors import InvalidSettingsError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import load_settings
from prime_runs_spool.sync.console import (
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_TIMEOUT,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    event_printer,
    json_report,
    exit_code,
    follow_until_stopped,
    report_lines,
)
from prime_runs_spool.sync.options import (AUTO, COPY_WAIT_ENV, DEFAULT_COPY_WAIT, DEFAULT_JOBS,
                                           DEFAULT_REQUEST_LIFETIME, SINK_ENV, SINKS, SyncOptions,
                                           seconds_problem)
from prime_runs_spool.sync.follow import FollowOptions, Follower
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.memory import return_large_blocks_promptly
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import remote_destination


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every usage error
        self.exit(EXIT_USAGE, f"prime-runs: {message}\n")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return _seconds(0.0)(raw)
    except (ValueError, argparse.ArgumentTypeError):
        sys.stderr.write(f"prime-runs: {name}={raw!r} is not a finite number of seconds, at least 0\n")
        sys.exit(EXIT_USAGE)


def _seconds(minimum: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds of at least ``minimum`` (as the
    command line's ``Seconds``; sync/options.py, ``seconds_problem``)."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        problem = seconds_problem(value, minimum)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return convert


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m prime_runs_spool.sync", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[Path(".")])
    parser.add_argument("--base-url")
    parser.add_argument("--team")
    parser.add_argument("--jobs", "-j", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--json", dest="as_json", action="store_true")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--copy-wait", type=_seconds(0.0))
    parser.add_argument("--timeout", type=_seconds(0.1), default=DEFAULT_TIMEOUT)
    parser.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS)
    parser.add_argument("--request-lifetime", type=_seconds(0.0))
    parser.add_argument("--backoff-cap", type=_seconds(0.0))
    parser.add_argument("--follow", action="store_true")
    parser.add_argument("--exit-when-idle", action="store_true")
    parser.add_argument("--poll-interval", type=_seconds(0.01), default=DEFAULT_POLL_INTERVAL)
    parser.add_argument("--to", choices=SINKS)
    return parser


#: The options an environment variable sets when the flag is not given (as click's
#: ``envvar``), with their defaults: read after parsing, so that a flag given wins over a bad
#: value and ``--help`` answers whatever the environment holds.
_FROM_ENV = (("copy_wait", COPY_WAIT_ENV, DEFAULT_COPY_WAIT),
             ("request_lifetime", "PRIME_RUNS_REQUEST_LIFETIME", DEFAULT_REQUEST_LIFETIME),
             ("backoff_cap", "PRIME_RUNS_BACKOFF_CAP", DEFAULT_BACKOFF_CAP))


def _from_env(args: argparse.Namespace) -> None:
    """Fill the options not given from the environment (exits 2 on a bad value)."""
    for dest, name, default in _FROM_ENV:
        if getattr(args, dest) is None:
            setattr(args, dest, _env_float(name, default))
    if args.to is None:
        raw = os.environ.get(SINK_ENV)
        if raw and raw not in SINKS:  # argparse checks choices against given values only
            sys.stderr.write(f"prime-runs: {SINK_ENV}={raw!r} is not one of {', '.join(SINKS)}\n")
            sys.exit(EXIT_USAGE)
        args.to = raw or AUTO


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _from_env(args)
    for path in args.paths:
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            sys.stderr.write(f"prime-runs: {path}: no such file or directory\n")
            return EXIT_USAGE
        except OSError:
            pass  # it exists but cannot be read: the walk names it beside the readable runs
    try:
        settings = load_settings(base_url=args.base_url, team_id=args.team)
    except InvalidSettingsError as exc:
        sys.stderr.write(f"prime-runs: {exc}\n")
        return EXIT_USAGE
    if not settings.api_key:
        sys.stderr.write("prime-runs: no API key: set PRIME_API_KEY (or api_key in ~/.prime/config.json)\n")
        return EXIT_USAGE
    cap = args.backoff_cap
    options = SyncOptions(request_lifetime=args.request_lifetime,
                          backoff=Backoff(base=min(0.5, cap), cap=cap, max_attempts=args.max_attempts),
                          to=args.to, copy_wait=args.copy_wait)
    destination = remote_destination(settings.base_url, settings.team_id)
    return_large_blocks_promptly()
    try:
        with PlatformClient(settings, timeout=args.timeout) as client:
            if args.follow:
                printer = event_printer(args.as_json, print, sys.stdout.flush)
                return follow_until_stopped(Follower(
                    list(args.paths), client, destination, options,
                    FollowOptions(poll_interval=args.poll_interval, exit_when_idle=args.exit_when_idle),
                    on_report=printer))
            reports = sync_paths(list(args.paths), client, destination, options, jobs=args.jobs, wait=args.wait)
    except Exception as exc:  # an internal error: one line, as prime-runs sync prints it
        sys.stderr.write(f"prime-runs: internal error: {type(exc).__name__}: {exc}\n")
        return EXIT_RUN_FAILED
    if args.as_json:
        print(json_report({"runs": [r.as_json() for r in reports], "ok": exit_code(reports) == 0}))
    else:
        for report in reports:
            print("\n".join(report_lines(report)))
    return exit_code(reports)


if __name__ == "__main__":
    sys.exit(main())
