"""Shared output helpers for the commands: usage errors, path checks, a progress line."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.plural import count, episodes
from prime_runs_spool.sync.command_line import Duration, Seconds  # noqa: F401  (the commands' types)
from prime_runs_spool.sync.options import EXIT_RUN_FAILED, EXIT_USAGE


def fail_usage(message: str) -> None:
    """One line on stderr, exit 2: a user error gets no traceback. One line whatever path it
    quotes (``files.shown``): a name given with a line feed or an ESC in it split the line,
    or drove the terminal."""
    from prime_runs_spool.files import shown

    click.echo(shown(f"{MESSAGE_PREFIX}{message}"), err=True)
    sys.exit(EXIT_USAGE)


#: Set (to anything) to see the traceback of an internal error of any command.
TRACEBACK_ENV = "PRIME_RUNS_TRACEBACK"


def internal_error(exc: BaseException, hint: str = "run with --verbose for the traceback") -> None:
    """An error no code path expected: one line and exit 1 (``--verbose`` shows the traceback
    instead; the caller re-raises then). The command's own output that cannot be written (a
    full disk under ``> report.json``, ``$SYNC_REPORT`` in CI) is said as that: it read
    'internal error: OSError: [Errno 28] No space left on device', after a sync that had
    pushed and saved everything."""
    why = _unwritable_output(exc)
    if why is not None:
        click.echo(f"{MESSAGE_PREFIX}cannot write this command's output ({why}): what it did is kept, its report is "
                   "lost; run it again where its output can be written", err=True)
        _discard_output()
    else:
        click.echo(f"{MESSAGE_PREFIX}internal error: {type(exc).__name__}: {exc} ({hint})", err=True)
    sys.exit(EXIT_RUN_FAILED)


def _discard_output() -> None:
    """Send what standard output still holds nowhere: its report is lost already, and the
    interpreter's last flush of it failed again on the same full disk, which printed
    'Exception ignored in: <_io.TextIOWrapper name='<stdout>'...> OSError' and made the exit
    code 120 in place of 1."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError):  # a stream without a descriptor of its own (a test's)
        pass
    finally:
        os.close(null)


def _unwritable_output(exc: BaseException) -> str | None:
    """Why, when ``exc`` is the failure of writing a line of output (raised from click's
    ``echo``, which writes and flushes the stream in C), else None."""
    import traceback

    if not isinstance(exc, OSError) or exc.filename is not None:
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or frames[-1].name != "echo" or os.path.basename(os.path.dirname(frames[-1].filename)) != "click":
        return None
    return exc.strerror or str(exc)


#: What the HTTP stack imports only because it is installed, and a sync never runs:
#: httpcore imports trio (for async code under trio), httpx its own command line (rich and
#: pygments). About 0.1 s of CPU before a sync's first request (Dec 1,
#: benchmarks/startup.py).
UNUSED_HTTP_EXTRAS = ("trio", "httpx._main")


def without_unused_http_extras() -> None:
    """Make the imports of UNUSED_HTTP_EXTRAS fail in this process, as if they were not
    installed (a ``None`` in ``sys.modules``), for a command whose process is ours.

    Both importers expect that: trio is optional to httpcore, and httpx's command line
    needs extras, each import guarded by ``except ImportError``; nothing in a sync calls
    either (tests/test_cli_basics.py checks that httpx still sends with them left out).
    A module already imported is left as it is.
    """
    for name in UNUSED_HTTP_EXTRAS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def leave(code: int) -> None:
    """Exit with ``code`` once a command's work is done, without the interpreter's final
    garbage collections.

    At exit CPython collects the whole heap again and again while it tears the modules
    down: with httpx, httpcore (and trio), prime-traces and pydantic imported, about 0.1 s
    the user waits for after the report is printed, longer than the finalize request
    (Dec 1, benchmarks/startup.py). By the time this is called everything the command
    must finish is finished (state files written and fsync'd, locks released, clients
    closed, the report written), so the objects alive are frozen (``gc.freeze``): atexit
    handlers, the flush of stdout and stderr and the modules' teardown still run, and
    the process's end frees what a collection would have.
    """
    gc.freeze()
    sys.exit(code)


def require_paths(paths: Iterable[Path]) -> list[Path]:
    """The paths, once each exists; a path that exists but cannot be read is let through,
    for the walk to name it beside the runs that can be read."""
    roots = list(paths)
    for path in roots:
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            fail_usage(f"{path}: no such file or directory")
        except OSError:
            pass
    return roots


