"""``python -m prime_runs_spool.sync``: sync (or follow) runs to the remote platform.

The library's own entry point, so the online shipper (runner/online.py) can start a sync
with nothing but this package and ``sys.executable``: the command line package is not
needed at run time. Its options are ``prime-runs sync``'s own, from the one definition
both use (sync/command_line.py), with the same defaults, environment variables, output
lines and exit codes (docs/cli.md); ``--local``, ``--replay``, ``--dry-run`` and the import
of eval outputs stay with ``prime-runs sync``. Each retry is one line on stderr (the
shipper's log).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.sync.command_line import KEY_SOURCES, shared_options
from prime_runs_spool.sync.options import EXIT_RUN_FAILED, EXIT_USAGE, SAMPLES

#: The name the usage lines give this command.
PROG = "python -m prime_runs_spool.sync"


def _fail(message: str) -> None:
    sys.stderr.write(f"{MESSAGE_PREFIX}{message}\n")
    sys.exit(EXIT_USAGE)


def _tell_retry(retry: object) -> None:
    sys.stderr.write(f"{MESSAGE_PREFIX}{retry.what} failed: {retry.why}; "  # type: ignore[attr-defined]
                     f"try {retry.attempt + 1} in {retry.delay:.1f} s\n")  # type: ignore[attr-defined]
    sys.stderr.flush()


def _tell_wait(wait: object) -> None:
    sys.stderr.write(f"{MESSAGE_PREFIX}{wait.line()}\n")  # type: ignore[attr-defined]
    sys.stderr.flush()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, exists=False))
@shared_options
def main(paths: tuple[Path, ...], base_url: str | None, team: str | None, to: str, jobs: int, wait: bool,
         copy_wait: float, as_json: bool, request_lifetime: float, timeout: float, max_attempts: int,
         retry_for: float, follow: bool, exit_when_idle: bool, poll_interval: float, backoff_cap: float) -> None:
    """Sync (or follow) the run spools under PATHS (default: .) to the remote platform."""
    from prime_runs_spool.errors import InvalidSettingsError
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import load_settings
    from prime_runs_spool.sync.console import event_printer, exit_code, follow_until_stopped, json_report, report_lines
    from prime_runs_spool.sync.follow import FollowOptions, Follower
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.memory import return_large_blocks_promptly
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import remote_destination

    if exit_when_idle and not follow:
        _fail("--exit-when-idle goes with --follow")
    roots = list(paths or (Path("."),))
    for path in roots:
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            _fail(f"{path}: no such file or directory")
        except OSError:
            pass  # it exists but cannot be read: the walk names it beside the readable runs
    try:
        settings = load_settings(base_url=base_url, team_id=team)
    except InvalidSettingsError as exc:
        _fail(str(exc))
    if not settings.api_key:
        _fail(f"no API key: set {KEY_SOURCES}")
    from prime_runs_spool.platform_api.key_check import refused_key

    # one read (two where Prime Traces has its own URL), as prime-runs sync does before it writes
    refusal = refused_key(settings, within=timeout, traces=to != SAMPLES)
    if refusal is not None:
        _fail(str(refusal))  # a key refused at the start is not tried again on every pass
    backoff = Backoff(base=min(0.5, backoff_cap), cap=backoff_cap, max_attempts=max_attempts, retry_for=retry_for,
                      on_retry=_tell_retry, on_wait=_tell_wait)
    options = SyncOptions(request_lifetime=request_lifetime, backoff=backoff, to=to, copy_wait=copy_wait)
    destination = remote_destination(settings.base_url, settings.team_id)
    return_large_blocks_promptly()
    try:
        with PlatformClient(settings, timeout=timeout) as client:
            if follow:
                printer = event_printer(as_json, print, sys.stdout.flush)
                sys.exit(follow_until_stopped(Follower(
                    roots, client, destination, options,
                    FollowOptions(poll_interval=poll_interval, exit_when_idle=exit_when_idle),
                    on_report=printer)))
            reports = sync_paths(roots, client, destination, options, jobs=jobs, wait=wait)
    except Exception as exc:  # an internal error: one line, as prime-runs sync prints it
        sys.stderr.write(f"{MESSAGE_PREFIX}internal error: {type(exc).__name__}: {exc}\n")
        sys.exit(EXIT_RUN_FAILED)
    if as_json:
        print(json_report({"runs": [r.as_json() for r in reports], "ok": exit_code(reports) == 0}))
    else:
        told: set[str] = set()
        for report in reports:
            print("\n".join(report_lines(report, told)))
    sys.exit(exit_code(reports))


def run() -> None:
    """The module's entry: a usage error is one line on stderr and exit 2, as every other
    error of a sync (click's own usage block is for people at a terminal; this command's
    stderr is the shipper's log)."""
    try:
        main.main(prog_name=PROG, standalone_mode=False)
    except click.ClickException as exc:
        sys.stderr.write(f"{MESSAGE_PREFIX}{exc.format_message()}\n")
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    run()
