"""The platform's evaluations API (docs/platform-api.md, docs/sync.md), as typed calls.

The client does one request per call and never retries: whether a failed request may be
sent again depends on what it does (an append is not idempotent), which only the sync engine
knows. What the client adds is the classification every retry decision rests on:

- ``NOT_SENT``: the platform cannot have acted (connection refused, connect timeout, 429).
- ``ANSWERED``: the platform finished with the request and said it failed (a 500, or a 503 or
  507 in the service's own JSON): one read tells whether it acted.
- ``IN_DOUBT``: the request may be in flight still, or may have been processed with its
  answer lost (a timeout after sending, a reset, 502, 504, any other 5xx: a gateway's answer
  for a request its upstream may still be at work on): it is reconciled only once it can
  no longer land (the request-lifetime fence).
- ``FATAL``: resending cannot help (401, 402, 403, 404, 409, 413, 422, other 4xx).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from prime_runs_spool._version import __version__
from prime_runs_spool.content.mask_text import mask_text
from prime_runs_spool.errors import FailureKind, PlatformError, UnexpectedAnswer, UnknownEvaluation
from prime_runs_spool.platform_api import answers
from prime_runs_spool.platform_api.no_answer import (GATEWAY_STATUSES, RATE_LIMITED, SEE_OTHER, answered_kind,
                                                     classify_transport_error)
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.platform_api.v0 import is_evaluation_id

if TYPE_CHECKING:
    import httpx

    from prime_runs_spool.platform_api.proxy import Proxy
    from prime_runs_spool.platform_api.traces import TracesUploader
    from prime_runs_spool.platform_api.traces_probe import TracesProbe

# httpx (with httpcore, and trio or rich where they are installed) is imported on the first
# request, not with this module: a sync with nothing to send makes no request, and its
# start-up should not pay for an HTTP stack it never uses (benchmarks/startup.py).

#: A samples body goes out in pieces of at most this size. h11 copies every buffer it is
#: handed, joined with its framing, except one exact ``bytes`` alone, which it passes on as
#: it is: so the sync lays a body out as ``bytes`` pieces of at most this size (sync/rows.py,
#: ``Batch``), each sent uncopied, and any other buffer goes out in views of this size,
#: which h11 copies one by one (a whole 25 MiB body handed to httpx is copied again by h11
#: and once more by every partial socket send). A piece or a copy stays well under the
#: 1 MiB mmap threshold the sync command fixes (sync/memory.py, LARGE_BLOCK): at 1 MiB
#: every copy was a fresh mapping, zero-filled page by page and unmapped again, which cost
#: about 0.4 s of CPU per 550 MB sent (Dec 1, benchmarks/sync_throughput.py); at 256 KiB
#: they reuse the heap.
#: tests/test_client.py checks the two sizes against each other.
SEND_CHUNK = 256 << 10
#: The answer to a status update of an evaluation that is already closed.
CONFLICT = 409
#: Episodes per page when reading a Prime Traces run's episode listing (the service's maximum).
TRACE_LISTING_PAGE = 100


class _Chunks:
    """A body, one buffer or a list of pieces, as what h11 is handed: each exact ``bytes``
    piece of at most ``SEND_CHUNK`` as it is (not copied), anything else in views of at
    most ``SEND_CHUNK``. Re-iterable, so nothing is consumed if the request has to be
    built again."""

    def __init__(self, body: bytes | bytearray | memoryview | list[bytes],
                 on_sent: Callable[[], None] | None = None, before_last: Callable[[], None] | None = None) -> None:
        self._parts: list[Any] = body if isinstance(body, list) else [body]
        self._length = sum(len(part) if type(part) is bytes else memoryview(part).nbytes for part in self._parts)
        self._on_sent = on_sent
        self._before_last = before_last

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Any:
        held = None  # each piece is handed on once the next is known: the last one waits for the gate
        for piece in self._pieces():
            if held is not None:
                yield held
            held = piece
        if held is not None:
            if self._before_last is not None:
                self._before_last()  # raises to leave the body unfinished: the platform never acts on it
            yield held
        if self._on_sent is not None:  # asked for the next piece: the last one was written
            self._on_sent()

    def _pieces(self) -> Any:
        for part in self._parts:
            if type(part) is bytes and len(part) <= SEND_CHUNK:
                yield part
                continue
            view = memoryview(part).cast("B")
            for start in range(0, len(view), SEND_CHUNK):
                yield view[start:start + SEND_CHUNK]

    def drop(self) -> None:
        """Let go of the body. httpx keeps the request in a reference cycle with its
        response, which only the garbage collector frees (and 25 MiB bytes do not make it
        run): without this, every body sent stays in memory until it happens to."""
        self._parts = []


def _tls_for(*urls: str) -> Any:
    """httpx's ``verify`` for a client that talks to ``urls`` only (it follows no redirect).

    The default loads the CA bundle, about 22 ms of CPU (Dec 6), even for a client that
    never makes a TLS connection, as for the local platform. When
    every URL is plain ``http``, the client gets a TLS context that trusts no certificate
    at all instead: nothing uses it, and if anything did, verification would fail, never
    pass unchecked."""
    if any(not url.startswith("http://") for url in urls):
        return True
    import ssl

    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verify_mode CERT_REQUIRED, no CA loaded


#: The platform's evaluations; one evaluation's path is this and its id (``_evaluation``).
EVALUATIONS_PATH = "/evaluations/"

#: What a refusal means and what to do about it. ``{platform}``: where the request went, so
#: that a key sent to another platform than its own (a wrong ``--base-url``) shows it.
_FATAL_ADVICE = {
    401: "the platform at {platform} refused the API key; check PRIME_API_KEY or ~/.prime/config.json, "
         "and that the key is this platform's (--base-url, PRIME_API_BASE_URL)",
    402: "the platform asks for payment; add credits to the account or team, then sync again",
    403: "the API key may not write at {platform}; check --team / PRIME_TEAM_ID, the key's permissions, "
         "and that the key is this platform's (--base-url, PRIME_API_BASE_URL)",
    404: "the platform knows nothing at this path",
    409: "the platform reported a conflict",
    413: "the request was too large for the platform",
    422: "the platform rejected the request body",
    # Never transient: a server that does not implement the request, not the platform.
    501: "the server at {platform} does not implement this request; check that --base-url is the platform",
}


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare enough that our own backoff is as good


def _detail(response: httpx.Response, secret: Secret | None = None) -> str:
    """An error body's words for one line (``answers.error_words``: what a JSON answer
    states, an HTML page's title, else the text), never a request body, with the API key
    scrubbed out of it before it is read or cut (a body that echoes the request's headers
    printed the key into the report, a CI log, the shipper's log file)."""
    text = response.text
    if secret is not None:
        text = secret.scrub(text)
    return answers.error_words(text)


def classify_response(method: str, path: str, response: httpx.Response,
                      secret: Secret | None = None) -> PlatformError:
    status = response.status_code
    what = f"{method} {path} answered {status}"
    if status < 400:
        return _redirected(what, response, secret)
    if status == RATE_LIMITED:
        return PlatformError(answered_kind(status), f"{what} (rate limited)", status=status,
                             retry_after=_retry_after(response))
    if status in GATEWAY_STATUSES:
        return PlatformError(answered_kind(status), f"{what} (gateway)", status=status,
                             retry_after=_retry_after(response))
    if status >= 500 and status not in _FATAL_ADVICE:  # its words quoted: the last try's are the error line's
        detail = _detail(response, secret)
        kind = FailureKind.ANSWERED if _the_services_failure(response) else FailureKind.IN_DOUBT
        return PlatformError(kind, what + (f" ({detail})" if detail else ""), status=status,
                             retry_after=_retry_after(response))
    advice = _FATAL_ADVICE.get(status, "the platform refused the request").format(platform=_origin_of(response))
    detail = _detail(response, secret)
    if status == 404 and path.startswith(EVALUATIONS_PATH) and path != EVALUATIONS_PATH:
        return UnknownEvaluation(f"{what}: the platform does not know this evaluation (was it deleted?)"
                                 + (f" ({detail})" if detail else ""))
    return PlatformError(FailureKind.FATAL, f"{what}: {advice}" + (f" ({detail})" if detail else ""),
                         status=status)


#: The 5xx only the service answers, done with the request: a 500 (an unhandled error's, which
#: Starlette answers in plain text) whatever its body; a 503 or a 507 in its own words,
#: FastAPI's ``{"detail": ...}`` (a gateway's JSON says ``message``: AWS API Gateway's, Kong's).
_SERVICE_ANSWERS = {500: False, 503: True, 507: True}


def _the_services_failure(response: httpx.Response) -> bool:
    """Whether a 5xx is the service's own (``ANSWERED``: one read tells whether it acted),
    not a gateway's answer for a request its upstream may still be at work on: envoy's
    codeless 503 for a reset before the answer's headers, Cloudflare's 524 once the origin is
    slower than it waits, any 5xx the platform never sends. Taken for the service's, the
    count read at once came before the request landed, and the rows were sent again
    (tests/test_client.py, a gateway's 503 and 524: 15 rows for 5 episodes)."""
    needs_words = _SERVICE_ANSWERS.get(response.status_code)
    if needs_words is None:
        return False
    if not needs_words:
        return True
    body = response.content
    if len(body) > 1 << 16 or not body.lstrip().startswith(b"{"):
        return False
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and "detail" in answer


def _redirected(what: str, response: httpx.Response, secret: Secret | None = None) -> PlatformError:
    """A redirect (a maintenance page, an ``http`` address moved to ``https``): the sync
    follows none, its API key would go with it wherever it leads. Taken for a success, as
    any status below 400 was, a samples request a gateway redirected counted as pushed:
    the run said synced, the platform held none of those rows, and every later sync said
    up to date. Any but a 303 says the request was not acted on here (``FATAL``: what was
    announced is withdrawn); a 303, that it was: in doubt, settled by reading. Where it
    leads is quoted as an answer's body is, the key scrubbed out (a gateway's login page
    may carry the request's key in its ``?token=``) and the address masked as a run's
    would be (a password in its userinfo, a secret-named query parameter)."""
    where = response.headers.get("location", "")
    where = mask_text(secret.scrub(where) if secret is not None else where)
    said = f"{what}, a redirect to {answers.error_words(where) or 'no address'}"
    if response.status_code == SEE_OTHER:
        return PlatformError(FailureKind.IN_DOUBT, said, status=response.status_code)
    return PlatformError(FailureKind.FATAL, f"{said}, which sync does not follow: is the platform down for "
                         f"maintenance, or is --base-url (PRIME_API_BASE_URL) not its address?",
                         status=response.status_code)


def _origin_of(response: httpx.Response) -> str:
    """``scheme://host[:port]`` of the request ``response`` answers: the platform it came from."""
    try:
        url = response.request.url
    except RuntimeError:  # a response made by hand, with no request
        return "this base URL"
    host = f"[{url.host}]" if ":" in url.host else url.host
    return f"{url.scheme}://{host}" + (f":{url.port}" if url.port else "")


@functools.cache
def _client_class() -> type[httpx.Client]:
    """``httpx.Client`` without cookies. The API is authorized by its key, never by a cookie,
    and httpx reads every answer's headers for cookies through the standard library's
    ``CookieJar`` (an ``urllib`` request built per answer): a tenth of a small request's
    instructions (one GET, cachegrind: 1.76 M with the jar, 1.56 M without, Dec 2). Its ``cookies`` is one empty
    jar that keeps nothing."""
    import httpx

    class NoCookies(httpx.Cookies):
        def extract_cookies(self, response: httpx.Response) -> None:
            return None

    none = NoCookies()

    class Client(httpx.Client):
        cookies = property(lambda self: none, lambda self, value: None)  # type: ignore[assignment]
        #: How the platform client sends on this client's transport when it is the sync's own
        #: (platform_api/wire.py); None: through ``send``.
        wire: Any = None

    return Client


class PlatformClient:
    """Typed calls to ``{base_url}/api/v1``. One instance per destination; thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        #: Seconds to wait for one answer: the traces client (sync/sinks/traces.py) waits as long.
        self.timeout = timeout
        self._timeout = timeout
        self._transport = transport
        self._lock = threading.Lock()
        #: Every HTTP client made, and those no request is using now (see _connection).
        self._made: list[httpx.Client] = []
        self._idle: list[httpx.Client] = []
        #: The SSL context the HTTP clients share: the CA bundle is loaded once.
        self._ssl: Any = None
        self._traces: TracesUploader | None = None
        self._traces_probe: TracesProbe | None = None
        #: Where every request's path is appended (``/api/v1``).
        self._api = settings.base_url + "/api/v1"
        #: The proxy the environment names for the platform (None: straight to it), as the
        #: settings found it; only for the sync's own transport, as httpx reads it only for a
        #: client without one.
        self._proxy: Proxy | None = settings.proxy if transport is None else None

    def _connection(self) -> httpx.Client:
        """An HTTP client no other request is using, made on first use (the module docstring
        says why); give it back with :meth:`_release`.

        One ``httpx.Client`` per request in flight, not one shared by the sync's threads:
        httpcore's pool checks every connection it holds against all the others (and polls
        each idle one) twice per request, work that grows with the square of ``--jobs``;
        alone, each client's pool holds one kept-alive connection. With :meth:`_send`, 11%
        fewer instructions a new run at 8 jobs (16.8 M to 15.0 M, Dec 2,
        benchmarks/sync_many_cpu.py under cachegrind).
        They share one SSL context, whose CA bundle costs about 30 ms of CPU to load."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            import httpx

            if self._ssl is None:  # the CA bundle only where a URL needs TLS (_tls_for)
                verify = _tls_for(self.settings.base_url, self.settings.traces_base_url)
                self._ssl = httpx.create_ssl_context() if verify is True else verify
            headers = {"User-Agent": f"prime-runs-spool/{__version__}", "Accept": "application/json"}
            if self.settings.api_key:
                headers["Authorization"] = f"Bearer {self.settings.api_key.reveal()}"
            from prime_runs_spool.platform_api.deadline import AnswerDeadlineTransport

            own = (AnswerDeadlineTransport(self._timeout, verify=self._ssl, proxy=self._proxy)
                   if self._transport is None else None)
            http = _client_class()(
                headers=headers,
                timeout=httpx.Timeout(self._timeout, connect=min(self._timeout, 10.0)),
                transport=own or self._transport,
            )
            if own is not None:
                from prime_runs_spool.platform_api.wire import Wire

                http.wire = Wire(http, own, self._api)
            self._made.append(http)
            return http

    def _release(self, http: httpx.Client) -> None:
        with self._lock:
            self._idle.append(http)

    def _send(self, method: str, path: str, content: Any, params: Mapping[str, Any] | None,
              length: int | None) -> tuple[int, bytes, httpx.Response | None]:
        """One request: its answer's status and body, and the answer itself where it is a
        refusal (``classify_response`` reads it) or came through another transport than the
        sync's own. On the sync's own, straight to the pool (platform_api/wire.py); on
        another, through ``httpx.Client`` with the URL parsed once: merged with a
        ``base_url`` and ``params``, httpx parses it three times over (character by
        character, in Python)."""
        import httpx

        query = str(httpx.QueryParams(params)) if params else ""
        http = self._connection()
        try:
            if http.wire is not None:
                return http.wire.exchange(method, path, query, content, length)
            # A declared length (as on the wire): httpx sends a body's pieces as they are, not
            # chunked, and a body its gate leaves unfinished is one the platform never acts on.
            headers = {"Content-Type": "application/json", "Content-Length": str(length)} if content is not None else {}
            url = self._api + path + (f"?{query}" if query else "")
            response = http.send(http.build_request(method, httpx.URL(url), content=content, headers=headers))
            return response.status_code, response.content, response
        finally:
            self._release(http)

    def traces(self) -> TracesUploader:
        """The destination's Prime Traces client, made on first use and shared like the HTTP
        client: one per sync, not one per run. Each costs an SSL context (about 30 ms of CPU
        loading the CA bundle) and a connection of its own: made per run, that was most of
        the first sync of many small runs (the sync's CPU 45.7 ms a run, 17.2 with one client,
        200 runs, Dec 1, benchmarks/sync_many.py)."""
        with self._lock:
            if self._traces is None:
                from prime_runs_spool.platform_api.traces import TracesUploader

                self._traces = TracesUploader(self.settings.traces_base_url,
                                              self.settings.api_key.reveal() if self.settings.api_key else None,
                                              self.settings.team_id, timeout=self._timeout,
                                              proxy=self.settings.traces_proxy)
            return self._traces

    def _get(self, url: str, **options: Any) -> httpx.Response:
        """A GET of an absolute URL on one of this client's HTTP clients (the traces probe's)."""
        http = self._connection()
        try:
            return http.get(url, **options)
        finally:
            self._release(http)

    def traces_probe(self) -> TracesProbe:
        """Whether the account has Prime Traces (``--to auto``), asked on this client's own
        connection and shared like the uploader: no prime-traces import, no second TLS
        context, for the common answer (platform_api/traces_probe.py says why)."""
        with self._lock:
            if self._traces_probe is None:
                from prime_runs_spool.platform_api.traces_probe import TracesProbe

                self._traces_probe = TracesProbe(self._get, self.settings.traces_base_url,
                                                 self.settings.team_id)
            return self._traces_probe

    def close(self) -> None:
        with self._lock:
            for http in self._made:
                http.close()
            self._made.clear()
            self._idle.clear()
            if self._traces is not None:
                self._traces.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | _Chunks | None = None,
        params: Mapping[str, Any] | None = None,
        before_last: Callable[[], None] | None = None,
    ) -> Any:
        """``before_last``: called before the last piece of the ``json_body`` is written (see
        :meth:`push_samples`)."""
        if json_body is not None:
            content = orjson.dumps(json_body)
            if before_last is not None:
                content = _Chunks(content, before_last=before_last)
        import httpx

        try:
            status, body, response = self._send(method, path, content, params,
                                                None if content is None else len(content))
        except httpx.TransportError as exc:
            raise classify_transport_error(method, path, exc, self._proxy) from None
        finally:
            if isinstance(content, _Chunks):
                content.drop()
        if not answers.is_success(status):
            raise classify_response(method, path, response, self.settings.api_key)  # type: ignore[arg-type]
        try:
            return orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            # The platform said yes but its answer is unreadable: for a non-idempotent call
            # that is as good as a lost answer.
            raise UnexpectedAnswer(FailureKind.IN_DOUBT,
                                   f"{method} {path}: unreadable answer", status=status) from None

    @staticmethod
    def _evaluation(evaluation_id: str, tail: str = "") -> str:
        """The path of an evaluation (``tail`` below it); a FATAL error, sending nothing, for
        an id that is not one plain path segment (``v0.is_evaluation_id``)."""
        if not is_evaluation_id(evaluation_id):
            raise PlatformError(FailureKind.FATAL, f"{evaluation_id[:80]!r} is not an evaluation id; nothing was "
                                "sent (is the sync state damaged? delete it and sync again)")
        return f"{EVALUATIONS_PATH}{evaluation_id}{tail}"

    def _team(self) -> dict[str, str]:
        return {"team_id": self.settings.team_id} if self.settings.team_id else {}

    # -- endpoints ---------------------------------------------------------------------

    def resolve_environment(self, name: str) -> str:
        """Get-or-create an environment by name; safe to repeat."""
        body = self._request("POST", "/environmentshub/resolve", json_body={"name": name, **self._team()})
        return answers.environment_id(body, "POST /environmentshub/resolve")

    def create_evaluation(self, payload: Mapping[str, Any], *,
                          before_last: Callable[[], None] | None = None) -> dict[str, Any]:
        """NOT idempotent: every success is a new evaluation. ``before_last``: as
        :meth:`push_samples`'s."""
        return answers.created_evaluation(self._request("POST", "/evaluations/", json_body={**payload, **self._team()},
                                                        before_last=before_last), "POST /evaluations/")

    def push_samples(self, evaluation_id: str, body: bytes | bytearray | memoryview | list[bytes], *,
                     on_sent: Callable[[], None] | None = None,
                     before_last: Callable[[], None] | None = None) -> dict[str, Any]:
        """NOT idempotent: appends every row in ``body`` (a ``{"samples": [...]}`` document,
        whole or as the pieces it is sent in). ``on_sent``: called once the whole body is
        written to the connection (the sync builds its next request only then:
        sync/rows.py, ``read_ahead``). ``before_last``: called before the body's last piece
        is written; what it raises leaves the request unfinished (its connection closed short
        of the declared length), so the platform never acts on it (sync/protocol.py,
        ``Protocol.send_once``)."""
        path = self._evaluation(evaluation_id, "/samples")
        return answers.samples_answer(self._request("POST", path, content=_Chunks(body, on_sent, before_last)),
                                      f"POST {path}")

    def update_evaluation(
        self, evaluation_id: str, *, metadata: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Idempotent; ``metadata`` replaces the stored document whole."""
        payload: dict[str, Any] = {}
        if metadata is not None:
            payload["metadata"] = metadata
        if metrics is not None:
            payload["metrics"] = metrics
        path = self._evaluation(evaluation_id)
        return answers.updated(self._request("PUT", path, json_body=payload), f"PUT {path}")

    def set_terminal_status(self, evaluation_id: str, body: Mapping[str, Any]) -> bool:
        """Close the evaluation out as FAILED or CANCELLED (``v0.terminal_status_body``).

        Idempotent. Returns False when the platform answers 409: the evaluation is already
        closed, so its outcome is recorded either way (as prime-runs 0.1.4 treats it).
        """
        try:
            path = self._evaluation(evaluation_id)
            answers.updated(self._request("PUT", path, json_body=dict(body)), f"PUT {path}")
        except PlatformError as exc:
            if exc.status == CONFLICT:
                return False
            raise
        return True

    def finalize(self, evaluation_id: str, metrics: Mapping[str, Any] | None, *,
                 before_last: Callable[[], None] | None = None) -> dict[str, Any]:
        """NOT idempotent: each call enqueues the platform's statistics job again.
        ``before_last``: as :meth:`push_samples`'s."""
        path = self._evaluation(evaluation_id, "/finalize")
        return answers.finalized(self._request("POST", path, json_body={"metrics": dict(metrics or {})},
                                               before_last=before_last), f"POST {path}")

    def get_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        path = self._evaluation(evaluation_id)
        return answers.evaluation(self._request("GET", path), f"GET {path}")

    def list_evaluations(
        self, *, environment_name: str | None = None, skip: int = 0, limit: int = 50,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"skip": skip, "limit": limit, **self._team()}
        if environment_name:
            params["environment_name"] = environment_name
        return answers.evaluations_page(self._request("GET", "/evaluations/", params=params), "GET /evaluations/")

    def trace_run_episode_ids(self, run_id: str) -> list[str]:
        """The ids of the episodes a Prime Traces run holds (its episode listing, every page),
        read on this client's own connection. Empty when the account has no Prime Traces
        (``service_not_enabled``, which refuses its uploads alike): nothing can be there. Any
        other ``403`` (a key that may write but not read) is raised like any failure: an
        empty answer there had a reconcile, or the adoption of a run vf-eval pushed, send every
        episode again. A ``404`` (no such route) is raised too: whether it means "nothing
        there" or "cannot tell" is the caller's to say (sync/sinks/traces.py,
        ``TracesSink._listing``)."""
        from prime_runs_spool.platform_api.traces_probe import PROBE_PATH, TEAM_HEADER, service_not_enabled

        url = self.settings.traces_base_url.rstrip("/") + PROBE_PATH
        headers = {TEAM_HEADER: self.settings.team_id} if self.settings.team_id else {}
        ids: list[str] = []
        cursor: str | None = None
        import httpx

        while True:
            params = {"run_id": run_id, "limit": TRACE_LISTING_PAGE, **({"cursor": cursor} if cursor else {})}
            try:
                response = self._get(url, params=params, headers=headers)
            except httpx.TransportError as exc:
                raise classify_transport_error("GET", PROBE_PATH, exc) from None
            if service_not_enabled(response):
                return []
            if response.status_code == 403:
                raise PlatformError(FailureKind.FATAL, f"GET {PROBE_PATH} answered 403: the API key may not read "
                                    "Prime Traces here, so which episodes it holds cannot be told and none was sent "
                                    "again; sync with a key that may read it", status=403)
            if response.status_code == 404:  # the route, not an evaluation: --replay would not help
                raise PlatformError(FailureKind.FATAL, f"GET {PROBE_PATH} answered 404 (no such route): which "
                                    "episodes Prime Traces holds of the run cannot be told; check the Prime Traces "
                                    "URL (PRIME_TRACES_URL, or traces_url in the config file)", status=404)
            if response.status_code >= 400:
                raise classify_response("GET", PROBE_PATH, response, self.settings.api_key)
            page = answers.trace_episodes_page(response, f"GET {PROBE_PATH}")
            ids += page["ids"]
            cursor = page["next_cursor"]
            if not cursor:
                return ids

    def list_samples(self, evaluation_id: str, *, page: int = 1, limit: int = 100) -> dict[str, Any]:
        path = self._evaluation(evaluation_id, "/samples")
        return answers.samples_page(self._request("GET", path, params={"page": page, "limit": limit}), f"GET {path}")
