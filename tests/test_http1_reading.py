"""platform_api/http1.py reads an HTTP/1.1 answer as h11 reads it: the same status, headers,
body and keep-alive, or an error where h11 raises one, on any bytes split at any read
boundary; and it reads a large answer in linear time. The sync's exactly-once decisions
stand on this reading: an answer h11 refuses read as a success here (a 101, a bad
Content-Length on a 204) would be acted on where httpx left the request in doubt."""

from __future__ import annotations

import h11
import httpcore
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool.platform_api import http1

pytestmark = pytest.mark.slow


class Pieces:
    """A network stream that gives ``pieces`` as its reads, then the connection's end."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.reads = 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.reads += 1
        if not self.pieces:
            return b""
        piece = self.pieces[0]
        if len(piece) > max_bytes:
            self.pieces[0] = piece[max_bytes:]
            return piece[:max_bytes]
        return self.pieces.pop(0)


#: What h11 normalizes in the headers it gives (one Content-Length for equal ones, the
#: Transfer-Encoding's case): the framing is compared by the body read instead.
_NORMALIZED = (b"content-length", b"transfer-encoding")


def ours(pieces: list[bytes], head_only: bool) -> tuple:
    stream = Pieces(pieces)
    try:
        status, headers, body, keep = http1._receive(stream, None, head_only)  # type: ignore[arg-type]
    except httpcore.RemoteProtocolError:
        return ("error",)
    # Bytes still unread past the answer: the next request's poll finds them and does not reuse it.
    return ("answer", status, [(n.lower(), v) for n, v in headers if n.lower() not in _NORMALIZED], body,
            keep and not stream.pieces)


def h11s(pieces: list[bytes], head_only: bool) -> tuple:
    """The answer as httpcore's HTTP/1.1 connection reads it through h11 (its head bound too)."""
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=http1.MAX_HEAD)
    connection.send(h11.Request(method="HEAD" if head_only else "GET", target="/", headers=[("Host", "x")]))
    connection.send(h11.EndOfMessage())
    pieces, body, response = list(pieces), b"", None
    try:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(pieces.pop(0) if pieces else b"")
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return ("error",)
    except h11.RemoteProtocolError:
        return ("error",)
    assert response is not None
    # A body that ended with the connection: h11 says DONE, and httpcore's pool finds it closed.
    to_close = not head_only and response.status_code not in (204, 304) and not any(
        name.lower() in _NORMALIZED for name, _ in response.headers.raw_items())
    keep = connection.their_state is h11.DONE and not to_close and not connection.trailing_data[0] and not pieces
    return ("answer", response.status_code,
            [(n.lower(), v) for n, v in response.headers.raw_items() if n.lower() not in _NORMALIZED], body, keep)


_NAMES = st.sampled_from([b"Server", b"X-Thing", b"content-type", b"Content-Length", b"Transfer-Encoding",
                          b"Connection", b"Date", b"X-A_b", b"Bad Name", b"", b"Set-Cookie"])
