"""``prime-runs eval``: verifiers' own eval (``vf-eval``), in this process, recording a spool.

A thin shell around :mod:`prime_runs_spool.runner.verifiers_eval`: every argument goes to
verifiers unchanged (click parses none of them), the exit code is verifiers' own, and an
offline run ends with one line saying how to sync its spool.
"""

from __future__ import annotations

import sys

import click

from .output import EXIT_USAGE
from prime_runs_spool.errors import SpoolError, VerifiersVersionError


@click.command(
    "eval",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("vf_eval_args", nargs=-1, type=click.UNPROCESSED)
def eval_command(vf_eval_args: tuple[str, ...]) -> None:
    """Run verifiers' eval (vf-eval) with every episode recorded in a spool.

    All arguments pass through to vf-eval unchanged (`@ eval.toml`, `--resume`, `--no-push`,
    `-c`, `--no-rich`, ...); `prime-runs eval --help` prints what this adds, then vf-eval's help.

    \b
    Examples:
      prime-runs eval @ eval.toml                 # vf-eval's arguments, unchanged
      prime-runs eval @ outputs/RUN/configs/resolved/eval.json --resume   # as vf-eval resumes
      PRIME_RUNS_MODE=online prime-runs eval @ eval.toml   # ship while it runs
    """
    from prime_runs_spool.runner.verifiers_eval import HELP_PREAMBLE, run_vf_eval, sync_hint

    argv = list(vf_eval_args)
    if not argv or any(arg in ("-h", "--help") for arg in argv):
        click.echo(HELP_PREAMBLE)
    try:
        code, session = run_vf_eval(argv)
    except VerifiersVersionError as exc:
        click.echo(f"prime-runs eval: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except SpoolError as exc:  # e.g. run.attach refused, a run in use: one line, no traceback
        click.echo(f"prime-runs eval: {exc}", err=True)
        sys.exit(1)
    hint = sync_hint(session)
    if hint:
        click.echo(hint, err=True)
    sys.exit(code)
