"""``prime-runs eval``: verifiers' own eval (``vf-eval``), in this process, recording a spool.

A thin shell around :mod:`prime_runs_spool.runner.verifiers_eval`: every argument goes to
verifiers unchanged (click parses none of them), the exit code is verifiers' own, and an
offline run ends with one line saying how to sync its spool, an online run that did not
ship everything with one line saying how many episodes, why, and how to ship them. Three
endings get the exact resume command: an interrupt (verifiers' 130), a full disk, and a
folder the eval may not write (a read-only file system, permission refused on the run's
folder, or a file where that folder should be), which would otherwise end in a traceback for
what is no bug: one line and exit 1 instead. Its
help (``--help``, ``-h``, or no argument) loads neither verifiers nor the writer.
"""

from __future__ import annotations

import sys

import click

from .doc_links import docs_epilog
from .output import EXIT_RUN_FAILED, EXIT_USAGE
from prime_runs_spool.errors import MESSAGE_PREFIX, SpoolError, VerifiersVersionError


#: The arguments that ask for the help instead of an eval, wherever they stand.
HELP_OPTIONS = ("-h", "--help")
#: verifiers' exit code after Ctrl-C or SIGTERM.
EXIT_INTERRUPTED = 130
#: The disk holding the run filled up: one line naming it and the resume command.
EXIT_DISK_FULL = EXIT_RUN_FAILED
#: A folder the run writes cannot be written: one line naming it and the resume command.
EXIT_UNWRITABLE = EXIT_RUN_FAILED


@click.command(
    "eval",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("vf_eval_args", nargs=-1, type=click.UNPROCESSED)
def eval_command(vf_eval_args: tuple[str, ...]) -> None:
    """Run verifiers' eval (vf-eval) with every episode recorded in a spool.

    All arguments pass through to vf-eval unchanged (`@ eval.toml`, `--resume`, `--no-push`,
    `-c`, `--no-rich`, ...); `prime-runs eval --help` prints what this adds, with examples
    (runner/eval_help.py, EVAL_HELP: click never shows this text), and points at vf-eval's
    help: printing it would import verifiers, seconds of CPU for a help text.
    """
    argv = list(vf_eval_args)
    if not argv or any(arg in HELP_OPTIONS for arg in argv):
        from prime_runs_spool.runner.eval_help import EVAL_HELP

        click.echo(EVAL_HELP + "\n" + docs_epilog().removeprefix("\b\n"))
        return
    from prime_runs_spool.runner.modes import resolve_mode

    try:  # before verifiers makes the run's folder: a typo is told at once, as a usage error
        resolve_mode()
    except ValueError as exc:
        click.echo(f"{MESSAGE_PREFIX}{exc} (set it to one of them, or unset it for offline)", err=True)
        sys.exit(EXIT_USAGE)
    from prime_runs_spool.runner.verifiers_eval import (
        EvalSession, disk_full_error, disk_full_line, interrupt_hint, launch_file_problem, not_shipped_lines,
        run_vf_eval, sync_hint, unwritable_error, unwritable_line,
    )

    problem = launch_file_problem(argv)
    if problem is not None:  # a folder or a FIFO as the @ file: one line, before verifiers reads it
        click.echo(f"{MESSAGE_PREFIX}{problem}", err=True)
        sys.exit(EXIT_USAGE)

    session = EvalSession(argv=argv)
    try:
        code, session = run_vf_eval(argv, session)
    except VerifiersVersionError as exc:
        click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
        sys.exit(EXIT_USAGE)
    except SpoolError as exc:  # e.g. run.attach refused, a run in use: one line, no traceback
        click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        full = disk_full_error(exc)
        if full is not None:
            click.echo(f"{MESSAGE_PREFIX}{disk_full_line(session, full)}", err=True)
            sys.exit(EXIT_DISK_FULL)
        unwritable = unwritable_error(exc, session)
        if unwritable is None:
            raise  # verifiers' own error (most often the environment's code): its traceback
        click.echo(f"{MESSAGE_PREFIX}{unwritable_line(session, unwritable)}", err=True)
        sys.exit(EXIT_UNWRITABLE)
    for line in not_shipped_lines(session):
        click.echo(f"{MESSAGE_PREFIX}{line}", err=True)
    hint = sync_hint(session)
    if hint:
        click.echo(hint, err=True)
    if code == EXIT_INTERRUPTED and (resume := interrupt_hint(session)):
        click.echo(resume, err=True)
    sys.exit(code)
