"""One kept-alive HTTP/1.1 connection to the platform, its requests and answers framed here.

Why: a small request through httpcore's pool and h11 cost about 1.06 M instructions (the
headers validated twice, an event object and a state machine per step, a trace around
every phase, the pool's bookkeeping), about 40 % of a new run's first sync. The sync's
requests need none of it: each of the sync's HTTP clients is used by one request at a time
(platform_api/client.py), so it needs one connection, not a pool; its headers are the
client's own, already checked by httpx once (platform_api/wire.py). What stays httpcore's is
the network stream: the connection and TLS as httpcore makes them, each read bounded by
the answer's deadline (platform_api/deadline.py), and its exceptions, which the transport
maps to httpx's as before, so a failure classifies as it did (platform_api/client.py).

The answer is read as h11 reads it: informational answers passed over, a body framed by
``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's end (none for 204,
304 and a HEAD), anything else a ``RemoteProtocolError``. A write that fails does not end
the exchange: the answer the server may have sent before it closed is read, as httpcore
does. The connection is kept for the next request only after a whole exchange that says
nothing against it (HTTP/1.1, no ``Connection: close``, no bytes past the answer), for at
most httpx's keep-alive expiry, and is never reused once the server has closed or written
to it (one ``poll``, as httpcore's pool asks). tests/test_client_wire.py holds the bytes and
every answer's reading equal to ``httpx.Client``'s.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpcore

#: httpx's default ``Limits.keepalive_expiry``: an idle connection older is not reused.
KEEPALIVE_EXPIRY = 5.0
#: httpcore's: the most an answer's head may take, and what one read asks for.
MAX_HEAD = 100 * 1024
READ = 64 * 1024

_STATUS = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: (.*))?")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_NO_BODY = (204, 304)
#: The headers that say how an answer is framed and whether its connection stays open.
_FRAMING = frozenset({b"connection", b"content-length", b"transfer-encoding"})

#: What one exchange gives: the answer's status, its headers as received, its body whole.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class Connection:
    """The connection one HTTP client's requests take in turn (opened by ``open_stream``,
    given the connect timeout), reopened when it was closed or has expired."""

    def __init__(self, open_stream: Callable[[float | None], httpcore.NetworkStream]) -> None:
        self._open = open_stream
        self._lock = threading.Lock()
        self._idle: httpcore.NetworkStream | None = None
        self._idle_until = 0.0
        #: The stream a request is on (closed with the rest, as httpcore's pool closes its
        #: connections in use), and whether :meth:`close` was called (none is kept then).
        self._active: httpcore.NetworkStream | None = None
        self._closed = False

    def exchange(self, head: bytes, content: bytes | Iterable[Any] | None, length: int | None,
                 timeouts: dict[str, float | None], *, head_only: bool = False) -> Answer:
        """Send ``head`` (the request line and headers, their blank line included) and
        ``content`` (``length`` bytes, one buffer or pieces), and read the answer whole.
        Raises httpcore's exceptions, and a body's own as it is."""
        stream = self._active = self._take(timeouts.get("connect"))
        try:
            whole = _send(stream, head, content, length, timeouts.get("write"))
            status, headers, body, keep = _receive(stream, timeouts.get("read"), head_only)
        except BaseException:
            self._active = None
            stream.close()
            raise
        self._active = None
        if keep and whole:
            self._give_back(stream)
        else:
            stream.close()
        return status, headers, body

    def _take(self, connect_timeout: float | None) -> httpcore.NetworkStream:
        with self._lock:
            stream, self._idle = self._idle, None
        if stream is not None:
            if time.monotonic() < self._idle_until and not stream.get_extra_info("is_readable"):
                return stream
            stream.close()  # expired, or closed by the server (or it wrote unasked)
        return self._open(connect_timeout)

    def _give_back(self, stream: httpcore.NetworkStream) -> None:
        with self._lock:
            if self._closed:
                extra = stream
            else:
                extra, self._idle = self._idle, stream
                self._idle_until = time.monotonic() + KEEPALIVE_EXPIRY
        if extra is not None:
            extra.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams, self._idle, self._active = (self._idle, self._active), None, None
        for stream in streams:
            if stream is not None:
                stream.close()


def _send(stream: httpcore.NetworkStream, head: bytes, content: bytes | Iterable[Any] | None,
          length: int | None, timeout: float | None) -> bool:
    """Write the request; False when a write failed (the answer is read all the same)."""
    try:
        stream.write(head, timeout)
        if content is None:
            return True
        sent = 0
        for piece in (content,) if isinstance(content, (bytes, bytearray, memoryview)) else content:
            size = memoryview(piece).nbytes
            if length is not None and sent + size > length:
                raise httpcore.LocalProtocolError("Too much data for declared Content-Length")
            if size:
                stream.write(piece, timeout)
            sent += size
        if length is not None and sent != length:
            raise httpcore.LocalProtocolError("Too little data for declared Content-Length")
    except httpcore.WriteError:
        return False
    return True


class _Reader:
    """The answer's bytes as they arrive, read on demand."""

    __slots__ = ("buffer", "stream", "timeout")

    def __init__(self, stream: httpcore.NetworkStream, timeout: float | None) -> None:
        self.stream = stream
        self.timeout = timeout
        self.buffer = b""

    def more(self) -> bool:
        data = self.stream.read(READ, self.timeout)
        self.buffer += data
        return bool(data)

    def line(self, what: str) -> bytes:
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > MAX_HEAD:
                raise httpcore.RemoteProtocolError(f"{what} too long")
            if not self.more():
                raise httpcore.RemoteProtocolError(
                    f"peer closed connection without sending complete message body: {what}")
        line, self.buffer = self.buffer[:end], self.buffer[end + 1:]
        return line.rstrip(b"\r")

    def exactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not self.more():
                raise httpcore.RemoteProtocolError(
                    f"peer closed connection without sending complete message body: received "
                    f"{len(self.buffer)} bytes, expected {count}")
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data


