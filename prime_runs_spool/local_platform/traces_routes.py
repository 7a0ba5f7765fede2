"""The local platform's Prime Traces service over HTTP: the routes under ``/api/v1`` that the
`prime-traces` client, prime-runs and the dashboard call (docs/local-platform.md, "Prime Traces").

Kept apart from the store (local_platform/traces.py), which decides what an upload stores and
what a read returns: here are only the wire's parts, the multipart body, the cursors and pages
of a listing, a run's summary as the service lists it, and the ``service_not_enabled`` answer
of an account with Prime Traces off.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from typing import Any

from prime_traces import ErrorCode
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prime_runs_spool.errors import TracesRejected
from prime_runs_spool.local_platform.traces import TracesStore
from prime_runs_spool.platform_api.traces import IDEMPOTENCY_HEADER, LINE_FORMAT_HEADER, MAX_BATCH_BYTES

API = "/api/v1"
#: Largest page of any listing, as the service caps it.
MAX_PAGE = 100
#: Lines without the episode header are bare traces (the service's default line format).
_TRACE_LINES = "trace"


def _multipart(body: bytes, content_type: str) -> dict[str, tuple[dict[str, str], bytes]]:
    """The parts of a ``multipart/form-data`` body by name: (their headers, their bytes)."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/form-data") or match is None:
        raise TracesRejected(400, ErrorCode.INVALID_METADATA, "the upload must be multipart/form-data")
    delimiter = b"--" + match.group(1).encode("latin-1")
    parts: dict[str, tuple[dict[str, str], bytes]] = {}
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, content = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        headers = {}
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        found = re.search(r'name="([^"]*)"', headers.get("content-disposition", ""))
        if found is None:
            continue
        if found.group(1) in parts:
            raise TracesRejected(400, ErrorCode.INVALID_METADATA, f"part {found.group(1)!r} appears twice")
        parts[found.group(1)] = (headers, content.removesuffix(b"\r\n"))
    return parts



def _run_summary(run_id: str, traces: list[dict[str, Any]], episodes: int) -> dict[str, Any]:
    rewards = [t["score"]["reward"] for t in traces if t["score"]["reward"] is not None]
    return {
        "run_id": run_id,
        "first_trace_created_at": min(t["created_at"] for t in traces),
        "last_trace_created_at": max(t["created_at"] for t in traces),
        "last_trace_ingested_at": max(t["ingested_at"] for t in traces),
        "trace_count": len(traces),
        "episode_count": episodes,
        "avg_reward": sum(rewards) / len(rewards) if rewards else None,
        "step_min": None, "step_max": None, "step_count": 0,
        "has_error": any(t["execution"]["has_error"] for t in traces),
        "first_user_id": None,
        "environment_ids": sorted({t["environment_id"] for t in traces if t["environment_id"]}),
        "model_ids": sorted({t["model"]["id"] for t in traces if t["model"]["id"]}),
        "context": traces[-1]["context"],
    }


# -- HTTP ------------------------------------------------------------------------------------


def _error(status: int, code: ErrorCode, message: str) -> Response:
    return JSONResponse({"error": {"code": code.value, "message": message}}, status_code=status)


def _cursor(request: Request) -> tuple[int, int]:
    raw = request.query_params.get("cursor")
    try:
        limit = min(MAX_PAGE, max(1, int(request.query_params.get("limit") or 50)))
        offset = int(base64.urlsafe_b64decode(raw.encode()).decode().removeprefix("o:")) if raw else 0
    except (ValueError, UnicodeDecodeError):
        raise TracesRejected(400, ErrorCode.INVALID_CURSOR, "cursor or limit is not valid") from None
    return offset, limit


def _listing(items: list[dict[str, Any]], more: bool, offset: int) -> Response:
    cursor = base64.urlsafe_b64encode(f"o:{offset + len(items)}".encode()).decode() if more else None
    return JSONResponse({"items": items, "next_cursor": cursor})


