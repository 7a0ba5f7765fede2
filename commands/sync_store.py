"""``prime-runs sync s3://bucket/prefix``: the sync command over an object-store URL.

Reached from ``commands/sync.py`` when a PATH is a store URL; it takes the same options
(read from the click context) and prints the same reports. The work is the library's
(``prime_runs_spool.sync.store_sync``).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .import_ import nothing_found_message
from .options import refuse_empty_path
from .output import fail_usage, internal_error
from .sync_report import print_reports
from .sync_setup import (carry_on_command, check_key, destination, exit_interrupted, progress_for, stop_on_signals,
                         stopped_following_line, sync_options)
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.importer.options import STATE_DIR_ENV

if TYPE_CHECKING:
    from prime_runs_spool.platform_api.settings import Settings


class PathOrURL(click.Path):
    """A PATH argument that may also be a store URL (kept as text: a Path would fold its
    ``//``)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        refuse_empty_path(self, value, param, ctx)
        if isinstance(value, str) and "://" in value:  # a plain path never imports the store's code
            from prime_runs_spool.store.objects import is_store_url

            if is_store_url(value):
                return str(value)
        return super().convert(value, param, ctx)


def store_urls(paths: tuple[Any, ...]) -> list[str]:
    """The PATHS that are store URLs (PathOrURL leaves them as text)."""
    return [p for p in paths if isinstance(p, str)]


def sync_urls(params: dict[str, Any], settings: Settings | None) -> None:
    """Run ``prime-runs sync`` over store URLs with the command's options; exits.
    ``settings``: the remote platform's, checked already (None with ``--local``)."""
    import os

    from prime_runs_spool.errors import StoreError, StoreSetupError, Stopped
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.sync.console import exit_code
    from prime_runs_spool.sync.memory import return_large_blocks_promptly
    from prime_runs_spool.sync.options import EXIT_OK, EXIT_RUN_FAILED
    from prime_runs_spool.sync.store_sync import sync_store

    paths = params["paths"]
    urls = store_urls(paths)
    if len(urls) != len(paths):
        fail_usage("give either local paths or store URLs, not both (run prime-runs sync once for each)")
    follow = bool(params.get("follow"))
    state_dir = params.get("state_dir") or os.environ.get(STATE_DIR_ENV) or None
    progress = progress_for(params)
    options = sync_options(params, progress)
    return_large_blocks_promptly()
    reports: list[Any] = []
    empty: list[str] = []  # the URLs with no run under them: nothing to sync is not success
    local_db = None
    # The first signal stops every run at its next safe point; a run on the wire finishes its
    # request, so that its lease is released (the store's other syncers would otherwise wait
    # out its lifetime). --follow stops its own way once the key is checked (docs/cli.md).
    interrupt = stop_on_signals()
    if settings is not None and (not params["dry_run"] or params.get("check_key")):
        try:  # before a lease or a state is written in the store; bounded, and a signal ends it
            with interrupt.abortable():
                check_key(settings, params["timeout"], params["to"], asked=bool(params.get("check_key")))
        except Stopped:
            exit_interrupted([])
    if follow:
        interrupt.uninstall()
    try:
        with destination(params["local"], params["db"], settings, params["team"]) as (
                settings_used, target, local_db):
            with PlatformClient(settings_used, timeout=params["timeout"]) as client:

                stop = threading.Event() if follow else interrupt.event

                def sync_pass(url: str) -> list[Any]:
                    return sync_store(url, client, target, options, jobs=params["jobs"], wait=params["wait"],
                                      on_progress=progress.update, state_dir=Path(state_dir) if state_dir else None,
                                      stop=stop)

                try:
                    if follow:
                        sys.exit(_follow(urls, sync_pass, params, stop, target))
                    for url in urls:
                        found = sync_pass(url)
                        reports += found
                        if not found:
                            empty.append(url)
                except Stopped:
                    progress.close()
                    exit_interrupted(reports)
                except StoreSetupError as exc:  # the URL or the setup, not the store: usage
                    progress.close()
                    fail_usage(str(exc))
                except StoreError as exc:
                    progress.close()
                    click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
                    sys.exit(EXIT_RUN_FAILED)
    except Exception as exc:
        if params.get("verbose"):
            raise
        progress.close()
        internal_error(exc)
    progress.close()
    code = exit_code(reports)
    if empty and not params.get("allow_empty"):
        code = EXIT_RUN_FAILED
    print_reports(reports, [], [], None, as_json=params["as_json"], local_db=local_db, ok=code == EXIT_OK,
                  empty=empty, dry_run=params["dry_run"])  # type: ignore[arg-type]
    for url in empty:
        click.echo(f"{MESSAGE_PREFIX}{nothing_found_message(url)}", err=True)  # type: ignore[arg-type]
    sys.exit(code)


def _follow(urls: list[str], sync_pass: Any, params: dict[str, Any], stop: Any, target: Any) -> int:
    """``--follow`` over store URLs: a pass every ``--poll-interval`` (10 s unless given:
    every pass costs store requests), each changed run reported as the local follower
    reports it (sync/store_follow.py), and a stop by a signal told as a local follow's
    (the runs finished, the command that carries on)."""
    from click.core import ParameterSource

    from prime_runs_spool.sync.console import event_printer, follow_until_stopped
    from prime_runs_spool.sync.store_follow import STORE_POLL_INTERVAL, StoreFollower

    given = click.get_current_context().get_parameter_source("poll_interval") is not ParameterSource.DEFAULT
    follower = StoreFollower(
        urls, sync_pass, interval=params["poll_interval"] if given else STORE_POLL_INTERVAL,
        exit_when_idle=params["exit_when_idle"],
        on_report=event_printer(params["as_json"], click.echo, sys.stdout.flush),
        on_error=lambda message: click.echo(f"{MESSAGE_PREFIX}{message}", err=True), stop=stop)
    code = follow_until_stopped(follower)
    if follower.stop.is_set():
        line = stopped_following_line(follower.finished.values(), carry_on_command(urls, target, params))
        click.echo(line, err=True)
    return code
