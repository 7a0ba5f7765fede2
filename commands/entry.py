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

#: As ``prime_runs_spool.errors.MESSAGE_PREFIX`` and ``sync.options.EXIT_INTERRUPTED`` say
#: them: spelled here because importing either is the very start-up this guards.
_INTERRUPTED_LINE = "\nprime-runs: interrupted\n"
_EXIT_INTERRUPTED = 130


def main() -> None:
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:
        sys.stderr.write(_INTERRUPTED_LINE)
        sys.exit(_EXIT_INTERRUPTED)
    command_line()
