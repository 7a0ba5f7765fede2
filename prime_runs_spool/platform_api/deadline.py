"""An HTTP transport whose answers must arrive whole within the timeout.

httpx's read timeout bounds each read from the socket, not the answer: a platform, or a
proxy before it, that sends one byte of its status line or headers every few seconds never
goes silent for that long, and a sync would wait for it forever. ``--timeout S`` promises
"seconds to wait for one answer", so the transport here bounds the answer: from the first
read of a request's answer, every read of it (status line, headers, body) gets only what
is left of ``timeout``, and one past it fails as a read timeout (the client classifies it
``IN_DOUBT``, like any lost answer). Sending is not bounded as a whole (a 25 MiB body over a
slow link may take longer than the answer should): each write keeps httpx's own timeout.

It is an httpcore network backend under httpx's own transport, because a read is the one
place that sees every byte of an answer, whichever connection of the pool it comes from.
"""

from __future__ import annotations

import math
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpcore
import httpx
from httpcore._backends.sync import SyncStream

from prime_runs_spool.platform_api.answer_cap import answer_cap
from prime_runs_spool.platform_api.http1 import Answer, Connection

if TYPE_CHECKING:
    from prime_runs_spool.platform_api.proxy import Proxy

_answer = threading.local()


class _AnswerDeadline:
    """Per thread (a sync request is sent and read on its caller's thread): when the
    current answer must be complete by, armed at its first read."""

    @staticmethod
    def reset(budget: float) -> None:
        _answer.budget = budget
        _answer.deadline = None

    @staticmethod
    def bound(timeout: float | None) -> float | None:
        budget = getattr(_answer, "budget", None)
        if budget is None:
            return timeout
        now = time.monotonic()
        if _answer.deadline is None:
            _answer.deadline = now + budget
        left = _answer.deadline - now
        if left <= 0:
            raise httpcore.ReadTimeout(f"no complete answer within {budget:g} s")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """httpcore's stream, each answer's reads bounded (:class:`_AnswerDeadline`). On httpcore's
    own plain socket stream, its reads and writes are made here on its socket, as it makes
    them (its failures raised as the same httpcore exceptions), but on a socket left
    non-blocking for its life, each wait a ``poll`` of its own given what is left of the
    timeout: a socket's timeout is set by an ``ioctl`` (with the sync's threads waiting, a
    hand-over of the interpreter lock too), and each read of an answer has a timeout of its
    own, so a request set it once or twice; and a socket with a timeout polls before every
    ``send``, where a write here is tried first and waits only if the socket's buffer is
    full. A TLS socket keeps its timeout (its reads can be waiting in the TLS layer, where a
    ``poll`` does not see them)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._sock = inner.get_extra_info("socket") if type(inner) is SyncStream else None
        self._readable = self._writable = None
        if type(self._sock) is socket.socket:  # plain TCP (or a Unix socket), not TLS
            self._sock.setblocking(False)
            self._readable, self._writable = select.poll(), select.poll()
            self._readable.register(self._sock, select.POLLIN)
            self._writable.register(self._sock, select.POLLOUT)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        timeout = _AnswerDeadline.bound(timeout)
        sock = self._sock
        if sock is None:
            return self._inner.read(max_bytes, timeout)
        try:
            if self._readable is None:
                if sock.gettimeout() != timeout:
                    sock.settimeout(timeout)
                return sock.recv(max_bytes)
            return _waited(self._readable, timeout, sock.recv, max_bytes)
        except socket.timeout as exc:
            raise httpcore.ReadTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.ReadError(exc) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        sock = self._sock
        if sock is None:
            self._inner.write(buffer, timeout)
            return
        try:
            if self._writable is None:
                if buffer and sock.gettimeout() != timeout:
                    sock.settimeout(timeout)
                while buffer:
                    buffer = buffer[sock.send(buffer):]
                return
            while buffer:
                try:
                    sent = sock.send(buffer)  # tried first: the socket's buffer has room, nearly always
                except BlockingIOError:
                    sent = _waited(self._writable, timeout, sock.send, buffer)
                buffer = buffer[sent:]
        except socket.timeout as exc:
            raise httpcore.WriteTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.WriteError(exc) from exc

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _waited(poller: select.poll, timeout: float | None, call: Callable[[Any], Any], arg: Any) -> Any:
    """``call(arg)`` on a non-blocking socket once ``poller`` says it can go, within ``timeout``
    seconds (None: no limit), as a socket with that timeout makes it (``socket.timeout`` past it)."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if end is None else max(0, min(_MOST, math.ceil((end - time.monotonic()) * 1000)))
        if not poller.poll(left):
            raise socket.timeout("timed out")
        try:
            return call(arg)
        except BlockingIOError:  # ready, and then not: wait again
            continue


