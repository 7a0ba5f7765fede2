"""Entry point of the ``prime-runs`` console script.

Each subcommand lives in its own module and is named here, so a command is easy to find and
the top level stays a table of contents. A command's module is imported when the command
is asked for (``--help`` asks for all of them): ``prime-runs sync`` loads no other command.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from .doc_links import docs_epilog
from .output import TRACEBACK_ENV, internal_error
from prime_runs_spool import __version__

#: Each command: the module that defines it and the click command's name there, in the
#: order ``--help`` lists them (its own, by name).
COMMANDS = {
    "eval": (".eval", "eval_command"),
    "export": (".export", "export"),
    "import": (".import_", "import_"),
    "mirror": (".mirror", "mirror"),
    "platform": (".platform", "platform"),
    "status": (".status", "status"),
    "sync": (".sync", "sync"),
    "verify": (".verify", "verify"),
    "view": (".view", "view"),
}
#: The command whose errors are not ours to shorten (see :func:`main`).
EVAL = "eval"


class Commands(click.Group):
    """The commands of :data:`COMMANDS`, each imported when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module, __package__), name)
        assert isinstance(command, click.Command) and command.name == cmd_name, (cmd_name, command)
        for each in (command, *getattr(command, "commands", {}).values()):  # platform's serve too
            each.epilog = docs_epilog()  # eval prints its own help, and ignores it
        return command


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=docs_epilog())
@click.version_option(__version__, prog_name="prime-runs")
def cli() -> None:
    """Spool eval episodes to disk and sync them to the Prime Intellect platform exactly once."""


def main() -> None:
    """The command line; an error no code path expected ends in one line, never a traceback
    (``PRIME_RUNS_TRACEBACK=1`` shows it): every command gets what ``sync`` has had. Not
    ``eval``: what escapes it is verifiers' (the user's environment code, most often), shown
    as ``vf-eval`` shows it."""
    try:
        cli()
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV) or sys.argv[1:2] == [EVAL]:
            raise
        internal_error(exc, f"set {TRACEBACK_ENV}=1 for the traceback")
