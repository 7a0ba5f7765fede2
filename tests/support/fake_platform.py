"""An in-memory platform behind ``httpx.MockTransport``, for fast unit tests of the engine.

It keeps the real platform's unkind semantics (appends never deduplicate, create and
finalize are not idempotent) and can fail chosen requests *after* applying them, which is
the case that makes duplicates. The end-to-end tests use the real local platform instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import httpx
import orjson


class FakePlatform:
    def __init__(self) -> None:
        self.evaluations: dict[str, dict[str, Any]] = {}
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, str]] = []
        self._ids = itertools.count(1)
        #: Called with (method, path, phase) where phase is "before" or "after" applying;
        #: may raise an httpx error or return a Response to send instead.
        self.fault: Callable[[str, str, str], httpx.Response | None] | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path.removeprefix("/api/v1")
        self.requests.append((method, path))
        if self.fault and (injected := self.fault(method, path, "before")) is not None:
            return injected
        response = self._apply(method, path, request)
        if self.fault and (injected := self.fault(method, path, "after")) is not None:
            return injected
        return response

    def _apply(self, method: str, path: str, request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content) if request.content else None
        parts = [p for p in path.split("/") if p]
        if method == "POST" and path == "/environmentshub/resolve":
            return httpx.Response(200, json={"data": {"id": f"env-{body['name']}"}})
        if method == "POST" and parts == ["evaluations"]:
            evaluation_id = f"ev{next(self._ids)}"
            self.evaluations[evaluation_id] = {
                "evaluation_id": evaluation_id, "name": body["name"], "status": "RUNNING",
                "metadata": body.get("metadata") or {}, "metrics": {}, "finalize_count": 0,
                "environment": body["environments"][0]["id"].removeprefix("env-"),
                "created_at": f"{len(self.evaluations):06d}",
            }
            self.samples[evaluation_id] = []
            return httpx.Response(201, json=self.evaluations[evaluation_id])
        if method == "GET" and parts == ["evaluations"]:
            env = request.url.params.get("environment_name")
            items = [e for e in self.evaluations.values() if env is None or e["environment"] == env]
            skip, limit = int(request.url.params.get("skip", 0)), int(request.url.params.get("limit", 50))
            return httpx.Response(200, json={"evaluations": items[skip:skip + limit], "total": len(items),
                                             "skip": skip, "limit": limit})
        evaluation = self.evaluations.get(parts[1]) if len(parts) > 1 else None
        if evaluation is None:
            return httpx.Response(404, json={"detail": "not found"})
        rows = self.samples[parts[1]]
        if method == "POST" and parts[2:] == ["samples"]:
            rows.extend(body["samples"])
            return httpx.Response(200, json={"evaluation_id": parts[1], "samples_pushed": len(body["samples"])})
        if method == "GET" and parts[2:] == ["samples"]:
            page, limit = int(request.url.params.get("page", 1)), int(request.url.params.get("limit", 100))
            chunk = rows[(page - 1) * limit: page * limit]
            return httpx.Response(200, json={"samples": chunk, "total": len(rows), "page": page,
                                             "limit": limit, "hasMore": page * limit < len(rows)})
        if method == "PUT" and len(parts) == 2:
            if "status" in body:  # a producer's close-out; refused whole once closed
                if evaluation["status"] in ("COMPLETED", "FAILED", "CANCELLED"):
                    return httpx.Response(409, json={"detail": "already closed"})
                evaluation["status"] = body["status"]
                evaluation["error_message"] = body.get("error_message")
            if "metadata" in body:
                evaluation["metadata"] = body["metadata"]
            if "metrics" in body:
                evaluation["metrics"] = body["metrics"]
            return httpx.Response(200, json=evaluation)
        if method == "POST" and parts[2:] == ["finalize"]:
            evaluation["status"] = "COMPLETED"
            evaluation["metrics"] = {**evaluation["metrics"], **(orjson.loads(request.content or b"{}").get("metrics") or {})}
            evaluation["finalize_count"] += 1
            return httpx.Response(200, json=evaluation)
        if method == "GET" and len(parts) == 2:
            return httpx.Response(200, json={**evaluation, "total_samples": len(rows)})
        return httpx.Response(405)
