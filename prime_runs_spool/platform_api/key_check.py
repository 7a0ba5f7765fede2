"""Whether the platform refuses an API key: one read, asked before a sync writes anything,
so that a wrong key is a configuration error told once instead of an error per run.

The check is only a shortcut to that early answer; it must never be what a sync waits on.
A platform that takes the connection and never answers would hold a request for a whole
``--timeout``, before a follower could take a lease or see its signals. So the read runs in
a thread of its own and is given up after :data:`KEY_CHECK_SECONDS`, whatever stalls (the
name, the connection, TLS, the answer): a platform that is down, slow or silent is met by
the passes themselves, through their visible retries and ``--retry-for``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prime_runs_spool.errors import FailureKind, PlatformError, UnexpectedAnswer
from prime_runs_spool.platform_api.answers import is_redirect
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Settings

#: Seconds the key check waits for the platform's answer before giving up on it (the sync
#: goes on as if the key were good; a refusal then reaches each run's pass instead).
KEY_CHECK_SECONDS = 5.0

#: The answers that mean the key itself is wrong: refused (401), or not allowed to read
#: where the sync would write (403).
REFUSED_KEY_STATUSES = (401, 403)

#: The answers that mean the base URL is not the platform at all: the platform always has
#: the evaluations listing the check reads, so an unknown path (404), a method the path
#: does not take (405) or none it implements (501) is some other server there (a model
#: server, a file server), which retrying cannot change. So is a success whose body is not
#: the listing (no JSON, or no ``evaluations`` list with its ``total``): another JSON API,
#: a web page served for every path.
NOT_THE_PLATFORM_STATUSES = (404, 405, 501)


def refused_key(settings: Settings, within: float = KEY_CHECK_SECONDS,
                on_no_answer: Callable[[float, str], None] | None = None, *,
                traces: bool = False, on_unanswered: Callable[[str], None] | None = None) -> PlatformError | None:
    """The platform's refusal of ``settings``' key (or a base URL that is not the platform),
    or, with ``traces`` (the sync may upload to Prime Traces) where Prime Traces has a URL of
    its own, that service's refusal of it: else every run had its evaluation created before
    its first upload was refused. None: accepted, or no answer within
    ``within`` seconds (at most :data:`KEY_CHECK_SECONDS`), or any other failure. Waits in
    the caller's thread with a plain join, so a signal handler that raises ends the wait.
    ``on_no_answer`` is called with those seconds and the URL asked when the check is given
    up on: a platform that holds its requests is otherwise first told a whole ``--timeout`` later.
    ``on_unanswered`` is called with why, when the platform's read ended with no verdict on the
    key (no connection, no name, a 5xx or a 429): for a sync that sends, the passes retry and
    say so; for ``--check-key`` with nothing to send, it is all that says the key went unchecked."""
    within = min(within, KEY_CHECK_SECONDS)
    refusals: list[PlatformError] = []
    unanswered: list[str] = []
    asking = [settings.base_url]
    own_traces = traces and settings.traces_base_url != settings.base_url

    def ask() -> None:
        try:
            with PlatformClient(settings, timeout=within) as client:
                client.list_evaluations(limit=1)
                if own_traces:
                    asking.append(settings.traces_base_url)
                    if (refusal := client.traces_probe().refused_key()) is not None:
                        refusals.append(refusal)
        except PlatformError as exc:
            if exc.kind is FailureKind.FATAL and exc.status in REFUSED_KEY_STATUSES:
                refusals.append(exc)
            elif exc.kind is FailureKind.FATAL and is_redirect(exc.status):
                refusals.append(exc)  # a redirect, which no pass follows: its line says where to
            elif exc.status in NOT_THE_PLATFORM_STATUSES:
                refusals.append(not_the_platform(settings.base_url, exc.status))
            elif isinstance(exc, UnexpectedAnswer):  # a success, but not the listing: another server
                refusals.append(not_the_platform(settings.base_url))
            else:
                unanswered.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - anything else is for the passes to meet and report
            unanswered.append(f"{type(exc).__name__}: {exc}")

    # A daemon: a check given up on is left to end by its own timeout, never joined at exit.
    thread = threading.Thread(target=ask, name="prime-runs-key-check", daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive() and on_no_answer is not None:
        on_no_answer(within, asking[-1])
    elif unanswered and on_unanswered is not None:
        on_unanswered(unanswered[0])
    return refusals[0] if refusals else None


def not_the_platform(base_url: str, status: int | None = None) -> PlatformError:
    """The one line for a base URL whose server does not serve the platform's API: its
    listing answered ``status``, or (None) answered something else than the listing."""
    answered = f"answered {status}" if status is not None else \
        "answered with something else than the platform's listing (its evaluations and their total)"
    return PlatformError(FailureKind.FATAL,
                         f"{base_url} does not look like the platform: its evaluations listing {answered}; "
                         "check --base-url (PRIME_API_BASE_URL, base_url in ~/.prime/config.json)", status=status)
