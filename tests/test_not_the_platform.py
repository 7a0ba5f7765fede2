"""A --base-url that is some other HTTP server (a model server, a static file server, another
JSON API) answers the platform's endpoints 404, 405 or 501, or 200 with something else than
the platform's answer: that is a setup error, told in one line
before any run is touched, not an outage retried for the whole --retry-for window. Real
`prime-runs sync` processes against a real HTTP server on loopback."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from support.runs import build_run
from test_sync_retries import run_piped, tree


class NothingImplemented(BaseHTTPRequestHandler):
    """Answers 501 to every method, as http.server does for a method it lacks."""

    def log_message(self, *args: object) -> None:
        pass


class QuietFiles(SimpleHTTPRequestHandler):
    """A static file server: GET of an unknown path 404, POST 501."""

    def log_message(self, *args: object) -> None:
        pass


class OnlyPosts(BaseHTTPRequestHandler):
    """A server whose every path takes POST only: GET answered 405."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(405)
        self.send_header("Allow", "POST")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class AnswersEverything(BaseHTTPRequestHandler):
    """Some other server that answers every GET 200: ``{"hello": "world"}`` (another JSON
    API), or a web page (a front end's server, one page for every path)."""

    body = b'{"hello": "world"}'
    content_type = "application/json"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class AnswersAPage(AnswersEverything):
    body = b"<!doctype html><html><body>Welcome</body></html>"
    content_type = "text/html"


class AnswersAnEmptyList(AnswersEverything):
    """JSON close to the listing, a list with no total: not the platform's answer either."""

    body = b'{"evaluations": []}'


@pytest.fixture(params=[NothingImplemented, QuietFiles, OnlyPosts, AnswersEverything, AnswersAPage, AnswersAnEmptyList],
                ids=["501", "404", "405", "200-other-json", "200-page", "200-no-total"])
def other_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "served").mkdir()
    handler = request.param
    if issubclass(handler, SimpleHTTPRequestHandler):
        handler = functools.partial(handler, directory=str(tmp_path / "served"))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow
def test_a_base_url_that_is_not_the_platform_exits_2_at_once_touching_no_run(tmp_path: Path,
                                                                           other_server: str) -> None:
    build_run(tmp_path / "outputs" / "run", "not-the-platform", 2)
    before = tree(tmp_path / "outputs")
    status, out, lines, took = run_piped(other_server, str(tmp_path / "outputs"), "--retry-for", "60s",
                                         HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    errors = [text for _, text in lines if text.strip()]
    assert status == 2, lines
    assert len(errors) == 1 and errors[0].startswith("prime-runs: "), errors
    assert other_server in errors[0] and "does not look like the platform" in errors[0], errors
    assert "--base-url" in errors[0] and "Traceback" not in errors[0], errors
    assert took < 30, (took, lines)  # not the 60 s window
    assert out == ""
    assert tree(tmp_path / "outputs") == before, "a sync to something else wrote into the paths"


class ListsThenNothing(BaseHTTPRequestHandler):
    """Answers the key check's listing as the platform would, and 501 to everything else:
    the check passes, and the runs' own requests meet the 501."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.startswith("/api/v1/evaluations/?"):
            body = b'{"evaluations": [], "total": 0}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(501)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_a_501_to_a_runs_request_fails_that_run_at_once_not_after_retry_for(tmp_path: Path) -> None:
    """501 is a server that does not implement the request: no retry changes that."""
    build_run(tmp_path / "outputs" / "run", "nothing-implemented", 2)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ListsThenNothing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        status, out, lines, took = run_piped(url, str(tmp_path / "outputs"), "--to", "samples", "--retry-for", "60s",
                                             HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert status == 1, (out, lines)
    assert not [text for _, text in lines if " try " in text], lines  # nothing retried
    assert out.startswith("error") and "answered 501" in out and "--base-url" in out, out
    assert took < 30, (took, out, lines)
