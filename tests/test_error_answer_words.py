"""What an error line quotes of the platform's answer: the words a JSON answer states
(FastAPI's ``detail``, a string or its list of validation errors; else ``message`` or
``error``), not its braces and quotes; any other body as it was sent; one line, the key
scrubbed out, bounded. The real ``prime-runs sync`` against a real HTTP server on loopback
that answers the key check's listing as the platform does and every run's request with
the answer under test."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from prime_runs_spool.platform_api.answers import QUOTED_CHARACTERS
from support.runs import build_run
from test_sync_retries import run_piped

#: A key with characters JSON may escape, echoed back by the answer with every character
#: escaped (``\\u00NN``): the words, decoded, would spell it out.
KEY = "sk/echoed-key-0123"
#: Where an answer echoes the request's key, escaped as JSON may escape it.
ECHOED = "{key}"

FASTAPI_422 = {"detail": [
    {"type": "missing", "loc": ["body", "name"], "msg": "Field required", "input": {"model": "secret-prompt"}},
    {"type": "string_type", "loc": ["body", "model"], "msg": "Input should be a valid string", "input": 7},
]}

CASES = {
    "detail": (400, json.dumps({"detail": "environment gsm8k is not yours"}), "environment gsm8k is not yours"),
    "fastapi-422": (422, json.dumps(FASTAPI_422),
                    "body.name: Field required; body.model: Input should be a valid string"),
    "message": (403, json.dumps({"message": "team t-1 has no access", "status": 403}), "team t-1 has no access"),
    "error": (402, json.dumps({"error": {"code": "payment_required", "message": "the plan ran out"}}),
              "the plan ran out"),
    "server-error": (500, json.dumps({"detail": "the database is read-only"}), "the database is read-only"),
    "echoed-key": (400, json.dumps({"detail": "bad key Bearer " + ECHOED}), "bad key Bearer ***"),
    "other-json": (404, json.dumps({"status": "gone"}), '{"status": "gone"}'),
    "text": (404, "no such route\r\nhere", "no such route here"),
    "long": (400, json.dumps({"detail": "why " * 100}), ("why " * 100)[:QUOTED_CHARACTERS].rstrip()),
}


def _answering(status: int, body: str) -> type[BaseHTTPRequestHandler]:
    class Answering(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.startswith("/api/v1/evaluations/?"):  # the key check's listing
                self._answer(200, json.dumps({"evaluations": [], "total": 0}))
            else:
                self._answer(status, body)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._answer(status, body)

        def _answer(self, code: int, text: str) -> None:
            key = self.headers.get("Authorization", "").removeprefix("Bearer ")
            data = text.replace(ECHOED, "".join(f"\\u{ord(c):04x}" for c in key)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json" if text.startswith("{") else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Answering


@pytest.fixture
def answering(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The server's base URL, answering the case ``request.param``, and the words expected."""
    status, body, words = CASES[request.param]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _answering(status, body))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", f" answered {status}", words
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow  # a sync a case
@pytest.mark.parametrize("answering", list(CASES), indirect=True)
def test_an_error_line_quotes_the_words_an_answer_states(tmp_path: Path, answering: tuple[str, str, str]) -> None:
    """Before, a JSON answer was quoted raw: ``({"detail":"..."})``, a validation error's
    ``input`` (what the request sent) included, the words' escapes as they were sent."""
    url, answered, words = answering
    build_run(tmp_path / "outputs" / "run", "error-words", 2)
    status, out, lines, _ = run_piped(url, str(tmp_path / "outputs"), "--to", "samples", "--max-attempts", "1",
                                      key=KEY, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    said = [line for line in out.splitlines() + [text for _, text in lines] if answered in line]
    assert status == 1 and said, (out, lines)
    assert all(f"{answered}" in line and f"({words})" in line for line in said), said
    assert KEY not in out + "".join(text for _, text in lines)
    assert "secret-prompt" not in out + "".join(text for _, text in lines)
