"""The options of a sync, defined once: ``prime-runs sync`` (commands/sync.py) and the
library's own ``python -m prime_runs_spool.sync`` (sync/__main__.py, what the online shipper
launches with ``sys.executable``, without the command line package) both take them from
:func:`shared_options`, with the same names, types, defaults, environment variables and help.

Cheap to import: click and the defaults only, so ``prime-runs --help`` pays for none of the
machinery behind the options.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from prime_runs_spool.sync.options import (
    COPY_WAIT_ENV,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_COPY_WAIT,
    DEFAULT_JOBS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REQUEST_LIFETIME,
    DEFAULT_TIMEOUT,
    MIN_REQUEST_LIFETIME,
    AUTO,
    ERROR,
    SINK_ENV,
    SINKS,
    seconds_problem,
)
from prime_runs_spool.sync.retry import DEFAULT_RETRY_FOR, RETRY_FOR_ENV

F = TypeVar("F", bound=Callable[..., Any])

#: Where the API key comes from, as every help text and error says it.
KEY_SOURCES = "PRIME_API_KEY, else api_key in ~/.prime/config.json"


class _NamesItsEnvironment(click.ParamType):
    """click names the option even when the value came from its environment variable,
    which is then the one to fix: say so."""

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None) -> Any:
        from click.core import ParameterSource

        envvar = getattr(param, "envvar", None)
        if ctx is not None and param is not None and param.name and isinstance(envvar, str) \
                and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT:
            message = f"{message.rstrip('.')} (from {envvar})"  # click's own messages end in a period
        super().fail(message, param, ctx)


class Seconds(_NamesItsEnvironment, click.FloatRange):
    """A number of seconds of at least ``minimum``, finite: click's FloatRange lets NaN and
    infinity through (sync/options.py, ``seconds_problem``, says what they did). A FloatRange
    for the range the help shows; its own checks are not used, whose words ("is not a valid
    seconds.", "is not in the range x>=0") read wrong."""

    name = "seconds"
    #: What a value that is no number should have been, in the one line that refuses it.
    expected = "a number of seconds (e.g. 600 or 2.5)"

    def __init__(self, minimum: float = 0.0) -> None:
        super().__init__(min=minimum)
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not {self.expected}", param, ctx)
        problem = seconds_problem(seconds, self.minimum)
        if problem:
            self.fail(problem, param, ctx)
        return seconds


class Choice(_NamesItsEnvironment, click.Choice):
    """click's Choice, naming the environment variable a bad value came from."""


class Duration(Seconds):
    """A duration: seconds, or a number with ``s``, ``m`` or ``h`` (``90``, ``90s``, ``5m``)."""

    name = "duration"
    expected = "a duration (90, 90s, 5m, 1h)"
    UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, str) and value.strip()[-1:].lower() in self.UNITS:
            text = value.strip()
            try:
                value = float(text[:-1]) * self.UNITS[text[-1].lower()]
            except ValueError:
                self.fail(f"{value!r} is not {self.expected}", param, ctx)
        return super().convert(value, param, ctx)


#: Each shared option, in the order the help lists them: (flags, click keyword arguments).
_SHARED: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--base-url",), dict(help="Platform API base URL (default: PRIME_API_BASE_URL, base_url in "
                                "~/.prime/config.json, else the public platform).")),
    (("--team", "team"), dict(help="Team id to sync into (default: PRIME_TEAM_ID).")),
    (("--to", "to"), dict(type=Choice(SINKS), default=AUTO, show_default=True, envvar=SINK_ENV,
                          help="Where episodes go: Prime Traces, the legacy samples table, or auto (traces, "
                               "falling back to samples if the account has no Prime Traces; env "
                               f"{SINK_ENV}). Recorded per run.")),
    (("--jobs", "-j"), dict(type=click.IntRange(1, 64), default=DEFAULT_JOBS, show_default=True,
                            help="Runs synced in parallel.")),
    (("--wait",), dict(is_flag=True, help="Wait for another sync working on a run instead of skipping it.")),
    (("--copy-wait",), dict(type=Seconds(0), envvar=COPY_WAIT_ENV, default=DEFAULT_COPY_WAIT, show_default=True,
                            help="Seconds to wait for another sync on this machine pushing a copy of a run "
                                 "(another folder holding the same run) to the same platform, before skipping "
                                 f"it (env {COPY_WAIT_ENV}).")),
    (("--json", "as_json"), dict(is_flag=True, help="Print one machine-readable report.")),
    (("--request-lifetime",), dict(type=Seconds(MIN_REQUEST_LIFETIME), envvar="PRIME_RUNS_REQUEST_LIFETIME",
                                   default=DEFAULT_REQUEST_LIFETIME, show_default=True,
                                   help="Seconds after which an unanswered request can no longer land (env "
                                        "PRIME_RUNS_REQUEST_LIFETIME).")),
    (("--timeout",), dict(type=Seconds(0.1), default=DEFAULT_TIMEOUT, show_default=True,
                          help="Seconds to wait for one answer.")),
    (("--max-attempts",), dict(type=click.IntRange(1), default=DEFAULT_MAX_ATTEMPTS, show_default=True,
                               help="Consecutive failures of one request before a run gives up (its state is "
                                    "kept).")),
    (("--retry-for",), dict(type=Duration(0), default=DEFAULT_RETRY_FOR, show_default=True, envvar=RETRY_FOR_ENV,
                            help="How long a platform that fails every request is retried (90, 90s, 5m, 1h), all "
                                 f"runs together; then each run still failing is reported {ERROR!r} (its state kept; env "
                                 f"{RETRY_FOR_ENV}).")),
    (("--follow",), dict(is_flag=True,
                         help="Keep following live spools: push episodes as they are appended, pick up new runs, "
                              "finish runs as they seal; until SIGINT/SIGTERM.")),
    (("--exit-when-idle",), dict(is_flag=True,
                                 help="With --follow: exit once every run found is finished and no writer is "
                                      "live.")),
    (("--poll-interval",), dict(type=Seconds(0.01), default=DEFAULT_POLL_INTERVAL, show_default=True,
                                help="With --follow: seconds between looks at each spool's size.")),
    (("--backoff-cap",), dict(type=Seconds(0.0), default=DEFAULT_BACKOFF_CAP, hidden=True,
                              envvar="PRIME_RUNS_BACKOFF_CAP", help="Longest wait between retries, in seconds.")),
)


def shared_options(command: F) -> F:
    """Add every shared option to a click command (listed in :data:`_SHARED`'s order), and
    ``-o/--output`` beside ``--json``."""
    for flags, settings in reversed(_SHARED):
        command = click.option(*flags, **settings)(command)
    return output_option(command)


#: What ``-o/--output`` takes, as the prime CLI spells its machine output: ``json`` is what
#: ``--json`` prints, ``table`` the lines a person reads (the default).
OUTPUTS = ("json", "table")


def output_option(command: F) -> F:
    """Add ``-o/--output json|table`` to a command that has ``--json`` (kept as its alias):
    the command still receives ``as_json`` alone, true when either asked for JSON."""

    @functools.wraps(command)
    def folded(*args: Any, output: str | None = None, **kwargs: Any) -> Any:
        if output == "json":
            kwargs["as_json"] = True
        return command(*args, **kwargs)

    return click.option("--output", "-o", "output", type=Choice(OUTPUTS), default=None,
                        help="json: one machine-readable report (as --json); table: lines (the default).")(folded)  # type: ignore[return-value]