def _receive(stream: httpcore.NetworkStream, timeout: float | None,
             head_only: bool) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    reader = _Reader(stream, timeout)
    while True:
        version, status, headers = _head(reader)
        if not 100 <= status < 200 or status == 101:
            break  # an informational answer is passed over, as h11 and httpcore do
    fields: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        if (name := name.lower()) in _FRAMING:
            fields.setdefault(name, []).extend(part.strip().lower() for part in value.split(b","))
    keep = version == b"1.1" and b"close" not in fields.get(b"connection", ())
    if head_only or status in _NO_BODY or status == 101:
        body, keep = b"", keep and status != 101
    elif b"transfer-encoding" in fields:
        if fields[b"transfer-encoding"] != [b"chunked"]:
            raise httpcore.RemoteProtocolError("Only Transfer-Encoding: chunked is supported")
        body = _chunked(reader)
    elif b"content-length" in fields:
        lengths = set(fields[b"content-length"])
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise httpcore.RemoteProtocolError("bad Content-Length")
        body = reader.exactly(int(next(iter(lengths))))
    else:  # an HTTP/1.0 body: the connection's end is its end
        while reader.more():
            pass
        body, keep = reader.buffer, False
        reader.buffer = b""
    return status, headers, body, keep and not reader.buffer


def _head(reader: _Reader) -> tuple[bytes, int, list[tuple[bytes, bytes]]]:
    while (found := _BLANK_LINE.search(reader.buffer)) is None:  # the first blank line, as h11 finds it
        if len(reader.buffer) > MAX_HEAD:
            raise httpcore.RemoteProtocolError("the answer's head is too long")
        if not reader.more():
            raise httpcore.RemoteProtocolError("Server disconnected without sending a response." if not reader.buffer
                                               else "peer closed connection without sending a complete response head")
    head, reader.buffer = reader.buffer[:found.start()], reader.buffer[found.end():]
    lines = head.lstrip(b"\r\n").split(b"\n")
    if b"\r" in head:
        lines = [line.rstrip(b"\r") for line in lines]
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise httpcore.RemoteProtocolError(f"illegal status line: {lines[0][:80]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t") and headers:  # an obsolete line folding: one value, as h11 joins it
            headers[-1] = (headers[-1][0], headers[-1][1] + b" " + line.strip(b" \t"))
            continue
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise httpcore.RemoteProtocolError(f"illegal header line: {line[:80]!r}")
        headers.append((name, value.strip(b" \t")))
    return status.group(1), int(status.group(2)), headers


def _chunked(reader: _Reader) -> bytes:
    pieces = []
    while True:
        size_line = reader.line("chunk size")
        size = size_line.split(b";", 1)[0].strip()
        if not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
            raise httpcore.RemoteProtocolError(f"illegal chunk header: {size_line[:80]!r}")
        if not (count := int(size, 16)):
            break
        pieces.append(reader.exactly(count))
        if reader.line("chunk end"):
            raise httpcore.RemoteProtocolError("a chunk longer than its size")
    while reader.line("trailer"):  # trailers, up to the blank line
        pass
    return b"".join(pieces)
