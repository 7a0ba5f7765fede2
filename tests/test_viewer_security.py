"""Who gets into the viewer and the platform's dashboard (docs/viewer.md, "Security").

Real processes (``prime-runs view``, ``prime-runs platform serve``) on loopback ports,
spoken to over HTTP; one test logs in with a real browser to see the cookie stay
out of the page's reach.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.errors import UnsafeListenError
from prime_runs_spool.viewer.auth import COOKIE_NAME, check_listen
from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.local_platform.server import EmbeddedPlatform

from support import platform_process
from support.browser import launched
from support.env import CLI, REPO_ROOT, child_env
from support.leaky import LEAKED, write_leaky_spool

FIXTURES = REPO_ROOT / "fixtures" / "outputs"
TOKEN = "view-s3cret"
#: Every kind of page and asset the viewer serves, and a path that matches none.
VIEWER_PATHS = ["/", "/?fragment=1", "/run?run=gsm8k-completed", "/run?run=gsm8k-completed&fragment=1",
                "/episode?run=gsm8k-completed&n=1", "/group?run=gsm8k-completed&example=0",
                "/compare?a=gsm8k-completed&b=gsm8k-failed", "/pair?a=gsm8k-completed&b=gsm8k-failed&example=0",
                "/plots?run=gsm8k-completed", "/across?metric=turns", "/static/viewer.css", "/static/viewer.js",
                "/nope"]


def _start_view(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(CLI + ["view", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    return proc, platform_process.first_line(proc)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    assert proc.wait(15) == 0, proc.stderr.read()


@pytest.fixture(scope="module")
def gated_view():
    proc, url = _start_view(str(FIXTURES), "--token", TOKEN)
    yield url.rstrip("/")
    _stop(proc)


@pytest.mark.parametrize(("command", "host"), [
    (["view", str(FIXTURES)], "0.0.0.0"), (["platform", "serve", "--db", "{db}"], "::"),
])
@pytest.mark.slow
def test_a_non_loopback_host_without_a_token_is_refused(command, host, tmp_path):
    argv = [part.replace("{db}", str(tmp_path / "p.db")) for part in command]
    done = subprocess.run(CLI + argv + ["--host", host, "--port", "0"], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to listen on" in lines[0] and "--token" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "p.db").exists()  # refused before anything was opened or bound


@pytest.mark.parametrize(("command", "variable"), [
    (["view", str(FIXTURES)], "PRIME_RUNS_VIEW_TOKEN"),
    (["platform", "serve", "--db", "{db}"], "PRIME_RUNS_PLATFORM_TOKEN"),
])
@pytest.mark.parametrize(("token", "problem"), [
    (" ", "is white space only"), ("s3cret\nX-Injected: yes", "holds a line break or another control character"),
])
def test_a_token_of_white_space_or_with_a_line_break_is_refused(command, variable, token, problem, tmp_path):
    """A blank token from the environment (``VAR=" "``) let the server listen on every address
    behind a password of one space; one with a line break could never be sent in a header."""
    argv = [part.replace("{db}", str(tmp_path / "p.db")) for part in command]
    done = subprocess.run(CLI + argv + ["--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True,
                          env=child_env(**{variable: token}), timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (f"prime-runs: {'view: ' if command[0] == 'view' else ''}refusing the token: it {problem}, "
                           "which no login form or Authorization header carries as typed; give another with --token "
                           "TOKEN (or its environment variable)\n")
    assert not (tmp_path / "p.db").exists()


def test_which_hosts_need_a_token():
    for host in ("0.0.0.0", "::", "192.0.2.1", "10.0.0.1", "viewer.example", "[::]"):
        with pytest.raises(UnsafeListenError, match="refusing to listen on"):
            check_listen(host, None)
        check_listen(host, "a-token")  # any host, with a token
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        check_listen(host, None)


@pytest.mark.slow
def test_loopback_is_the_default_needs_no_token_and_answers_only_to_loopback_names():
    """Without a token: a page elsewhere that points its own name at 127.0.0.1 (DNS
    rebinding) reads nothing."""
    proc, url = _start_view(str(FIXTURES))
    try:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url).status_code == 200
        for host in ("evil.example", "evil.example:80", "192.168.1.5"):
            r = httpx.get(url, headers={"Host": host})
            assert r.status_code == 403 and "Janet" not in r.text, host
        port = url.rstrip("/").rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert httpx.get(url, headers={"Host": host}).status_code == 200, host
    finally:
        _stop(proc)


@pytest.mark.slow
def test_with_a_token_every_page_and_asset_needs_it(gated_view):
    for path in VIEWER_PATHS:
        r = httpx.get(gated_view + path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/login?next="), path
        assert "Janet" not in r.text and "body{" not in r.text
        assert httpx.post(gated_view + path, data={"x": "1"}).status_code == 401, path
        forged = httpx.get(gated_view + path, cookies={COOKIE_NAME: TOKEN})  # the token itself is not a session
        assert forged.status_code == 303, path


@pytest.mark.slow
def test_the_token_is_entered_once_and_kept_in_an_httponly_samesite_cookie(gated_view):
    wrong = httpx.post(gated_view + "/login", data={"token": "nope", "next": "/"})
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    r = httpx.post(gated_view + "/login", data={"token": TOKEN, "next": "/run?run=gsm8k-completed"})
    assert r.status_code == 303 and r.headers["location"] == "/run?run=gsm8k-completed"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    with httpx.Client(base_url=gated_view, cookies=r.cookies) as session:
        for path in VIEWER_PATHS:
            assert session.get(path).status_code == (404 if path == "/nope" else 200), path
    # a login only ever sends the browser back to this server
    for evil in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        r = httpx.post(gated_view + "/login", data={"token": TOKEN, "next": evil})
        assert r.headers["location"] == "/"


@pytest.mark.slow
def test_a_browser_logs_in_once_and_no_script_can_read_the_cookie(gated_view):
    with launched() as browser:
        page = browser.new_page()
        page.goto(gated_view + "/run?run=gsm8k-completed")
        assert page.url.startswith(gated_view + "/login")
        page.fill('input[name="token"]', TOKEN)
        page.click('button[type="submit"]')
        page.wait_for_url(gated_view + "/run?run=gsm8k-completed")
        assert page.locator("#match-count .total").inner_text() == "6"
        assert page.evaluate("document.cookie") == ""  # HttpOnly: not visible to scripts
        page.goto(gated_view + "/episode?run=gsm8k-completed&n=2")  # no second prompt
        assert page.url.endswith("/episode?run=gsm8k-completed&n=2")


@pytest.mark.slow
def test_the_dashboard_is_behind_the_token_and_the_api_keeps_its_bearer_check(tmp_path):
    with platform_process.running(tmp_path / "p.db", "--token", TOKEN) as platform:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        env = httpx.post(f"{platform.api}/environmentshub/resolve", json={"name": "gsm8k"}, headers=bearer)
        evaluation = httpx.post(f"{platform.api}/evaluations/", headers=bearer, json={
            "name": "secret-eval", "environments": [{"id": env.json()["data"]["id"]}],
            "metadata": {"config_source": {"format": "toml", "text": "model = 'private'", "filename": "e.toml"}}}).json()
        base = platform.base_url
        pages = [evaluation["viewer_url"].replace(base, ""), "/", "/dashboard/", "/dashboard/static/viewer.css",
                 f"/dashboard/run?run={evaluation['evaluation_id']}"]
        for path in pages:
            r = httpx.get(base + path)
            assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
            assert "private" not in r.text and "secret-eval" not in r.text
        login = httpx.post(base + "/login", data={"token": TOKEN, "next": "/dashboard/"})
        assert login.status_code == 303
        with httpx.Client(base_url=base, cookies=login.cookies, follow_redirects=True) as session:
            page = session.get(evaluation["viewer_url"].replace(base, ""))
            assert page.status_code == 200 and "secret-eval" in page.text
            # the session cookie opens pages, never the API: that stays Bearer-only
            assert session.get("/api/v1/evaluations/").status_code == 401
        assert httpx.get(f"{platform.api}/evaluations/").status_code == 401
        assert httpx.get(f"{platform.api}/evaluations/", headers=bearer).status_code == 200


@pytest.mark.slow
def test_without_a_token_the_dashboard_answers_only_to_loopback_names(tmp_path):
    with platform_process.running(tmp_path / "p.db") as platform:
        assert httpx.get(platform.base_url + "/dashboard/", headers={"Host": "evil.example"}).status_code == 403
        assert httpx.get(platform.base_url + "/dashboard/").status_code == 200
        assert httpx.get(platform.api + "/evaluations/").status_code == 200


def _platform_with_rows(api: str, headers: dict[str, str] | None = None) -> str:
    """An evaluation holding three rows with a prompt in each, on the platform at ``api``."""
    env = httpx.post(f"{api}/environmentshub/resolve", json={"name": "gsm8k"}, headers=headers).json()["data"]["id"]
    evaluation = httpx.post(f"{api}/evaluations/", json={"name": "private-eval", "environments": [{"id": env}]},
                            headers=headers).json()["evaluation_id"]
    rows = [{"example_id": n, "prompt": f"private prompt {n}"} for n in range(3)]
    assert httpx.post(f"{api}/evaluations/{evaluation}/samples", json={"samples": rows},
                      headers=headers).status_code == 200
    return evaluation


@pytest.mark.slow
def test_without_a_token_the_api_answers_only_to_loopback_names(tmp_path):
    """DNS rebinding: a page on rebind.attacker.example, its name pointed at 127.0.0.1, is
    same-origin with itself and reaches the platform's port. Without a token, ``/api/`` must
    answer it nothing: neither the rows nor a write."""
    with platform_process.running(tmp_path / "p.db") as platform:
        evaluation = _platform_with_rows(platform.api)
        rebound = {"Host": "rebind.attacker.example"}
        port = platform.base_url.rsplit(":", 1)[1]
        for path in ("/evaluations/", f"/evaluations/{evaluation}", f"/evaluations/{evaluation}/samples"):
            r = httpx.get(platform.api + path, headers=rebound)
            assert r.status_code == 403 and "private" not in r.text, path
            r = httpx.get(platform.api + path, headers={"Host": f"rebind.attacker.example:{port}"})
            assert r.status_code == 403, path
        copied = '{"samples": [{"example_id": 0, "prompt": "private prompt 0"}]}'
        r = httpx.post(f"{platform.api}/evaluations/{evaluation}/samples", content=copied,
                       headers={**rebound, "Content-Type": "application/json"})
        assert r.status_code == 403
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert httpx.get(f"{platform.api}/evaluations/{evaluation}", headers={"Host": host}).status_code == 200
        total = httpx.get(f"{platform.api}/evaluations/{evaluation}/samples").json()["total"]
        assert total == 3


@pytest.mark.slow
@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8", None,
                                          "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          "application/jsonx", "text/json"])
def test_a_body_not_sent_as_json_is_refused_and_stores_nothing(tmp_path, content_type):
    """A page on another origin may send, without asking first (a CORS "simple request"),
    a POST typed ``text/plain``, a form, or an untyped ``Blob``, to 127.0.0.1 itself: its
    ``Host`` is loopback. Only ``application/json`` needs the preflight this server never
    grants, so a JSON endpoint reads nothing else (415)."""
    with platform_process.running(tmp_path / "p.db") as platform:
        evaluation = _platform_with_rows(platform.api)
        copied = b'{"samples": [{"example_id": 0, "prompt": "private prompt 0"}]}'
        headers = {"Content-Type": content_type} if content_type else {}
        for path in (f"/evaluations/{evaluation}/samples", "/evaluations/", f"/evaluations/{evaluation}/finalize"):
            r = httpx.post(platform.api + path, content=copied, headers=headers)
            assert r.status_code == 415 and "application/json" in r.json()["detail"], (path, r.text)
        r = httpx.put(f"{platform.api}/evaluations/{evaluation}", content=b'{"metadata": {"x": 1}}', headers=headers)
        assert r.status_code == 415
        document = httpx.get(f"{platform.api}/evaluations/{evaluation}").json()
        assert document["total_samples"] == 3 and document["status"] != "COMPLETED"
        assert httpx.get(f"{platform.api}/evaluations/").json()["total"] == 1
        # The same row typed application/json (any case, with parameters) is stored.
        r = httpx.post(f"{platform.api}/evaluations/{evaluation}/samples", content=copied,
                       headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert r.status_code == 200


@pytest.mark.slow
def test_the_real_clients_still_write_to_a_platform_without_a_token(tmp_path):
    """prime-runs 0.1.4's own HTTP client (what verifiers ships with) and this package's sync
    both type their bodies ``application/json``: a whole run through each is stored."""
    from prime_runs._http import PlatformClient as PrimeRunsClient
    from prime_runs._http import encode_json

    with platform_process.running(tmp_path / "p.db") as platform:
        client = PrimeRunsClient(api_key="unused", base_url=platform.base_url)
        try:
            env = client.post("/environmentshub/resolve", json_body={"name": "gsm8k"})["data"]["id"]
            evaluation = client.post("/evaluations/", json_body={"name": "by-prime-runs",
                                                                 "environments": [{"id": env}]})["evaluation_id"]
            client.post(f"/evaluations/{evaluation}/samples", content=encode_json({"samples": [{"example_id": 0}]}))
            client.put(f"/evaluations/{evaluation}", json_body={"metadata": {"k": "v"}})
            client.post(f"/evaluations/{evaluation}/finalize", json_body={"metrics": {}})
        finally:
            client.close()
        document = httpx.get(f"{platform.api}/evaluations/{evaluation}").json()
        assert document["total_samples"] == 1 and document["status"] == "COMPLETED"
        run = tmp_path / "gsm8k-completed"
        shutil.copytree(FIXTURES / "gsm8k-completed", run)
        done = subprocess.run(CLI + ["sync", str(run), "--base-url", platform.base_url, "--to", "samples"],
                              capture_output=True, text=True, env=child_env(PRIME_API_KEY="unused"), timeout=120)
        assert done.returncode == 0, done.stderr
        pushed = [e for e in httpx.get(f"{platform.api}/evaluations/").json()["evaluations"]
                  if e["evaluation_id"] != evaluation]
        assert len(pushed) == 1 and pushed[0]["total_samples"] == 6 and pushed[0]["status"] == "COMPLETED"


def test_wrong_tokens_make_the_next_try_wait_doubling_up_to_a_cap():
    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES, MAX_LOGIN_WAIT, LoginThrottle

    now = [1000.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    for _ in range(FREE_LOGIN_FAILURES - 1):
        throttle.failed("10.0.0.1")
        assert throttle.wait("10.0.0.1") == 0.0
    waits = []
    for _ in range(12):
        throttle.failed("10.0.0.1")
        waits.append(throttle.wait("10.0.0.1"))
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0] and waits[-1] == MAX_LOGIN_WAIT
    assert throttle.wait("10.0.0.2") == 0.0  # another address is not held back
    now[0] += MAX_LOGIN_WAIT
    assert throttle.wait("10.0.0.1") == 0.0
    throttle.succeeded("10.0.0.1")
    throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == 0.0  # a right token forgot the wrong ones
    for n in range(10_000):  # memory stays bounded whoever knocks
        throttle.failed(f"addr-{n}")
    assert len(throttle._failures) <= 4096


@pytest.mark.slow
def test_a_guesser_is_held_back_and_its_tries_are_not_even_compared():
    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES

    proc, url = _start_view(str(FIXTURES), "--token", TOKEN)
    base = url.rstrip("/")
    try:
        for n in range(FREE_LOGIN_FAILURES):
            r = httpx.post(base + "/login", data={"token": f"guess-{n}", "next": "/"})
            assert r.status_code == 401, n
        held = httpx.post(base + "/login", data={"token": TOKEN, "next": "/"})  # right, but too soon
        assert held.status_code == 429 and held.headers["retry-after"] == "1"
        assert "set-cookie" not in held.headers and "try again in 1 s" in held.text
        time.sleep(1.1)
        r = httpx.post(base + "/login", data={"token": TOKEN, "next": "/"})
        assert r.status_code == 303 and COOKIE_NAME in r.headers["set-cookie"]
        assert httpx.post(base + "/login", data={"token": "wrong", "next": "/"}).status_code == 401
    finally:
        _stop(proc)


@pytest.mark.slow
def test_a_guesser_cannot_pick_its_address_with_a_forwarded_for_header():
    """uvicorn believes ``X-Forwarded-For`` from 127.0.0.1 unless told not to: every client
    on this machine, and every one behind an SSH tunnel or a local proxy, could name a new
    address for each guess and never be held back."""
    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES

    proc, url = _start_view(str(FIXTURES), "--token", TOKEN)
    base = url.rstrip("/")
    try:
        codes = [httpx.post(base + "/login", data={"token": f"guess-{n}", "next": "/"},
                            headers={"X-Forwarded-For": f"203.0.113.{n}"}).status_code
                 for n in range(FREE_LOGIN_FAILURES + 3)]
        # held back once the free failures are spent, whatever address each try names; not
        # every later try: on a loaded machine one may come after its wait and be answered
        assert codes[:FREE_LOGIN_FAILURES] == [401] * FREE_LOGIN_FAILURES, codes
        assert 429 in codes[FREE_LOGIN_FAILURES:], codes
    finally:
        _stop(proc)


def test_the_throttle_holds_an_ipv6_network_not_each_of_its_addresses():
    """A client with IPv6 has a /64 (2**64 addresses) to pick from: throttled per address it
    would never wait, and it would push every other address out of the table. So an IPv6
    client is held back by its /64, and an IPv4 client seen as ``::ffff:a.b.c.d`` by its IPv4
    address."""
    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES, LoginThrottle

    throttle = LoginThrottle(clock=lambda: 1000.0)
    for n in range(FREE_LOGIN_FAILURES):
        throttle.failed(f"2001:db8:1:2::{n + 1:x}")
    assert throttle.wait("2001:db8:1:2:ffff:ffff:ffff:ffff") > 0
    assert throttle.wait("2001:db8:1:3::1") == 0.0  # another network is not held back
    for n in range(FREE_LOGIN_FAILURES):
        throttle.failed("::ffff:198.51.100.7")
    assert throttle.wait("198.51.100.7") > 0
    throttle.succeeded("2001:db8:1:2::abcd")
    assert throttle.wait("2001:db8:1:2::1") == 0.0


def test_after_the_free_wrong_tokens_the_very_next_try_waits():
    """docs/viewer.md: "After 5 wrong tokens from one client address, that address must wait
    1 s before its next try": the sixth try, not the seventh."""
    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES, LoginThrottle

    throttle = LoginThrottle(clock=lambda: 1000.0)
    for n in range(FREE_LOGIN_FAILURES):
        assert throttle.wait("10.0.0.9") == 0.0, n
        throttle.failed("10.0.0.9")
    assert throttle.wait("10.0.0.9") == 1.0


