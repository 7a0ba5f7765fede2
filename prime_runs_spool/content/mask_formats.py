"""Credentials written inside a string in another format: JSON or a dict, a YAML or header
line, an HTTP authorization value, a PEM block, a ``.netrc`` entry, a connection string.

``mask_text`` (content/mask_text.py) reads a string as a command line: flags, assignments,
URLs. But a config's strings also hold text written in other formats, each with its own way
of naming a secret, that the command-line rules cannot see: a JSON object given as a string
(``'{"api_key": "..."}'``, a TOML table or a Python dict printed into it), a ``Name: value``
line (``Authorization: Bearer ...``, ``api_key: ...`` in YAML, with a block below it), an ``Authorization`` value
given alone (``Bearer ...``, ``Basic dXNlcjpwYXNz``), a private key pasted whole
(``-----BEGIN ... PRIVATE KEY-----``), a ``.netrc`` line (``machine h login u password p``),
an ODBC string's ``PWD=...;``, an XML element (``<password>...</password>``), a Dockerfile's ``ENV NAME value``, a Slack or Discord webhook's
URL, and a URL's userinfo written without a scheme (``user:pass@host:5432``). Each rule here finds such a secret by how that format marks
it (a key named like a secret, a header name, a scheme word, a PEM label) and returns its
span; ``mask_text`` replaces the spans. docs/masking.md, "Inside strings", lists them.
"""

from __future__ import annotations

import base64
import binascii
import re

from prime_runs_spool.content.mask_locations import TEXT_TABLE_NAMES, is_secret_name, spelling

#: A key and its separator: a name (quoted or not, a JSON text's quotes escaped or not) at the
#: start of the text or after a blank, a bracket, a comma or a semicolon, then ``:`` or ``=``
#: (with blanks around it, as YAML, JSON, TOML and a header line write it). The value follows
#: (:func:`_value_end`).
_KEY = re.compile(r"(?<![^\s{,;(\['\"])(\\?[\"']?)([A-Za-z_][A-Za-z0-9_.\-]*)\1[ \t]*([:=])[ \t]*")
#: Where an unquoted value ends: after ``:`` at a line's end, a separator of a flow table or a
#: list, a quote (a header's value holds blanks and ``;``: ``Bearer ...``, ``Cookie: a=1; b=2``);
#: after ``=`` at a blank, ``;``, ``&`` or a quote only (a shell's, a query's, a connection
#: string's separators).
_VALUE_END = re.compile(r"[\n\r,}\]\"']")
_ASSIGNED_END = re.compile(r"[\s;\"'&]")
#: An HTTP authorization given as a value by itself: ``Bearer <token>`` (a word of 8
#: characters or more, up to a blank, a quote, ``,`` or ``;``), ``Basic <base64 of user:pass>`` (checked by decoding it).
_BEARER = re.compile(r"(?<![A-Za-z0-9])(?:Bearer|BEARER)[ \t]+([^\s'\"\\,;]{8,})")
_BASIC = re.compile(r"(?<![A-Za-z0-9])(?:Basic|BASIC)[ \t]+([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")
#: A private key pasted whole: the lines between its ``BEGIN`` and its ``END`` (or the
#: text's end, if it was cut).
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----")
#: A ``.netrc`` entry: the word after ``password`` (or ``account``), in a text that names a
#: ``machine`` (or the ``default`` entry).
_NETRC_HOST = re.compile(r"(?<!\S)(?:machine|default)(?!\S)")
_NETRC_SECRET = re.compile(r"(?<!\S)(?:password|account)[ \t]+([^\s'\"]+)")
#: A Dockerfile's ``ENV NAME value`` (the form without ``=``), its name named like a secret:
#: the rest of the line.
_DOCKERFILE_ENV = re.compile(r"(?<![^\n])[ \t]*ENV[ \t]+([A-Za-z_][A-Za-z0-9_.\-]*)[ \t]+([^\n=]+)")
#: A webhook's URL carries its secret in the path (Slack's, Discord's): the path after the
#: service's fixed prefix, whatever key the URL sits under.
_WEBHOOK = re.compile(r"(?:hooks\.slack\.com/(?:services|workflows|triggers)/|discord(?:app)?\.com/api/webhooks/)"
                      r"([^\s'\"?#]+)")
