"""The platform client classifies every failure the way the sync protocol relies on."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.errors import FailureKind, PlatformError
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings, load_settings, normalize_base_url

from support.env import CLI, child_env
from support.runs import build_run
from support.traces_upload import LINE, upload_refused


def client_with(handler) -> PlatformClient:
    settings = Settings(base_url="http://platform.test", api_key=Secret("sk-test-key-value"),
                        team_id="team-1", frontend_url="http://app.test")
    return PlatformClient(settings, transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, FailureKind.NOT_SENT), (500, FailureKind.ANSWERED), (503, FailureKind.IN_DOUBT),
     (502, FailureKind.IN_DOUBT), (504, FailureKind.IN_DOUBT), (524, FailureKind.IN_DOUBT), (401, FailureKind.FATAL),
     (402, FailureKind.FATAL), (403, FailureKind.FATAL), (404, FailureKind.FATAL),
     (409, FailureKind.FATAL), (413, FailureKind.FATAL), (422, FailureKind.FATAL)],
)
def test_status_codes_are_classified(status: int, kind: FailureKind) -> None:
    """Without a body: a 503 or any 5xx but a 500 may be a gateway's, its upstream still at work."""
    client = client_with(lambda request: httpx.Response(status, headers={"Retry-After": "3"}))
    with pytest.raises(PlatformError) as caught:
        client.push_samples("ev1", b'{"samples":[]}')
    assert caught.value.kind is kind
    assert caught.value.status == status
    if status == 429:
        assert caught.value.retry_after == 3.0


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [(503, b'{"detail": "write deadline passed"}', FailureKind.ANSWERED),
     (507, b'{"detail": "the database is full"}', FailureKind.ANSWERED),
     (500, b"Internal Server Error", FailureKind.ANSWERED),
     (503, b"upstream connect error or disconnect/reset before headers", FailureKind.IN_DOUBT),
     (503, b"[1]", FailureKind.IN_DOUBT),
     (503, b'{"message": "Service Unavailable"}', FailureKind.IN_DOUBT),
     (507, b"<html><title>507</title></html>", FailureKind.IN_DOUBT),
     (524, b'{"detail": "a timeout occurred"}', FailureKind.IN_DOUBT)],
)
def test_a_5xx_is_the_services_own_only_in_its_answer(status: int, body: bytes, kind: FailureKind) -> None:
    """The service's 503 and 507 are in its words (FastAPI's ``detail``); its 500 may be plain
    text (Starlette's). Anything else is a gateway's (API Gateway's and Kong's JSON say
    ``message``), for a request its upstream may still be at work on."""
    client = client_with(lambda request: httpx.Response(status, content=body))
    with pytest.raises(PlatformError) as caught:
        client.push_samples("ev1", b'{"samples":[]}')
    assert (caught.value.kind, caught.value.status) == (kind, status)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [(httpx.ConnectError("refused"), FailureKind.NOT_SENT),
     (httpx.ConnectTimeout("slow"), FailureKind.NOT_SENT),
     (httpx.ReadTimeout("late"), FailureKind.IN_DOUBT),
     (httpx.RemoteProtocolError("reset"), FailureKind.IN_DOUBT),
     (httpx.ReadError("reset"), FailureKind.IN_DOUBT),
     (httpx.WriteError("broken pipe"), FailureKind.IN_DOUBT)],
)
def test_transport_errors_are_classified(exc: Exception, kind: FailureKind) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(PlatformError) as caught:
        client_with(handler).finalize("ev1", {})
    assert caught.value.kind is kind


def test_requests_carry_key_team_and_exact_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/resolve"):
            return httpx.Response(200, json={"data": {"id": "env-1"}})
        return httpx.Response(200, json={"evaluation_id": "ev1", "samples_pushed": 1})

    client = client_with(handler)
    assert client.resolve_environment("gsm8k") == "env-1"
    client.push_samples("ev1", b'{"samples":[{"a":1}]}')
    assert seen[0].headers["authorization"] == "Bearer sk-test-key-value"
    assert seen[0].url.path == "/api/v1/environmentshub/resolve"
    assert b'"team_id":"team-1"' in seen[0].content
    assert seen[1].url.path == "/api/v1/evaluations/ev1/samples"
    assert seen[1].content == b'{"samples":[{"a":1}]}'


