"""``prime-runs view``: a local web viewer over spools (see docs/viewer.md).

The viewer (Jinja2, Starlette, uvicorn) is imported only when the command runs, so
``prime-runs --help`` and the other commands do not pay for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .options import LocalPath, OutputFolderPath, allow_empty_option, read_state_dir_option
from .output import SkippedLinks, count, fail_usage, require_paths
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.importer.options import default_state_dir


@click.command("view")
@click.argument("paths", nargs=-1, type=LocalPath(path_type=Path, hint=(
    "sync the store into the local platform (prime-runs sync URL --local) and browse it with "
    "prime-runs platform serve, or view the folder it was mirrored from")))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--port", default=None, type=click.IntRange(0, 65535),
              help="Port to listen on; 0 picks a free one. Default: 7676, or the next free one.")
@click.option("--open", "open_browser", is_flag=True, help="Open the viewer in a browser once it listens.")
@click.option("--token", default=None, envvar="PRIME_RUNS_VIEW_TOKEN",
              help="Require this token (entered once in the browser) for every page. "
                   "Also read from PRIME_RUNS_VIEW_TOKEN.")
@click.option("--export", "export_dir", type=OutputFolderPath(), default=None,
              help="Write a static copy of the pages to this folder and exit, instead of serving.")
@read_state_dir_option
@allow_empty_option
def view(paths: tuple[Path, ...], host: str, port: int | None, token: str | None, export_dir: Path | None,
         state_dir: Path | None, open_browser: bool, allow_empty: bool) -> None:
    """Serve a web viewer over every run spool under PATHS (default: .), reading the spools
    only: no platform, no network. The first line of stdout is the URL to open. Eval outputs
    with no spool are shown read-only, marked "not spooled", with the command that imports them.

    Exit 0 after a clean stop (SIGINT/SIGTERM) or a finished export; 1 when a path given to
    --export holds neither a spool nor eval outputs (unless --allow-empty) or a run exported
    cannot be read (its pages say why); 2 on a usage error
    (a path does not exist, a non-loopback --host without --token, the address cannot be bound).

    \b
    Examples:
      prime-runs view outputs
      prime-runs view outputs --export site/
    """
    from prime_runs_spool.errors import SpoolError
    from prime_runs_spool.viewer.server import serve_viewer
    from prime_runs_spool.viewer.sources import SpoolSource

    roots = require_paths(paths or (Path("."),))
    if export_dir is not None:
        from prime_runs_spool.importer.places import paths_with_nothing
        from prime_runs_spool.viewer.export import export
        from prime_runs_spool.viewer.index import UNREADABLE

        from .import_ import nothing_found_message

        # A site of nothing published looks like one of runs: said, and exit 1, as sync,
        # status, verify and import do (a served viewer is exempt: runs may appear later).
        # Said after the export, so that a folder that cannot be written stays a usage error.
        empty = paths_with_nothing(roots)
        links = SkippedLinks()
        source = SpoolSource(roots, default_state_dir(state_dir), links)
        try:
            written = export(source, export_dir)
        except SpoolError as exc:
            fail_usage(f"view --export: {exc}")
        except OSError as exc:  # the folder written to: say which path, and why, not the errno
            fail_usage(f"view --export: {exc.filename or export_dir}: cannot be written ({exc.strerror or exc})")
        click.echo(f"{(export_dir / 'index.html').resolve().as_uri()}")
        click.echo(f"wrote {count(written, 'file')} to {export_dir}", err=True)
        for path in empty:
            click.echo(f"{MESSAGE_PREFIX}{nothing_found_message(path)}", err=True)
        # A run none of whose records could be read (another user's segment): its pages in the
        # site say why, and so does the command, as export says of a table's rows.
        unread = [run.error for run in source.runs() if run.status == UNREADABLE and run.error]
        for error in unread:
            click.echo(f"{MESSAGE_PREFIX}{error} (the run's pages in the export say so)", err=True)
        links.say()
        sys.exit(1 if unread or (empty and not allow_empty) else 0)
    try:
        serve_viewer(roots, host=host, port=port, token=token, out=sys.stdout,
                     state_dir=default_state_dir(state_dir), open_in=sys.stderr if open_browser else None,
                     on_link=SkippedLinks(at_once=True))
    except SpoolError as exc:
        fail_usage(f"view: {exc}")
    except OSError as exc:
        fail_usage(f"view: cannot listen on {host}:{port if port is not None else 'the default port'}: "
                   f"{exc.strerror or exc}")
