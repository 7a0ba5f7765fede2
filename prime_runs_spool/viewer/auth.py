"""Keeping strangers out of the viewer and the platform's dashboard.

Two rules (docs/viewer.md, "Security"):

- **Loopback by default, a token otherwise.** A server asked to listen on anything but a
  loopback address refuses to start without a token (:func:`check_listen`): runs hold
  prompts, answers and configs that are nobody else's business.
- **With a token, every page and asset needs it.** :class:`TokenGate` answers any request
  outside ``/api/`` that lacks the session cookie with a login form; the token is entered
  once and the browser keeps a cookie that is ``HttpOnly`` (no script reads it) and
  ``SameSite=Strict`` (no other site's page sends it). The cookie holds an HMAC of the
  token, never the token itself. ``/api/`` keeps its own Bearer check.
- **Guessing costs time.** After :data:`FREE_LOGIN_FAILURES` wrong tokens from one client
  address, that address waits before its next try is even compared (:class:`LoginThrottle`;
  the platform's Bearer check counts in the same one: it takes the same token).
- **Without a token, only loopback names.** :class:`LoopbackHostOnly` refuses a request
  whose ``Host`` is not a loopback address or ``localhost``, the platform's ``/api/`` as
  much as any page: a web page elsewhere that points its own domain name at 127.0.0.1
  (DNS rebinding) must neither read the runs nor write rows.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import math
import time
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

from prime_runs_spool.errors import UnsafeListenError

COOKIE_NAME = "prime_runs_session"
LOGIN_PATH = "/login"
#: Requests under these prefixes are left to their own check (the API's Bearer token).
API_PREFIX = "/api/"
#: A login form body larger than this is refused.
_MAX_FORM_BYTES = 8 * 1024
#: Wrong tokens one client address may send before it has to wait: then 1 s, doubling with
#: each wrong one, up to MAX_LOGIN_WAIT. A person who mistyped waits a second; a script
#: that tried a thousand tokens waits five minutes between tries.
FREE_LOGIN_FAILURES = 5
MAX_LOGIN_WAIT = 300.0
#: Client addresses remembered at most (the oldest are forgotten first): memory stays bounded
#: whoever knocks.
_MAX_ADDRESSES = 4096


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _host_name(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            text = value.decode("latin-1").strip()
            if text.startswith("["):  # [::1]:port
                return text[1:text.find("]")] if "]" in text else text
            return text.rsplit(":", 1)[0] if text.count(":") == 1 else text
    return ""


class LoopbackHostOnly:
    """ASGI middleware for a server without a token: every path (pages, assets, the
    platform's ``/api/``) only for loopback ``Host`` names. Such a server listens only on
    loopback (:func:`check_listen`), so a foreign name can only be a rebound one."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not is_loopback(_host_name(scope)):
            await _send(send, 403, b"this server answers only to a loopback address (or give it a --token)\n",
                        [(b"content-type", b"text/plain; charset=utf-8")])
            return
        await self.app(scope, receive, send)


def check_listen(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token (raises :class:`UnsafeListenError`),
    and a token that is none: white space only (a blank ``PRIME_RUNS_VIEW_TOKEN=" "`` let
    the viewer listen on every address behind a one-space password) or holding a line
    break or another control character (no header carries it)."""
    if token and not token.strip():
        raise UnsafeListenError(host, "is white space only")
    if token and not token.isprintable():
        raise UnsafeListenError(host, "holds a line break or another control character")
    if not token and not is_loopback(host):
        raise UnsafeListenError(host)


def session_value(token: str) -> str:
    """What the cookie holds: proof of the token, from which the token cannot be read back."""
    return hmac.new(token.encode(), b"prime-runs viewer session", hashlib.sha256).hexdigest()


def _cookies(scope: dict[str, Any]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed cookie header is just no cookie
                continue
    return {key: morsel.value for key, morsel in jar.items()}


#: How many times a ``next`` is percent-decoded to look for a hidden character: more layers
#: than that is no view state this server ever made, and is refused.
_DECODINGS = 3


def _stays_here(text: str) -> bool:
    """Whether ``text`` is a path on this server however a browser reads it: ``/`` then no
    second ``/`` or ``\\``, no backslash anywhere, no control character (C0, DEL, C1).

    Browsers drop tabs and line feeds from a URL, strip leading controls and spaces, and
    read ``\\`` as ``/``: ``/<tab>/host`` and ``/\\host`` are ``//host``, another origin.
    A scheme (``javascript:``, ``https:``) never starts with ``/``.
    """
    return (text[:1] == "/" and text[1:2] not in ("/", "\\") and "\\" not in text
            and not any(ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F for char in text))


def safe_next(target: str | None) -> str:
    """Where to send a browser after it logged in: ``target`` if it is a path on this server
    (:func:`_stays_here`) as given and in each percent-decoded form, else ``/``.

    The decoded forms are checked too, so that a target decoded once more (by a proxy, or a
    later page) cannot become another origin then. As given it must be printable ASCII, as
    every URL this server sends to ``/login`` is: the ``Location`` header then carries it
    byte for byte (a line feed there would be a refused header, never an answer).
    """
    if not target or not target.isascii() or not target.isprintable() or " " in target:
        return "/"
    text = target
    for _ in range(_DECODINGS):
        if not _stays_here(text):
            return "/"
        decoded = unquote(text, errors="replace")
        if decoded == text:
            return target
        text = decoded
    return "/"


class LoginThrottle:
    """Wrong tokens per client address, and until when each address must wait.

    An address with :data:`FREE_LOGIN_FAILURES` wrong tokens waits 1 s before its next try,
    then 2 s after each wrong one more, 4 s... up to :data:`MAX_LOGIN_WAIT`; a right token
    forgets it. While it
    waits, its tries are not compared at all, so a guesser learns nothing from them.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}  # address: (wrong tokens, wait until)

    def wait(self, address: str) -> float:
        """Seconds ``address`` must still wait before a try is compared (0: none)."""
        entry = self._failures.get(throttled_as(address))
        return max(0.0, entry[1] - self._clock()) if entry else 0.0

    def failed(self, address: str) -> None:
        address = throttled_as(address)
        count = self._failures.pop(address, (0, 0.0))[0] + 1
        over = count - FREE_LOGIN_FAILURES  # 0 at the last free one: its next try waits 1 s
        delay = min(MAX_LOGIN_WAIT, 2.0 ** min(over, 30)) if over >= 0 else 0.0
        self._failures[address] = (count, self._clock() + delay)  # re-inserted: the newest
        while len(self._failures) > _MAX_ADDRESSES:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, address: str) -> None:
        self._failures.pop(throttled_as(address), None)


