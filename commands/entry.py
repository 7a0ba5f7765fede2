"""The ``prime-runs`` console script's entry: the command line, with a Ctrl-C during its own
start-up told as every other one is.

Importing the command line (click, the commands' option types, the library under them)
takes a few tenths of a second, and a Ctrl-C pressed right after Enter lands there, before
any handler of ``cli.py`` exists: it ended in a ``KeyboardInterrupt`` traceback. This module
imports nothing but the standard library's ``sys``, ``io`` and ``signal`` (the first two
loaded at the interpreter's start, the third in about half a millisecond) before it
imports ``cli``, so what is left of that window is the interpreter's own start.

A shell without job control (a script's ``prime-runs sync ... &``) starts a background
command with SIGINT ignored, and Python keeps that: ``kill -INT`` of a background sync was
lost until its own handlers were installed (seconds of imports under load) and while a
follow switched to its own (the ignore put back between them), and the sync went on. Every
command but ``eval`` takes SIGINT back first thing, so it ends as Ctrl-C ends it; ``eval``
keeps what its shell gave it, as ``vf-eval`` does, its episodes being the eval's to stop.
"""

from __future__ import annotations

import io
import signal
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


def refuse_closed_output() -> None:
    """One line and exit 2, before anything is done, when standard output is closed (``>&-``,
    a parent's closed descriptor): Python then has no ``sys.stdout``, and a command's output
    went nowhere without a word: ``status`` exited 0 having printed nothing, a sync's report
    was lost the same way, and ``sync --local``, ``view`` or ``mirror`` ended in an internal
    error ('Unable to configure formatter', 'NoneType' object has no attribute 'flush')."""
    if sys.stdout is not None:
        return
    from prime_runs_spool.errors import MESSAGE_PREFIX
    from prime_runs_spool.sync.options import EXIT_USAGE

    if sys.stderr is not None:
        sys.stderr.write(f"{MESSAGE_PREFIX}standard output is closed, so this command's output would go nowhere: "
                         "nothing was done; send it somewhere (> FILE, or > /dev/null to drop it)\n")
    sys.exit(EXIT_USAGE)


def hold_closed_streams() -> None:
    """Standard input and standard error, when closed (``<&-``, ``2>&-``), opened on
    ``/dev/null``: as they were, click wrote a usage error to the closed descriptor 2 and
    failed ('Bad file descriptor'), so the command ended as an internal error, exit 1 in place
    of its documented 2; and the first file a command opened would take the free descriptor
    (0 or 2), where a line meant for the terminal would be written into it. Closed, what goes
    to standard error is dropped, as ``2>/dev/null`` drops it."""
    import os

    for fd, name in ((0, "stdin"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


#: The error handler standard output encodes with (:func:`escape_what_cannot_be_encoded`).
ESCAPE_ERRORS = "prime-runs-json-escape"


def _json_escape(exc: UnicodeError) -> tuple[str, int]:
    """What the output's encoding cannot hold, as JSON escapes it: ``\\uXXXX``, a character
    beyond the BMP as its surrogate pair. Valid inside a JSON string (``--json``, ``-o json``)
    and read back as the same character; readable in a line for a person."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    escaped = []
    for char in exc.object[exc.start:exc.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            escaped.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            escaped.append(f"\\u{code:04x}")
    return "".join(escaped), exc.end


def escape_what_cannot_be_encoded() -> None:
    """Standard output in an encoding that cannot hold every character (a Latin-1 terminal,
    ``PYTHONIOENCODING=latin-1``) writes what it cannot hold as JSON escapes it: a run named
    ``名前`` ended ``status``, ``sync`` and their ``--json`` reports in 'internal error:
    UnicodeEncodeError', exit 1, after the work was done. (An ASCII one click writes as
    UTF-8 itself; the interpreter's own default is UTF-8.)"""
    import codecs

    codecs.register_error(ESCAPE_ERRORS, _json_escape)
    stdout = sys.stdout
    if stdout is not None and getattr(stdout, "errors", None) == "strict" and hasattr(stdout, "reconfigure"):
        stdout.reconfigure(errors=ESCAPE_ERRORS)


def main() -> None:
    take_sigint_back()
    if sys.argv[1:2] != ["eval"]:  # eval's output is verifiers', as the user's environment set it
        hold_closed_streams()
        refuse_closed_output()
        whole_writes()
        escape_what_cannot_be_encoded()
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:  # the words and the code every command ends a Ctrl-C with
        from prime_runs_spool.errors import MESSAGE_PREFIX
        from prime_runs_spool.sync.options import EXIT_INTERRUPTED

        sys.stderr.write(f"\n{MESSAGE_PREFIX}interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    command_line()


def take_sigint_back() -> None:
    """SIGINT handled as Python handles it where no shell ignored it (``KeyboardInterrupt``,
    then each command's own handler), unless the command is ``eval`` (see the docstring)."""
    if sys.argv[1:2] != ["eval"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
