"""``--to auto``'s one question to Prime Traces, "does this account have it?", asked on the
platform client's own connection (docs/sync.md, "Sinks").

Asked through the ``prime-traces`` client, the question cost more than its answer: that
client's import (pydantic's models under it) and its own TLS context, about 0.14 s of CPU
before the first samples request of every ``auto`` sync to an account without Prime Traces,
the local platform's included (Dec 1, benchmarks/startup.py). The read is one GET of the
episode listing with the account's key and team; the answer is in the service's error
envelope, ``{"error": {"code": ...}}``, which the library reads the same way
(``prime_traces.core.client``; tests/test_traces_sync.py checks the two names below
against the library's). An account that has Prime Traces uploads through the library as
before (platform_api/traces.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prime_runs_spool.errors import FailureKind, PlatformError

#: The error code of an account that has Prime Traces turned off
#: (``prime_traces.ErrorCode.SERVICE_NOT_ENABLED``).
SERVICE_NOT_ENABLED = "service_not_enabled"
#: The header naming the team, spelled as the service declares it (as the library sends it).
TEAM_HEADER = "X-Prime-Team-ID"
#: How long the service's answer is taken as still true: the runs of one sync (and a
#: follower's new runs within this window) share one probe instead of one each.
ENABLED_ANSWER_SECONDS = 60.0
#: Where the probe reads, under the service's base URL.
PROBE_PATH = "/api/v1/episodes"


def _json_object(response: Any) -> dict[str, Any] | None:
    """An answer's body when it is a JSON object, else None (an HTML page, a list): each
    question below asks what such a body holds."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _error_code(response: Any) -> str | None:
    error = (_json_object(response) or {}).get("error")
    return error.get("code") if isinstance(error, dict) else None


def _is_listing(response: Any) -> bool:
    """Whether a 2xx is the service's episode listing (``{"items": [...], ...}``, what
    ``prime_traces`` reads): a captive portal's sign-in page, or a proxy's own 200, answers
    every address and says nothing of the account. Taken for the service's yes, it had
    ``auto`` name traces in a new evaluation on an account that may have no Prime Traces."""
    body = _json_object(response)
    return body is not None and isinstance(body.get("items"), list)


def _in_the_services_words(response: Any) -> bool:
    """Whether an error answer is the service's: its envelope (``{"error": {...}}``) or
    FastAPI's ``{"detail": ...}``, the two ``prime_traces`` reads. A captive portal's or a
    proxy's own 403 (an HTML page) answers every address and says nothing of the account:
    taken for a write-only token's, it read as "enabled", kept for a minute, and a new
    evaluation named traces on an account that may have none."""
    body = _json_object(response)
    return body is not None and (isinstance(body.get("error"), dict) or "detail" in body)


def service_not_enabled(response: Any) -> bool:
    """Whether an answer is the service's ``service_not_enabled``: a 403 about the account
    (Prime Traces off), unlike a 403 about the key (one that may write but not read)."""
    return response.status_code == 403 and _error_code(response) == SERVICE_NOT_ENABLED


class TracesProbe:
    """The answer for one service, shared by the runs of a sync (``PlatformClient.traces_probe``)."""

    def __init__(self, get: Callable[..., Any], base_url: str, team_id: str | None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        #: A GET on the platform client's HTTP clients (``PlatformClient._get``: its key in their headers).
        self._get = get
        self._url = base_url.rstrip("/") + PROBE_PATH
        self._headers = {TEAM_HEADER: team_id} if team_id else {}
        self._clock = clock
        self._lock = threading.Lock()
        #: The service's last answer and when it came; a failed probe is not kept.
        self._answer: tuple[bool, float] | None = None

    def enabled(self) -> bool:
        """One cheap read: False only when the service says ``service_not_enabled`` (an
        account-level answer, given to reads and writes alike). Anything else, a 403 with
        another code (a write-only token) or a failure included, is left for the upload to
        decide, so ``auto`` learns the common case without first building a 30 MiB batch."""
        return self.answer() is not False

    def answer(self) -> bool | None:
        """:meth:`enabled` as the service said it; None when it said nothing about the
        account (no answer, a gateway's 503, a 2xx that is not its listing, a 403 not in its
        words): a guess then, which a new evaluation must not
        name as its sink (sync/sinks/choice.py, ``for_create``)."""
        import httpx

        with self._lock:
            known = self._answer
            if known is not None and self._clock() - known[1] < ENABLED_ANSWER_SECONDS:
                return known[0]
            try:
                response = self._get(self._url, params={"limit": 1}, headers=self._headers)
            except httpx.HTTPError:
                return None  # no answer from the service: nothing to remember
            if response.status_code == 403 and _in_the_services_words(response):
                answer = not service_not_enabled(response)
            elif response.is_success and _is_listing(response):
                answer = True
            else:
                return None  # not an answer about the account: nothing to remember
            self._answer = (answer, self._clock())
            return answer

    def refused_key(self) -> PlatformError | None:
        """The service's refusal of the key (401), asked afresh: the start-up key check's
        second read where Prime Traces has its own URL (platform_api/key_check.py), since
        the platform accepting a key says nothing of another host. None for anything else:
        a 403 may be a write-only token or ``service_not_enabled``, each left to the upload
        and ``auto`` to decide, and no answer is for the passes to meet."""
        import httpx

        try:
            response = self._get(self._url, params={"limit": 1}, headers=self._headers)
        except httpx.HTTPError:
            return None
        if response.status_code != 401:
            return None
        service = self._url[:-len(PROBE_PATH)]
        return PlatformError(FailureKind.FATAL, f"GET {PROBE_PATH} answered 401: Prime Traces at {service} refused "
                             "the API key the platform accepts; check that PRIME_TRACES_URL (or traces_url in "
                             "~/.prime/config.json) is this platform's Prime Traces and the key is valid there, or "
                             "sync with --to samples", status=401)
