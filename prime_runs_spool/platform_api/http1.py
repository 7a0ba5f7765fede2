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

The answer is read as h11 reads it: informational answers passed over (a 101 refused), a
body framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's end
(none for 204, 304 and a HEAD), anything else a ``RemoteProtocolError``. A write that fails does not end
the exchange: the answer the server may have sent before it closed is read, as httpcore
does. The connection is kept for the next request only after a whole exchange that says
nothing against it (HTTP/1.1 or later, as h11 says, no ``Connection: close``, no bytes past the answer), for at
most httpx's keep-alive expiry, and is never reused once the server has closed or written
to it (one ``poll``, as httpcore's pool asks). tests/test_client_wire.py holds the bytes and
every answer's reading equal to ``httpx.Client``'s; tests/test_http1_reading.py holds the
reading of any bytes, split at any read, equal to h11's (its grammar is h11's, below: what
h11 refuses, a 101 no request asked for, a bad framing header on a bodiless answer, is
refused here, a failure the client leaves in doubt, not an answer it acts on).
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
#: A request body's first piece this small is written with the head, in one write.
JOINED = 64 * 1024

# h11's grammar (h11/_abnf.py), so that what it refuses is refused here too.
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_FIELD_VALUE = rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?"
_STATUS = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: (?:[ \t]|[^\x00\s])*)?")
_HEADER = re.compile(rb"(%s):[ \t]*(%s)[ \t]*" % (_TOKEN, _FIELD_VALUE))
#: A head's header lines, each with its line end: checked whole and split in two calls.
_HEADER_LINE = re.compile(_HEADER.pattern + rb"\r?\n")
_HEADER_LINES = re.compile(rb"(?:%s:[ \t]*%s[ \t]*\r?\n)*" % (_TOKEN, _FIELD_VALUE))
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,20}")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_EMPTY_LINE = (b"\n", b"\r\n")
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
    """Write the request; False when a write failed (the answer is read all the same). The
    head goes out with the body's first piece when that is at most :data:`JOINED` bytes: one
    write, not two (each a ``poll`` and a ``send``, and a hand-over of the interpreter lock
    among the sync's threads; every request of a new run's first sync is that small)."""
    try:
        if content is None:
            stream.write(head, timeout)
            return True
        sent = 0
        held: bytes | None = head  # until the first piece is known
        for piece in (content,) if isinstance(content, (bytes, bytearray, memoryview)) else content:
            size = memoryview(piece).nbytes
            if length is not None and sent + size > length:
                raise httpcore.LocalProtocolError("Too much data for declared Content-Length")
            sent += size
            if held is not None:
                if size <= JOINED:
                    piece, size = held + piece, size + len(held)
                else:
                    stream.write(held, timeout)
                held = None
            if size:
                stream.write(piece, timeout)
        if held is not None:
            stream.write(held, timeout)
        if length is not None and sent != length:
            raise httpcore.LocalProtocolError("Too little data for declared Content-Length")
    except httpcore.WriteError:
        return False
    return True


class _Reader:
    """The answer's bytes as they arrive, read on demand. A ``bytearray``: appending a read
    and taking from the front cost what they move, so a large answer is read in linear time
    (``bytes +=`` copied the whole buffer on every read: quadratic)."""

    __slots__ = ("buffer", "stream", "timeout")

    def __init__(self, stream: httpcore.NetworkStream, timeout: float | None) -> None:
        self.stream = stream
        self.timeout = timeout
        self.buffer = bytearray()

    def more(self) -> bool:
        data = self.stream.read(READ, self.timeout)
        self.buffer += data
        return bool(data)

    def take(self, count: int) -> bytes:
        if count >= len(self.buffer):
            data = bytes(self.buffer)
            self.buffer.clear()
            return data
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def block(self, what: str) -> bytes:
        """The lines up to the first blank one, each with its line feed (the blank line is
        consumed, not returned), as h11 finds them."""
        if self.buffer.startswith(_EMPTY_LINE):
            del self.buffer[:1 if self.buffer[0] == 10 else 2]
            return b""
        searched = 0  # each search starts where the last one stopped (as h11's): not quadratic in a slow head
        while (found := _BLANK_LINE.search(self.buffer, searched)) is None:
            searched = max(0, len(self.buffer) - 2)
            self._more_within_head(what)
            if self.buffer.startswith(_EMPTY_LINE):
                return self.block(what)
        return self.take(found.end())[:found.start() + 1]

    def line(self, what: str) -> bytes:
        """One line, its ``\r\n`` included (the one delimiter h11 takes in a chunked body)."""
        searched = 0
        while (end := self.buffer.find(b"\r\n", searched)) < 0:
            searched = max(0, len(self.buffer) - 1)
            self._more_within_head(what)
        return self.take(end + 2)

    def exactly(self, count: int) -> bytes:
        """``count`` bytes, read in pieces joined once (a large body is not copied per read)."""
        if len(self.buffer) >= count:
            return self.take(count)
        got = len(self.buffer)
        pieces = [self.take(got)]
        while got < count:
            if not self.more():
                raise httpcore.RemoteProtocolError(
                    f"peer closed connection without sending complete message body: received "
                    f"{got + len(self.buffer)} bytes, expected {count}")
            piece = self.take(min(len(self.buffer), count - got))
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)

    def _more_within_head(self, what: str) -> None:
        if len(self.buffer) > MAX_HEAD:
            raise httpcore.RemoteProtocolError(f"{what} too long")
        if not self.more():
            raise httpcore.RemoteProtocolError(
                "Server disconnected without sending a response." if what == "head" and not self.buffer
                else f"peer closed connection without sending complete message body: {what}")


