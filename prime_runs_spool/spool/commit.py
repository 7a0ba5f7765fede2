"""Group commit's hand-off: the batch that one flush (one synced pwritev) makes durable, and
how its members are woken once it is (docs/spool-format.md, section 5).

Out of the writer so that the writer keeps the segment (its lock, its durable mark, the
flush itself) and this module keeps who waits and how they wake: thread callers on their
own raw locks, woken in a chain; async callers on futures, settled through their event
loop in one call per loop; and the helper thread that flushes for async callers when no
thread is flushing.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

from prime_runs_spool.errors import SpoolWriteError


class Batch:
    """Lines that will reach the disk in one flush (spool/writer.py), and who waits for them.

    A thread caller waits on its own raw lock (``waiters``), acquired on its behalf when it
    joins and released by whoever settles the batch: waking a batch wakes exactly its members,
    and each of them with one futex hand-off, with no condition variable to re-acquire. An
    async caller waits on a future (``futures``), settled through its loop.
    """

    __slots__ = ("parts", "waiters", "futures", "callbacks", "error", "leader")

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.waiters: list[Any] = []
        self.futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: Called with the batch's error (None once durable) by whoever settles it, whatever
        #: became of the task awaiting the future: a cancelled append still learns its fate.
        self.callbacks: list[Any] = []
        self.error: SpoolWriteError | None = None
        #: The member's lock that was handed the job of flushing this batch (or True for a
        #: helper thread); None while the batch waits behind the flush in progress.
        self.leader: Any = None


def helper_loop(jobs: queue.SimpleQueue[Any]) -> None:
    """Run flushes handed to a writer's helper thread until the writer releases it (None)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            job[0](*job[1])
        except BaseException:  # _lead settled the batch with the error; keep serving the writer
            pass
        # Hold nothing while waiting: the last job's bound method would keep a writer that
        # its owner dropped without closing alive, file and lock included.
        del job


def settle_batch(batch: Batch) -> None:
    """Tell a flushed (or failed) batch's callbacks its outcome, then wake its members but its leader.

    Only the first member is woken here; each member wakes the next one as it wakes up.
    Waking all of them at once would put dozens of threads in the queue for the GIL,
    the leader passing the flush on among them; a chain keeps that queue short.
    """
    for callback in batch.callbacks:
        try:
            callback(batch.error)
        except Exception:  # the callback's owner accounts for itself; the writer goes on
            pass
    waiters = batch.waiters
    if waiters:
        first = 1 if waiters[0] is batch.leader else 0
        if first < len(waiters):
            waiters[first].release()
    if batch.futures:
        # One call per event loop, not per future: each call_soon_threadsafe writes to the
        # loop's wake-up pipe, a system call and a wake-up for the loop each.
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for loop, future in batch.futures:
            by_loop.setdefault(loop, []).append(future)
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(settle_all, futures, batch.error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


def settle_all(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():  # cancelled while it waited
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