def test_unreadable_success_is_in_doubt() -> None:
    client = client_with(lambda request: httpx.Response(200, content=b"<html>"))
    with pytest.raises(PlatformError) as caught:
        client.create_evaluation({"name": "x"})
    assert caught.value.kind is FailureKind.IN_DOUBT


def test_fatal_error_message_says_what_to_do_and_hides_the_key() -> None:
    client = client_with(lambda request: httpx.Response(401, json={"detail": "bad key"}))
    with pytest.raises(PlatformError) as caught:
        client.get_evaluation("ev1")
    message = str(caught.value)
    assert "PRIME_API_KEY" in message
    assert "sk-test-key-value" not in message and "sk-test-key-value" not in repr(client.settings)


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_names_the_platform_it_was_sent_to(status: int) -> None:
    """A key sent to another platform than its own (a wrong --base-url) is refused there: the
    line names where the request went, so the wrong host shows."""
    client = client_with(lambda request: httpx.Response(status, json={"detail": "no"}))
    with pytest.raises(PlatformError) as caught:
        client.get_evaluation("ev1")
    assert "http://platform.test" in str(caught.value) and "--base-url" in str(caught.value), caught.value


@pytest.mark.parametrize("status", [401, 403])
def test_a_key_refused_by_the_traces_service_names_it(status: int) -> None:
    refused = upload_refused(lambda request: httpx.Response(
        status, json={"error": {"code": "unauthorized", "message": "no"}}))
    assert f"answered {status}" in str(refused) and "http://traces.test:8443" in str(refused), refused


@pytest.mark.parametrize(("message", "line"), [
    ("Prime Traces is not enabled for this account", "Prime Traces is not enabled for this account"),
    ("Ask your team admin.", "Prime Traces is not enabled for this account (Ask your team admin.)"),
])
def test_service_not_enabled_is_said_once_with_the_services_words_only_when_they_add_some(
        message: str, line: str) -> None:
    """The local platform (and a service saying the same) gave 'Prime Traces is not enabled
    for this account (Prime Traces is not enabled for this account)' under every run."""
    from prime_runs_spool.errors import ServiceNotEnabled

    refused = upload_refused(lambda request: httpx.Response(
        403, json={"error": {"code": "service_not_enabled", "message": message}}))
    assert isinstance(refused, ServiceNotEnabled) and str(refused) == line


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [(429, "rate_limited", FailureKind.NOT_SENT), (503, "ingest_unavailable", FailureKind.ANSWERED),
     (503, None, FailureKind.IN_DOUBT), (502, None, FailureKind.IN_DOUBT), (504, None, FailureKind.IN_DOUBT),
     (500, None, FailureKind.IN_DOUBT), (400, "invalid", FailureKind.FATAL)],
)
def test_a_traces_answer_that_may_follow_the_services_commit_is_in_doubt(status: int, code: str | None,
                                                                       kind: FailureKind) -> None:
    """A gateway's answer (502, 504, a 503 without the service's refusal code) may come after
    it forwarded the batch and the service stored it, and the service's own 500 after its
    commit: the sink keeps such a batch announced (tests/test_sink_in_doubt.py). Only the
    service declining it (a rate limit, a coded 503) or refusing it says it was not stored."""
    body = {"error": {"code": code, "message": "no"}} if code else {"detail": "upstream"}
    refused = upload_refused(lambda request: httpx.Response(status, json=body), base_url="http://traces.test")
    assert refused.kind is kind, refused


@pytest.mark.parametrize(("status", "body"), [(200, b""), (200, b"null"), (200, b"[]"), (201, b'"stored"'),
                                             (204, b"")])