@pytest.mark.slow
def test_the_api_bearer_check_is_throttled_with_the_login(tmp_path):
    """The platform's ``/api/`` takes the same token as ``/login``: unthrottled, a guesser
    skipped the login's waits by guessing Bearer keys there, as fast as the server answers.
    Wrong keys count with wrong logins; while the address waits, a key is not compared
    (429 with Retry-After, which the sync client waits out); a client with the right key
    from another address is not held back."""
    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES

    with platform_process.running(tmp_path / "p.db", "--token", TOKEN) as platform:
        url = f"{platform.api}/evaluations/"
        # Each try from an address of its own: on a loaded machine the 1 s wait may be over
        # before the next request is answered, and then that try proves nothing.
        for address in ("127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"):
            with httpx.Client(transport=httpx.HTTPTransport(local_address=address)) as guesser:
                for n in range(FREE_LOGIN_FAILURES):
                    assert guesser.get(url, headers={"Authorization": f"Bearer guess-{n}"}).status_code == 401, n
                last_wrong = time.monotonic()
                held = guesser.get(url, headers={"Authorization": f"Bearer {TOKEN}"})  # right, but too soon
                login = guesser.post(platform.base_url + "/login", data={"token": TOKEN})  # one count
                with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as elsewhere:
                    assert elsewhere.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
                if time.monotonic() - last_wrong > 0.9:
                    continue
                assert held.status_code == 429 and held.headers["retry-after"] == "1", held.text
                assert login.status_code == 429
                time.sleep(1.1)
                assert guesser.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
                assert guesser.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401  # forgotten
                break
        else:
            pytest.fail("every try took longer than the 1 s wait it tests: the machine is too loaded")


