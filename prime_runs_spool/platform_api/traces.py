"""Prime Traces' wire contract, as sync and the local platform both need it (docs/platform-api.md).

The `prime-traces` package is the client made for this service, so its constants, its
batching and its HTTP client are used as they are; what lives here is what it leaves to a
producer: how one episode record becomes one line (stamped with the run, encoded as the
library encodes in-memory records), and how the client's typed errors map onto the retry
classes every other platform call uses (``FailureKind``).

Why an upload may always be sent again: its idempotency key is the SHA-256 of the exact
uncompressed bytes, and the service replays the committed receipt for a key it already
holds instead of storing twice. So, unlike a samples append, a traces upload needs no
request-lifetime fence: every failure short of a refusal is retried with the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
from prime_traces import (
    APIError,
    ErrorCode,
    ForbiddenError,
    LineFormat,
    RetryableAPIError,
    TracesAPIClient,
    TransportError,
)
from prime_traces.batching import DEFAULT_TARGET_BATCH_BYTES, MAX_BATCH_BYTES, MAX_LINE_BYTES, Batch
from prime_traces.core.client import is_ambiguous_delete_failure

from prime_runs_spool.errors import FailureKind, PlatformError, ServiceNotEnabled
from prime_runs_spool.platform_api.answers import error_words, is_redirect
from prime_runs_spool.platform_api.deadline import AnswerDeadlineTransport
from prime_runs_spool.platform_api.no_answer import GATEWAY_STATUSES, SEE_OTHER, answered_kind, classify_transport_error
from prime_runs_spool.platform_api.proxy import Proxy
from prime_runs_spool.platform_api.settings import Secret

#: A batch closes at this many uncompressed bytes (the library's default, under the
#: deployed transport's 32 MiB request cap); one line over MAX_LINE_BYTES is refused locally.
TARGET_BATCH_BYTES = DEFAULT_TARGET_BATCH_BYTES
__all__ = ["TARGET_BATCH_BYTES", "MAX_BATCH_BYTES", "MAX_LINE_BYTES", "EPISODE_LINES", "RUN_TYPE",
           "SCHEMA_VERSION", "stamp_run", "encode_line", "TracesUploader", "receipt_id"]

#: Each line is one whole episode with its member traces (``X-Prime-Line-Format``).
EPISODE_LINES = LineFormat.EPISODE
#: What ``run.type`` says of every run sync uploads: an evaluation.
RUN_TYPE = "eval"
#: The metadata part's ``schema_version``: the only one the service defines.
SCHEMA_VERSION = 1
#: The header carrying the content address, and its one accepted shape.
IDEMPOTENCY_HEADER = "Idempotency-Key"
LINE_FORMAT_HEADER = "X-Prime-Line-Format"
KEY_PREFIX = "sha256:"


def stamp_run(record: Mapping[str, Any], run_id: str, run_type: str = RUN_TYPE) -> dict[str, Any]:
    """A copy of ``record`` keyed to the platform's run: ``run.id`` and ``run.type`` set on the
    episode and on every member trace, whatever the producer recorded, the rest of each
    ``run`` block kept. The service reads a trace's run from ``trace.run.id`` only, so the
    members matter; a member without a ``run`` takes the episode's. (Upstream prime-runs
    stamps every uploaded copy the same way; tests/test_traces_sync.py checks ours against it.)"""
    stamped = dict(record)
    run = _rekey(stamped.get("run"), run_id, run_type)
    stamped["run"] = run
    members = stamped.get("traces")
    if isinstance(members, list):
        stamped["traces"] = [
            {**member, "run": _rekey(member.get("run") or run, run_id, run_type)}
            if isinstance(member, Mapping) else member
            for member in members
        ]
    return stamped


def _rekey(run: Any, run_id: str, run_type: str) -> dict[str, Any]:
    keyed = dict(run) if isinstance(run, Mapping) else {}
    keyed["id"] = run_id
    keyed["type"] = run_type
    return keyed


def encode_line(record: Mapping[str, Any]) -> bytes:
    """One JSONL line, encoded exactly as ``TracesClient.upload_records`` encodes a record
    (compact separators, UTF-8 kept, NaN refused), so a line we build and the library's
    line for the same record are the same bytes and hash to the same key."""
    return json.dumps(dict(record), ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8") + b"\n"


def receipt_id(receipt: Mapping[str, Any]) -> str:
    return str(receipt.get("upload_id"))


class TracesUploader:
    """One Prime Traces service, as sync calls it: one upload per call, never retried here
    (the sync engine owns retries, as for every other request), failures classified."""

    def __init__(self, base_url: str, api_key: str | None, team_id: str | None, *,
                 timeout: float = 120.0, transport: httpx.BaseTransport | None = None,
                 proxy: Proxy | None = None) -> None:
        """``proxy``: the one the settings found for ``base_url`` (``Settings.traces_proxy``)."""
        self.base_url = base_url
        self._proxy = proxy
        #: The key, to scrub it from what the service answers (an echo of the headers).
        self._secret = Secret(api_key or "")
        self._client = TracesAPIClient(api_key=api_key or "", base_url=base_url, team_id=team_id or "",
                                       timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                                       transport=transport or AnswerDeadlineTransport(timeout, proxy=proxy))
        # The library follows redirects: a gateway's 307 sent the batch, episodes and all, to
        # whatever host it named, and a 303's page was read as the receipt. Sync follows none
        # (platform_api/no_answer.py, SEE_OTHER): the answer is classified here instead.
        self._client.client.follow_redirects = False
        # A 2xx is checked here before the library reads it: one whose body is no JSON object
        # (empty, ``null``: a proxy's, not the service's) raised a bare ValueError ("internal
        # error") or an APIError with no status, which read as a refusal: the batch, stored
        # as likely as not, was withdrawn, and --to samples sent it again. An httpx response
        # hook, public in both libraries: replacing the library's private reader
        # (``_upload_result``) stopped working, without a word, the day a release renamed it.
        hooks = self._client.client.event_hooks
        self._client.client.event_hooks = {**hooks, "response": [*hooks.get("response", []), _receipt_or_in_doubt]}

    def close(self) -> None:
        self._client.close()

    def upload(self, batch: Batch, context: Mapping[str, str]) -> dict[str, Any]:
        """POST one batch (gzip, mtime 0: the same bytes on every attempt) and return its
        receipt; raises :class:`PlatformError` (:class:`ServiceNotEnabled` for an account
        without Prime Traces)."""
        try:
            return self._client.upload_batch(batch.data, batch.idempotency_key, line_format=EPISODE_LINES,
                                             schema_version=SCHEMA_VERSION, context=dict(context) or None,
                                             compress=True)
        except APIError as exc:
            raise classify(exc, self._secret, self.base_url, self._proxy) from None
        except PlatformError as exc:  # the response hook's (a 2xx without a receipt), passed through as raised
            raise exc from None


def _receipt_or_in_doubt(response: httpx.Response) -> None:
    """Raise IN_DOUBT for an upload's 2xx without a receipt (an empty body, a 204, a body
    that is not a JSON object): it may follow the service's commit as well as a proxy's
    that never passed it on, so the batch stays in doubt and is sent again under its key.
    Any other answer is left to the library (a refusal raised as it types it)."""
    if not response.is_success:
        return
    response.read()
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise PlatformError(FailureKind.IN_DOUBT, f"POST /traces answered {response.status_code} without a receipt "
                            "(an empty body, or JSON that is not an object): the batch may be stored",
                            status=response.status_code)


def classify(exc: APIError, secret: Secret | None = None, service: str = "this URL",
             proxy: Proxy | None = None) -> PlatformError:
    """The library's typed error as a retry class. Content addressing makes every ambiguous
    outcome safe to resend: whatever is not a refusal is sent again, with the same key, and
    no fence waits. ``IN_DOUBT`` says only that the batch may be stored (the sink keeps it
    announced, sync/sinks/addressed.py): no answer, a gateway's (502, 504, a 503 without the
    service's refusal code: the library's own rule, which forwarded the request first, as
    nginx's 504 and envoy's 503 do) or the service's own 500, which may follow its commit.
    ``NOT_SENT`` or ``ANSWERED`` is the service declining it (429, a coded 503). ``service``:
    the URL the batch went to, named in a refused key's line (a key sent to another platform
    than its own)."""
    code = exc.code or ""
    status = exc.status_code
    said = error_words(secret.scrub(str(exc)) if secret is not None else str(exc))  # the service's, without the key
    answered = f"POST /traces answered {status}" + (f" {code}" if code else "")
    if isinstance(exc, ForbiddenError) and code == ErrorCode.SERVICE_NOT_ENABLED.value:
        line = "Prime Traces is not enabled for this account"
        quoted = said and said.rstrip(". ").lower() not in line.lower()  # the service's words, unless ours
        return ServiceNotEnabled(line + (f" ({said})" if quoted else ""), status=status)
    if isinstance(exc, RetryableAPIError):
        # Sent again whatever its kind; the kind says whether it may have been stored (a
        # gateway's 502 or 504, a codeless 503: the batch may have reached the service), which
        # keeps a batch in doubt (sync/sinks/addressed.py) as for a platform request.
        kind = (FailureKind.IN_DOUBT if is_ambiguous_delete_failure(exc) else
                answered_kind(status) if status is not None else FailureKind.ANSWERED)
        return PlatformError(kind, answered + (" (gateway)" if status in GATEWAY_STATUSES else ""),
                             status=status, retry_after=exc.retry_after)
    if isinstance(exc, TransportError) and isinstance(exc.__cause__, httpx.TransportError):
        # Told in the platform requests' words ("cannot connect (connection refused by HOST)",
        # "no answer (timed out ...)"), not the library's; a connection never made is not sent.
        return classify_transport_error("POST", "/traces", exc.__cause__, proxy)
    if isinstance(exc, TransportError):
        return PlatformError(FailureKind.IN_DOUBT, f"POST /traces: no answer ({said})")
    if status is not None and status >= 500:
        return PlatformError(FailureKind.IN_DOUBT, f"POST /traces answered {status}", status=status)
    if is_redirect(status):  # followed nowhere (TracesUploader)
        if status == SEE_OTHER:  # acted on, its result elsewhere: the batch may be stored
            return PlatformError(FailureKind.IN_DOUBT, f"{answered}, a redirect", status=status)
        return PlatformError(FailureKind.FATAL, f"{answered}, a redirect, which sync does not follow: is Prime "
                             f"Traces down for maintenance, or is {service} (PRIME_TRACES_URL) not its address?",
                             status=status)
    advice = {401: f"the traces service at {service} refused the API key; check PRIME_API_KEY, and that the key "
                   "is this platform's (--base-url, PRIME_TRACES_URL)",
              403: f"the API key may not write traces at {service}; check its scopes and --team",
              400: "the traces service rejected the batch",
              409: "the traces service holds these bytes under another line format",
              413: f"the traces service at {service}, or a proxy in front of it, takes no request this large; raise "
                   f"the proxy's limit (nginx: client_max_body_size, 1 MiB unless set; a batch is up to "
                   f"{TARGET_BATCH_BYTES // 2**20} MiB before gzip)"}.get(status or 0, "refused")
    return PlatformError(FailureKind.FATAL, f"{answered}: {advice} ({said})", status=status)
