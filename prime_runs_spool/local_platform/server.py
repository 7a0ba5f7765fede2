"""Running the local platform with uvicorn: as a foreground server, or embedded in a thread.

The serving itself is the viewer's (``viewer.server``, one way to listen in this package):
the listening socket is bound before uvicorn starts and handed to it, so with port 0 the
kernel picks a free port and we know it without a probe-then-bind race, and tests and
``sync --local`` can run many platforms side by side.

uvicorn runs in a background thread in both modes. Embedded, that is the point; in the
foreground it lets the main thread own SIGTERM/SIGINT and stop the server cleanly with
exit status 0 (uvicorn's own handlers re-raise the signal once it has stopped).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import TextIO

from prime_runs_spool.local_platform.app import create_app
from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.viewer.auth import check_listen
from prime_runs_spool.viewer.server import EmbeddedServer, run_until_signalled


class EmbeddedPlatform:
    """The local platform serving ``db_path`` on a loopback port, for the ``with`` block.

    >>> with EmbeddedPlatform("platform.db") as platform:
    ...     httpx.get(f"{platform.base_url}/api/v1/evaluations/")

    Entering raises ``PlatformDatabaseError`` if the database cannot be opened and ``OSError`` if
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
        self._server: EmbeddedServer | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port``, without ``/api/v1``; valid inside the ``with`` block."""
        if self._server is None:
            raise RuntimeError("the platform is not running")
        return self._server.base_url

    def is_alive(self) -> bool:
        return self._server is not None and self._server.is_alive()

    def __enter__(self) -> EmbeddedPlatform:
        self._store = Store(self.db_path)
        try:
            app = create_app(self._store, token=self.token, frontend_url=self.frontend_url,
                             request_deadline=self.request_deadline, traces=self.traces)
            self._server = EmbeddedServer(app, host=self.host, port=self.port, name="prime-runs-platform")
            self._server.__enter__()
        except BaseException:
            self._server = None
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

    def _stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self._store is not None:
            self._store.close()
        self._server = self._store = None


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
    parent process can use it as the readiness signal. Raises UnsafeListenError, before
    binding anything, for a non-loopback ``host`` without a ``token``.
    """
    check_listen(host, token)
    run_until_signalled(EmbeddedPlatform(db_path, token, host=host, port=port, frontend_url=frontend_url,
                                         request_deadline=request_deadline, traces=traces), out)
