"""Rendering the viewer's pages: one Jinja2 environment, autoescaping everything.

Why Jinja2 with autoescape on: every string an episode holds (a prompt, a tool's output,
a model's answer) is attacker-controlled as far as the browser is concerned, so escaping
must be the default that nothing forgets, not a call each template has to remember.

Links are built by a :class:`Links` object, so the same templates serve a live server
(query-string URLs under a mount prefix) and a static export (relative file names).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2

from prime_runs_spool.files import shell_word
from prime_runs_spool.viewer.search import marked
from prime_runs_spool.viewer.transcript import pretty

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
#: The assets the pages load; nothing else is served from the static folder.
ASSETS = ("viewer.css", "viewer.js", "chart.umd.min.js")


class Links:
    """URLs of a live viewer mounted at ``prefix`` (``""`` or e.g. ``/dashboard``)."""

    static_export = False

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix.rstrip("/")

    def _url(self, path: str, params: Mapping[str, Any]) -> str:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        return f"{self.prefix}{path}" + (f"?{query}" if query else "")

    def runs(self) -> str:
        return f"{self.prefix}/"

    def runs_view(self, params: Mapping[str, Any]) -> str | None:
        """The runs page sorted or filtered by ``params`` (None where that needs a server)."""
        return self._url("/", params)

    def run(self, key: str, params: Mapping[str, Any] | None = None) -> str | None:
        return self._url("/run", {"run": key, **(params or {})})

    def episode(self, key: str, number: int, hl: str | None = None) -> str | None:
        """``hl``: words to highlight on the page (a search's)."""
        return self._url("/episode", {"run": key, "n": number, "hl": hl or None})

    def group(self, key: str, example: Any) -> str | None:
        return self._url("/group", {"run": key, "example": example})

    def compare(self, params: Mapping[str, Any]) -> str | None:
        return self._url("/compare", params)

    def pair(self, a: str, b: str, example: Any, ra: int | None = None, rb: int | None = None) -> str | None:
        """One example's rollouts of runs ``a`` and ``b`` side by side; ``ra``/``rb``: which
        of each run's rollouts of it (1 = its first in rollout order)."""
        return self._url("/pair", {"a": a, "b": b, "example": example, "ra": ra, "rb": rb})

    def plots(self, key: str) -> str | None:
        return self._url("/plots", {"run": key})

    def across(self, group: str | None = None, metric: str | None = None) -> str | None:
        """Across runs, grouped by ``group``, of the reward or of ``metric``."""
        return self._url("/across", {"group": group, "metric": metric})

    def static(self, name: str) -> str:
        return f"{self.prefix}/static/{name}"


#: Kept as they are in a file name; every other byte is written ``_xx`` (its hex).
_SLUG_KEEP = re.compile(r"[a-z0-9.\-]")
#: A slug longer than this is cut and its key's whole SHA-256 added, after ``~``.
_MAX_SLUG = 105


def file_slug(key: Any) -> str:
    """A file-name-safe name for a run key or example id, different for different keys.

    Lowercase letters, digits, ``.`` and ``-`` stay; every other byte of the key's UTF-8
    (uppercase letters too: a case-insensitive disk would merge ``A`` and ``a``) becomes
    ``_`` and its two hex digits, so a slug reads back to its key: no two keys share one,
    however many share a prefix. A key whose slug would be longer than ``_MAX_SLUG``
    characters (a file name has 255 bytes) is its slug's first 40 characters, ``~`` (in no
    spelled-out slug) and its whole SHA-256: two such keys share a name only if they share
    a SHA-256.
    """
    text = str(key)
    slug = "".join(char if _SLUG_KEEP.fullmatch(char) else "".join(f"_{byte:02x}" for byte in char.encode())
                   for char in text)
    if len(slug) <= _MAX_SLUG:
        return slug
    return f"{slug[:40]}~{hashlib.sha256(text.encode()).hexdigest()}"


class ExportLinks(Links):
    """Relative file names of a static export: the default view of each page only."""

    static_export = True

    def __init__(self) -> None:
        super().__init__("")

    def runs(self) -> str:
        return "index.html"

    def runs_view(self, params: Mapping[str, Any]) -> str | None:
        return None

    def run(self, key: str, params: Mapping[str, Any] | None = None) -> str | None:
        params = dict(params or {})
        page = params.pop("page", "1")
        if params:
            return None  # filters and sorts need the server
        return f"run-{file_slug(key)}-p{page}.html"

    def episode(self, key: str, number: int, hl: str | None = None) -> str | None:
        return f"episode-{file_slug(key)}-{number}.html"

    def group(self, key: str, example: Any) -> str | None:
        return f"group-{file_slug(key)}+{file_slug(example)}.html"  # "+": in no slug, so the two split one way

    def compare(self, params: Mapping[str, Any]) -> str | None:
        """Only a pair's default view (every example, no other tab) is a file."""
        if set(params) != {"a", "b"}:
            return None
        return f"compare-{file_slug(json.dumps([params['a'], params['b']]))}.html"

    def pair(self, a: str, b: str, example: Any, ra: int | None = None, rb: int | None = None) -> str | None:
        if ra not in (None, 1) or rb not in (None, 1):
            return None  # each run's first rollout of the example only
        return f"pair-{file_slug(json.dumps([a, b, str(example)]))}.html"

    def plots(self, key: str) -> str | None:
        return f"plots-{file_slug(key)}.html"

    def across(self, group: str | None = None, metric: str | None = None) -> str | None:
        if metric is None:
            return f"across-{group or 'model'}.html"
        return f"across-{group or 'model'}+{file_slug(metric)}.html"  # "+": in no slug

    def static(self, name: str) -> str:
        return f"static/{name}"


def fmt_number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def fmt_seconds(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.2f} s"


def fmt_time(value: Any) -> str:
    """An ISO timestamp as ``2026-01-15 12:00:00Z``; anything else as it is."""
    if not isinstance(value, str):
        return "–" if value is None else str(value)
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if when.tzinfo is not None:
        when = when.astimezone(dt.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S") + ("Z" if when.tzinfo is not None else "")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # ``argument``: a path in a command the page hands on to paste, shell-quoted as the command line's are.
    env.filters.update(num=fmt_number, seconds=fmt_seconds, when=fmt_time, pretty=pretty, marked=marked,
                       argument=lambda value: shell_word(str(value)))
    return env


ENV = _environment()


def render(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


def asset(name: str) -> bytes:
    if name not in ASSETS:
        raise KeyError(name)
    return (STATIC / name).read_bytes()