def _receive(stream: httpcore.NetworkStream, timeout: float | None,
             head_only: bool) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    reader = _Reader(stream, timeout)
    while True:
        version, status, headers, fields = _head(reader)
        if status == 101:  # h11: a switch of protocol no request asked for
            raise httpcore.RemoteProtocolError("an answer of 101 Switching Protocols, which no request asked for")
        if status >= 200:
            break  # an informational answer is passed over, as h11 and httpcore do
    if status < 200:  # not 1xx, and not a status h11 reads (000-099)
        raise httpcore.RemoteProtocolError(f"illegal status code {status}")
    keep = version >= b"1.1" and b"close" not in fields.get(b"connection", ())
    if head_only or status in _NO_BODY:
        body = b""
    elif b"transfer-encoding" in fields:
        body = _chunked(reader)
    elif b"content-length" in fields:
        body = reader.exactly(int(fields[b"content-length"][0]))
    else:  # an HTTP/1.0 body: the connection's end is its end
        pieces = [reader.take(len(reader.buffer))]
        while reader.more():
            pieces.append(reader.take(len(reader.buffer)))
        body, keep = b"".join(pieces), False
    return status, headers, body, keep and not reader.buffer


def _head(reader: _Reader) -> tuple[bytes, int, list[tuple[bytes, bytes]], dict[bytes, list[bytes]]]:
    """One answer's head: its version, status, headers as received, and the framing
    headers' values (checked as h11 checks them, whether or not a body follows)."""
    block = reader.block("head")
    if not block:
        raise httpcore.RemoteProtocolError("no response line received")
    end = block.index(b"\n")
    first = block[:end - 1] if block[end - 1:end] == b"\r" else block[:end]
    status = _STATUS.fullmatch(first)
    if status is None:
        raise httpcore.RemoteProtocolError(f"illegal status line: {first[:80]!r}")
    headers = _fields(block[end + 1:])
    fields: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        if (name := name.lower()) in _FRAMING:
            fields.setdefault(name, []).extend(part.strip().lower() for part in value.split(b","))
    if (lengths := fields.get(b"content-length")) is not None:
        if len(set(lengths)) != 1 or _CONTENT_LENGTH.fullmatch(lengths[0]) is None:
            raise httpcore.RemoteProtocolError("bad Content-Length")
    if b"transfer-encoding" in fields and fields[b"transfer-encoding"] != [b"chunked"]:
        raise httpcore.RemoteProtocolError("Only Transfer-Encoding: chunked is supported")
    return status.group(1), int(status.group(2)), headers, fields


def _fields(block: bytes) -> list[tuple[bytes, bytes]]:
    """Header lines (or a chunked body's trailer), each with its line feed, as h11 reads
    them: an obsolete line folding joined to the line before with one space, then each line
    checked whole (without a folding, all of them by one match: the common case's cost)."""
    if _HEADER_LINES.fullmatch(block) is not None:
        return _HEADER_LINE.findall(block)
    lines = [line[:-1] if line.endswith(b"\r") else line for line in block.split(b"\n")[:-1]]
    folded: list[bytes] = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            if not folded:
                raise httpcore.RemoteProtocolError("continuation line at start of headers")
            folded[-1] += b" " + line.lstrip(b" \t")
        else:
            folded.append(line)
    headers = []
    for line in folded:
        if (field := _HEADER.fullmatch(line)) is None:
            raise httpcore.RemoteProtocolError(f"illegal header line: {line[:80]!r}")
        headers.append((field.group(1), field.group(2)))
    return headers


def _chunked(reader: _Reader) -> bytes:
    pieces = []
    while True:
        size_line = reader.line("chunk size")
        if (size := _CHUNK_SIZE.fullmatch(size_line)) is None:
            raise httpcore.RemoteProtocolError(f"illegal chunk header: {size_line[:80]!r}")
        if not (count := int(size.group(1), 16)):
            break
        pieces.append(reader.exactly(count))
        if reader.exactly(2) != b"\r\n":
            raise httpcore.RemoteProtocolError("malformed chunk footer")
    _fields(reader.block("trailer"))
    return b"".join(pieces)