#: The longest wait ``poll`` takes, in milliseconds.
_MOST = 2**31 - 1


class _Backend(httpcore.SyncBackend):
    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _Stream(super().connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _Stream(super().connect_unix_socket(*args, **kwargs))


class AnswerDeadlineTransport(httpx.HTTPTransport):
    """httpx's default transport (same limits; TLS as ``verify`` says, httpx's default unless
    given; through ``proxy``, the one the environment names: platform_api/proxy.py), each
    answer bounded by ``timeout`` seconds from its first byte awaited."""

    def __init__(self, timeout: float, *, verify: Any = True, proxy: Proxy | None = None) -> None:
        super().__init__(verify=verify, proxy=None if proxy is None else proxy.url)
        self._budget = timeout
        # The one httpx transport attribute reached into: HTTPTransport takes no network
        # backend, its connection pool does (httpcore.ConnectionPool(network_backend=...)),
        # and its SSL context (httpx's, from ``verify``) is the one a connection of our own
        # (platform_api/http1.py) starts TLS with.
        self._pool._network_backend = _Backend()
        #: The platform client's requests straight to the platform, on one connection of
        #: their own (platform_api/wire.py); None through a proxy: httpcore's pool then.
        self.direct = None if proxy is not None else {}

    def connection(self, scheme: bytes, host: bytes, port: int | None) -> Connection:
        """The connection of our own to ``scheme://host:port``, made on first use."""
        key = (scheme, host, port)
        own = self.direct.get(key)
        if own is None:
            own = self.direct[key] = Connection(lambda timeout: self._connect(scheme, host, port, timeout))
        return own

    def _connect(self, scheme: bytes, host: bytes, port: int | None, timeout: float | None) -> httpcore.NetworkStream:
        """A stream as httpcore's pool opens one: TCP (``TCP_NODELAY``), then TLS for
        ``https`` with httpx's context, ALPN ``http/1.1``, the host's name sent and checked."""
        name = host.decode("ascii")
        stream = self._pool._network_backend.connect_tcp(name, port or (443 if scheme == b"https" else 80),
                                                          timeout=timeout)
        if scheme == b"https":
            context = self._pool._ssl_context
            context.set_alpn_protocols(["http/1.1"])
            stream = stream.start_tls(context, server_hostname=name, timeout=timeout)
        return stream

    def exchange_direct(self, connection: Connection, head: bytes, content: Any, length: int | None,
                        timeouts: dict[str, float | None], head_only: bool) -> Answer:
        """One request on ``connection``, its answer bounded as every answer here is;
        httpcore's failures raised as httpx's of the same name (as :meth:`exchange`)."""
        self._arm()
        try:
            return connection.exchange(head, content, length, timeouts, head_only=head_only)
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                httpcore.ProxyError, httpcore.UnsupportedProtocol) as exc:
            raise _as_httpx(exc) from exc

    def close(self) -> None:
        for own in (self.direct or {}).values():
            own.close()
        super().close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._arm()
        return super().handle_request(request)

    def exchange(self, request: httpcore.Request) -> httpcore.Response:
        """One request on this transport's pool, its answer read whole (``.content``) and its
        connection given back: what ``handle_request`` does without an ``httpx`` request and
        response around it (platform_api/wire.py says why). httpcore's failures are raised as
        httpx's of the same name, as ``handle_request`` raises them; anything else (a body's
        own exception) as it is."""
        self._arm()
        try:
            response = self._pool.handle_request(request)
            try:
                response.read()
            finally:
                response.close()
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                httpcore.ProxyError, httpcore.UnsupportedProtocol) as exc:
            raise _as_httpx(exc) from exc
        return response

    def _arm(self) -> None:
        cap = answer_cap()
        _AnswerDeadline.reset(self._budget if cap is None else max(0.0, min(self._budget, cap)))


def _as_httpx(exc: Exception) -> httpx.TransportError:
    """httpx's exception for an httpcore one: the most specific class of the same name
    (httpcore's and httpx's trees name alike)."""
    for kind in type(exc).__mro__:
        mapped = getattr(httpx, kind.__name__, None)
        if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
            return mapped(str(exc))
    return httpx.TransportError(str(exc))
