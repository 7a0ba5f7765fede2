"""The ``prime-runs`` console script's entry: the command line, with a Ctrl-C during its own
start-up told as every other one is.

Importing the command line (click, the commands' option types, the library under them)
takes a few tenths of a second, and a Ctrl-C pressed right after Enter lands there, before
any handler of ``cli.py`` exists: it ended in a ``KeyboardInterrupt`` traceback. This module
imports nothing but the standard library's ``sys`` before it imports ``cli``, so what is
left of that window is the interpreter's own start.
"""

from __future__ import annotations

import io
import sys


def whole_writes() -> None:
    """Standard output that writes each line whole or says it could not.

    With ``PYTHONUNBUFFERED`` (a CI image's or a Dockerfile's habit) or ``python -u``, the
    text stream writes straight to the file and ignores how much of it the file took: a disk
    that filled in the middle of a report (``> report.json``, ``$SYNC_REPORT``) kept its
    first part, the rest was dropped without an error, and the command said nothing and
    exited 0 over a cut JSON document. A buffer under the stream writes what is left again,
    so the full disk is an error the command tells (``output.internal_error``). Each line is
    still out at once (line buffering, and every ``click.echo`` flushes)."""
    stdout = sys.stdout
    if isinstance(getattr(stdout, "buffer", None), io.RawIOBase):
        raw = io.FileIO(stdout.fileno(), "w", closefd=False)
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=stdout.encoding, errors=stdout.errors,
                                      line_buffering=True)


def main() -> None:
    if sys.argv[1:2] != ["eval"]:  # eval's output is verifiers', as the user's environment set it
        whole_writes()
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:  # the words and the code every command ends a Ctrl-C with
        from prime_runs_spool.errors import MESSAGE_PREFIX
        from prime_runs_spool.sync.options import EXIT_INTERRUPTED

        sys.stderr.write(f"\n{MESSAGE_PREFIX}interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    command_line()
