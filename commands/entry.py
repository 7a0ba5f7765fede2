"""The ``prime-runs`` console script's entry: the command line, with a Ctrl-C during its own
start-up told as every other one is.

Importing the command line (click, the commands' option types, the library under them)
takes a few tenths of a second, and a Ctrl-C pressed right after Enter lands there, before
any handler of ``cli.py`` exists: it ended in a ``KeyboardInterrupt`` traceback. This module
imports nothing but the standard library's ``sys`` before it imports ``cli``, so what is
left of that window is the interpreter's own start.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:  # the words and the code every command ends a Ctrl-C with
        from prime_runs_spool.errors import MESSAGE_PREFIX
        from prime_runs_spool.sync.options import EXIT_INTERRUPTED

        sys.stderr.write(f"\n{MESSAGE_PREFIX}interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    command_line()
