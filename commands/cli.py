"""Entry point of the ``prime-runs`` console script.

Each subcommand lives in its own module and is registered here, so a command is easy to
find and the top level stays a table of contents.
"""

from __future__ import annotations

import os
import sys

import click

from .import_ import import_
from .eval import eval_command
from .export import export
from .mirror import mirror
from .output import TRACEBACK_ENV, internal_error
from .platform import platform
from .status import status
from .sync import sync
from .verify import verify
from .view import view
from prime_runs_spool import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="prime-runs")
def cli() -> None:
    """Spool eval episodes to disk and sync them to the Prime Intellect platform exactly once."""


cli.add_command(verify)
cli.add_command(sync)
cli.add_command(status)
cli.add_command(platform)
cli.add_command(import_)
cli.add_command(eval_command)
cli.add_command(view)
cli.add_command(mirror)
cli.add_command(export)


def main() -> None:
    """The command line; an error no code path expected ends in one line, never a traceback
    (``PRIME_RUNS_TRACEBACK=1`` shows it): every command gets what ``sync`` has had. Not
    ``eval``: what escapes it is verifiers' (the user's environment code, most often), shown
    as ``vf-eval`` shows it."""
    try:
        cli()
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV) or sys.argv[1:2] == [eval_command.name]:
            raise
        internal_error(exc, f"set {TRACEBACK_ENV}=1 for the traceback")