_VALUES = st.one_of(st.sampled_from([
    b"", b"close", b"keep-alive", b"Upgrade, close", b"chunked", b"gzip, chunked", b"Chunked", b"identity", b"5",
    b" 5 ", b"5, 5", b"5,6", b"-1", b"+5", b"0x5", b"1" + b"0" * 19, b"1" + b"0" * 20, b"x\x00y", b"x\x0by",
    b"caf\xc3\xa9", b"a\tb"]), st.binary(max_size=8))


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[bytes], bool]:
    """An answer's bytes (1xx before it; any version, status, reason, header case, folding;
    framed by Content-Length, chunks with extensions and trailers, both or neither; bytes
    after it; a byte mutated or the bytes cut short), split at random read boundaries."""
    eol = draw(st.sampled_from([b"\r\n", b"\n"]))
    raw = b"".join(b"HTTP/1.1 " + draw(st.sampled_from([b"100 Continue", b"102 P", b"103 Early"])) + eol + eol
                   for _ in range(draw(st.integers(0, 2))))
    raw += (b"HTTP/" + draw(st.sampled_from([b"1.1", b"1.1", b"1.0", b"2.0", b"1.x"])) + b" "
            + draw(st.sampled_from([b"200", b"201", b"204", b"304", b"404", b"409", b"500", b"101", b"099", b"2000"]))
            + draw(st.sampled_from([b" OK", b"", b" ", b" Not Found", b" x\x01", b" x\x00", b" caf\xc3\xa9"])) + eol)
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["length", "chunked", "length", "chunked", "none", "both"]))
    headers = [(draw(_NAMES), draw(_VALUES)) for _ in range(draw(st.integers(0, 3)))]
    if framing in ("length", "both"):
        headers.append((draw(st.sampled_from([b"Content-Length", b"CONTENT-LENGTH"])), b"%d" % len(body)))
    if framing in ("chunked", "both"):
        headers.append((draw(st.sampled_from([b"Transfer-Encoding", b"transfer-encoding"])), b"chunked"))
    for name, value in draw(st.permutations(headers)):
        raw += name + draw(st.sampled_from([b": ", b":", b" : ", b":\t"])) + value + eol
        if draw(st.integers(0, 9)) == 0:
            raw += draw(st.sampled_from([b" ", b"\t"])) + b"folded" + eol
    raw += eol
    if framing in ("chunked", "both"):
        start = 0
        while start < len(body):
            size = draw(st.integers(1, len(body) - start))
            raw += (draw(st.sampled_from(["%x", "%X", "%04x"])) % size).encode()
            raw += draw(st.sampled_from([b"", b";a=b", b" ;x", b";", b" "])) + eol + body[start:start + size] + eol
            start += size
        raw += b"0" + draw(st.sampled_from([b"", b";e"])) + eol
        raw += b"".join(draw(st.sampled_from([b"T-x: 1", b"T-y:2", b"bad line", b" folded"])) + eol
                        for _ in range(draw(st.integers(0, 2))))
        raw += eol
    else:
        raw += body
    raw += draw(st.sampled_from([b"", b"", b"HTTP/1.1 200 OK\r\n", b"x"]))
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        raw = raw[:at] + draw(st.binary(max_size=3)) + raw[at + draw(st.integers(0, 3)):]
    if draw(st.integers(0, 5)) == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)]) if raw[a:b]]
    return pieces, draw(st.integers(0, 5)) == 0


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(answers())
def test_every_answer_reads_as_h11_reads_it(answer: tuple[list[bytes], bool]) -> None:
    pieces, head_only = answer
    assert ours(pieces, head_only) == h11s(pieces, head_only), b"".join(pieces)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",  # no request asked for a switch
    b"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n",  # checked with no body to frame
    b"HTTP/1.1 200 OK\r\nContent-Length: 1" + b"0" * 20 + b"\r\n\r\n",  # past h11's 20 digits
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 21 + b"\r\n",  # a chunk size past 20 digits
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\n0\n\n",  # chunks end in CRLF
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",  # a NUL in a value
    b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",  # a blank line before the status line
])
def test_what_h11_refuses_is_refused(raw: bytes) -> None:
    assert h11s([raw], False) == ("error",)
    assert ours([raw], False) == ("error",)


def test_a_large_answer_is_read_in_linear_time() -> None:
    """``bytes +=`` per read copied the buffer so far each time: 32 MiB in 64 KiB reads
    moved about 8.7 GB. Counted as the bytes the reader's buffer holds after each read, which
    stays near the answer's size (each read taken out as it comes) however it is framed."""
    body = b"x" * (32 << 20)
    for head in (b"Content-Length: %d\r\n" % len(body), b""):
        raw = b"HTTP/1.1 200 OK\r\n" + head + b"\r\n" + body
        stream = Pieces([raw[i:i + http1.READ] for i in range(0, len(raw), http1.READ)])
        held = 0
        reader_more = http1._Reader.more

        def more(self: http1._Reader) -> bool:
            nonlocal held
            got = reader_more(self)
            held += len(self.buffer)
            return got

        http1._Reader.more = more  # type: ignore[method-assign]
        try:
            assert http1._receive(stream, None, False)[2] == body  # type: ignore[arg-type]
        finally:
            http1._Reader.more = reader_more  # type: ignore[method-assign]
        assert held < 4 * len(body), held


def test_a_head_sent_a_byte_at_a_time_is_searched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each search for the head's end starts where the last stopped, as h11's: searched
    from the start on every read, a 100 KiB head dripped a byte a read (each read within
    the answer's deadline) was searched 5 G bytes, 2.1 s of CPU against h11's 0.9 s."""
    searched = 0

    class Counting:
        def search(self, buffer: bytes, start: int = 0):  # noqa: ANN201
            nonlocal searched
            searched += len(buffer) - start
            return pattern.search(buffer, start)

    pattern = http1._BLANK_LINE
    monkeypatch.setattr(http1, "_BLANK_LINE", Counting())
    head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (http1.MAX_HEAD - 200) + b"\r\nContent-Length: 0\r\n\r\n"
    assert http1._receive(Pieces([head[i:i + 1] for i in range(len(head))]), None, False)[0] == 200  # type: ignore[arg-type]
    assert searched < 4 * len(head), searched