#: A signature given as a query parameter outside a URL (an Azure ``SharedAccessSignature=sv=
#: ...&sig=...`` connection string): its value, as in a URL's query.
_SIGNATURE = re.compile(r"(?<=[?&;])(?:sig|[A-Za-z\-]*signature)=([^&;\s'\"#]*)", re.IGNORECASE)
#: An XML element named like a secret (``<password>...</password>``, Maven's ``settings.xml``,
#: NuGet's ``<add key="ClearTextPassword" value="..."/>`` aside): its text.
_XML_ELEMENT = re.compile(r"<([A-Za-z_][A-Za-z0-9_.\-]*)>([^<]*)</\1>")
#: A URL's userinfo without a scheme (``user:pass@host``, Redis's ``:pass@host``), at the start
#: of a word: the part between ``:`` and ``@``. Not a container image pinned by its digest
#: (``image:tag@sha256:...``).
#: A ``.pgpass`` line, ``host:port:database:user:password`` (``\:`` escapes a colon, ``*`` matches
#: any), as a word: the port (digits or ``*``) and the password (the rest of the word). Only in a
#: text that names ``pgpass`` (a command writing the file, ``PGPASSFILE``): five fields with a
#: number second are also an IPv6 address or a key of fields (``user:1000:profile:name:x``).
_PGPASS_FIELD = r"(?:[^\s'\":\\]|\\.)+"
_PGPASS_LINE = re.compile(rf"(?<![^\s'\"]){_PGPASS_FIELD}:(\d{{1,5}}|\*):{_PGPASS_FIELD}:{_PGPASS_FIELD}:"
                          r"((?:[^\s'\"\\]|\\.)+)")
_BARE_USERINFO = re.compile(r"(?<![^\s'\"=(,;<])[A-Za-z0-9._%+\-]*:([^\s@/'\":]+)@(?!sha\d+:)[A-Za-z0-9\[]")


