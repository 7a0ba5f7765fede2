"""Running the local platform with uvicorn: as a foreground server, or embedded in a thread.

The listening socket is bound here, before uvicorn starts, and handed to it: with port 0
the kernel picks a free port and we know it without a probe-then-bind race, so tests and
``sync --local`` can run many platforms side by side.

uvicorn runs in a background thread in both modes. Embedded, that is the point; in the
foreground it lets the main thread own SIGTERM/SIGINT and stop the server cleanly with
exit status 0 (uvicorn's own handlers re-raise the signal once it has stopped).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import TextIO

import uvicorn

from prime_runs_spool.local_platform.app import create_app
from prime_runs_spool.local_platform.store import Store

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


def base_url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EmbeddedPlatform:
    """The local platform serving ``db_path`` on a loopback port, for the ``with`` block.

    >>> with EmbeddedPlatform("platform.db") as platform:
    ...     httpx.get(f"{platform.base_url}/api/v1/evaluations/")

    Entering raises ``StoreError`` if the database cannot be opened and ``OSError`` if
    the address cannot be bound; leaving stops the server and closes the database.
    """

    def __init__(
        self,
        db_path: str | Path,
        token: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        frontend_url: str | None = None,
        request_deadline: float | None = None,
        traces: bool = False,
    ) -> None:
        self.db_path = Path(db_path)
        #: Whether the Prime Traces service is on (off: it answers ``service_not_enabled``).
        self.traces = traces
        self.token = token
        self.host = host
        self.port = port
        self.frontend_url = frontend_url
        self.request_deadline = request_deadline
        self._store: Store | None = None
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port``, without ``/api/v1``; valid inside the ``with`` block."""
        if self._sock is None:
            raise RuntimeError("the platform is not running")
        return base_url_of(self._sock)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> EmbeddedPlatform:
        self._store = Store(self.db_path)
        try:
            self._sock = bind_socket(self.host, self.port)
            app = create_app(self._store, token=self.token, frontend_url=self.frontend_url,
                             request_deadline=self.request_deadline, traces=self.traces)
            config = uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(
                target=self._server.run,
                kwargs={"sockets": [self._sock]},
                name="prime-runs-platform",
                daemon=True,
            )
            self._thread.start()
            self._wait_started()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _wait_started(self) -> None:
        assert self._server is not None and self._thread is not None
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the platform server stopped during startup")
            if time.monotonic() > deadline:
                raise RuntimeError("the platform server did not start in time")
            time.sleep(0.01)

    def _stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(_SHUTDOWN_TIMEOUT)
        if self._sock is not None:
            self._sock.close()
        if self._store is not None:
            self._store.close()
        self._server = self._thread = self._sock = self._store = None


def serve(
    db_path: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    frontend_url: str | None = None,
    request_deadline: float | None = None,
    traces: bool = False,
    out: TextIO,
) -> None:
    """Serve until SIGTERM or SIGINT; write the base URL as the first line of ``out``.

    The line is written, and flushed, only once the server accepts connections, so a
    parent process can use it as the readiness signal.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with EmbeddedPlatform(
        db_path, token, host=host, port=port, frontend_url=frontend_url, request_deadline=request_deadline,
        traces=traces,
    ) as platform:
        out.write(platform.base_url + "\n")
        out.flush()
        while not stop.wait(0.5):
            if not platform.is_alive():
                raise RuntimeError("the platform server stopped unexpectedly")
