"""Running an ASGI app with uvicorn on a socket bound here: the viewer's, or the platform's.

The listening socket is bound before uvicorn starts and handed to it: with port 0 the
kernel picks a free port and we know it without a probe-then-bind race, so tests can run
many servers side by side. uvicorn runs in a background thread, so the main thread owns
SIGTERM/SIGINT and stops the server cleanly with exit status 0.
"""

from __future__ import annotations

import errno
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType, TracebackType
from typing import Any, TextIO

import uvicorn

from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.files import OnLink
from prime_runs_spool.signal_event import SignalEvent
from prime_runs_spool.viewer.auth import check_listen

_STARTUP_TIMEOUT = 30.0
_SHUTDOWN_TIMEOUT = 10.0


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    The protocol is named explicitly: asyncio only sets ``TCP_NODELAY`` on accepted sockets
    whose ``proto`` is ``IPPROTO_TCP``, and without it every keep-alive request waits out
    the peer's 40 ms delayed ACK between uvicorn's header and body writes.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def bind_first_free(host: str, ports: Sequence[int]) -> socket.socket:
    """A listening socket on the first of ``ports`` that is free on ``host``: a port in use
    (``EADDRINUSE``) moves on to the next; any other failure, or the last port's, raises."""
    for port in ports[:-1]:
        try:
            return bind_socket(host, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    return bind_socket(host, ports[-1])


def base_url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EmbeddedServer:
    """``app`` served by uvicorn in a thread on ``host:port`` for the ``with`` block."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int | Sequence[int] = 0,
                 name: str = "prime-runs-server") -> None:
        """``port``: one port (0: any free one), or ports to try in order (the first free)."""
        self.app = app
        self.host = host
        self.ports = [port] if isinstance(port, int) else list(port)
        self.name = name
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._sock is None:
            raise RuntimeError("the server is not running")
        return base_url_of(self._sock)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> EmbeddedServer:
        try:
            self._sock = bind_first_free(self.host, self.ports)
            # proxy_headers off: uvicorn would otherwise take X-Forwarded-For from 127.0.0.1 as
            # the client's address, and the login throttle (viewer/auth.py) counts by it.
            config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                    timeout_graceful_shutdown=5, proxy_headers=False)
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                            name=self.name, daemon=True)
            self._thread.start()
            deadline = time.monotonic() + _STARTUP_TIMEOUT
            while not self._server.started:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the {self.name} server stopped during startup")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {self.name} server did not start in time")
                time.sleep(0.01)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(_SHUTDOWN_TIMEOUT)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None


def run_until_signalled(server: Any, out: TextIO, first_line: Callable[[str], str] = lambda url: url,
                        then: Callable[[str], None] | None = None) -> None:
    """Enter ``server``, print its URL as the first line of ``out``, serve until SIGTERM/SIGINT.
    ``then``: called with that URL once it is printed (in a thread of its own)."""
    stop = SignalEvent()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with server:
        url = first_line(server.base_url)
        out.write(url + "\n")
        out.flush()
        if then is not None:
            threading.Thread(target=then, args=(url,), name="prime-runs-view-open", daemon=True).start()
        while not stop.wait(0.5):
            if not server.is_alive():
                raise RuntimeError("the server stopped unexpectedly")  # surfaces as exit 1 with its reason


#: ``prime-runs view``'s port when none is given: the same every time, so a bookmark or an
#: open tab keeps working across restarts; taken, the next of VIEW_PORT_TRIES, then any free one.
DEFAULT_VIEW_PORT = 7676
VIEW_PORT_TRIES = 10


def view_ports(port: int | None) -> list[int]:
    """The ports ``prime-runs view`` tries: ``port`` alone when given (0: any free one),
    else the default, the ones after it, then any free one."""
    if port is not None:
        return [port]
    return [*range(DEFAULT_VIEW_PORT, DEFAULT_VIEW_PORT + VIEW_PORT_TRIES), 0]


def open_browser(url: str, err: TextIO) -> None:
    """Open ``url`` in the user's browser (``$BROWSER``, else the system's); say so when none
    could be started, rather than fail: the URL is on the first line of stdout anyway."""
    import webbrowser

    try:
        opened = webbrowser.open(url)
    except webbrowser.Error:
        opened = False
    if not opened:
        err.write(f"{MESSAGE_PREFIX}no browser could be opened; open {url}\n")
        err.flush()


def serve_viewer(paths: Iterable[Any], *, host: str = "127.0.0.1", port: int | None = None, token: str | None = None,
                 out: TextIO, state_dir: Any = None, open_in: TextIO | None = None,
                 on_link: OnLink | None = None) -> None:
    """``prime-runs view``: serve the viewer over the spools under ``paths`` until signalled.
    ``port``: see :func:`view_ports`. ``open_in``: open the URL in a browser, saying on this
    stream when none could be. ``on_link``: told of each link out of the paths the scans pass
    over; the first scan is made at start-up, once the URL is printed, for it to be told then.

    Raises UnsafeListenError (before binding) for a non-loopback host without a token,
    NoSuchPathError for a path that does not exist, OSError when the address cannot be bound.
    """
    from prime_runs_spool.viewer.app import create_viewer_app
    from prime_runs_spool.viewer.sources import SpoolSource

    check_listen(host, token)
    source = SpoolSource(paths, state_dir, on_link)
    app = create_viewer_app(source, token=token)

    def started(url: str) -> None:
        source.runs()  # the first scan, which a first page would make anyway
        if open_in is not None:
            open_browser(url, open_in)

    run_until_signalled(EmbeddedServer(app, host=host, port=view_ports(port), name="prime-runs-view"), out,
                        lambda url: url + "/", started)
