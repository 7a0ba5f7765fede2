"""The store behind the memory sink (support/memory_sink.py): batches kept in memory by
their digest, a batch sent again answered with its receipt and never kept twice. And, run
as ``python -m support.memory_store RUNS PLATFORM_URL KEY``, a sync of RUNS to it (the
child the tests SIGKILL; the memory sink's URL from its environment)."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson


class MemoryStore:
    """``PUT /runs/{run}/batches/{sha256}`` keeps a batch once; ``lines(run)`` reads them back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[str, list[str]] = {}
        self._lines: dict[str, list[dict[str, Any]]] = {}
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = self.path.strip("/").split("/")
                if len(parts) != 4 or hashlib.sha256(body).hexdigest() != parts[3]:
                    return self._answer(400, {"error": "not a batch under its digest"})
                store.keep(parts[1], parts[3], body)
                self._answer(200, {"upload_id": parts[3]})

            def _answer(self, status: int, document: dict[str, Any]) -> None:
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def keep(self, run: str, digest: str, body: bytes) -> None:
        with self._lock:
            if digest in self._batches.setdefault(run, []):
                return  # content addressed: answered, never kept twice
            self._batches[run].append(digest)
            self._lines.setdefault(run, []).extend(orjson.loads(line) for line in body.splitlines())

    def lines(self, run: str | None = None) -> list[dict[str, Any]]:
        """The lines kept for ``run``, in the order they arrived (every run's, for None)."""
        with self._lock:
            if run is not None:
                return list(self._lines.get(run, []))
            return [line for lines in self._lines.values() for line in lines]

    def __enter__(self) -> MemoryStore:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def main(argv: list[str]) -> int:
    """Sync the runs under ``argv[0]`` to the memory sink, their evaluations on the platform
    at ``argv[1]`` (key ``argv[2]``), with the end-to-end tests' short timings."""
    import support.memory_sink  # noqa: F401 - registers the sink
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import remote_destination

    runs, base_url, key = argv
    settings = Settings(base_url=base_url, api_key=Secret(key), team_id=None, frontend_url=base_url)
    options = SyncOptions(to=support.memory_sink.MemorySink.name, request_lifetime=1.0,
                          backoff=Backoff(base=0.05, cap=0.2, max_attempts=20))
    with PlatformClient(settings, timeout=5) as client:
        reports = sync_paths([Path(runs)], client, remote_destination(base_url, None), options, jobs=1)
    print(json.dumps([report.as_json() for report in reports]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