def throttled_as(address: str) -> str:
    """The client a throttle entry is for: an IPv6 address's /64, the network one host is
    given (2**64 addresses: per address, a guesser would never wait, and would push every
    other entry out of the table); an IPv4 address seen as ``::ffff:a.b.c.d`` as itself."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


async def held_back(throttle: LoginThrottle, address: str, send: Any) -> bool:
    """Answer 429 with ``Retry-After`` if ``address`` must still wait (True): the try is
    then not compared at all."""
    wait = throttle.wait(address)
    if wait <= 0:
        return False
    seconds = math.ceil(wait)
    await _send(send, 429, f"too many wrong tokens from this address: try again in {seconds} s\n".encode(),
                [(b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", str(seconds).encode())])
    return True


def client_address(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


class TokenGate:
    """ASGI middleware: every HTTP request outside ``/api/`` needs the session cookie."""

    def __init__(self, app: Any, token: str, throttle: LoginThrottle | None = None) -> None:
        self.app = app
        self.token = token
        self.session = session_value(token)
        #: Shared with the platform's Bearer check, which takes the same token.
        self.throttle = throttle or LoginThrottle()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        if scope["path"] == LOGIN_PATH:
            await self._login(scope, receive, send)
            return
        given = _cookies(scope).get(COOKIE_NAME, "")
        if hmac.compare_digest(given.encode(), self.session.encode()):
            await self.app(scope, receive, send)
            return
        if scope["method"] in ("GET", "HEAD"):
            path = scope.get("raw_path") or scope["path"].encode()  # as sent: percent-encoded, ASCII
            query = scope.get("query_string") or b""
            target = (path + (b"?" + query if query else b"")).decode("latin-1")
            await _send(send, 303, b"", [(b"location", f"{LOGIN_PATH}?{urlencode({'next': target})}".encode())])
        else:
            await _send(send, 401, b"a token is required\n", [(b"content-type", b"text/plain; charset=utf-8")])

    async def _login(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        target = safe_next((query.get("next") or ["/"])[0])
        if scope["method"] != "POST":
            await _send(send, 200, _login_page(target, failed=False), _HTML)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > _MAX_FORM_BYTES:
                await _send(send, 413, b"form too large\n", [(b"content-type", b"text/plain")])
                return
            if not message.get("more_body"):
                break
        address = client_address(scope)
        if await held_back(self.throttle, address, send):
            return
        form = parse_qs(body.decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0]
        target = safe_next((form.get("next") or [target])[0])
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            self.throttle.failed(address)
            await _send(send, 401, _login_page(target, failed=True), _HTML)
            return
        self.throttle.succeeded(address)
        cookie = f"{COOKIE_NAME}={self.session}; Path=/; HttpOnly; SameSite=Strict"
        await _send(send, 303, b"", [(b"location", target.encode()), (b"set-cookie", cookie.encode())])


_HTML = [(b"content-type", b"text/html; charset=utf-8")]


def _login_page(target: str, *, failed: bool) -> bytes:
    note = "<p>That token is not right.</p>" if failed else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Token required</title></head>"
        "<body><h1>Token required</h1><p>This viewer was started with a token. Enter it once; "
        "the browser keeps a session cookie.</p>" + note +
        f"<form method='post' action='{LOGIN_PATH}'><input type='hidden' name='next' value='{html.escape(target, quote=True)}'>"
        "<label>token <input type='password' name='token' autofocus></label> <button type='submit'>enter</button>"
        "</form></body></html>"
    ).encode()


async def _send(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store"),
               (b"x-content-type-options", b"nosniff")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
