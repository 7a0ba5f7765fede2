"""What ``prime-runs sync`` settles before it touches anything: the platform and key it
sends with, the options every pass shares, the stop a signal asks for.

Shared by the local sync (commands/sync.py) and the sync over store URLs
(commands/sync_store.py), so both check the same things, in the same order, and say the
same words. Every configuration error found here exits 2 before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .output import Progress, fail_usage
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.plural import count
from prime_runs_spool.sync.command_line import KEY_SOURCES

if TYPE_CHECKING:
    from prime_runs_spool.platform_api.settings import Settings
    from prime_runs_spool.sync.interrupt import Interrupt
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import Destination

#: Where ``prime-runs platform serve --port LOCAL_BROWSE_PORT`` serves the viewer pages that
#: ``--local`` links to: the embedded server itself lives only as long as the command.
LOCAL_BROWSE_PORT = 8765
LOCAL_FRONTEND = f"http://127.0.0.1:{LOCAL_BROWSE_PORT}"

def remote_settings(base_url: str | None, team: str | None, *, need_key: bool) -> Settings:
    """The remote platform's settings, or exit 2 with one line: a base URL no request can
    use, or no API key where one is needed (``--dry-run`` sends nothing and needs none)."""
    from prime_runs_spool.errors import InvalidSettingsError
    from prime_runs_spool.platform_api.settings import load_settings

    try:
        settings = load_settings(base_url=base_url, team_id=team)
    except InvalidSettingsError as exc:
        fail_usage(str(exc))
    if need_key and not settings.api_key:
        fail_usage(f"no API key: set {KEY_SOURCES}, or sync into the local platform with --local")
    return settings


def check_key(settings: Settings, timeout: float, to: str, asked: bool = False) -> None:
    """One read with the key, before anything is written: a key the platform refuses (401) or
    that may not read here (403) exits 2 once, instead of once per run after the imports; so
    does one Prime Traces refuses (401) where it has its own URL and ``to`` may send there.
    A platform that cannot be reached, or does not answer within the check's own short bound
    (platform_api/key_check.py), is not a configuration error: the passes retry it. ``asked``
    (``--check-key``): a read that ended with no verdict (no connection, a 5xx) is said in one
    line, the sync going on; with every run up to date no pass follows to say anything, and
    a CI job offline ended 0 without a word, its key never checked."""
    from prime_runs_spool.platform_api.key_check import refused_key
    from prime_runs_spool.sync.options import SAMPLES

    def no_answer(waited: float, url: str) -> None:
        which = "the platform" if url == settings.base_url else "Prime Traces"
        click.echo(f"{MESSAGE_PREFIX}{which} at {url} did not answer within {waited:g} s; going on: "
                   f"each request waits up to {timeout:g} s for its answer (--timeout), and every retry is told",
                   err=True)

    def unanswered(why: str) -> None:
        click.echo(f"{MESSAGE_PREFIX}the API key is not checked (--check-key): {why}; going on without the check",
                   err=True)

    refusal = refused_key(settings, within=timeout, on_no_answer=no_answer, traces=to != SAMPLES,
                          on_unanswered=unanswered if asked else None)
    if refusal is not None:
        fail_usage(str(refusal))


def local_database(db: Path | None) -> Path:
    """The database ``--local`` writes: ``--db``, else the default one (local_platform/place.py).
    One that cannot be (``database_blocker``) is a usage error naming where it came from."""
    from prime_runs_spool.local_platform.place import database_blocker, database_source, default_database

    path = (db or default_database()).expanduser()
    blocker = database_blocker(path)
    if blocker is not None:
        fail_usage(f"{database_source(db)}: cannot open database {path}: {blocker}")
    return path.resolve()


def new_database_line(reports: Iterable[Any], db: str, target: Destination, sink: str | None) -> str | None:
    """After a ``--local`` sync that created its database: the runs whose states say episodes
    were pushed into a database at that path before (it was deleted or moved since), which
    a plain sync takes for up to date while none of theirs is in the new one; and the
    ``--replay`` that pushes them into it. None when there is none. One run is named once,
    by one of its copies (``cp -r``, an artifact unpacked twice: one local run id), and not
    at all when a copy pushed it in this very sync: a ``--replay`` of each copy pushed the
    run once per copy."""
    from prime_runs_spool.sync.state import sync_command

    reports = list(reports)
    filled = {report.local_run_id or report.path for report in reports if report.pushed_now}
    gone: dict[str, str] = {}  # by the run's local id: the first of its copies
    for report in reports:
        if report.pushed_total > report.pushed_now and (run := report.local_run_id or report.path) not in filled:
            gone.setdefault(run, report.path)
    if not gone:
        return None
    return (f"{MESSAGE_PREFIX}warning: {db} did not exist before this sync, so what {count(len(gone), 'run')} pushed "
            "into a database at that path before (deleted or moved since?) is not in it; push them into it again "
            f"with: {sync_command(list(gone.values()), target, sink, '--replay')}")


@contextlib.contextmanager
def destination(local: bool, db: Path | None, settings: Settings | None,
                team: str | None) -> Iterator[tuple[Settings, Destination, str | None]]:
    """Settings and the destination identity; for ``--local``, a running embedded platform,
    its Prime Traces service on (a run whose state records traces there carries on there;
    ``auto`` sends a new run to samples without asking, ``SyncOptions.auto_sink``).
    ``settings``: the remote platform's (:func:`remote_settings`), None with ``local``."""
    from prime_runs_spool.errors import PlatformDatabaseError
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.state import local_destination, remote_destination

    if not local:
        assert settings is not None
        yield settings, remote_destination(settings.base_url, settings.team_id), None
        return
    from prime_runs_spool.local_platform.place import database_source, folder_refused
    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.files import make_private_dir

    db_path = local_database(db)
    try:
        make_private_dir(db_path.parent)
    except OSError as exc:
        fail_usage(folder_refused(db_path.parent, db, exc.strerror))
    with contextlib.ExitStack() as stack:
        try:
            platform = stack.enter_context(EmbeddedPlatform(db_path, frontend_url=LOCAL_FRONTEND, traces=True))
        except PlatformDatabaseError as exc:  # not SQLite, a directory, a FIFO: the user's --db to fix
            fail_usage(f"{database_source(db)}: {exc}")
        # Its key, which asks nothing of it, is one no message holds: every error line is
        # scrubbed of the key, and "local" was scrubbed out of paths ('test_a_***_database').
        local_settings = Settings(base_url=platform.base_url, api_key=Secret(f"local-{secrets.token_hex(16)}"),
                                  team_id=team, frontend_url=LOCAL_FRONTEND)
        yield local_settings, local_destination(db_path, team), str(db_path)


