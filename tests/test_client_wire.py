"""The platform client's own transport sends straight to httpx's connection pool
(platform_api/wire.py): the requests must go out as ``httpx.Client`` sends them, byte for
byte, and every answer and failure must read as it does through ``httpx.Client``."""

from __future__ import annotations

import gzip
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from prime_runs_spool.errors import FailureKind, PlatformError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings

KEY = "sk-wire-test-key-value"
#: One answer every call the tests make can read.
EVERYTHING = orjson.dumps({"evaluation_id": "ev-1", "status": "COMPLETED", "total_samples": 0, "evaluations": [],
                           "total": 0, "data": {"id": "env-1"}, "samples": [], "samples_pushed": 0})


def answer(status: int = 200, body: bytes = EVERYTHING, *headers: tuple[str, str]) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class RawServer:
    """An HTTP/1.1 server on a socket: keeps every request's bytes (head and body) and
    answers each with what ``script`` returns for them (None: closes the connection; a
    tuple: its one part sent, then the connection closed)."""

    def __init__(self, script: Callable[[bytes], bytes | tuple[bytes] | None]) -> None:
        self.script = script
        self.requests: list[bytes] = []
        #: Connections accepted so far, and closed by the server so far.
        self.accepted = self.closed = 0
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._closing, args=(conn,), daemon=True).start()

    def _closing(self, conn: socket.socket) -> None:
        try:
            self._connection(conn)
        finally:
            self.closed += 1

    def _connection(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buffer) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                request, buffer = head + b"\r\n\r\n" + buffer[:length], buffer[length:]
                self.requests.append(request)
                reply = self.script(request)
                if reply is None:
                    return
                conn.sendall(reply[0] if isinstance(reply, tuple) else reply)
                if isinstance(reply, tuple):
                    return

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def server() -> Iterator[RawServer]:
    box: list[Callable[[bytes], bytes | tuple[bytes] | None]] = [lambda request: answer()]
    raw = RawServer(lambda request: box[0](request))
    raw.answering = box  # type: ignore[attr-defined]
    yield raw
    raw.close()


def clients(url: str) -> list[PlatformClient]:
    """The client on its own transport, and one sending through ``httpx.Client``."""
    settings = Settings(base_url=url, api_key=Secret(KEY), team_id="team-1", frontend_url="http://app.test")
    return [PlatformClient(settings, timeout=5), PlatformClient(settings, timeout=5, transport=httpx.HTTPTransport())]