@pytest.mark.slow
def test_many_wrong_logins_in_flight_at_once_get_no_more_tries_than_one_at_a_time():
    """Forty wrong tokens sent at once, on forty connections: each is checked and counted with
    no await between (viewer/auth.py), so exactly the free ones are compared."""
    import asyncio

    from prime_runs_spool.viewer.auth import FREE_LOGIN_FAILURES

    proc, url = _start_view(str(FIXTURES), "--token", TOKEN)
    base = url.rstrip("/")

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            answers = await asyncio.gather(*(client.post(base + "/login", data={"token": f"guess-{n}", "next": "/"})
                                             for n in range(40)))
        return [a.status_code for a in answers]

    try:
        codes = asyncio.run(burst())
    finally:
        _stop(proc)
    assert sorted(codes) == [401] * FREE_LOGIN_FAILURES + [429] * (40 - FREE_LOGIN_FAILURES), codes


@pytest.mark.slow
def test_a_form_posted_by_a_page_elsewhere_uploads_no_traces(tmp_path):
    """The Prime Traces upload is multipart, a type any page may post without asking; but it
    needs an ``Idempotency-Key`` header, which no page sends without a CORS preflight this
    server never grants. A form post without one stores nothing; the real client's upload is."""
    from prime_traces import LineFormat, TracesClient

    from fixtures.episodes import make_episode
    from prime_runs_spool.platform_api.traces import encode_line, stamp_run

    line = encode_line(stamp_run(make_episode(0), "run-x"))
    with platform_process.running(tmp_path / "p.db", "--traces") as platform:
        form = {"metadata": ("metadata.json", b"{}", "application/json"),
                "traces": ("traces.jsonl", line, "application/x-ndjson")}
        r = httpx.post(f"{platform.api}/traces", files=form)
        assert r.status_code == 400 and "Idempotency-Key" in r.text, r.text
        assert httpx.get(f"{platform.api}/traces").json()["items"] == []
        with TracesClient(api_key="unused", base_url=platform.base_url) as client:
            [receipt] = client.upload_lines([line], line_format=LineFormat.EPISODE, context={})
        assert receipt.status == "committed"
        assert len(httpx.get(f"{platform.api}/traces").json()["items"]) == 1