async def _body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BATCH_BYTES:
            raise TracesRejected(400, ErrorCode.UPLOAD_TOO_LARGE, f"request over {MAX_BATCH_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def traces_routes(service: TracesStore, *, enabled: bool, run_in_threadpool: Any) -> list[Route]:
    """The service's routes under ``/api/v1``; every one answers ``service_not_enabled`` when
    the platform was started without Prime Traces."""

    def route(path: str, methods: Iterable[str]):
        def wrap(handler: Any) -> Route:
            async def endpoint(request: Request) -> Response:
                if not enabled:
                    return _error(403, ErrorCode.SERVICE_NOT_ENABLED, "Prime Traces is not enabled for this account")
                try:
                    return await handler(request)
                except TracesRejected as exc:
                    return _error(exc.status, exc.code, str(exc))
            return Route(f"{API}{path}", endpoint, methods=list(methods))
        return wrap

    async def upload(request: Request) -> Response:
        body = await _body(request)
        parts = _multipart(body, request.headers.get("content-type", ""))
        line_format = request.headers.get(LINE_FORMAT_HEADER.lower(), _TRACE_LINES)
        metadata = parts.get("metadata")
        receipt, _ = await run_in_threadpool(service.upload, request.headers.get(IDEMPOTENCY_HEADER.lower(), ""),
                                             line_format, None if metadata is None else metadata[1],
                                             parts.get("traces"))
        return JSONResponse(receipt)

    def filters(request: Request, *names: str) -> dict[str, Any]:
        return {name: request.query_params[name] for name in names if name in request.query_params}

    async def list_traces(request: Request) -> Response:
        offset, limit = _cursor(request)
        items, more = await run_in_threadpool(service.page, "trace_docs", filters(request, "run_id", "episode_id"),
                                              request.query_params.getlist("upload_id"), offset, limit)
        return _listing(items, more, offset)

    async def get_trace(request: Request) -> Response:
        found = await run_in_threadpool(service.one, "trace_docs", "trace_id", request.path_params["id"])
        if found is None:
            raise TracesRejected(404, ErrorCode.TRACE_NOT_FOUND, f"trace {request.path_params['id']} not found")
        if request.query_params.get("raw") == "true":
            return Response(found[1], media_type="application/json")
        return JSONResponse(found[0])

    async def list_episodes(request: Request) -> Response:
        offset, limit = _cursor(request)
        items, more = await run_in_threadpool(service.page, "trace_episodes", filters(request, "run_id"),
                                              request.query_params.getlist("upload_id"), offset, limit)
        return _listing(items, more, offset)

    async def get_episode(request: Request) -> Response:
        episode_id = request.path_params["id"]
        found = await run_in_threadpool(service.one, "trace_episodes", "episode_id", episode_id)
        if found is None:
            raise TracesRejected(404, ErrorCode.EPISODE_NOT_FOUND, f"episode {episode_id} not found")
        if request.query_params.get("raw") == "true":
            return Response(found[1], media_type="application/json")
        members, _ = await run_in_threadpool(service.page, "trace_docs", {"episode_id": episode_id}, [], 0, 10_000)
        aggregate = {"trace_count": len(members), "total_tokens": sum(t["total_tokens"] for t in members),
                     "total_duration_ms": sum(t["duration_ms"] for t in members),
                     "any_trace_error": any(t["execution"]["has_error"] for t in members),
                     "agent_names": sorted({t["agent_name"] for t in members if t["agent_name"]})}
        return JSONResponse({**found[0], "traces": aggregate})

    async def episode_traces(request: Request) -> Response:
        offset, limit = _cursor(request)
        items, more = await run_in_threadpool(service.page, "trace_docs", {"episode_id": request.path_params["id"]},
                                              [], offset, limit)
        return _listing(items, more, offset)

    def summaries(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by_run: dict[str, list[dict[str, Any]]] = {}
        for trace in traces:
            if trace["run_id"] is not None:
                by_run.setdefault(trace["run_id"], []).append(trace)
        runs = []
        for run_id, members in by_run.items():
            runs.append(_run_summary(run_id, members, service.counts(run_id)["episodes"]))
        return sorted(runs, key=lambda run: run["last_trace_ingested_at"], reverse=True)

    async def list_runs(request: Request) -> Response:
        offset, limit = _cursor(request)
        runs = await run_in_threadpool(lambda: summaries(service.run_traces()))
        return _listing(runs[offset:offset + limit], len(runs) > offset + limit, offset)

    async def get_run(request: Request) -> Response:
        run_id = request.path_params["id"]
        runs = await run_in_threadpool(lambda: summaries(service.run_traces(run_id)))
        if not runs:
            raise TracesRejected(404, ErrorCode.RUN_NOT_FOUND, f"run {run_id} holds no traces")
        return JSONResponse(runs[0])

    async def run_steps(request: Request) -> Response:
        return JSONResponse({"step_min": None, "step_max": None, "step_count": 0, "items": []})

    return [
        route("/traces", ["POST"])(upload),
        route("/traces", ["GET"])(list_traces),
        route("/traces/{id}", ["GET"])(get_trace),
        route("/episodes", ["GET"])(list_episodes),
        route("/episodes/{id}", ["GET"])(get_episode),
        route("/episodes/{id}/traces", ["GET"])(episode_traces),
        route("/runs", ["GET"])(list_runs),
        route("/runs/{id}", ["GET"])(get_run),
        route("/runs/{id}/steps", ["GET"])(run_steps),
    ]

