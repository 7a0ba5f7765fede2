"""Proof that an event loop kept running: a task that ticks at a fixed interval."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class Ticker:
    """Counts the ticks of a task that wakes every ``interval`` seconds while the block runs.

    A loop blocked on a write or an fsync stops ticking, so a test compares ``ticks`` with
    what ``elapsed`` allows. ``elapsed`` is measured from when the ticker first got to run.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.ticks = 0
        self.elapsed = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0

    async def _tick(self) -> None:
        while not self._stop.is_set():
            self.ticks += 1
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        self._started = time.monotonic()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.elapsed = time.monotonic() - self._started
        self._stop.set()
        assert self._task is not None
        await self._task
