"""Where a sync sends to and with which key: environment first, then ``~/.prime/config.json``.

The names and precedence are the platform's public clients' (docs/sync.md). The API key is
held in a :class:`Secret` whose ``repr`` and ``str`` never show it, so it cannot reach a log
line or a traceback by accident.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.content.mask_text import mask_given_url
from prime_runs_spool.errors import InvalidBaseUrlError, InvalidSettingsError
from prime_runs_spool.platform_api.proxy import Proxy, proxy_for

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"


class Secret:
    """A string that does not print itself."""

    __slots__ = ("_value", "_quoted", "_base64")

    def __init__(self, value: str) -> None:
        self._value = value
        #: The value as an answer may quote it, as patterns made on the first scrub.
        self._quoted: re.Pattern[str] | None = None
        self._base64: re.Pattern[str] | None = None

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def scrub(self, text: str) -> str:
        """``text`` with the secret in it replaced by ``***``: for what a server answered,
        which an endpoint (a debugging proxy, an echo service, a misconfigured gateway) may
        have filled with the request's own ``Authorization`` header, as it is or encoded the
        way an answer quotes it: in any letter case (a header echoed lower-cased), each
        character as itself or escaped (JSON's ``\\/`` and ``\\u0070``, percent-encoding,
        HTML's named and numeric entities ``&amp;``, ``&#112;``, ``&#x70;``), or base64; and
        broken by white space anywhere (a page wrapped at a column, base64 cut into lines):
        an error line joins its words with one space, which printed such a key whole."""
        if not self._value:
            return text
        if self._quoted is None or self._base64 is None:
            self._quoted = _quoted_pattern(self._value)
            self._base64 = _broken_anywhere(sorted(_base64_forms(self._value), key=len, reverse=True))
        return self._base64.sub(MASK, self._quoted.sub(MASK, text))


#: HTML's named entities for the characters ``html.escape`` and XML escape.
_NAMED_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}
#: The characters JSON may escape with a backslash before them.
_JSON_ESCAPED = frozenset('"\\/')


def _quoted_pattern(value: str) -> re.Pattern[str]:
    """One pattern for ``value`` quoted in any of the textual encodings an answer uses, each
    character on its own (an encoder may escape only some), in any letter case (that of the
    escapes' hex digits too). The few texts that only decode to something like the key are
    scrubbed as well, which costs nothing in an error line."""
    def one(ch: str) -> str:
        code = ord(ch)
        forms = [f"&#0*{code};", f"&#x0*{code:x};", f"%{code:02x}", re.escape(f"\\u{code:04x}")]
        if ch in _NAMED_ENTITIES:
            forms.append(_NAMED_ENTITIES[ch])
        if ch in _JSON_ESCAPED:
            forms.append(re.escape("\\" + ch))
        # the character as itself last: an escape that starts with it ("&" of "&#38;") is
        # taken whole, so nothing of it is left after the "***"
        return "(?:" + "|".join([*forms, re.escape(ch)]) + ")"

    return re.compile(_BLANKS.join(one(ch) for ch in value), re.IGNORECASE)


#: What may come between two characters of the key as an answer quotes it: white space, a
#: line break included, as itself or as JSON writes it in a string (``\n``, ``\r``, ``\t``,
#: ``\u000a``, and ``\u00a0``, ``\u2028``, ``\u001f``... as ASCII-only JSON writes every
#: character ``str.split`` cuts at): an error line reads a JSON answer for its words after the
#: scrub (answers.error_words), which turns those escapes into the white space it joins.
_BLANKS = (r"(?:\s|\\[nrtf]|\\u(?i:"
           + "|".join(f"{code:04x}" for code in range(0x10000) if chr(code).isspace()) + "))*")


def _broken_anywhere(forms: list[str]) -> re.Pattern[str]:
    """One pattern for any of ``forms`` (longest first), white space allowed between any two
    of its characters; for no form (a key too short for a whole base64 group), one that
    matches nothing."""
    return re.compile("|".join(_BLANKS.join(map(re.escape, form)) for form in forms) or "(?!)")


def _base64_forms(value: str) -> set[str]:
    """``value`` in base64, as an answer may quote it. Base64 runs in groups of 3 bytes, so
    for each of the 3 places the value can start in a group, the groups made of its bytes
    only (at most 2 bytes at each end stay readable)."""
    forms: set[str] = set()
    raw = value.encode()
    for start in range(3):
        whole = raw[start:start + (len(raw) - start) // 3 * 3]
        if len(whole) >= 6:
            forms |= {base64.b64encode(whole).decode(), base64.urlsafe_b64encode(whole).decode()}
    return forms


@dataclass(frozen=True)
class Settings:
    """A destination: where samples go, as whom, and where a person can look at them."""

    base_url: str
    api_key: Secret | None
    team_id: str | None
    frontend_url: str
    #: The Prime Traces service, when it is not at ``base_url`` (PRIME_TRACES_URL, or
    #: ``traces_url`` in the config file). Production serves both on one domain, as does the
    #: local platform, so by default traces go where the evaluations go.
    traces_url: str | None = None
    #: The proxy the environment names for ``base_url`` and for ``traces_base_url`` (None:
    #: straight there; platform_api/proxy.py), found once, when the settings are made: an
    #: unusable one is refused then (:func:`load_settings`: at once, before anything is
    #: sent), and the platform's client and the Prime Traces client take it from here rather
    #: than each reading the environment again. Not shown: a proxy URL may hold a password.
    proxy: Proxy | None = field(init=False, repr=False, compare=False)
    traces_proxy: Proxy | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        proxy = proxy_for(self.base_url)
        object.__setattr__(self, "proxy", proxy)
        object.__setattr__(self, "traces_proxy", proxy if self.traces_base_url == self.base_url
                           else proxy_for(self.traces_base_url))

    @property
    def traces_base_url(self) -> str:
        return self.traces_url or self.base_url

    def viewer_url(self, evaluation_id: str) -> str:
        return f"{self.frontend_url.rstrip('/')}/dashboard/evaluations/{evaluation_id}"


#: The schemes a platform can be reached by.
BASE_URL_SCHEMES = ("http", "https")


def normalize_base_url(url: str, source: str = "the base URL") -> str:
    """Strip a trailing slash and a trailing ``/api/v1``, as the public clients do, after
    checking that ``url`` can reach a platform at all.

    Raises :class:`InvalidBaseUrlError` (naming ``source``, e.g. ``--base-url``) for a URL
    no request could ever go to: a typo must fail at once as a usage error, not be retried
    as if the network were down.
    """
    given = url.strip()
    url = given.rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    problem = _base_url_problem(url) if "://" in given else "it does not start with http:// or https://"
    if problem:
        raise InvalidBaseUrlError(f"{source} {_shown(given)!r} is not a usable URL: {problem}; "
                                  f"give one like {DEFAULT_BASE_URL}")
    return url


def _base_url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as a platform's base URL, or None."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number in range
    except ValueError as exc:  # never the value quoted: a "port" may be a password's first part
        return re.sub(r" as '.*'$", "", str(exc).lower().rstrip("."))
    if parts.scheme.lower() not in BASE_URL_SCHEMES:
        return f"the scheme must be http or https, not {parts.scheme!r}"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "port 0 cannot be connected to"
    if parts.query or parts.fragment:
        return "a base URL takes no ?query or #fragment"
    if "@" in parts.netloc:
        # httpx would send it as Basic auth in place of the API key, and the state file
        # records the base URL (its destination): a password there would reach the disk.
        return "a base URL takes no user:password@ (the API key goes in PRIME_API_KEY)"
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return "it contains white space or control characters"
    return None


def _shown(url: str) -> str:
    """``url`` as an error message may show it (``mask_given_url``)."""
    return mask_given_url(url)


def load_settings(
    *,
    base_url: str | None = None,
    team_id: str | None = None,
    env: Mapping[str, str] | None = None,
    config_path: Path | None = None,
) -> Settings:
    """Resolve settings: explicit arguments, then the environment, then the config file."""
    env = os.environ if env is None else env
    config_path = config_path or Path(env.get("HOME", str(Path.home()))) / ".prime" / "config.json"
    file_settings = _config_file(config_path)

    def pick(explicit: str | None, env_names: tuple[str, ...], file_key: str) -> str | None:
        if explicit:
            return explicit
        for name in env_names:
            if env.get(name):
                return env[name]
        value = file_settings.get(file_key)
        return value if isinstance(value, str) and value else None

    key = _header_safe_key(pick(None, ("PRIME_API_KEY",), "api_key"),
                           "PRIME_API_KEY" if env.get("PRIME_API_KEY") else f"api_key in {config_path}")
    chosen = pick(base_url, ("PRIME_API_BASE_URL", "PRIME_BASE_URL"), "base_url") or DEFAULT_BASE_URL
    return Settings(  # its proxies found as it is made: one no request can go through said now, once
        base_url=normalize_base_url(chosen, _source_of(chosen, base_url, env, config_path)),
        api_key=Secret(key) if key else None,
        team_id=_header_safe_team(pick(team_id, ("PRIME_TEAM_ID",), "team_id"),
                                  _team_source(team_id, env, config_path)),
        frontend_url=pick(None, ("PRIME_FRONTEND_URL",), "frontend_url") or DEFAULT_FRONTEND_URL,
        traces_url=_traces_url(pick(None, ("PRIME_TRACES_URL",), "traces_url")),
    )


def _config_file(path: Path) -> dict[str, object]:
    """The prime CLI's settings file, ``{}`` when there is none. One that is there but cannot
    be read as a JSON object (a trailing comma after a hand edit) is an
    :class:`InvalidSettingsError` naming the file and why, never its content (it holds the
    key): passed over, it said "no API key" of a file holding one, and with the key in the
    environment its ``base_url`` and ``team_id`` were dropped in silence."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise InvalidSettingsError(f"{path} cannot be read as settings ({why}); fix it or move it away") from None
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        why = f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}" \
            if isinstance(exc, json.JSONDecodeError) else "not JSON"
        raise InvalidSettingsError(f"{path} cannot be read as settings ({why}); fix it or move it away") from None
    if not isinstance(loaded, dict):
        raise InvalidSettingsError(f"{path} cannot be read as settings (not a JSON object); fix it or move it away")
    return loaded


def _header_safe_key(key: str | None, source: str) -> str | None:
    """``key`` without the white space around it (a key pasted with its line feed); an
    :class:`InvalidSettingsError` naming ``source``, never the key, when what is left cannot
    go in an ``Authorization`` header. Sent as it was, httpx failed on every request in a
    way sync takes for a lost answer, retried, and waited out its fences."""
    if key is None:
        return None
    key = key.strip()
    if key and not all("!" <= ch <= "~" for ch in key):
        raise InvalidSettingsError(f"the API key ({source}) holds a character an HTTP header cannot carry "
                                   "(a line break, a space, a control or non-ASCII character); nothing was sent")
    return key or None


def _header_safe_team(team: str | None, source: str) -> str | None:
    """``team`` without the white space around it; an :class:`InvalidSettingsError` naming
    ``source`` when what is left cannot go in Prime Traces' team header (a line break, a
    space): sent as it was, every upload failed as a lost answer, retried until given up."""
    if team is None:
        return None
    team = team.strip()
    if team and not all("!" <= ch <= "~" for ch in team):
        raise InvalidSettingsError(f"the team id ({source}) holds a character an HTTP header cannot carry "
                                   f"(a line break, a space, a control or non-ASCII character): {team!r}; "
                                   "nothing was sent")
    return team or None


def _team_source(explicit: str | None, env: Mapping[str, str], config_path: Path) -> str:
    return "--team" if explicit else "PRIME_TEAM_ID" if env.get("PRIME_TEAM_ID") else f"team_id in {config_path}"


def _source_of(chosen: str, explicit: str | None, env: Mapping[str, str], config_path: Path) -> str:
    """Where the base URL ``chosen`` came from, for an error message that says what to fix."""
    if explicit:
        return "--base-url"
    for name in ("PRIME_API_BASE_URL", "PRIME_BASE_URL"):
        if env.get(name) == chosen:
            return name
    return f"base_url in {config_path}"


def _traces_url(url: str | None) -> str | None:
    return normalize_base_url(url, "the Prime Traces URL (PRIME_TRACES_URL or traces_url)") if url else None
