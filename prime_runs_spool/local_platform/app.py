"""The local platform's HTTP surface: the evaluations API under ``/api/v1``.

It reproduces the real platform's semantics as its public clients see them (see
``docs/local-platform.md``), including the unkind ones, because sync is only proven
exactly-once against a server that would duplicate: samples append without deduplication,
evaluation create and finalize are not idempotent. Every state change goes straight to the
``Store``; the app holds no state of its own, so a restart loses nothing.
"""

from __future__ import annotations

import hmac
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import urlencode

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from prime_runs_spool.errors import AlreadyClosed, DeadlineExceeded, NotFound
#: The largest request body accepted is the real platform's limit.
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.local_platform.store import Store, write_deadline
from prime_runs_spool.local_platform.traces import TracesStore
from prime_runs_spool.local_platform.traces_routes import traces_routes
from prime_runs_spool.viewer.auth import LoginThrottle, LoopbackHostOnly, TokenGate, client_address, held_back

#: How much of an over-limit body is read and thrown away so the client, still sending,
#: gets to read the 413 instead of a reset; beyond this the connection is simply dropped.
_DRAIN_BYTES = 64 * 1024 * 1024
#: Upper bound of ``limit`` on the list endpoints, so one request cannot ask for everything.
MAX_PAGE_LIMIT = 1000

API = "/api/v1"
#: Where the viewer over the platform's evaluations is mounted.
DASHBOARD = "/dashboard"


class ORJSONResponse(JSONResponse):
    """JSON via orjson: the same bytes-for-bytes encoder the client and the store use."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


# -- request bodies -------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ResolveBody(_Body):
    name: str = Field(min_length=1)
    team_id: str | None = None


class EnvironmentRef(_Body):
    id: str = Field(min_length=1)
    version_id: str | None = None


class CreateBody(_Body):
    name: str = Field(min_length=1)
    environments: list[EnvironmentRef]
    tags: list[str] = Field(default_factory=list)
    model_name: str | None = None
    dataset: str | None = None
    framework: str | None = None
    description: str | None = None
    metadata: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    team_id: str | None = None


class UpdateBody(_Body):
    metadata: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    #: A producer closing the evaluation out (prime-runs 0.1.4); COMPLETED only comes from finalize.
    status: Literal["FAILED", "CANCELLED"] | None = None
    error_message: str | None = None


class FinalizeBody(_Body):
    metrics: dict[str, Any] = Field(default_factory=dict)


# -- middleware and helpers ------------------------------------------------------------


class BearerAuth:
    """Refuse ``/api/`` requests without ``Authorization: Bearer <token>`` (401).

    A pure ASGI middleware so the check runs before a body is read: a client with a wrong
    key learns that first, not that its 30 MiB body was too large.
    """

    def __init__(self, app: ASGIApp, token: str, throttle: LoginThrottle) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.throttle = throttle  # the dashboard login's: one token, one count of wrong tries

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            address = client_address(scope)
            if await held_back(self.throttle, address, send):
                return
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                if given:  # a key that is wrong is a guess; none at all is not
                    self.throttle.failed(address)
                response = ORJSONResponse(
                    {"detail": "invalid or missing API key"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
            self.throttle.succeeded(address)  # as a right login: the address's wrong keys are forgotten
        await self.app(scope, receive, send)


async def _read_body(request: Request) -> bytes:
    """The request body, refusing (413) one over ``MAX_REQUEST_BYTES`` without buffering it.

    Both the declared ``Content-Length`` and the bytes actually streamed are checked, so a
    chunked upload cannot get around the limit.
    """
    declared = request.headers.get("content-length")
    stream = request.stream()
    if declared is not None and declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
        await _drain(stream)
        raise HTTPException(413, f"request body exceeds {MAX_REQUEST_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            await _drain(stream)
            raise HTTPException(413, f"request body exceeds {MAX_REQUEST_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Read and discard the rest of a refused body, up to ``_DRAIN_BYTES``."""
    drained = 0
    async for chunk in stream:
        drained += len(chunk)
        if drained > _DRAIN_BYTES:
            return


#: The one media type a JSON endpoint reads. Refusing every other (415), a missing one
#: included, is what keeps a web page's cross-site "simple request" (``text/plain``, a form
#: post, a typeless ``Blob``) from writing here: a page can send ``application/json`` only
#: after a CORS preflight, which this server never grants.
JSON_MEDIA_TYPE = "application/json"


def _is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() == JSON_MEDIA_TYPE


async def _json_body(request: Request) -> Any:
    if not _is_json(request.headers.get("content-type")):
        raise HTTPException(415, f"the body must be sent as Content-Type: {JSON_MEDIA_TYPE}")
    raw = await _read_body(request)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HTTPException(422, f"malformed JSON body: {exc}") from None