CALLS: dict[str, Callable[[PlatformClient], object]] = {
    "resolve": lambda client: client.resolve_environment("gsm8k"),
    "create": lambda client: client.create_evaluation({"name": "r", "environments": [{"id": "env-1"}]}),
    "samples": lambda client: client.push_samples("ev-1", [b'{"samples":[', b'{"a":1}', b"]}"]),
    "samples whole": lambda client: client.push_samples("ev-1", b'{"samples":[]}'),
    "metadata": lambda client: client.update_evaluation("ev-1", metadata={"k": "v"}),
    "finalize": lambda client: client.finalize("ev-1", {"reward": 1.0}),
    "read": lambda client: client.get_evaluation("ev-1"),
    "listing": lambda client: client.list_evaluations(environment_name="math & more/é?x=1", skip=3, limit=7),
    "samples page": lambda client: client.list_samples("ev-1", page=2),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_each_request_goes_out_byte_for_byte_as_httpx_client_sends_it(server: RawServer, call: str) -> None:
    own, through_httpx = clients(server.url)
    with own, through_httpx:
        CALLS[call](own)
        assert own._made[0].wire is not None  # the request did go straight to the pool
        CALLS[call](through_httpx)
        assert through_httpx._made[0].wire is None
    assert len(server.requests) == 2
    assert server.requests[0] == server.requests[1]
    assert f"Bearer {KEY}".encode() in server.requests[0]


def _outcome(client: PlatformClient, call: str) -> object:
    try:
        return ("answer", CALLS[call](client))
    except PlatformError as exc:
        return ("failed", exc.kind, exc.status, exc.retry_after, str(exc))


ANSWERS: dict[str, Callable[[bytes], bytes | tuple[bytes] | None]] = {
    "gzip": lambda request: answer(200, gzip.compress(EVERYTHING), ("Content-Encoding", "gzip")),
    "empty": lambda request: answer(200, b""),
    "unreadable": lambda request: answer(200, b"<html>"),
    "rate limited": lambda request: answer(429, b"slow down", ("Retry-After", "7")),
    "refused key": lambda request: answer(403, f'{{"detail": "bad key {KEY}"}}'.encode()),
    "gone": lambda request: answer(404, b'{"detail": "not found"}'),
    "gateway": lambda request: answer(502, b"bad gateway"),
    "failed": lambda request: answer(500, b"oops"),
    "refused gzip": lambda request: answer(422, gzip.compress(b'{"detail": "bad body"}'), ("Content-Encoding", "gzip")),
    "redirect": lambda request: answer(307, b"", ("Location", "http://elsewhere.invalid/")),
    "no answer": lambda request: None,
    "cut short": lambda request: (answer(200)[:40],),
    "chunked": lambda request: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part)
                                           for part in (EVERYTHING[:10], EVERYTHING[10:]))
                                + b"0\r\nX-Trailer: 1\r\n\r\n"),
    "chunked cut short": lambda request: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",),
    "chunked refused": lambda request: (b"HTTP/1.1 422 X\r\nTransfer-Encoding: chunked\r\n\r\n"
                                        b"4\r\nbad \r\n4\r\nbody\r\n0\r\n\r\n"),
    "other encoding": lambda request: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",),
    "informational": lambda request: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x\r\n\r\n" + answer(),
    "closing": lambda request: (answer(200, EVERYTHING, ("Connection", "close")),),
    "until its end": lambda request: (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + EVERYTHING,),
    "folded": lambda request: answer(403, b"no", ("X-Folded", "one\r\n two")),
    "two lengths": lambda request: (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",),
    "bad status line": lambda request: (b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}",),
    "bad header": lambda request: (b"HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 2\r\n\r\n{}",),
    "no content": lambda request: (b"HTTP/1.1 204 No Content\r\n\r\n",),
    # What h11 refuses (tests/test_http1_reading.py has the rest): in doubt, never a success.
    "switching protocols": lambda request: (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",),
    "no content, bad length": lambda request: (b"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n",),
    "a NUL in a header": lambda request: (b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n" + answer()[17:],),
}


@pytest.mark.parametrize("call", ["create", "samples", "read"])
@pytest.mark.parametrize("kind", list(ANSWERS))
def test_every_answer_reads_as_it_does_through_httpx_client(server: RawServer, kind: str, call: str) -> None:
    server.answering[0] = ANSWERS[kind]  # type: ignore[attr-defined]
    own, through_httpx = clients(server.url)
    with own, through_httpx:
        got = _outcome(own, call)
        expected = _outcome(through_httpx, call)
    assert got == expected
    assert KEY not in repr(got)


def test_a_platform_that_is_not_there_fails_alike_naming_its_host() -> None:
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{spare.getsockname()[1]}"
    spare.close()  # nothing listens there now
    own, through_httpx = clients(url)
    with own, through_httpx:
        got, expected = _outcome(own, "create"), _outcome(through_httpx, "create")
    assert got == expected
    assert "connection refused by 127.0.0.1:" in str(got)


def _reset(conn: socket.socket) -> None:
    """Closed with a reset (RST), not a FIN."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


#: A connection's ends that no script of bytes can say: what the server does on the socket.
RESETS: dict[str, Callable[[socket.socket], object]] = {
    "reset before the answer": lambda conn: (conn.recv(65536), _reset(conn)),
    "reset mid body": lambda conn: (conn.recv(65536), conn.sendall(answer()[:60]), time.sleep(0.05), _reset(conn)),
    "reset during the upload": lambda conn: (conn.recv(1024), _reset(conn)),
    "refused during the upload": lambda conn: (conn.recv(1024), conn.sendall(answer(413, b"too big")), _reset(conn)),
}


@pytest.mark.parametrize("kind", list(RESETS))
def test_a_reset_connection_fails_alike(kind: str) -> None:
    """A reset classifies as through httpx.Client (in doubt, or the answer sent before it
    when the upload is cut: a 413 is refused, not in doubt): the sync's retries and fences
    decide by that kind."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                RESETS[kind](conn)

    threading.Thread(target=serve, daemon=True).start()
    big = b'{"samples":[' + b"1," * (8 << 20) + b"1]}"  # more than the socket buffers take
    own, through_httpx = clients(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with own, through_httpx:
            got, expected = ([_outcome_of(lambda: client.push_samples("ev-1", big)) for client in (own, through_httpx)]
                             if "upload" in kind else [_outcome(client, "samples") for client in (own, through_httpx)])
    finally:
        listener.close()
    # The kind and status, which the sync decides by; the reason may differ by a race on
    # either path (a reset met by a write reads as the server's end, by a read as a reset).
    assert got[:3] == expected[:3]  # type: ignore[index]
    assert got[:2] == (("failed", FailureKind.IN_DOUBT) if "refused" not in kind else ("failed", FailureKind.FATAL))


def _outcome_of(call: Callable[[], object]) -> object:
    try:
        return ("answer", call())
    except PlatformError as exc:
        return ("failed", exc.kind, exc.status, exc.retry_after, str(exc))


@pytest.mark.parametrize("kind", ["kept", "closed after each answer"])
def test_requests_take_one_connection_in_turn_and_a_new_one_once_the_server_closed_it(
        server: RawServer, kind: str) -> None:
    """Kept alive: one connection for every request; closed by the server after each answer
    (said or not), the next request opens another and is answered."""
    if kind != "kept":
        server.answering[0] = lambda request: (answer(),)  # type: ignore[attr-defined]
    own, _ = clients(server.url)
    got = []
    with own:
        for call in ("read", "create", "samples", "read"):
            got.append(_outcome(own, call))
            # Closed by the server before the next request (not while it is on its way, a
            # race any client loses, as httpx's does: that request is in doubt).
            deadline = time.monotonic() + 5
            while kind != "kept" and server.closed < len(got) and time.monotonic() < deadline:
                time.sleep(0.001)
    assert all(outcome[0] == "answer" for outcome in got), got
    assert len(server.requests) == 4
    assert server.accepted == (1 if kind == "kept" else 4)


def test_the_client_s_own_requests_never_go_through_httpcore_s_pool(server: RawServer, monkeypatch) -> None:
    """Framed on a connection of its own (platform_api/http1.py): the pool and h11 cost
    about 1 M instructions a small request, most of a new run's sync."""
    import httpcore

    def refused(self, request):  # noqa: ANN001, ANN202
        raise AssertionError("went through httpcore's pool")

    monkeypatch.setattr(httpcore.ConnectionPool, "handle_request", refused)
    own, _ = clients(server.url)
    with own:
        for call in ("read", "create", "samples", "samples whole", "finalize"):
            assert _outcome(own, call)[0] == "answer"
    assert len(server.requests) == 5
