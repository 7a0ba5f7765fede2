"""A sync behind a proxy (docs/cli.md, "prime-runs sync"): the standard environment variables
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) choose the way to the
platform, as they do for vf-eval's own pushes (httpx's defaults).

A real ``prime-runs sync`` subprocess, a real forward proxy on loopback that forwards each
request it is given in absolute form and counts them, and the local platform behind it. The
sync names the platform ``platform.test``, a name only the proxy resolves (to the platform's
loopback address), as a proxy resolves the names its clients cannot: a loopback URL never
goes through a proxy (``--local``'s platform is on this machine).
"""

from __future__ import annotations

import http.client
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from support.runs import build_run
from support.sync_e2e import api, assert_exactly_once, run_sync, server  # noqa: F401  (fixtures)


#: The name the sync is given for the platform; only the proxy knows where it is.
PLATFORM_NAME = "platform.test"


class _Forward(BaseHTTPRequestHandler):
    """One request in absolute form (``POST http://host:port/path HTTP/1.1``), sent on to
    its host (``PLATFORM_NAME`` read as 127.0.0.1) as it came, the answer given back;
    anything else is refused with 400."""

    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        target = urlsplit(self.path)
        if target.scheme != "http" or not target.hostname:
            self.send_error(400, "not a forward proxy request")
            return
        self.server.seen.append(f"{self.command} {target.path}")  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
        address = "127.0.0.1" if target.hostname == PLATFORM_NAME else target.hostname
        headers["Host"] = f"{address}:{target.port}"
        upstream = http.client.HTTPConnection(address, target.port, timeout=30)
        try:
            path = target.path + (f"?{target.query}" if target.query else "")
            upstream.request(self.command, path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def proxy() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def _proxy_url(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def _named(base_url: str) -> str:
    """The platform's URL with ``PLATFORM_NAME`` for its loopback address."""
    return base_url.replace("127.0.0.1", PLATFORM_NAME)


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_sync_goes_through_the_proxy_the_environment_names(tmp_path, server, api, proxy, variable):  # noqa: F811
    builder = build_run(tmp_path / "run", uuid.uuid4().hex, 3)
    result = run_sync(_named(server.base_url), str(tmp_path), extra_env={variable: _proxy_url(proxy), "NO_PROXY": ""})
    assert result.returncode == 0, result.stderr
    assert_exactly_once(api, builder)
    seen = proxy.seen  # type: ignore[attr-defined]
    assert any(line.startswith("POST ") and line.endswith("/samples") for line in seen), seen
    assert any(line.startswith("POST ") and line.endswith("/finalize") for line in seen), seen


def test_no_proxy_names_the_platform_host_and_the_proxy_is_not_used(tmp_path, server, proxy):  # noqa: F811
    build_run(tmp_path / "run", uuid.uuid4().hex, 2)
    result = run_sync(_named(server.base_url), str(tmp_path), "--retry-for", "0",
                      extra_env={"HTTP_PROXY": _proxy_url(proxy), "NO_PROXY": "example.org,.test"})
    assert proxy.seen == []  # type: ignore[attr-defined]
    assert result.returncode == 1
    assert f"host name {PLATFORM_NAME}" in result.stdout, result.stdout  # asked for directly: no such name


def test_a_loopback_platform_never_goes_through_the_proxy(tmp_path, server, api, proxy):  # noqa: F811
    builder = build_run(tmp_path / "run", uuid.uuid4().hex, 2)
    result = run_sync(server.base_url, str(tmp_path), extra_env={"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    assert_exactly_once(api, builder)


@pytest.mark.parametrize("password", ["pw-s3cret", "pw s3cret"])
def test_a_proxy_that_cannot_be_reached_is_named_in_one_line(tmp_path, server, password):  # noqa: F811
    """Named with its password masked, one holding a space too (pasted as it is, which
    httpx sends as given): every retry's line printed that one whole."""
    build_run(tmp_path / "run", uuid.uuid4().hex, 1)
    result = run_sync(_named(server.base_url), str(tmp_path), "--retry-for", "0",
                      extra_env={"HTTP_PROXY": f"http://user:{password}@127.0.0.1:9", "NO_PROXY": ""})
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert "cannot connect through the proxy http://***@127.0.0.1:9 (from HTTP_PROXY" in output, output
    assert "s3cret" not in output


@pytest.mark.parametrize("url", ["socks5://user:pa ss@h:1080", "http://user:pa ss@h:3128/", "http://u:p@ss w@h",
                                 "http://u:pa/ss@h:3128", "http://tok en@h"])
def test_a_proxys_password_is_never_shown(url: str) -> None:
    from prime_runs_spool.platform_api.proxy import Proxy

    shown = Proxy(url, "HTTPS_PROXY").shown
    assert "ss" not in shown and "en" not in shown and "@h" in shown, shown


@pytest.mark.parametrize(("value", "said"), [
    ("socks5://127.0.0.1:1080", "ALL_PROXY=socks5://127.0.0.1:1080"), ("ftp://proxy.example:21", None),
    ("http://u:pw-s3cret@[::1", "ALL_PROXY"), ("http://u:pw-s3cret@127.0.0.1:99999", "ALL_PROXY"),
    ("http://u:s3cret", "ALL_PROXY"), ("http://u:pw-s3cret@127.0.0.1:0", "ALL_PROXY=http://***@127.0.0.1:0")])
def test_a_proxy_the_sync_cannot_use_is_a_usage_error(tmp_path, value, said):
    """Also one that does not parse (an unclosed ``[``) or whose port is none: they ended in
    'internal error: ValueError: Invalid IPv6 URL' (exit 1), or every run's 'internal error:
    ValueError: Port out of range 0-65535'; such a URL is not shown (the "port" of
    ``http://user:secret``, its host left out, is a password)."""
    build_run(tmp_path / "run", uuid.uuid4().hex, 1)
    result = run_sync(f"http://{PLATFORM_NAME}:1", str(tmp_path), extra_env={"ALL_PROXY": value, "NO_PROXY": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{said or 'ALL_PROXY=' + value}: not a proxy this sync can use" in result.stderr, result.stderr
    assert "s3cret" not in result.stderr and "internal error" not in result.stderr, result.stderr


def test_the_environment_is_read_once_for_each_url_of_a_destination(tmp_path, monkeypatch):
    """The settings find the proxy of each URL the sync sends to (the platform, Prime Traces
    elsewhere) once; the platform's client and its Prime Traces client take it from them.
    Each read the environment again: four reads for these two URLs, three for one."""
    import urllib.request

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.proxy import Proxy
    from prime_runs_spool.platform_api.settings import load_settings

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "traces.test")
    reads: list[None] = []
    real = urllib.request.getproxies_environment
    monkeypatch.setattr(urllib.request, "getproxies_environment", lambda: reads.append(None) or real())
    settings = load_settings(env={"PRIME_API_KEY": "k", "PRIME_API_BASE_URL": "https://platform.test",
                                  "PRIME_TRACES_URL": "https://traces.test"}, config_path=tmp_path / "none.json")
    with PlatformClient(settings, timeout=5) as client:
        client.traces()
    assert len(reads) == 2, reads
    assert (settings.proxy, settings.traces_proxy) == (Proxy("http://proxy.test:3128", "HTTPS_PROXY"), None)
    assert "proxy.test" not in repr(settings)