async def _model_body(request: Request, model: type[_Body]) -> Any:
    data = await _json_body(request)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        raise _Unprocessable(errors) from None


class _Unprocessable(HTTPException):
    """A 422 whose detail is pydantic's structured error list, like FastAPI's."""

    def __init__(self, errors: list[Any]) -> None:
        super().__init__(422)
        self.errors = errors


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPException(422, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise HTTPException(422, f"{name} must be between {low} and {high}")
    return value


# -- the app --------------------------------------------------------------------------


#: What the platform answers when its database cannot take a request (the request not stored).
INSUFFICIENT_STORAGE = 507
#: SQLite's words for a disk that takes no more.
_STORAGE_ERRORS = ("disk I/O error", "database or disk is full")


def create_app(store: Store, *, token: str | None = None, frontend_url: str | None = None,
               request_deadline: float | None = None, traces: bool = False) -> Starlette:
    """The platform app over ``store``.

    ``frontend_url`` is the base of ``viewer_url``; by default the server's own base URL,
    where ``/dashboard/evaluations/{id}`` serves a read-only page, so the link sync prints
    opens something real. ``traces`` turns the Prime Traces service on (local_platform/traces.py);
    off, it answers ``service_not_enabled`` like an account that has it turned off.
    """
    traces_store = TracesStore(store)

    def viewer_url(request: Request, evaluation_id: str) -> str:
        base = frontend_url or str(request.base_url)
        return f"{base.rstrip('/')}/dashboard/evaluations/{evaluation_id}"

    def document(request: Request, evaluation: dict[str, Any]) -> dict[str, Any]:
        return {**evaluation, "viewer_url": viewer_url(request, evaluation["evaluation_id"])}

    async def resolve_environment(request: Request) -> Response:
        body = await _model_body(request, ResolveBody)
        env = await run_in_threadpool(store.resolve_environment, body.name, body.team_id)
        return ORJSONResponse({"data": env})

    async def get_environment(request: Request) -> Response:
        owner, name = request.path_params["owner"], request.path_params["name"]
        env = await run_in_threadpool(store.get_environment, owner, name)
        return ORJSONResponse({"data": env})

    async def create_evaluation(request: Request) -> Response:
        body = await _model_body(request, CreateBody)
        fields = body.model_dump()
        fields["environments"] = [ref.model_dump(exclude_none=True) for ref in body.environments]
        evaluation = await run_in_threadpool(lambda: store.create_evaluation(**fields))
        return ORJSONResponse(document(request, evaluation), status_code=201)

    async def list_evaluations(request: Request) -> Response:
        skip = _int_param(request, "skip", 0, 0, 2**62)
        limit = _int_param(request, "limit", 50, 1, MAX_PAGE_LIMIT)
        evaluations, total = await run_in_threadpool(
            lambda: store.list_evaluations(
                skip=skip,
                limit=limit,
                environment_name=request.query_params.get("environment_name"),
                team_id=request.query_params.get("team_id"),
            )
        )
        return ORJSONResponse(
            {
                "evaluations": [document(request, e) for e in evaluations],
                "total": total,
                "skip": skip,
                "limit": limit,
            }
        )

    async def get_evaluation(request: Request) -> Response:
        evaluation = await run_in_threadpool(store.get_evaluation, request.path_params["id"])
        return ORJSONResponse(document(request, evaluation))

    async def update_evaluation(request: Request) -> Response:
        body = await _model_body(request, UpdateBody)
        evaluation = await run_in_threadpool(
            lambda: store.update_evaluation(
                request.path_params["id"], metadata=body.metadata, metrics=body.metrics,
                status=body.status, error_message=body.error_message,
            )
        )
        return ORJSONResponse(document(request, evaluation))

    async def finalize_evaluation(request: Request) -> Response:
        body = await _model_body(request, FinalizeBody)
        evaluation = await run_in_threadpool(
            store.finalize, request.path_params["id"], body.metrics
        )
        return ORJSONResponse(document(request, evaluation))

    async def push_samples(request: Request) -> Response:
        data = await _json_body(request)
        samples = data.get("samples") if isinstance(data, dict) else None
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise HTTPException(422, 'body must be {"samples": [object, ...]}')
        bodies = [orjson.dumps(sample).decode() for sample in samples]
        evaluation = await run_in_threadpool(
            store.append_samples, request.path_params["id"], bodies
        )
        return ORJSONResponse(
            {
                "evaluation_id": evaluation["evaluation_id"],
                "samples_pushed": len(bodies),
                "status": evaluation["status"],
            }
        )

    async def list_samples(request: Request) -> Response:
        page = _int_param(request, "page", 1, 1, 2**40)
        limit = _int_param(request, "limit", 100, 1, MAX_PAGE_LIMIT)
        bodies, total = await run_in_threadpool(
            lambda: store.list_samples(
                request.path_params["id"], offset=(page - 1) * limit, limit=limit
            )
        )
        return ORJSONResponse(
            {
                # Rows go out as stored: no parse and re-encode of up to 25 MiB each.
                "samples": [orjson.Fragment(body) for body in bodies],
                "total": total,
                "page": page,
                "limit": limit,
                "hasMore": page * limit < total,
            }
        )

    async def dashboard(request: Request) -> Response:
        # The evaluation's viewer_url: the viewer's run page for it (same query kept).
        await run_in_threadpool(store.get_evaluation, request.path_params["id"])  # 404 if unknown
        query = urlencode({"run": request.path_params["id"]})
        return RedirectResponse(f"{DASHBOARD}/run?{query}", status_code=307)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{DASHBOARD}/", status_code=307)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = exc.errors if isinstance(exc, _Unprocessable) else exc.detail
        return ORJSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    async def not_found(request: Request, exc: Exception) -> Response:
        return ORJSONResponse({"detail": str(exc.args[0])}, status_code=404)

    async def deadline_exceeded(request: Request, exc: Exception) -> Response:
        return ORJSONResponse({"detail": str(exc)}, status_code=503)

    async def already_closed(request: Request, exc: Exception) -> Response:
        return ORJSONResponse({"detail": str(exc)}, status_code=409)

    async def cannot_store(request: Request, exc: Exception) -> Response:
        # The database failed (a full disk, a file size limit, a read-only file): the
        # request's transaction rolled back, nothing of it stored. Said in the answer, which
        # a sync's error line quotes, not as a traceback on the terminal of a sync --local.
        first = exc
        while isinstance(first.__context__, sqlite3.OperationalError):  # the rollback's, after the write's
            first = first.__context__
        hint = " (a full disk, or a file size limit: ulimit -f?)" if str(first) in _STORAGE_ERRORS else ""
        return ORJSONResponse({"detail": f"the platform's database {store.path} failed: {first}{hint}"},
                              status_code=INSUFFICIENT_STORAGE)

    routes = [
        Route(f"{API}/environmentshub/resolve", resolve_environment, methods=["POST"]),
        Route(f"{API}/environmentshub/{{owner}}/{{name}}/@latest", get_environment, methods=["GET"]),
        Route(f"{API}/evaluations/", create_evaluation, methods=["POST"]),
        Route(f"{API}/evaluations/", list_evaluations, methods=["GET"]),
        Route(f"{API}/evaluations/{{id}}", get_evaluation, methods=["GET"]),
        Route(f"{API}/evaluations/{{id}}", update_evaluation, methods=["PUT"]),
        Route(f"{API}/evaluations/{{id}}/finalize", finalize_evaluation, methods=["POST"]),
        Route(f"{API}/evaluations/{{id}}/samples", push_samples, methods=["POST"]),
        Route(f"{API}/evaluations/{{id}}/samples", list_samples, methods=["GET"]),
        Route(f"{DASHBOARD}/evaluations/{{id}}", dashboard, methods=["GET"]),
        Route("/", home, methods=["GET"]),
        # The dashboard is the viewer over this store; the gate below covers it.
        Mount(DASHBOARD, app=_Dashboard(store, traces_store)),
        *traces_routes(traces_store, enabled=traces, run_in_threadpool=run_in_threadpool),
    ]
    # The dashboard's gate (docs/viewer.md, "Security"): the token, or loopback names only.
    throttle = LoginThrottle()
    middleware = ([Middleware(TokenGate, token=token, throttle=throttle),
                   Middleware(BearerAuth, token=token, throttle=throttle)] if token
                  else [Middleware(LoopbackHostOnly)])
    if request_deadline is not None:
        middleware.insert(0, Middleware(RequestDeadline, seconds=request_deadline))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: http_error, NotFound: not_found,
                            DeadlineExceeded: deadline_exceeded, AlreadyClosed: already_closed,
                            sqlite3.OperationalError: cannot_store},
    )


class _Dashboard:
    """The viewer over ``store``, built on the first dashboard request: its templates and
    Jinja2 are not worth importing for a ``sync --local`` that never shows a page."""

    def __init__(self, store: Store, traces: TracesStore) -> None:
        self.store, self.traces = store, traces
        self.app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            from prime_runs_spool.viewer.app import create_viewer_app
            from prime_runs_spool.viewer.sources import PlatformSource

            self.app = create_viewer_app(PlatformSource(self.store, self.traces), mounted=True)
        await self.app(scope, receive, send)


class RequestDeadline:
    """Give every request a deadline, counted from its arrival: a write still uncommitted
    by then is refused (503) and rolled back (``store.write_deadline``)."""

    def __init__(self, app: Any, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        token = write_deadline.set(time.monotonic() + self.seconds)
        try:
            await self.app(scope, receive, send)
        finally:
            write_deadline.reset(token)