def foreign_spool(run_dir: Path, run_id: str) -> None:
    """A spool from a foreign producer that records today's masking_version but missed
    the trace-config locations (docs/masking.md: 'a spool from an older or foreign
    producer that missed a location still never puts a credential on the screen')."""
    write_leaky_spool(run_dir, run_id, {"run_id": run_id, "name": "foreign", "environments": ["gsm8k"], "model": "m",
                                        "framework": "verifiers", "config": {"model": "m"},
                                        "masking_version": MASKING_VERSION}, range(2))


@pytest.mark.slow
@pytest.mark.parametrize("to", ["traces", "samples"])
def test_a_dashboard_episode_page_masks_what_the_producer_missed(tmp_path: Path, to: str) -> None:
    foreign_spool(tmp_path / "runs" / "foreign", "foreign")
    db = tmp_path / "p.db"
    result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--to", to,
                                   "--json"], capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    # the same spool viewed locally (prime-runs view) is masked on display: the dashboard must be too
    with EmbeddedPlatform(db, traces=True) as platform, httpx.Client(follow_redirects=True) as browser:
        page = browser.get(platform.base_url + "/dashboard/episode", params={"run": report["evaluation_id"], "n": 1})
        assert page.status_code == 200
        shown = [name for name, secret in LEAKED.items() if secret in page.text]
        assert not shown, f"the dashboard's episode page shows credentials in clear at: {shown}"


