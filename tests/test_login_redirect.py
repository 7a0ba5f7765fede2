"""Where a login sends the browser (docs/viewer.md, "Security"): back to a page of this
server, never to another origin, whatever ``next`` says.

A real ``prime-runs view --token`` over HTTP; Hypothesis over ``next`` values, judged the
way a browser resolves a ``Location`` (below); and Debian's chromium logging in through a
link an attacker built.
"""

from __future__ import annotations

import re
import subprocess
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import platform_process
from support.browser import launched
from support.env import CLI, REPO_ROOT, child_env

FIXTURES = REPO_ROOT / "fixtures" / "outputs"
TOKEN = "redirect-s3cret"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def browser_leaves_origin(location: str) -> bool:
    """Whether a browser on ``http://this-server/`` that follows ``location`` lands on another
    origin: the URL standard's parser strips leading and trailing C0 controls and spaces,
    removes every tab, LF and CR, and for http reads ``\\`` as ``/``; then a scheme or a
    leading ``//`` names another origin."""
    text = location.strip("".join(map(chr, range(0x21))))
    text = re.sub("[\t\n\r]", "", text).replace("\\", "/")
    return bool(_SCHEME.match(text)) or text.startswith("//")


def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(CLI + ["view", str(FIXTURES), "--token", TOKEN, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    return proc, platform_process.first_line(proc).rstrip("/")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    assert proc.wait(15) == 0
    return proc.stderr.read()


@pytest.fixture(scope="module")
def view():
    proc, url = _start()
    yield url
    stderr = _stop(proc)
    assert "Traceback" not in stderr, stderr  # no next value made the server fail


_CLIENT = httpx.Client(timeout=30)  # one keep-alive connection for the many logins below


def _login(view: str, target: str) -> httpx.Response:
    return _CLIENT.post(view + "/login", data={"token": TOKEN, "next": target})


# A browser reads all of these as another origin, or they hide a character it drops.
HOSTILE = ["/\t/other.example", "/%09/other.example", "/\n/other.example", "/\r/other.example",
           "/%0a/other.example", "/%250a/other.example", "//other.example", "/\\other.example",
           "/%5Cother.example", "/%2F/other.example", "/%252F%252Fother.example", "\x00//other.example",
           " //other.example", "https://other.example/", "javascript:alert(1)", "/\x7f/other.example",
           "/\x1b/other.example", "\t/other.example", "/\u0085/other.example"]


@pytest.mark.parametrize("target", HOSTILE)
def test_a_login_never_sends_the_browser_elsewhere(view, target):
    r = _login(view, target)
    assert r.status_code == 303 and r.headers["location"] == "/", (target, r.headers)
    page = httpx.get(view + "/login", params={"next": target})  # the form keeps only a safe one
    assert page.status_code == 200 and 'name="next" value="/"' in page.text.replace("'", '"'), target


def test_a_line_feed_in_next_is_answered_not_a_dropped_connection(view):
    """A ``Location`` holding a line feed is a header the HTTP library refuses: the connection
    used to drop, with a traceback in the log (the module's fixture checks the log)."""
    for target in ("/run\n", "/run?x=1\r\nSet-Cookie: a=b", "/\n/other.example"):
        r = _login(view, target)
        assert r.status_code == 303 and r.headers["location"] == "/" and "a=b" not in r.headers["set-cookie"]


def test_a_page_of_this_server_is_where_the_login_returns(view):
    for target in ("/", "/run?run=gsm8k-completed", "/episode?run=gsm8k-completed&n=2",
                   "/run?run=gsm8k-completed&q=caf%C3%A9%20au%20lait&sort=-reward", "/compare?a=x&b=y#top"):
        r = _login(view, target)
        assert r.status_code == 303 and r.headers["location"] == target


def test_the_login_remembers_the_page_asked_for_as_it_was_sent(view):
    r = httpx.get(view + "/run?run=gsm8k-completed&q=a%20b", follow_redirects=False)
    assert r.status_code == 303
    login = httpx.get(view + r.headers["location"])
    assert 'value="/run?run=gsm8k-completed&amp;q=a%20b"' in login.text.replace("'", '"')


_PIECES = st.sampled_from(["/", "//", "\\", "\t", "\n", "\r", " ", "%", "%09", "%0a", "%2f", "%2F", "%5c",
                           "%25", "%2509", "http:", "https:", "javascript:", "other.example", "@", ":", "?",
                           "#", "&", "=", "run", "\x00", "\x7f", "\x1f", "\u0085", "\u2215", "é", "."])


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.lists(st.one_of(_PIECES, st.text(max_size=3)), max_size=8).map("".join))
def test_whatever_next_holds_the_location_is_this_origin(view, target):
    r = _login(view, target)
    assert r.status_code == 303
    location = r.headers["location"]
    assert not browser_leaves_origin(location), (target, location)
    assert location in (target, "/")  # kept as it was, or the runs page


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.text(alphabet="abcxyz019-_.~=&?", min_size=1, max_size=6), min_size=1, max_size=4))
def test_every_plain_path_of_this_server_is_kept(view, path):
    target = "/" + "/".join(quote(part, safe="=&?") for part in path)
    assert _login(view, target).headers["location"] == target


@pytest.mark.slow
def test_chromium_logging_in_through_a_hostile_link_stays_on_this_origin(view):
    """An attacker's link to the login page, ``next`` holding a tab: the browser drops the
    tab from the ``Location`` and ``/<tab>/localhost:PORT/`` becomes ``//localhost:PORT/``,
    another origin than ``127.0.0.1:PORT``. After the login the browser must still be here."""
    port = view.rsplit(":", 1)[1]
    other = f"/\t/localhost:{port}/compare"
    with launched() as browser:
        page = browser.new_page()
        page.goto(view + "/login?next=" + quote(other, safe=""))
        page.fill('input[name="token"]', TOKEN)
        page.click('button[type="submit"]')
        page.wait_for_load_state()
        assert page.url.startswith(view + "/"), page.url
        assert "localhost" not in page.url
