"""A request to the platform as bytes, its fixed parts built once.

Why: ``httpx.Client.send`` builds, for every request, a URL parsed character by character,
the client's headers merged into a new set, a request whose headers are checked twice, a
response, and reads the answer through four wrapping streams. On the sync's small requests
that was about a third of the client's instructions (cachegrind, one run's create, samples
and finalize: 1.65 M instructions a request through ``Client.send``, 1.06 M straight to
httpcore's pool, Dec 7). Straight to the platform (no proxy), a request is not handed to
the pool either: its head is written here as h11 writes it and it goes out on one
connection of its own (platform_api/http1.py: the pool and h11 were most of what was left).
What goes out is the same bytes as ``Client.send`` sends: the same headers (the client's
own, with its defaults, the key and ``Accept``) in the order httpx puts them, ``Host`` first
and the body's ``Content-Length`` last, the same timeouts; and what comes back is read as
httpx reads it (an encoded answer decoded by httpx). tests/test_client_wire.py compares the
two on the wire, for every request and every kind of answer.

Only for the sync's own transport (``deadline.AnswerDeadlineTransport``); a client given
another transport (the tests' in-process platform) sends through ``httpx.Client``, and one
through a proxy hands each request to httpcore's pool, which speaks to the proxy.
"""

from __future__ import annotations

from typing import Any

import httpcore
import httpx

from prime_runs_spool.platform_api import answers
from prime_runs_spool.platform_api.deadline import AnswerDeadlineTransport

#: The methods httpx sends ``Content-Length: 0`` for when they carry no body.
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_JSON = (b"Content-Type", b"application/json")


class Wire:
    """The parts of every request one ``httpx.Client`` sends to ``api`` that never change."""

    def __init__(self, http: httpx.Client, transport: AnswerDeadlineTransport, api: str) -> None:
        base = httpx.URL(api)
        self._api = api
        self._transport = transport
        self._scheme, self._host, self._port = base.raw_scheme, base.raw_host, base.port
        #: ``api``'s path, encoded as httpx encodes it; a request's path (plain ASCII, its
        #: evaluation id checked by ``v0.is_evaluation_id``) is appended as it is.
        self._path = base.raw_path
        self._headers: list[tuple[bytes, bytes]] = [(b"Host", base.netloc), *http.headers.raw]
        self._timeout = http.timeout.as_dict()
        #: Straight to the platform (not through a proxy): the connection the requests take
        #: (platform_api/http1.py), and every request's headers as h11 writes them.
        self._direct = (None if transport.direct is None
                        else transport.connection(self._scheme, self._host, self._port))
        self._fixed = b"".join(b"%s: %s\r\n" % pair for pair in self._headers)

    def exchange(self, method: str, path: str, query: str, content: Any,
                 length: int | None) -> tuple[int, bytes, httpx.Response | None]:
        """Send one request and read its answer whole: its status, its body (decoded), and,
        for any answer but a success (``answers.is_success``), the answer as an ``httpx.Response``
        for the client's classification. ``content``: ``bytes`` or an iterable of them ``length`` long."""
        target = self._path + path.encode("ascii")
        if query:
            target += b"?" + query.encode("ascii")
        if self._direct is not None:
            return self._exchange_direct(method, path, query, target, content, length)
        headers = self._headers.copy()
        if content is not None:  # its length declared: a body left unfinished is never acted on
            headers.append(_JSON)
            headers.append((b"Content-Length", str(length).encode("ascii")))
        elif method in _BODY_METHODS:
            headers.append((b"Content-Length", b"0"))
        request = httpcore.Request(method.encode("ascii"),
                                   httpcore.URL(scheme=self._scheme, host=self._host, port=self._port, target=target),
                                   headers=headers, content=content, extensions={"timeout": self._timeout})
        try:
            answer = self._transport.exchange(request)
        except httpx.TransportError as exc:
            exc.request = self._as_httpx(method, path, query)  # the host a failure names
            raise
        status = answer.status
        if not answers.is_success(status) or _encoded(answer.headers):
            response = httpx.Response(status, headers=answer.headers, content=answer.content,
                                      request=self._as_httpx(method, path, query))
            return status, response.content, response
        return status, answer.content, None

    def _exchange_direct(self, method: str, path: str, query: str, target: bytes, content: Any,
                         length: int | None) -> tuple[int, bytes, httpx.Response | None]:
        """:meth:`exchange` on the connection of our own: the same bytes, framed here."""
        if content is not None:
            framing = b"Content-Type: application/json\r\nContent-Length: %d\r\n" % length
        elif method in _BODY_METHODS:
            framing = b"Content-Length: 0\r\n"
        else:
            framing = b""
        head = b"%s %s HTTP/1.1\r\n%s%s\r\n" % (method.encode("ascii"), target, self._fixed, framing)
        try:
            status, headers, body = self._transport.exchange_direct(self._direct, head, content, length,
                                                                    self._timeout, method == "HEAD")
        except httpx.TransportError as exc:
            exc.request = self._as_httpx(method, path, query)  # the host a failure names
            raise
        if not answers.is_success(status) or _encoded(headers):
            response = httpx.Response(status, headers=headers, content=body,
                                      request=self._as_httpx(method, path, query))
            return status, response.content, response
        return status, body, None

    def _as_httpx(self, method: str, path: str, query: str) -> httpx.Request:
        return httpx.Request(method, self._api + path + (f"?{query}" if query else ""))


def _encoded(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether an answer's body is content-encoded (httpx decodes it)."""
    return any(name.lower() == b"content-encoding" and value.strip().lower() != b"identity"
               for name, value in headers)