def format_spans(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that hold a secret by the rules of this module."""
    spans: list[tuple[int, int]] = []
    if ":" in text or "=" in text:
        for key in _KEY.finditer(text):
            name = key.group(2)
            secret = is_secret_name(name) or (key.group(3) == "=" and _is_odbc_password(name, text))
            table = not secret and spelling(name) in TEXT_TABLE_NAMES
            if (secret or table) and key.group(3) == ":" and _line_ends(text, key.end()):
                spans.extend(_block_spans(text, key.start(), key.end(), whole=secret))  # YAML's block below
            elif secret and key.group(3) == "=" and text[key.end():key.end() + 1] == "{" and ";" in text:
                spans.append((key.end() + 1, _odbc_braced_end(text, key.end() + 1)))  # ``PWD={a;b}}c}``
            elif secret:
                spans.extend(_value_spans(text, key.end(), key.group(3) == "="))
            elif table and text[key.end():key.end() + 1] in ("{", "["):
                spans.extend(table_spans(text, key.end(), _balanced_end(text, key.end())))
        if "@" in text:
            spans.extend(match.span(1) for match in _BARE_USERINFO.finditer(text))
    if "Bearer" in text or "BEARER" in text:
        spans.extend(match.span(1) for match in _BEARER.finditer(text))
    if "Basic" in text or "BASIC" in text:
        spans.extend(match.span(1) for match in _BASIC.finditer(text) if _is_basic_credential(match.group(1)))
    if "ENV" in text:
        spans.extend(match.span(2) for match in _DOCKERFILE_ENV.finditer(text) if is_secret_name(match.group(1)))
    if "hooks.slack.com/" in text or "/api/webhooks/" in text:
        spans.extend(match.span(1) for match in _WEBHOOK.finditer(text))
    if "=" in text and ("sig=" in text or "ignature=" in text or "SIG=" in text or "IGNATURE=" in text):
        spans.extend(match.span(1) for match in _SIGNATURE.finditer(text))
    if "</" in text:
        spans.extend(match.span(2) for match in _XML_ELEMENT.finditer(text) if is_secret_name(match.group(1)))
    if "-----BEGIN" in text:
        for match in _PEM.finditer(text):
            end = text.find("-----END", match.end())
            spans.append((match.end(), len(text) if end < 0 else end))
    if "assword" in text or "account" in text:
        if _NETRC_HOST.search(text):
            spans.extend(match.span(1) for match in _NETRC_SECRET.finditer(text))
    if ":" in text and ("pgpass" in text or "PGPASS" in text):
        spans.extend(match.span(2) for match in _PGPASS_LINE.finditer(text))
    return spans


def maybe(text: str) -> bool:
    """Whether a rule of this module can find something in ``text`` (true for every text one
    can, and for some others): a few substring tests, as ``mask_text``'s own."""
    return ":" in text or "=" in text or "Bearer" in text or "BEARER" in text or "Basic" in text or "BASIC" in text \
        or "BEGIN" in text or "assword" in text or "ccount" in text or "ENV" in text or "</" in text


def table_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The value of every key of the table written in ``text[start:end]`` (JSON, a flow
    table, a dict printed): what a table after ``-H`` or ``-e`` has masked, as every value of
    a ``headers`` table is."""
    spans = []
    for key in _KEY.finditer(text, start, end):
        spans.extend(_value_spans(text, key.end(), key.group(3) == "=", limit=end))
    return spans


def _line_ends(text: str, at: int) -> bool:
    """Whether nothing but blanks follows ``at`` on its line (and another line follows)."""
    end = text.find("\n", at)
    return end >= 0 and not text[at:end].strip()


def _block_spans(text: str, key_start: int, value_start: int, whole: bool) -> list[tuple[int, int]]:
    """A YAML key whose value is the block below it (the lines indented deeper than the key's,
    or a list's items at its depth):
    the whole block when the key is named like a secret (``api_keys:`` then ``- sk-...``), every
    value in it when the key names a table of credentials (``headers:`` then ``X-Team: ...``)."""
    line_start = text.rfind("\n", 0, key_start) + 1
    indent = len(text[line_start:key_start]) - len(text[line_start:key_start].lstrip(" \t"))
    start = text.find("\n", value_start) + 1
    end = start
    while end < len(text):
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        line = text[end:line_end]
        depth = len(line) - len(line.lstrip(" \t"))
        if line.strip() and (depth < indent or (depth == indent and line[depth:depth + 1] != "-")):
            break  # (a YAML list may sit at its key's own indentation)
        end = line_end + 1
    end = min(end, len(text))
    if end > start and text[end - 1] == "\n":
        end -= 1
    if whole:
        return [(start, end)] if text[start:end].strip() else []
    return table_spans(text, start, end)


def _value_spans(text: str, at: int, assigned: bool, limit: int | None = None) -> list[tuple[int, int]]:
    """The span of the value that starts at ``at`` (a quoted one: inside its quotes, so the
    text stays what it was written as; a table or a list: whole, brackets included)."""
    limit = len(text) if limit is None else limit
    if at >= limit:
        return []
    first = text[at]
    if first in "\"'":
        close = _closing_quote(text, at + 1, first)
        return [(at + 1, min(close, limit))]
    if first == "\\" and text[at + 1:at + 2] == '"':  # a JSON text inside a JSON string: \"...\"
        close = text.find('\\"', at + 2)
        return [(at + 2, limit if close < 0 else min(close, limit))]
    if first in "{[":
        return [(at, min(_balanced_end(text, at), limit))]
    end = (_ASSIGNED_END if assigned else _VALUE_END).search(text, at, limit)
    stop = limit if end is None else end.start()
    while stop > at and text[stop - 1] in " \t":
        stop -= 1
    return [(at, stop)] if stop > at else []


def _closing_quote(text: str, start: int, quote: str) -> int:
    """Where the string opened before ``start`` ends (a backslash escapes), or the text's end."""
    at = start
    while at < len(text):
        char = text[at]
        if char == "\\":
            at += 2
            continue
        if char == quote:
            return at
        at += 1
    return len(text)


def _balanced_end(text: str, start: int) -> int:
    """Just after the bracket that closes the one at ``start`` (strings inside skipped), or
    the text's end."""
    depth = 0
    at = start
    while at < len(text):
        char = text[at]
        if char in "\"'":
            at = _closing_quote(text, at + 1, char) + 1
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return len(text)


def _odbc_braced_end(text: str, start: int) -> int:
    """Where an ODBC value in braces that starts at ``start`` (after its ``{``) ends: at the
    first ``}`` that is not ``}}`` (a brace inside the value is written twice), or the text's
    end. What is inside may hold ``;`` and blanks."""
    at = text.find("}", start)
    while 0 <= at and text[at + 1:at + 2] == "}":
        at = text.find("}", at + 2)
    return len(text) if at < 0 else at


def _is_odbc_password(name: str, text: str) -> bool:
    """``PWD=`` (any case) in an ODBC or ADO connection string, whose pairs ``;`` separates;
    not a shell's ``PWD=/home/...``."""
    return spelling(name) == "pwd" and ";" in text


def _is_basic_credential(word: str) -> bool:
    """Whether ``word`` is the base64 of ``user:password`` (what ``Basic`` carries): prose
    after the word ``basic`` does not decode to text with a colon."""
    try:
        decoded = base64.b64decode(word + "=" * (-len(word) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded and decoded.isascii() and decoded.decode("ascii").isprintable()
