"""Entry point of the ``prime-runs`` console script.

Each subcommand lives in its own module and is named here, so a command is easy to find and
the top level stays a table of contents. A command's module is imported when the command
is asked for (``--help`` asks for all of them): ``prime-runs sync`` loads no other command.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

from .doc_links import docs_epilog
from .output import TRACEBACK_ENV, internal_error
from prime_runs_spool import __version__
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.sync.options import EXIT_INTERRUPTED

#: Each command: the module that defines it and the click command's name there, in the
#: order ``--help`` lists them (its own, by name).
COMMANDS = {
    "ci-script": (".ci_script", "ci_script"),
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
#: Where a context keeps the command asked for, for an error click gives no context of its
#: own (an option missing its value): the line still names that command's --help.
ASKED_FOR = "prime_runs.command"
#: The command whose errors are not ours to shorten (see :func:`main`).
EVAL = "eval"


def usage_line(exc: click.ClickException, ctx: click.Context) -> str:
    """Click's error as one line in the commands' own voice: click prints a usage block, a
    hint and ``Error: ...`` (four lines); every other error of every command is one line
    beginning :data:`MESSAGE_PREFIX`, which is what a CI log is searched for."""
    text = exc.format_message().rstrip(".")
    text = text[:1].lower() + text[1:]
    where = getattr(exc, "ctx", None)  # the command's own, when click knows it
    path = where.command_path if where else " ".join([ctx.command_path, *ctx.meta.get(ASKED_FOR, ())])
    return f"{MESSAGE_PREFIX}{text} (see {path} --help)"


@contextlib.contextmanager
def one_line_errors(ctx: click.Context) -> Iterator[None]:
    """Click's own errors (a bad option or value, a missing argument, an unknown command) as
    :func:`usage_line`, with click's exit code (2 for a usage error). The help click prints
    for a group called without a command is left to click."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.ClickException as exc:
        click.echo(usage_line(exc, ctx), err=True)
        sys.exit(exc.exit_code)


class Commands(click.Group):
    """The commands of :data:`COMMANDS`, each imported when asked for; click's own errors,
    raised while the arguments are parsed at any level, each in one line."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[ASKED_FOR] = [name] if name else []
        return name, command, rest

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with one_line_errors(ctx):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors(ctx):
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt:  # Ctrl-C in a command with no handler of its own (export, verify...)
                click.echo(f"\n{MESSAGE_PREFIX}interrupted", err=True)  # after the ^C the terminal echoed
                sys.exit(EXIT_INTERRUPTED)

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
    command = sys.argv[1:2]  # read now: verifiers' eval rewrites sys.argv as it parses its own
    try:
        cli()
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV) or command == [EVAL]:
            raise
        internal_error(exc, f"set {TRACEBACK_ENV}=1 for the traceback")
