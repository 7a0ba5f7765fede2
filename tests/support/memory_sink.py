"""A third sink, in one file: the proof that a new destination needs nothing else.

It keeps a run's episodes in a store held in memory by another process (support/memory_store.py),
reached over HTTP: content-addressed batches of at most BATCH_LINES lines, so exactly once
rests on the same announcing and rebuilding Prime Traces uses (sync/sinks/addressed.py).
Importing this module registers it: ``SyncOptions(to="memory")`` then syncs to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

from prime_runs_spool.platform_api.client import classify_response, classify_transport_error
from prime_runs_spool.sync.sinks.addressed import AddressedSink, Cut, HeldStream, Line, LineStream
from prime_runs_spool.sync.sinks.registry import register

#: The memory store's base URL (a fault proxy in front of it, in the tests).
URL_ENV = "PRIME_RUNS_MEMORY_SINK_URL"
BATCH_LINES = 3


class MemorySink(AddressedSink):
    name = "memory"
    title = "the memory store"

    def encode(self, record: Any) -> bytes:
        return orjson.dumps({**record.data, "run_id": self.context.run_id}) + b"\n"

    def cut(self, stream: LineStream | HeldStream) -> Iterator[Cut]:
        taken: list[Line] = []
        reached = stream.cursor
        for line in stream.lines():
            if len(taken) == BATCH_LINES:
                reached = taken[-1].after
                yield self._cut(taken, reached, None)
                taken = []
            taken.append(line)
        if taken:
            yield self._cut(taken, stream.cursor, stream.seal)
        elif stream.cursor != reached:
            yield Cut(None, stream.cursor, seal=stream.seal)

    @staticmethod
    def _cut(lines: list[Line], end: Any, seal: dict[str, Any] | None) -> Cut:
        return Cut(b"".join(line.data for line in lines), end, len(lines), sum(line.traces for line in lines),
                   seal, [line.episode_id for line in lines])

    def upload(self, cut: Cut) -> str:
        path = f"/runs/{self.context.run_id}/batches/{cut.digest}"
        try:
            response = httpx.put(os.environ[URL_ENV] + path, content=cut.data, timeout=2.0)
        except httpx.TransportError as exc:
            raise classify_transport_error("PUT", path, exc) from None
        if response.status_code != 200:
            raise classify_response("PUT", path, response)
        return str(response.json()["upload_id"])


register(MemorySink)