def _stderr_columns() -> int:
    """The width of the terminal stderr is on (its own: stdout may be a pipe)."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return columns or shutil.get_terminal_size((120, 20)).columns


class Progress:
    """A single self-rewriting status line on a terminal; silent otherwise.

    Redrawn only when its text changes, at most ten times a second: progress callbacks
    come from every run's worker thread after every request.
    """

    def __init__(self, enabled: bool, clock: Any = time.monotonic) -> None:
        self.enabled = enabled
        #: Each run's episodes pushed (a sample is one) and bytes sent as last told, and their sums: kept as
        #: they change, so that a sync of thousands of runs does not sum them all at each.
        self._runs: dict[str, tuple[int, int]] = {}
        self._pushed = 0
        self._sent = 0
        self._lock = threading.Lock()
        self._clock = clock
        self._shown = ""
        self._drawn_at = 0.0
        self._totals = ""
        #: The last retry told, shown after the totals until they move again.
        self._retry = ""

    def update(self, report: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            pushed, sent = self._runs.get(report.path, (0, 0))
            self._runs[report.path] = (report.pushed_now, report.bytes_sent)
            self._pushed += report.pushed_now - pushed
            self._sent += report.bytes_sent - sent
            totals = f"syncing {count(len(self._runs), 'run')}: {episodes(self._pushed)}, {self._sent / 1e6:.1f} MB sent"
            if totals != self._totals:
                self._totals, self._retry = totals, ""
            self._draw(force=False)

    def retrying(self, retry: Any) -> None:
        """A failed request about to be tried again (sync/retry.py, ``Retry``): on the
        progress line on a terminal, else one line on stderr, so a platform that is down is
        never a silent wait (a CI log shows each try)."""
        if not self.enabled:
            click.echo(f"{MESSAGE_PREFIX}{retry.what} failed: {retry.why}; try {retry.attempt + 1} in {retry.delay:.1f} s",
                       err=True)
            return
        with self._lock:  # the reason last: what a narrow terminal cuts is the least needed
            self._retry = f"try {retry.attempt + 1} in {retry.delay:.1f} s, {retry.what} failed: {retry.why}"
            self._draw(force=True)

    def waiting(self, wait: Any) -> None:
        """A run waiting out a request that may still land (sync/retry.py, ``Wait``), for up
        to a request lifetime: told as a retry is, so that the wait is never silent."""
        told = wait.line()
        if not self.enabled:
            click.echo(f"{MESSAGE_PREFIX}{told}", err=True)
            return
        with self._lock:
            self._retry = told
            self._draw(force=True)

    def _draw(self, *, force: bool) -> None:
        now = self._clock()
        if not force and now - self._drawn_at < 0.1:
            return  # before the terminal's width is asked: most updates stop here
        line = self._totals or "syncing"
        if self._retry:
            line = f"{line}; {self._retry}"
        width = max(20, _stderr_columns() - 1)
        line = line[:width]
        if line == self._shown:
            return
        # Padded with spaces over what the line before showed, as wide as it was.
        pad = max(72, len(self._shown))
        self._shown, self._drawn_at = line, now
        sys.stderr.write("\r" + line.ljust(pad))
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self._shown:
            sys.stderr.write("\r" + " " * max(72, len(self._shown)) + "\r")
            sys.stderr.flush()


class SkippedLinks:
    """The symbolic links a command's walks passed over that lead out of its paths (an
    ``OnLink``), each said once on stderr: after the report, or, for a command that walks
    again and again (``--follow``: ``at_once``), when first met. A note, not an error, so the
    exit code stays what the runs make it (docs/cli.md, "Symbolic links below the paths")."""

    def __init__(self, *, at_once: bool = False) -> None:
        self.links: dict[Path, Path] = {}
        self._at_once = at_once

    def __call__(self, link: Path, target: Path) -> None:
        if link not in self.links:
            self.links[link] = target
            if self._at_once:
                self._say(link, target)

    def say(self) -> None:
        if not self._at_once:
            for link, target in self.links.items():
                self._say(link, target)

    @staticmethod
    def _say(link: Path, target: Path) -> None:
        from prime_runs_spool.files import skipped_link_message

        click.echo(f"{MESSAGE_PREFIX}{skipped_link_message(link, target)}", err=True)