def test_a_traces_upload_answered_2xx_without_a_receipt_is_in_doubt_whatever_the_library_calls_its_reader(
        monkeypatch, status: int, body: bytes) -> None:
    """A 2xx to an upload that holds no receipt (a proxy's: empty, ``null``, not an object)
    may follow the service's commit: in doubt, so the batch is sent again under its key.
    Sync read the 2xx by replacing prime-traces' private ``_upload_result``; a release
    calling its reader by another name (here: the replacement never met) made the answer a
    refusal ('API response was not a dictionary', FATAL: the batch withdrawn, --to samples
    sending it again) or an internal error, without a word at start-up."""
    from prime_traces import TracesAPIClient

    original = TracesAPIClient.upload_batch

    def as_if_renamed(self, *args, **kwargs):
        vars(self).pop("_upload_result", None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TracesAPIClient, "upload_batch", as_if_renamed)
    refused = upload_refused(lambda request: httpx.Response(status, content=body))
    assert (refused.kind, refused.status) == (FailureKind.IN_DOUBT, status), refused
    assert "without a receipt" in str(refused) and "\n" not in str(refused), refused
    assert refused.__cause__ is None


@pytest.mark.parametrize(("status", "kind"), [(307, FailureKind.FATAL), (302, FailureKind.FATAL),
                                             (301, FailureKind.FATAL), (303, FailureKind.IN_DOUBT)])
def test_a_redirect_is_no_success(status: int, kind: FailureKind) -> None:
    """The sync follows no redirect, and took any status below 400 for the platform's success:
    a samples request a gateway redirected counted as pushed. A 303 says it was acted on
    where it leads (in doubt, settled by reading), any other redirect that it was not."""
    location = "https://status.example/maintenance"
    client = client_with(lambda request: httpx.Response(status, headers={"Location": location},
                                                        json={"detail": "moved"}))
    with pytest.raises(PlatformError) as caught:
        client.push_samples("ev1", b'{"samples":[]}')
    assert (caught.value.kind, caught.value.status) == (kind, status), caught.value
    assert location in str(caught.value) and "\n" not in str(caught.value), caught.value


def _sync_samples(runs: Path, db: Path, base_url: str, *, attempts: int, lifetime: float = 0.2):
    """One sync of ``runs`` to the samples of the local platform whose database is ``db``,
    reached at ``base_url`` (the platform itself, or a fault proxy before it): request
    lifetimes and retries short enough for a test to wait them out."""
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import local_destination

    settings = Settings(base_url=base_url, api_key=Secret("local"), team_id=None, frontend_url=base_url)
    with PlatformClient(settings, timeout=5) as client:
        (report,) = sync_paths([runs], client, local_destination(db, None),
                               SyncOptions(to=SAMPLES, request_lifetime=lifetime,
                                           backoff=Backoff(base=0.01, cap=0.01, max_attempts=attempts)))
    return report


def _sync_through_fault(platform_url: str, runs: Path, db: Path, fault: str, *, methods: list[str], paths: str):
    """One sync (one try a request) through a fault proxy before the local platform at
    ``platform_url`` that answers every request of ``methods`` to ``paths`` with ``fault``;
    the fault must have been met, or the test would prove nothing."""
    from fixtures.fault_proxy import FaultProxy

    with FaultProxy(platform_url, rates={fault: 1.0}, methods=methods, paths=paths) as proxy:
        report = _sync_samples(runs, db, proxy.base_url, attempts=1)
        assert fault in proxy.faults()
    return report


