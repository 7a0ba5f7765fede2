"""``prime-runs sync``: push every spool under some paths to a platform, exactly once.

Thin by design: it resolves settings, starts the embedded local platform for ``--local``,
and prints what the library's reports say. The protocol lives in
``prime_runs_spool.sync``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .import_ import nothing_found_message, quiet_library_warnings
from .options import StateDirPath, allow_empty_option
from .output import SkippedLinks, fail_usage, internal_error, leave, require_paths, without_unused_http_extras
from .sync_report import browse_line, print_reports, waiting_imports
from .sync_setup import (carry_on_command, destination, exit_interrupted, local_database, new_database_line,
                         progress_for, remote_settings, stop_on_signals, stopped_following_line, sync_options)
from .sync_setup import check_key as check_settings_key
from .sync_store import PathOrURL, store_urls, sync_urls
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.importer.options import STATE_DIR_ENV, default_state_dir
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.plural import count
from prime_runs_spool.sync.command_line import shared_options
from prime_runs_spool.sync.options import EXIT_OK, EXIT_RUN_FAILED, SAMPLES

if TYPE_CHECKING:
    from prime_runs_spool.importer.outputs import ImportReport

# The machinery behind the command (the HTTP client, the state model, the engine) is
# imported in the functions that use it, not here: ``prime-runs --help`` defines every
# command's options and must not pay for any of it (tests/test_cli_basics.py).


def _checked_tags(tags: tuple[str, ...]) -> tuple[str, ...]:
    """``--tag``'s values: one empty or of blanks only (``--tag "$UNSET"``), or holding a line
    break or another control character, was added to every evaluation created as it was."""
    for tag in tags:
        _one_line(tag, "tag")
    return tags


def _checked_name(name: str | None) -> str | None:
    """``--name``'s value, by ``--tag``'s rule: an empty one (``--name "$UNSET"``) was passed
    over for the manifest's name without a word, and one of blanks or holding a line break
    named every evaluation a replay created so."""
    return None if name is None else _one_line(name, "name")


def _one_line(value: str, what: str) -> str:
    """``value``, a name or a tag a created evaluation carries: one that is empty or of
    blanks only, or holds a control character, is bad usage."""
    if not value.strip():
        raise click.BadParameter(f"{value!r} is blanks only and names no {what}")
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise click.BadParameter(f"{value!r} holds a control character (a line break?); give the {what} on one line")
    return value


@click.command("sync")
@click.argument("paths", nargs=-1, type=PathOrURL(path_type=Path, readable=False))
@shared_options
@click.option("--local", is_flag=True, help="Sync into the local platform, run embedded on loopback (no key needed).")
@click.option("--db", type=click.Path(path_type=Path), help="The local platform's database (with --local).")
@click.option("--dry-run", is_flag=True, help="Read everything and report what would be sent; send nothing (no key "
                                              "needed).")
@click.option("--skip-corrupt", is_flag=True,
              help="Skip past a corrupt segment's damaged rest (recorded in the evaluation's metadata).")
@click.option("--replay", is_flag=True,
              help="Push runs again as new evaluations; continues a run's unfinished replay (sync.md in the "
                   "documentation, below).")
@click.option("--replay-id", help="With --replay: the replay to start or continue, by id.")
@click.option("--name", callback=lambda ctx, param, name: _checked_name(name),
              help="With --replay: the new evaluations' name.")
@click.option("--tag", "tags", multiple=True, callback=lambda ctx, param, tags: _checked_tags(tags),
              help="Add a tag to created evaluations (repeatable).")
@click.option("--max-request-bytes", type=click.IntRange(1024, MAX_REQUEST_BYTES), default=MAX_REQUEST_BYTES, hidden=True,
              help="Request body ceiling (tests and benchmarks use smaller ones).")
@click.option("--traces-batch-bytes", type=click.IntRange(1024), default=None, hidden=True,
              help="Uncompressed bytes at which a traces batch closes (tests use smaller ones).")
@click.option("--no-import", is_flag=True,
              help="Do not import eval outputs that have no spool; list them instead.")
@click.option("--state-dir", type=StateDirPath(), envvar=STATE_DIR_ENV,
              help="Keep imported spools, and the sync lock and state of spools on a read-only source, here, "
                   f"not in the sources (env {STATE_DIR_ENV}).")
@click.option("--check-key", is_flag=True,
              help="Ask the platform whether it accepts the API key even when there is nothing to send (a sync "
                   "with nothing to do asks it nothing); refused: exit 2. For CI: a rotated key shows before the "
                   "next run needs it.")
@allow_empty_option
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks for unexpected errors.")
def sync(paths: tuple[Path, ...], base_url: str | None, team: str | None, local: bool, db: Path | None,
         jobs: int, wait: bool, copy_wait: float, dry_run: bool, as_json: bool, skip_corrupt: bool,
         request_lifetime: float, timeout: float, max_attempts: int, retry_for: float, follow: bool,
         exit_when_idle: bool,
         poll_interval: float, replay: bool, replay_id: str | None, name: str | None,
         tags: tuple[str, ...], max_request_bytes: int, backoff_cap: float, no_import: bool,
         state_dir: Path | None, allow_empty: bool, verbose: bool, to: str,
         traces_batch_bytes: int | None, check_key: bool) -> None:
    """Push the episodes of every run spool under PATHS (default: .) to the platform, exactly once.

    Eval outputs written without a spool (verifiers' traces.jsonl, or metadata.json +
    results.jsonl) are imported first, unless --no-import, and a spool behind its traces.jsonl
    (plain vf-eval continued the run) is caught up. A run vf-eval already pushed is synced
    into that evaluation. Run it any number of times,
    interrupt it anywhere: each episode's sample lands once, each evaluation is created once
    and finalized once. The first Ctrl-C (SIGINT, SIGTERM) stops at the next safe point within
    about a second and exits 130; a second one stops at once. Every retry is shown.

    The API key comes from PRIME_API_KEY, else api_key in ~/.prime/config.json (--dry-run and
    --local need none); the platform from --base-url, PRIME_API_BASE_URL or base_url there.

    Exit 0 when every run is synced or has nothing to do, 1 when some run failed or a path
    holds nothing to sync, 2 on a usage or configuration error (no key, a refused key, a bad
    URL) before anything is written, 130 after SIGINT or SIGTERM (0 once --follow follows).

    \b
    Examples:
      PRIME_API_KEY=... prime-runs sync outputs
      prime-runs sync outputs --local            # into the local platform, no key
      prime-runs sync outputs --dry-run --json   # what would be sent
      prime-runs sync outputs --follow           # ship live runs as they grow
      prime-runs sync /mnt/artifact --state-dir ~/.cache/prime-runs   # a read-only CI artifact
    """
    from prime_runs_spool.errors import Stopped
    from prime_runs_spool.importer.places import not_spooled, paths_with_nothing, spool_roots, to_refresh
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.sync.state import valid_replay_id
    from prime_runs_spool.sync.console import event_printer, exit_code, follow_until_stopped
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.memory import return_large_blocks_promptly

    without_unused_http_extras()  # before anything imports httpx
    # Everything that can be wrong with the command is found before anything is written
    # anywhere (an import, a state, a database): the options' own rules, which hold for local
    # paths and store URLs alike, then the platform's settings and key.
    if (name or replay_id is not None) and not replay:
        fail_usage("--name and --replay-id go with --replay")
    if replay_id is not None and not valid_replay_id(replay_id):
        fail_usage(f"--replay-id {replay_id!r} is not a replay id: 1 to 64 letters, digits, '_' or '-', "
                   "starting with a letter or digit (the report's replay_id)")
    if follow and (replay or dry_run):
        fail_usage("--follow does not combine with --replay or --dry-run")
    if exit_when_idle and not follow:
        fail_usage("--exit-when-idle goes with --follow")
    # Options that name where episodes go are never passed over: a --db without --local
    # sent them to the remote platform, a --base-url with it left them on this machine.
    if db is not None and not local:
        fail_usage("--db goes with --local (without it, sync pushes to the platform at the base URL, not into a "
                   "database)")
    if check_key and local:
        fail_usage("--check-key does not combine with --local (the local platform takes no key)")
    if base_url is not None and local:
        fail_usage("--base-url does not combine with --local (the local platform runs embedded; for one served with "
                   "prime-runs platform serve, give its URL without --local)")
    # Locally auto means samples for a run with no sink yet (nothing to probe: the embedded
    # platform is this machine's), and, as everywhere, the sink a run's state records.
    params = {**click.get_current_context().params, "auto_sink": SAMPLES if local else None}
    if not store_urls(paths):
        require_paths(paths or (Path("."),))  # a mistyped path is told before a missing key
    settings = None if local else remote_settings(base_url, team, need_key=not dry_run or check_key)
    if store_urls(paths):  # s3://bucket/prefix and the like (commands/sync_store.py)
        sync_urls(params, settings)
    given = require_paths(paths or (Path("."),))
    interrupt = stop_on_signals()
    progress = progress_for(params)
    options = sync_options(params, progress)
    quiet_library_warnings()
    state = default_state_dir(state_dir)
    empty = [] if follow else paths_with_nothing(given)
    key_checked = False

    def check_key_once() -> None:  # before the first write the platform could refuse
        nonlocal key_checked
        if settings is not None and (check_key or not dry_run) and not key_checked:
            key_checked = True
            try:
                with interrupt.abortable():
                    check_settings_key(settings, timeout, to, asked=check_key)
            except Stopped:
                pass  # the stop is set: nothing begins

    if check_key:  # asked: whatever there is to do (a no-op sync asks the platform nothing)
        check_key_once()
        if interrupt.is_set():
            exit_interrupted([])

    left_out: list[Path] = []
    imports: list[ImportReport] = []
    failed_imports: list[ImportReport] = []
    if no_import or dry_run:
        left_out = not_spooled(given, state)
    elif follow:
        pass  # the follower imports before each walk of the paths (commands/follow_imports.py)
    elif to_refresh(given, state):  # the importer (and the writer under it) only when there is work for it
        from prime_runs_spool.importer.outputs import FAILED_STATES as IMPORT_FAILED, import_paths

        check_key_once()
        imports = import_paths(given, state_dir=state, refresh_only=True, stop=interrupt.is_set)
        failed_imports = [r for r in imports if r.state in IMPORT_FAILED]
    if interrupt.is_set():
        exit_interrupted([])
    roots = spool_roots(given, state)
    links = SkippedLinks()
    return_large_blocks_promptly()  # bounded memory whatever --jobs (prime_runs_spool.sync.memory)
    reports = []
    new_db = local and not dry_run and not replay and not local_database(db).exists()
    try:
        with destination(local, db, settings, team) as (settings_used, target, local_db):
            with PlatformClient(settings_used, timeout=timeout) as client:
                if follow:
                    from prime_runs_spool.sync.follow import FollowOptions, Follower

                    from .follow_imports import FollowImports

                    check_key_once()  # a follower writes states: a refused key first, once (bounded)
                    if interrupt.is_set():
                        exit_interrupted([])
                    interrupt.uninstall()  # the follower stops on signals its own way (docs/cli.md)
                    if local_db and not as_json:  # the links it prints open only once served
                        click.echo(browse_line(local_db))
                    imports_seen = None if no_import else FollowImports(
                        given, state, as_json=as_json, echo=click.echo, flush=sys.stdout.flush)
                    follower = Follower(
                        roots, client, target, options,
                        FollowOptions(poll_interval=poll_interval, exit_when_idle=exit_when_idle),
                        on_report=event_printer(as_json, click.echo, sys.stdout.flush), state_dir=state,
                        discover=imports_seen, on_link=SkippedLinks(at_once=True))
                    code = follow_until_stopped(follower)
                    if (code == EXIT_OK and exit_when_idle and not follower.stop.is_set()
                            and imports_seen is not None and imports_seen.failed):
                        code = EXIT_RUN_FAILED  # as a one-shot sync whose import failed
                    if follower.stop.is_set():
                        carry_on = carry_on_command(given, target, params)
                        done = (run.done for run in follower.runs.values())
                        click.echo(stopped_following_line(done, carry_on), err=True)
                    sys.exit(code)
                reports = sync_paths(roots, client, target, options, jobs=jobs, wait=wait,
                                     on_progress=progress.update, stop=interrupt, first_pass=check_key_once,
                                     state_dir=state, on_link=links)
                if interrupt.is_set():
                    progress.close()
                    print_reports(reports, imports, left_out, state, as_json=as_json, local_db=local_db, ok=False)
                    exit_interrupted(reports)
    except Exception as exc:  # an internal error: one line, unless asked for the traceback
        if verbose:
            raise
        progress.close()
        internal_error(exc)
    progress.close()
    code = exit_code(reports)
    # Nothing to push at all (no spool, no eval output with an episode) is not success either.
    # An eval still writing its outputs (a pushing vf-eval) is a run, left for a later sync.
    nothing = not reports and not allow_empty and not empty and not left_out and not waiting_imports(imports)
    if failed_imports or (empty and not allow_empty) or nothing:
        code = EXIT_RUN_FAILED
    print_reports(reports, imports, left_out, state, as_json=as_json, local_db=local_db, ok=code == EXIT_OK,
                  empty=empty, dry_run=dry_run)
    links.say()
    if new_db and (line := new_database_line(reports, local_db, target, params["to"])):
        click.echo(line, err=True)
    for path in empty:
        click.echo(f"{MESSAGE_PREFIX}{nothing_found_message(path)}", err=True)
    if failed_imports:
        click.echo(f"{MESSAGE_PREFIX}{count(len(failed_imports), 'run')} could not be imported: {failed_imports[0].error}",
                   err=True)
    elif nothing:
        click.echo(f"{MESSAGE_PREFIX}nothing to sync: no spool, and no eval output with an episode, under the paths "
                   "(--allow-empty makes this exit 0)", err=True)
    leave(code)
