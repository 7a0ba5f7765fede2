"""``prime-runs platform``: run the local platform (see docs/local-platform.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .output import Seconds, fail_usage


@click.group("platform")
def platform() -> None:
    """Run a local, SQLite-backed implementation of the platform's evaluations API."""


@platform.command("serve")
@click.option("--db", "db_path", default=None,
              help="SQLite database file, created if missing (default: $PRIME_RUNS_LOCAL_DB, else "
                   "$XDG_DATA_HOME/prime-runs/local-platform.db: the one prime-runs sync --local writes).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on; 0 picks a free one.")
@click.option("--token", default=None, envvar="PRIME_RUNS_PLATFORM_TOKEN",
              help="Require 'Authorization: Bearer TOKEN' on /api/, and the token (entered once in "
                   "the browser) on every dashboard page. Required for a non-loopback --host. "
                   "Also read from PRIME_RUNS_PLATFORM_TOKEN (out of ps).")
@click.option("--frontend-url", default=None,
              help="Base of viewer_url links (default: this server's own URL).")
@click.option("--request-deadline", type=Seconds(0), default=None,
              help="Refuse (503, nothing written) a write still uncommitted this many seconds "
                   "after its request arrived.")
@click.option("--traces", is_flag=True,
              help="Turn the Prime Traces service on (off, it answers service_not_enabled, like an "
                   "account without it; local-platform.md in the documentation, below).")
def serve_command(
    db_path: str | None, host: str, port: int, token: str | None, frontend_url: str | None,
    request_deadline: float | None, traces: bool,
) -> None:
    """Serve until SIGTERM/SIGINT; the first line of stdout is the base URL.

    Exit status: 0 after a clean stop, 2 on a usage error (database cannot be opened,
    address cannot be bound, a non-loopback --host without --token).

    \b
    Examples:
      prime-runs platform serve --port 8765       # what sync --local wrote, on loopback
      prime-runs platform serve --db platform.db --port 8000 --token s3cret
    """
    from prime_runs_spool.errors import PlatformDatabaseError, UnsafeListenError
    from prime_runs_spool.local_platform.place import database_blocker, database_source, default_database, folder_refused

    blocker = database_blocker(Path(db_path) if db_path is not None else default_database())
    if blocker is not None:
        fail_usage(f"{database_source(db_path and Path(db_path))}: cannot open database "
                   f"{db_path if db_path is not None else default_database()}: {blocker}")
    if db_path is None:
        from prime_runs_spool.files import make_private_dir

        db_path = str(default_database())
        try:
            make_private_dir(default_database().parent)
        except OSError as exc:
            fail_usage(folder_refused(default_database().parent, None, exc.strerror))

    try:
        # the server stack (uvicorn, Starlette, the viewer's Jinja2) only when serving
        from prime_runs_spool.local_platform.server import serve

        serve(db_path, host=host, port=port, token=token, frontend_url=frontend_url,
              request_deadline=request_deadline, traces=traces, out=sys.stdout)
    except (PlatformDatabaseError, UnsafeListenError) as exc:
        fail_usage(str(exc))
    except OSError as exc:
        fail_usage(f"cannot listen on {host}:{port}: {exc.strerror or exc}")