@pytest.mark.slow
def test_the_dashboard_leaves_out_a_producers_launch_file_that_sets_a_credential(tmp_path: Path) -> None:
    """prime-runs' own client sends ``metadata.config_source`` as written: the dashboard shows
    it only when the check sync applies to its own would let it travel."""
    secret = "ls_PRODUCER_LAUNCH_FILE_SECRET_8080"
    launch_files = {"leaky": f'model = "m"\n[client.headers]\nAuthorization = "Bearer {secret}"\n',
                    "clean": 'model = "m"\nnum_examples = 7\n'}
    with platform_process.running(tmp_path / "p.db") as server, \
            httpx.Client(base_url=server.api) as api, httpx.Client(follow_redirects=True) as browser:
        environment = api.post("/environmentshub/resolve", json={"name": "gsm8k"}).json()["data"]["id"]
        pages = {}
        for name, text in launch_files.items():
            created = api.post("/evaluations/", json={
                "name": f"sdk-{name}", "environments": [{"id": environment}], "model_name": "m",
                "metadata": {"model": "m", "config_source": {"format": "toml", "filename": "eval.toml", "text": text}}})
            assert created.status_code == 201, created.text
            page = browser.get(f"{server.base_url}/dashboard/evaluations/{created.json()['evaluation_id']}")
            assert page.status_code == 200
            pages[name] = page.text
    assert secret not in pages["leaky"]
    assert "num_examples = 7" in pages["clean"]  # a launch file that may travel is still shown


@pytest.mark.slow
def test_the_platform_takes_its_token_from_the_environment_out_of_every_users_sight(tmp_path: Path) -> None:
    """The platform's token is its clients' API key: on the command line every user of the
    machine reads it (``ps``, ``/proc/PID/cmdline``); ``PRIME_RUNS_PLATFORM_TOKEN`` keeps it out."""
    secret = "platform-token-kept-out-of-ps-5150"
    proc = subprocess.Popen(CLI + ["platform", "serve", "--db", str(tmp_path / "p.db"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_RUNS_PLATFORM_TOKEN=secret))
    try:
        base = platform_process.first_line(proc)
        assert secret.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert httpx.get(f"{base}/api/v1/evaluations/").status_code == 401
        allowed = httpx.get(f"{base}/api/v1/evaluations/", headers={"Authorization": f"Bearer {secret}"})
        assert allowed.status_code == 200, allowed.text
    finally:
        _stop(proc)
