"""``prime-runs sync``: push every spool under some paths to a platform, exactly once.

Thin by design: it resolves settings, starts the embedded local platform for ``--local``,
and prints what the library's reports say. The protocol lives in
``prime_runs_spool.sync``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from commands.import_ import import_line, nothing_found_message, quiet_library_warnings
from commands.output import (Progress, Seconds, fail_usage, internal_error, leave, require_paths,
                            without_unused_http_extras)
from commands.sync_store import PathOrURL, store_urls, sync_urls
from prime_runs_spool.errors import InvalidSettingsError, PlatformDatabaseError
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.importer.options import STATE_DIR_ENV, default_state_dir
from prime_runs_spool.sync.options import (
    AUTO,
    COPY_WAIT_ENV,
    SAMPLES,
    STORE_ENV,
    STORES,
    TRACES,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_COPY_WAIT,
    DEFAULT_JOBS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REQUEST_LIFETIME,
    DEFAULT_TIMEOUT,
    EXIT_OK,
    EXIT_RUN_FAILED,
)

if TYPE_CHECKING:
    from prime_runs_spool.platform_api.settings import Settings
    from prime_runs_spool.importer.outputs import ImportReport
    from prime_runs_spool.sync.options import RunReport
    from prime_runs_spool.sync.state import Destination

# The machinery behind the command (the HTTP client, the state model, the engine) is
# imported in the functions that use it, not here: ``prime-runs --help`` defines every
# command's options and must not pay for any of it (tests/test_cli_basics.py).

#: Where ``prime-runs platform serve --port LOCAL_BROWSE_PORT`` serves the viewer pages that
#: ``--local`` links to: the embedded server itself lives only as long as the command.
LOCAL_BROWSE_PORT = 8765
LOCAL_FRONTEND = f"http://127.0.0.1:{LOCAL_BROWSE_PORT}"


def default_local_db() -> Path:
    return Path(os.environ.get("PRIME_RUNS_LOCAL_DB") or Path.home() / ".prime" / "local-platform.db")


@contextlib.contextmanager
def _destination(local: bool, db: Path | None, base_url: str | None, team: str | None, traces: bool = False
                 ) -> Iterator[tuple[Settings, Destination, str | None]]:
    """Settings and the destination identity; for ``--local``, a running embedded platform
    (with its Prime Traces service on when ``traces``: ``--to traces``)."""
    from prime_runs_spool.platform_api.settings import Secret, Settings, load_settings
    from prime_runs_spool.sync.state import local_destination, remote_destination

    if local:
        from prime_runs_spool.local_platform.server import EmbeddedPlatform
        from prime_runs_spool.spool.layout import make_private_dir

        db_path = (db or default_local_db()).expanduser().resolve()
        try:
            make_private_dir(db_path.parent)
        except OSError as exc:
            fail_usage(f"cannot create {db_path.parent}: {exc.strerror}")
        with contextlib.ExitStack() as stack:
            try:
                platform = stack.enter_context(EmbeddedPlatform(db_path, frontend_url=LOCAL_FRONTEND, traces=traces))
            except PlatformDatabaseError as exc:  # not SQLite, a directory, a FIFO: the user's --db to fix
                fail_usage(f"--db: {exc}")
            settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=team,
                                frontend_url=LOCAL_FRONTEND)
            yield settings, local_destination(db_path, team), str(db_path)
        return
    try:
        settings = load_settings(base_url=base_url, team_id=team)
    except InvalidSettingsError as exc:
        fail_usage(str(exc))
    if not settings.api_key:
        fail_usage("no API key: set PRIME_API_KEY (or api_key in ~/.prime/config.json), "
                   "or sync into the local platform with --local")
    yield settings, remote_destination(settings.base_url, settings.team_id), None


@click.command("sync")
@click.argument("paths", nargs=-1, type=PathOrURL(path_type=Path, readable=False))
@click.option("--base-url", help="Platform API base URL (default: PRIME_API_BASE_URL or the public platform).")
@click.option("--team", "team", help="Team id to sync into (default: PRIME_TEAM_ID).")
@click.option("--local", is_flag=True, help="Sync into the local platform, run embedded on loopback.")
@click.option("--db", type=click.Path(path_type=Path), help="The local platform's database (with --local).")
@click.option("--to", "to", type=click.Choice(STORES), default=AUTO, show_default=True, envvar=STORE_ENV,
              help="Where episodes go: Prime Traces, the legacy samples table, or auto (traces, falling back "
                   f"to samples if the account has no Prime Traces; env {STORE_ENV}). Recorded per run.")
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=DEFAULT_JOBS, show_default=True,
              help="Runs synced in parallel.")
@click.option("--wait", is_flag=True, help="Wait for another sync working on a run instead of skipping it.")
@click.option("--copy-wait", type=Seconds(0), envvar=COPY_WAIT_ENV, default=DEFAULT_COPY_WAIT, show_default=True,
              help="Seconds to wait for another sync on this machine pushing a copy of a run (another folder "
                   f"holding the same run) to the same platform, before skipping it (env {COPY_WAIT_ENV}).")
@click.option("--dry-run", is_flag=True, help="Read everything and report what would be sent; send nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable report.")
@click.option("--skip-corrupt", is_flag=True,
              help="Skip past a corrupt segment's damaged rest (recorded in the evaluation's metadata).")
@click.option("--request-lifetime", type=Seconds(0), envvar="PRIME_RUNS_REQUEST_LIFETIME",
              default=DEFAULT_REQUEST_LIFETIME, show_default=True,
              help="Seconds after which an unanswered request can no longer land (env PRIME_RUNS_REQUEST_LIFETIME).")
@click.option("--timeout", type=Seconds(0.1), default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds to wait for one answer.")
@click.option("--max-attempts", type=click.IntRange(1), default=DEFAULT_MAX_ATTEMPTS, show_default=True,
              help="Consecutive failures of one request before a run gives up (its state is kept).")
@click.option("--follow", is_flag=True,
              help="Keep following live spools: push episodes as they are appended, pick up new runs, "
                   "finish runs as they seal; until SIGINT/SIGTERM (see docs/sync.md).")
@click.option("--exit-when-idle", is_flag=True,
              help="With --follow: exit once every run found is finished and no writer is live.")
@click.option("--poll-interval", type=Seconds(0.01), default=DEFAULT_POLL_INTERVAL, show_default=True,
              help="With --follow: seconds between looks at each spool's size.")
@click.option("--replay", is_flag=True,
              help="Push runs again as new evaluations; continues a run's unfinished replay (see docs/sync.md).")
@click.option("--replay-id", help="With --replay: the replay to start or continue, by id.")
@click.option("--name", help="With --replay: the new evaluations' name.")
@click.option("--tag", "tags", multiple=True, help="Add a tag to created evaluations (repeatable).")
@click.option("--max-request-bytes", type=click.IntRange(1024, MAX_REQUEST_BYTES), default=MAX_REQUEST_BYTES, hidden=True,
              help="Request body ceiling (tests and benchmarks use smaller ones).")
@click.option("--traces-batch-bytes", type=click.IntRange(1024), default=None, hidden=True,
              help="Uncompressed bytes at which a traces batch closes (tests use smaller ones).")
@click.option("--backoff-cap", type=Seconds(0.0), default=DEFAULT_BACKOFF_CAP, hidden=True,
              envvar="PRIME_RUNS_BACKOFF_CAP",
              help="Longest wait between retries, in seconds.")
@click.option("--no-import", is_flag=True,
              help="Do not import eval outputs that have no spool; list them instead.")
@click.option("--state-dir", type=click.Path(path_type=Path), envvar=STATE_DIR_ENV,
              help=f"Keep imported spools and their sync state here, not in the sources (env {STATE_DIR_ENV}).")
@click.option("--allow-empty", is_flag=True, help="Exit 0 even when a path holds neither a spool nor eval outputs.")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks for unexpected errors.")
def sync(paths: tuple[Path, ...], base_url: str | None, team: str | None, local: bool, db: Path | None,
         jobs: int, wait: bool, copy_wait: float, dry_run: bool, as_json: bool, skip_corrupt: bool,
         request_lifetime: float, timeout: float, max_attempts: int, follow: bool, exit_when_idle: bool,
         poll_interval: float, replay: bool, replay_id: str | None, name: str | None,
         tags: tuple[str, ...], max_request_bytes: int, backoff_cap: float, no_import: bool,
         state_dir: Path | None, allow_empty: bool, verbose: bool, to: str,
         traces_batch_bytes: int | None) -> None:
    """Push the episodes of every run spool under PATHS (default: .) to the platform, exactly once.

    Eval outputs written without a spool (verifiers' traces.jsonl, or metadata.json +
    results.jsonl) are imported first, unless --no-import. Run it any number of times,
    interrupt it anywhere: each episode's sample lands once, each evaluation is created once
    and finalized once. Exit 0 when every run is synced or has nothing to do, 1 when some run
    failed or a path holds nothing to sync, 2 on a usage or configuration error.
    """
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.sync.console import event_printer, exit_code, follow_until_stopped
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.memory import return_large_blocks_promptly
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.importer.places import not_spooled, paths_with_nothing, spool_roots, to_refresh

    from prime_runs_spool.spool.layout import valid_replay_id

    without_unused_http_extras()  # before anything imports httpx
    # The options' own rules first: they hold for local paths and store URLs alike.
    if (name or replay_id is not None) and not replay:
        fail_usage("--name and --replay-id go with --replay")
    if replay_id is not None and not valid_replay_id(replay_id):
        fail_usage(f"--replay-id {replay_id!r} is not a replay id: 1 to 64 letters, digits, '_' or '-', "
                   "starting with a letter or digit (the report's replay_id)")
    if follow and (replay or dry_run):
        fail_usage("--follow does not combine with --replay or --dry-run")
    if exit_when_idle and not follow:
        fail_usage("--exit-when-idle goes with --follow")
    if local and to == AUTO:
        # The embedded platform runs Prime Traces only for --to traces: auto would probe it,
        # learn that, and fall back for every run (with a warning each). Say samples at once.
        to = SAMPLES
    if store_urls(paths):  # s3://bucket/prefix and the like (commands/sync_store.py)
        sync_urls({**click.get_current_context().params, "to": to})
    given = require_paths(paths or (Path("."),))
    options = SyncOptions(request_lifetime=request_lifetime, skip_corrupt=skip_corrupt, dry_run=dry_run,
                          max_request_bytes=max_request_bytes,
                          backoff=Backoff(base=min(0.5, backoff_cap), cap=backoff_cap, max_attempts=max_attempts),
                          replay=replay, replay_id=replay_id, name=name, tags=tags, to=to,
                          traces_batch_bytes=traces_batch_bytes, copy_wait=copy_wait)
    quiet_library_warnings()
    state = default_state_dir(state_dir)
    empty = [] if follow else paths_with_nothing(given)
    left_out: list[Path] = []
    imports: list[ImportReport] = []
    failed_imports: list[ImportReport] = []
    if no_import or dry_run:
        left_out = not_spooled(given, state)
    elif to_refresh(given):  # the importer (and the writer under it) only when there is work for it
        from prime_runs_spool.importer.outputs import FAILED_STATES as IMPORT_FAILED, import_paths

        imports = import_paths(given, state_dir=state, refresh_only=True)
        failed_imports = [r for r in imports if r.state in IMPORT_FAILED]
    roots = spool_roots(given, state)
    progress = Progress(enabled=not as_json and sys.stderr.isatty() and not follow)
    return_large_blocks_promptly()  # bounded memory whatever --jobs (prime_runs_spool.sync.memory)
    try:
        with _destination(local, db, base_url, team, to == TRACES) as (settings, destination, local_db):
            with PlatformClient(settings, timeout=timeout) as client:
                if follow:
                    from prime_runs_spool.sync.follow import FollowOptions, Follower

                    sys.exit(follow_until_stopped(Follower(
                        roots, client, destination, options,
                        FollowOptions(poll_interval=poll_interval, exit_when_idle=exit_when_idle),
                        on_report=event_printer(as_json, click.echo, sys.stdout.flush))))
                reports = sync_paths(roots, client, destination, options, jobs=jobs, wait=wait,
                                     on_progress=progress.update)
    except Exception as exc:  # an internal error: one line, unless asked for the traceback
        if verbose:
            raise
        progress.close()
        internal_error(exc)
    progress.close()
    code = exit_code(reports)
    # Nothing to push at all (no spool, no eval output with an episode) is not success either.
    nothing = not reports and not allow_empty and not empty and not left_out
    if failed_imports or (empty and not allow_empty) or nothing:
        code = EXIT_RUN_FAILED
    print_reports(reports, imports, left_out, state, as_json=as_json, local_db=local_db, ok=code == EXIT_OK)
    for path in empty:
        click.echo(f"prime-runs: {nothing_found_message(path)}", err=True)
    if failed_imports:
        click.echo(f"prime-runs: {len(failed_imports)} run(s) could not be imported: {failed_imports[0].error}",
                   err=True)
    elif nothing:
        click.echo("prime-runs: nothing to sync: no spool, and no eval output with an episode, under the paths "
                   "(--allow-empty makes this exit 0)", err=True)
    leave(code)


def print_reports(reports: list[RunReport], imports: list[ImportReport], left_out: list[Path], state: Path | None,
                  *, as_json: bool, local_db: str | None, ok: bool) -> None:
    """The reports as ``prime-runs sync`` prints them (docs/cli.md), for local paths and
    store URLs alike (commands/sync_store.py), so a script reads one format."""
    from prime_runs_spool.importer.places import import_command
    from prime_runs_spool.sync.console import json_report, report_lines

    if as_json:
        document: dict[str, Any] = {
            "runs": [report.as_json() for report in reports],
            "imports": [report.as_json() for report in imports],
            "not_imported": [str(path) for path in left_out],
            "ok": ok,
        }
        if local_db:
            document["local_db"] = local_db
        click.echo(json_report(document, indent=True))
        return
    for imported in imports:
        for line in import_line(imported):
            click.echo(line)
    for path in left_out:
        click.echo(f"not spooled {path}: not imported (run: {import_command(path, state)})")
    if not reports:
        click.echo("no runs found")
        return
    for report in reports:
        for line in report_lines(report):
            click.echo(line)
    if local_db:
        click.echo(f"browse with: prime-runs platform serve --db {local_db} --port {LOCAL_BROWSE_PORT}")