@pytest.mark.slow
def test_a_samples_request_a_gateway_redirects_is_not_counted_pushed(tmp_path: Path) -> None:
    """A gateway before the platform answers every samples request with a 307 (a maintenance
    page), forwarding none. The pass fails in one line naming the redirect, and the next
    sync, the platform reachable, pushes every episode; before, the run said synced, 5
    pushed, the platform held none of them, and every later sync said up to date."""
    from fixtures.fault_proxy import FaultProxy
    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from support.runs import build_run

    build_run(tmp_path / "runs" / "run", "redirected-samples", 5)
    db = tmp_path / "p.db"

    def sync(base_url: str):
        return _sync_samples(tmp_path / "runs", db, base_url, attempts=2)

    with EmbeddedPlatform(db) as platform:
        with FaultProxy(platform.base_url, rates={"redirect": 1.0}, methods=["POST"], paths=r"/samples$") as proxy:
            redirected = sync(proxy.base_url)
        assert (redirected.state, redirected.pushed_now) == ("error", 0), redirected
        assert "307" in redirected.error and "status.example" in redirected.error, redirected.error
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{redirected.evaluation_id}").json()
        assert evaluation["total_samples"] == 0
        done = sync(platform.base_url)
        assert (done.state, done.pushed_now) == ("synced", 5), done
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{redirected.evaluation_id}").json()
        assert evaluation["total_samples"] == 5


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["ok_empty", "ok_null_after", "ok_object"])
def test_a_samples_request_answered_2xx_without_the_platforms_answer_is_in_doubt(tmp_path: Path, fault: str) -> None:
    """A proxy answers a samples request 200 with an empty body, never passing it on
    (``ok_empty``), or with ``{}`` (``ok_object``: an object without the platform's
    ``samples_pushed``), or passes it on and answers 200 ``null`` (``ok_null_after``). None is
    the platform's answer: the request is in doubt, settled by the count (in the pass, once
    its lifetime is past, or by the next sync), each row there once. Before, an empty 2xx (and a `{}`) counted as pushed: the run said synced,
    5 pushed, the platform held none of them, and every later sync said up to date."""
    from prime_runs_spool.local_platform.server import EmbeddedPlatform

    build_run(tmp_path / "runs" / "run", "bare-2xx-samples", 5)
    runs, db = tmp_path / "runs", tmp_path / "p.db"

    def sync(base_url: str):
        return _sync_samples(runs, db, base_url, attempts=1)

    with EmbeddedPlatform(db) as platform:
        bare = _sync_through_fault(platform.base_url, runs, db, fault, methods=["POST"], paths=r"/samples$")
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{bare.evaluation_id}").json()
        assert evaluation["total_samples"] == bare.pushed_total, bare  # what it says is there, is
        if fault in ("ok_empty", "ok_object"):  # nothing there to settle it by: a line saying so
            assert (bare.state, bare.pushed_now) == ("error", 0), bare
            assert "without the platform's answer" in bare.error and "\n" not in bare.error, bare.error
        done = sync(platform.base_url)
        assert (done.state in ("synced", "up_to_date"), done.pushed_total) == (True, 5), done
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{bare.evaluation_id}").json()
        assert evaluation["total_samples"] == 5


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["status_503_first", "status_524_first"])
def test_a_samples_request_a_gateway_fails_while_the_platform_works_on_it_is_in_doubt(
        tmp_path: Path, fault: str) -> None:
    """A gateway before the platform answers the samples request with a page of its own
    (envoy's codeless 503 for a reset, Cloudflare's 524 once the origin is slower than it
    waits) while the platform is still at work on it: the request lands 0.3 s later, within
    its lifetime. Not the service's answer, so in doubt: the count, short at once, is read
    again once the request can no longer land, and each row is there once. Before, the 503
    and the 524 read as the service's own, done with the request: one count, read before the
    request landed, and the rows sent again, 10 rows for 5 episodes."""
    from fixtures.fault_proxy import FaultProxy
    from prime_runs_spool.local_platform.server import EmbeddedPlatform

    build_run(tmp_path / "runs" / "run", "gateway-first", 5)
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db) as platform:
        with FaultProxy(platform.base_url, rates={fault: 1.0}, methods=["POST"], paths=r"/samples$",
                        delay=0.3) as proxy:
            report = _sync_samples(tmp_path / "runs", db, proxy.base_url, attempts=3, lifetime=2.0)
            time.sleep(0.5)  # any request the gateway still holds has reached the platform
            assert fault in proxy.faults()
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{report.evaluation_id}").json()
        assert evaluation["total_samples"] == 5, (report, proxy.log)
        assert (report.state, report.pushed_total) == ("synced", 5), report


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["ok_empty", "ok_null_after", "ok_object"])
def test_a_finalize_answered_2xx_without_the_platforms_answer_is_in_doubt(tmp_path: Path, fault: str) -> None:
    """The finalize answered 200 with no body by a proxy that never passed it on, or passed
    on and answered ``null``: in doubt, settled by the evaluation's status, so the
    evaluation ends COMPLETED, finalized once. Before, an empty 2xx counted as done: the
    state said finalized, the evaluation stayed RUNNING without its metrics, and every
    later sync said up to date."""
    from prime_runs_spool.local_platform.server import EmbeddedPlatform

    build_run(tmp_path / "runs" / "run", "bare-2xx-finalize", 3)
    runs, db = tmp_path / "runs", tmp_path / "p.db"

    def sync(base_url: str):
        return _sync_samples(runs, db, base_url, attempts=1)

    with EmbeddedPlatform(db) as platform:
        first = _sync_through_fault(platform.base_url, runs, db, fault, methods=["POST"], paths=r"/finalize$")
        sync(platform.base_url)
        again = sync(platform.base_url)
        assert again.state == "up_to_date", again
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{first.evaluation_id}").json()
        assert (evaluation["status"], evaluation["finalize_count"], evaluation["total_samples"]) == (
            "COMPLETED", 1, 3), evaluation


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["ok_empty", "ok_object"])
def test_a_failed_runs_end_answered_2xx_without_the_platforms_answer_is_not_taken_as_recorded(
        tmp_path: Path, fault: str) -> None:
    """A failed run's end (the metadata PUT and the status PUT) answered 200 with no body, or
    with ``{}`` (a stub's), by a proxy that never passed them on: the run's error, and the
    next sync records the end. Before, the run said failed as recorded, the evaluation stayed
    RUNNING without its end, and every later sync said up to date. A PUT is answered with
    the evaluation, its status in it (the local platform's, as docs/platform-api.md says)."""
    from prime_runs_spool.local_platform.server import EmbeddedPlatform

    build_run(tmp_path / "runs" / "run", "bare-2xx-put", 3, status="failed")
    runs, db = tmp_path / "runs", tmp_path / "p.db"

    def sync(base_url: str):
        return _sync_samples(runs, db, base_url, attempts=1)

    with EmbeddedPlatform(db) as platform:
        first = _sync_through_fault(platform.base_url, runs, db, fault, methods=["PUT"],
                                    paths=r"/evaluations/[^/]+$")
        assert first.state == "error" and "without the platform's answer" in first.error, first
        assert sync(platform.base_url).state == "failed"
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{first.evaluation_id}").json()
        assert (evaluation["status"], evaluation["metadata"]["prime_runs"]["status"]) == ("FAILED", "failed")


