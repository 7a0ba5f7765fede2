"""The viewer's HTTP surface: server-rendered pages over a :class:`~.sources.Source`.

Pages (docs/viewer.md): ``/`` the runs, ``/run`` one run's summary, histogram and sample
table, ``/episode`` one episode, ``/group`` all rollouts of one example, ``/compare`` two
runs by example id, ``/pair`` one example's transcripts in two runs side by side. Every
view's state is in its query string, so a URL reopens it.
``?fragment=1`` returns only the part of a page that refreshes itself (the runs table,
a live run's body), which the page's one script polls every second.

Every response carries a Content-Security-Policy allowing only this server's own script
and stylesheet: escaping is what keeps an episode's ``<script>`` inert, and the policy is
the second lock on the same door.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from prime_runs_spool.errors import SpoolError, UnknownRunError
from prime_runs_spool.files import printable
from prime_runs_spool.viewer.auth import LoopbackHostOnly, TokenGate
from prime_runs_spool.viewer.index import RunIndex
from prime_runs_spool.viewer.pages import Pages
from prime_runs_spool.viewer.render import ASSETS, Links, asset
from prime_runs_spool.viewer.sources import Source

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
_CONTENT_TYPES = {"viewer.css": "text/css; charset=utf-8", "viewer.js": "text/javascript; charset=utf-8",
                  "chart.umd.min.js": "text/javascript; charset=utf-8"}


def _html(text: str, status: int = 200) -> Response:
    """The page as UTF-8. A folder name that is not UTF-8 reaches the text as lone surrogates
    wherever a page shows a path; they are shown as ``\\xNN`` (``files.printable``) so one
    odd folder never turns a page into a 500."""
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        body = printable(text).encode("utf-8")
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def create_viewer_app(source: Source, *, token: str | None = None, mounted: bool = False) -> Any:
    """The viewer over ``source``: behind a :class:`TokenGate` when ``token`` is set, else
    answering only to loopback host names (:class:`LoopbackHostOnly`).

    ``mounted``: the app is mounted in another whose own middleware does both (the local
    platform mounts it at ``/dashboard``); links are built under the mount's ``root_path``.
    """

    def pages(request: Request) -> Pages:
        return Pages(source, Links(request.scope.get("root_path", "")))

    def fragment_url(request: Request) -> str:
        query = "&".join(part for part in request.url.query.split("&") if part and not part.startswith("fragment="))
        return f"{request.url.path}?{query + '&' if query else ''}fragment=1"

    async def render(request: Request, build: Any) -> Response:
        try:
            body = await run_in_threadpool(build, pages(request), dict(request.query_params), fragment_url(request))
        except UnknownRunError as exc:
            return _html(pages(request).message("Not found", str(exc)), 404)
        except (SpoolError, OSError) as exc:  # OSError: its files changed under the viewer (a folder made a file)
            return _html(pages(request).message("Cannot read this run", str(exc)), 500)
        return _html(body)

    async def runs_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.runs(params, frag))

    async def run_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.run(params, frag))

    async def episode_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.episode(params))

    async def group_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.group(params))

    async def plots_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.plots(params))

    async def across_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.across(params))

    async def compare_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.compare(params))

    async def pair_page(request: Request) -> Response:
        return await render(request, lambda p, params, frag: p.pair(params))

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return Response(asset(name), media_type=_CONTENT_TYPES[name], headers=SECURITY_HEADERS)

    routes = [
        Route("/", runs_page, methods=["GET"]),
        Route("/run", run_page, methods=["GET"]),
        Route("/episode", episode_page, methods=["GET"]),
        Route("/group", group_page, methods=["GET"]),
        Route("/compare", compare_page, methods=["GET"]),
        Route("/pair", pair_page, methods=["GET"]),
        Route("/plots", plots_page, methods=["GET"]),
        Route("/across", across_page, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
    ]
    app: Any = Starlette(routes=routes)
    if not mounted:
        app = TokenGate(app, token) if token else LoopbackHostOnly(app)
    return app


def wait_indexed(run: RunIndex, seconds: float) -> None:
    """Refresh ``run`` until it has caught up or ``seconds`` have passed (for export, tests)."""
    deadline = time.monotonic() + seconds
    run.refresh(budget=seconds)
    while run.behind and time.monotonic() < deadline:
        run.refresh(budget=deadline - time.monotonic())