def sync_options(params: dict[str, Any], progress: Progress) -> SyncOptions:
    """The options every pass of this command shares, from its parameters; every retry is
    told to ``progress`` (the progress line on a terminal, else a line on stderr), and every
    wait for a request in doubt."""
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.retry import Backoff

    cap = params["backoff_cap"]
    backoff = Backoff(base=min(0.5, cap), cap=cap, max_attempts=params["max_attempts"],
                      retry_for=params["retry_for"], on_retry=progress.retrying, on_wait=progress.waiting)
    return SyncOptions(request_lifetime=params["request_lifetime"], skip_corrupt=params["skip_corrupt"],
                       dry_run=params["dry_run"], max_request_bytes=params["max_request_bytes"], backoff=backoff,
                       replay=params["replay"], replay_id=params["replay_id"], name=params["name"],
                       tags=params["tags"], to=params["to"], traces_batch_bytes=params.get("traces_batch_bytes"),
                       copy_wait=params["copy_wait"], auto_sink=params.get("auto_sink"))


def progress_for(params: dict[str, Any]) -> Progress:
    """The progress line: on a terminal, not with --json or --follow (their lines are the
    output); retries are told either way."""
    return Progress(enabled=not params["as_json"] and sys.stderr.isatty() and not params["follow"])


def stop_on_signals() -> Interrupt:
    """SIGINT and SIGTERM from here on: the first ends the sync at its next safe point, a
    second at once (sync/interrupt.py)."""
    from prime_runs_spool.store.lease import release_held
    from prime_runs_spool.sync.interrupt import Interrupt

    interrupt = Interrupt()

    def at_once() -> None:
        os.write(2, f"\n{MESSAGE_PREFIX}stopped at once (second signal); every state is consistent, "
                    "run the same prime-runs sync again to carry on\n".encode())
        for line in release_held():  # a store's or a mirrored folder's: else skipped until they expire
            os.write(2, f"{MESSAGE_PREFIX}{line}\n".encode())

    interrupt.install(on_second=at_once)
    return interrupt


def stopped_following_line(done: Iterable[bool], carry_on: str) -> str:
    """After ``--follow`` is stopped by a signal (exit 0), over local paths or store URLs:
    how many runs it found were finished and how many were not (a live writer, a platform
    that failed), ``done`` holding one flag a run: it had ended without a word, whatever it
    left behind. ``carry_on``: :func:`carry_on_command`."""
    flags = list(done)
    finished = sum(flags)
    return (f"{MESSAGE_PREFIX}stopped following: {count(finished, 'run')} finished, {len(flags) - finished} not yet; "
            f"the state is saved, carry on with (or add --follow): {carry_on}")


def carry_on_command(paths: Iterable[Path | str], target: Destination, params: dict[str, Any]) -> str:
    """The ``prime-runs sync`` that carries on where this one went, pasted: its paths, its
    destination and sink (sync/state.py, ``sync_command``), and the options that say where
    its states are and what it reads (``--state-dir``, ``--no-import``, ``--skip-corrupt``)."""
    from prime_runs_spool.sync.state import sync_command

    more = [*(["--state-dir", str(params["state_dir"])] if params.get("state_dir") else []),
            *(["--no-import"] if params.get("no_import") else []),
            *(["--skip-corrupt"] if params.get("skip_corrupt") else [])]
    return sync_command([str(p) for p in paths], target, params["to"], *more)


def exit_interrupted(reports: list[Any]) -> None:
    """After the first signal: one line saying what was done and what is left, then exit 130.
    Through ``os._exit``, once the output is flushed: a pass still on the wire after the
    grace is not waited for (its request is announced in its state, which the next sync
    settles), and the kernel releases its lock; its lease in a store (a mirrored folder's)
    is given up unless that request may still land (store/lease.py, ``release_held``)."""
    from prime_runs_spool.store.lease import release_held
    from prime_runs_spool.sync.options import EXIT_INTERRUPTED, INTERRUPTED

    left = [r for r in reports if r.state == INTERRUPTED]
    pushed = sum(r.pushed_now for r in reports)
    done = (f"{count(len(reports) - len(left), 'run')} done, {len(left)} left, {pushed} pushed by this sync"
            if reports else "before any run's pass ended")
    click.echo(f"{MESSAGE_PREFIX}interrupted: {done}; the state is saved, run the same prime-runs sync again to "
               "carry on", err=True)
    for line in release_held():
        click.echo(f"{MESSAGE_PREFIX}{line}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)