def test_a_base_url_that_redirects_is_told_by_the_key_check() -> None:
    """An ``http`` address the platform moved to ``https`` (a 301 to every request): the key
    check, which any sync that sends makes first, says the redirect and where it leads, a
    configuration error before anything is written, not an error under every run."""
    import http.server
    import threading

    from prime_runs_spool.platform_api.key_check import refused_key

    class Moved(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(301)
            self.send_header("Location", "https://platform.example" + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        refused = refused_key(Settings(base_url=base, api_key=Secret("k"), team_id=None, frontend_url=base))
    finally:
        server.shutdown()
        server.server_close()
    assert refused is not None and refused.kind is FailureKind.FATAL, refused
    assert "301" in str(refused) and "https://platform.example" in str(refused), refused


NGINX_413 = ("<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request "
             "Entity Too Large</h1></center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n")


@pytest.mark.parametrize("service", ["traces", "platform"])
def test_a_proxys_413_page_is_told_by_its_title_with_what_to_do(service: str) -> None:
    """A proxy in front of the service (nginx: 1 MiB unless set) refuses the body with an HTML
    page: the line says what it is and what to change, one line, not the page's markup (nor
    "answered 413 : refused", the Prime Traces line's before)."""
    from prime_runs_spool.platform_api.client import classify_response

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(413, text=NGINX_413, headers={"content-type": "text/html"}, request=request)

    if service == "traces":
        refused = upload_refused(answer)
        said = str(refused)
        assert said.startswith("POST /traces answered 413: the traces service at http://traces.test:8443, or a proxy "
                               "in front of it, takes no request this large; raise the proxy's limit"), said
        assert refused.kind is FailureKind.FATAL
    else:
        said = str(classify_response("POST", "/evaluations/e/samples",
                                     answer(httpx.Request("POST", "http://platform.test/x"))))
        assert "too large" in said, said
    assert said.endswith("(an HTML page: 413 Request Entity Too Large)"), said
    assert "<" not in said and "\n" not in said and "  " not in said, said


def test_settings_precedence(tmp_path) -> None:
    config = tmp_path / ".prime" / "config.json"
    config.parent.mkdir()
    config.write_text('{"api_key": "from-file", "base_url": "https://file.example/api/v1", "team_id": "t-file"}')
    from_file = load_settings(env={"HOME": str(tmp_path)})
    assert from_file.api_key is not None and from_file.api_key.reveal() == "from-file"
    assert from_file.base_url == "https://file.example"
    assert from_file.team_id == "t-file"
    from_env = load_settings(env={"HOME": str(tmp_path), "PRIME_API_KEY": "from-env",
                                  "PRIME_BASE_URL": "http://old.example/"})
    assert from_env.api_key.reveal() == "from-env"
    assert from_env.base_url == "http://old.example"
    explicit = load_settings(base_url="http://flag.example", team_id="t-flag", env={"HOME": str(tmp_path)})
    assert (explicit.base_url, explicit.team_id) == ("http://flag.example", "t-flag")
    assert normalize_base_url("https://x.example/api/v1/") == "https://x.example"
    nothing = load_settings(env={"HOME": str(tmp_path / "nowhere")})
    assert nothing.api_key is None


@pytest.mark.parametrize(("url", "why"), [
    ("htp:/typo", "does not start with http:// or https://"),
    ("localhost:8000", "does not start with http:// or https://"),
    ("http://[::1", "invalid ipv6 url"),
    ("http://", "names no host"),
    ("ftp://files.example", "scheme must be http or https"),
    ("http://127.0.0.1:99999", "port out of range"),
    ("http://platform.example?team=1", "no ?query"),
])
def test_a_base_url_no_request_could_reach_is_refused_naming_where_it_came_from(tmp_path, url, why) -> None:
    from prime_runs_spool.errors import InvalidBaseUrlError

    with pytest.raises(InvalidBaseUrlError, match=re.escape(why)) as flag:
        load_settings(base_url=url, env={"HOME": str(tmp_path)})
    assert str(flag.value).startswith(f"--base-url {url!r} is not a usable URL")
    with pytest.raises(InvalidBaseUrlError, match="^PRIME_API_BASE_URL "):
        load_settings(env={"HOME": str(tmp_path), "PRIME_API_BASE_URL": url})
    config = tmp_path / ".prime" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(f'{{"base_url": "{url}"}}')
    with pytest.raises(InvalidBaseUrlError, match=f"^base_url in {re.escape(str(config))} "):
        load_settings(env={"HOME": str(tmp_path)})


@pytest.mark.parametrize("url", [
    "http://alice:hunter2@platform.example:port/",
    "http://alice:hun/ter2@platform.example/",  # a password holding "/" ends urlsplit's authority early
    "http://alice:hunter 2@platform.example/",  # white space in it: the URL pattern of masking stops there
])
def test_a_refused_base_url_never_shows_its_userinfo(tmp_path, url: str) -> None:
    from prime_runs_spool.errors import InvalidBaseUrlError

    with pytest.raises(InvalidBaseUrlError) as refused:
        load_settings(base_url=url, env={"HOME": str(tmp_path)})
    said = str(refused.value)
    assert not {"alice", "hunter", "hunter2", "hun", "ter2", "2"} & set(re.split(r"[^a-z0-9]+", said)), said
    assert "http://***@platform.example" in said, said
    assert load_settings(base_url="http://[::1]:8000/api/v1", env={"HOME": str(tmp_path)}).base_url == "http://[::1]:8000"


def test_a_body_goes_out_in_slices_well_under_the_sync_mmap_threshold() -> None:
    """h11 copies each slice it is handed: a slice at the 1 MiB mmap threshold the sync command
    fixes (sync/memory.py) made every copy a fresh mapping, faulted in and unmapped again,
    about 0.4 s of CPU per 550 MB sent (Dec 1, benchmarks/sync_throughput.py)."""
    from prime_runs_spool.platform_api.client import SEND_CHUNK, _Chunks
    from prime_runs_spool.sync.memory import LARGE_BLOCK

    assert SEND_CHUNK * 4 <= LARGE_BLOCK
    body = bytes(range(256)) * (SEND_CHUNK * 2 // 256) + b"!"
    slices = list(_Chunks(body))
    assert [len(s) for s in slices] == [SEND_CHUNK, SEND_CHUNK, 1]
    assert b"".join(slices) == body


def test_on_sent_is_called_once_the_whole_body_is_written() -> None:
    """The sync builds its next request only once this one's body is on the wire
    (sync/rows.py, ``read_ahead``): ``on_sent`` must not come before the last slice."""
    from prime_runs_spool.platform_api.client import SEND_CHUNK, _Chunks

    calls: list[int] = []
    body = b"x" * (SEND_CHUNK * 2 + 5)
    slices = _Chunks(body, lambda: calls.append(1))
    taken = 0
    for _ in slices:
        assert not calls  # not before the last slice is asked for again
        taken += 1
    assert taken == 3 and calls == [1]

    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.read())
        return httpx.Response(200, json={"evaluation_id": "ev1", "samples_pushed": 1})

    client_with(handler).push_samples("ev1", body, on_sent=lambda: calls.append(2))
    assert seen == [body] and calls == [1, 2]


def test_a_client_for_plain_http_loads_no_ca_bundle_and_can_verify_nothing() -> None:
    """Loading the CA bundle costs about 22 ms of CPU (Dec 6) that a client never making a
    TLS connection does not need; what it gets instead trusts no
    certificate, so TLS through it can only fail. Any https URL keeps the default."""
    import ssl

    from prime_runs_spool.platform_api.client import _tls_for

    context = _tls_for("http://127.0.0.1:8000", "http://127.0.0.1:8000")
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 0
    assert _tls_for("https://api.primeintellect.ai", "https://api.primeintellect.ai") is True
    assert _tls_for("http://127.0.0.1:8000", "https://traces.example") is True
    settings = Settings(base_url="http://127.0.0.1:9", api_key=Secret("k"), team_id=None, frontend_url="http://x")
    with PlatformClient(settings) as client:
        client._connection()  # made without the bundle, and usable


def test_a_query_goes_out_as_httpx_would_encode_it() -> None:
    """The client builds each URL itself (one parse, not httpx's three): the same bytes."""
    seen: list[httpx.Request] = []
    client = client_with(lambda request: seen.append(request) or httpx.Response(200, json={"evaluations": [], "total": 0}))
    client.list_evaluations(environment_name="math & more/é?x=1", skip=3, limit=7)
    expected = httpx.Request("GET", "http://platform.test/api/v1/evaluations/",
                             params={"skip": 3, "limit": 7, "team_id": "team-1",
                                     "environment_name": "math & more/é?x=1"}).url
    assert seen[0].url == expected
    assert seen[0].url.params["environment_name"] == "math & more/é?x=1"


def test_each_request_in_flight_has_an_http_client_of_its_own_and_they_are_reused() -> None:
    """httpcore's pool checks every connection it holds against the others twice per
    request: one pool per request in flight keeps that to one connection each."""
    import threading

    inside, release = threading.Barrier(3), threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/ev-slow"):
            inside.wait(5)
            release.wait(5)
        return httpx.Response(200, json={"evaluation_id": "x", "status": "RUNNING", "total_samples": 0})

    client = client_with(handler)
    threads = [threading.Thread(target=client.get_evaluation, args=("ev-slow",)) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait(5)  # both requests are in the handler at once
    client.get_evaluation("ev-fast")  # a third, meanwhile
    release.set()
    for thread in threads:
        thread.join(5)
    assert len(client._made) == 3
    for _ in range(5):
        client.get_evaluation("ev-fast")  # one at a time: no new client
    assert len(client._made) == 3
    made = list(client._made)
    client.close()
    assert all(http.is_closed for http in made)


def test_the_client_keeps_no_cookie_the_platform_sets() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"evaluation_id": "x", "status": "RUNNING", "total_samples": 0},
                              headers={"Set-Cookie": "session=abc; Path=/"})

    client = client_with(handler)
    client.get_evaluation("ev1")
    client.get_evaluation("ev1")
    assert "cookie" not in seen[1].headers


def test_the_client_sends_nothing_for_an_id_that_is_not_one_path_segment() -> None:
    from prime_runs_spool.errors import FailureKind, PlatformError
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings

    sent: list[str] = []
    evaluation = {"evaluation_id": "dd8a5b36-5461-44c7-9384-9c341638dd79", "status": "RUNNING", "total_samples": 0}
    transport = httpx.MockTransport(lambda request: sent.append(str(request.url)) or httpx.Response(200,
                                                                                                  json=evaluation))
    settings = Settings(base_url="http://platform.invalid", api_key=Secret("k"), team_id=None,
                        frontend_url="http://platform.invalid")
    with PlatformClient(settings, transport=transport) as client:
        for bad in ("..", "../../x", "a/b", "a?b=1", "a%2Fb", "", "x" * 65):
            with pytest.raises(PlatformError) as caught:
                client.push_samples(bad, b'{"samples":[]}')
            assert caught.value.kind is FailureKind.FATAL
        client.get_evaluation("dd8a5b36-5461-44c7-9384-9c341638dd79")
    assert sent == ["http://platform.invalid/api/v1/evaluations/dd8a5b36-5461-44c7-9384-9c341638dd79"], sent


@pytest.fixture
def trickling_platform():
    """A platform (or a proxy before it) that answers every request with a status line and
    then one header line every 0.3 s, forever: never silent long enough for a read timeout."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not stop.wait(0.3):
                    conn.sendall(b"X-Still-Here: yes\r\n")
            except OSError:
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


@pytest.mark.slow
def test_a_platform_that_trickles_its_answer_does_not_hold_a_sync_forever(tmp_path: Path, trickling_platform) -> None:
    """--timeout bounded each read, not the answer (httpx has no total deadline): a
    platform or a proxy that trickles bytes held the sync forever."""
    build_run(tmp_path / "runs" / "r", "trickled", 1)
    try:
        result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--base-url", trickling_platform,
                                       "--to", "samples", "--timeout", "1", "--max-attempts", "1",
                                       "--request-lifetime", "1"],
                                capture_output=True, text=True, timeout=8, env=child_env(PRIME_API_KEY="key"))
    except subprocess.TimeoutExpired:
        pytest.fail("sync --timeout 1 against a trickling platform still ran after 8 s")
    assert result.returncode == 1, result.stderr


def test_the_traces_clients_do_not_wait_forever_for_a_trickled_answer(trickling_platform) -> None:
    """Both ways sync talks to Prime Traces: ``--to auto``'s probe (on the platform client's
    connection) and the uploader's own HTTP client."""
    import time

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.platform_api.traces import TracesUploader

    settings = Settings(base_url=trickling_platform, api_key=Secret("key"), team_id=None,
                        frontend_url="http://x")
    started = time.monotonic()
    with PlatformClient(settings, timeout=1.0) as client:
        assert client.traces_probe().enabled()  # no answer: left for the upload to decide
    assert time.monotonic() - started < 4

    uploader = TracesUploader(trickling_platform, "key", None, timeout=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(httpx.ReadTimeout):
            uploader._client.client.get(trickling_platform + "/api/v1/episodes")
    finally:
        uploader.close()
    assert time.monotonic() - started < 4


@pytest.mark.parametrize(("status", "kind"), [(307, FailureKind.FATAL), (308, FailureKind.FATAL),
                                             (302, FailureKind.FATAL), (303, FailureKind.IN_DOUBT)])
def test_a_traces_upload_a_gateway_redirects_goes_nowhere_else(status: int, kind: FailureKind) -> None:
    """The traces library follows redirects: a gateway's 307 to an upload sent the batch,
    episodes and all, to the host it named (here one that answers with a receipt), and a
    303's page was read as the receipt. Sync follows none, for Prime Traces as for the
    platform: one request, a redirect (any but a 303: not stored, the batch withdrawn; a
    303: acted on, in doubt), and nothing sent to the other host."""
    import hashlib

    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.host}")
        if request.url.host == "traces.test":
            return httpx.Response(status, headers={"Location": "http://elsewhere.test/api/v1/traces"})
        return httpx.Response(200, json={"idempotency_key": f"sha256:{hashlib.sha256(LINE).hexdigest()}"})

    refused = upload_refused(answer, base_url="http://traces.test")
    assert asked == ["POST traces.test"], asked
    assert (refused.kind, refused.status) == (kind, status), refused
    assert f"answered {status}" in str(refused) and "redirect" in str(refused), refused
