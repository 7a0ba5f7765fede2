"""Group commit: which caller flushes, who waits for which flush, and how they wake
(docs/spool-format.md, section 5).

An append returns only once its line is written and fdatasync'ed. Concurrent appenders
share that cost. At most one flush runs at a time, so lines reach the file in the order of
their sequence numbers. An appender that finds nobody flushing writes and syncs its own
lines inline (one synced write: ``spool/durable_file.py``; no other thread, no hand-off).
One that finds a flush in progress adds its lines to the open *batch* and sleeps on its
own lock. When a flush ends, its leader wakes one member of the open batch to flush it;
that new leader closes the batch only when it starts writing, so it takes everything
queued by then (the busier the writer, the bigger the groups). A flushed batch's members
are woken as a chain, each waking the next, so the GIL queue stays short and the next
flush is not stuck behind dozens of woken threads (64 threads at 2 KB: 40k appends a second
woken as a chain, 25k woken all at once, Nov 29; benchmarks/append.py).

An async caller never writes or syncs on its event loop: when nobody is flushing, it hands
the flush to the writer's helper thread (one per writer, started on first use) and leaves
the batch open, so the tasks the loop runs before it next waits join that group; each
flushed batch settles a loop's futures with one call into that loop.

A failed flush breaks the writer for good (the file may have lost what it reported
written), and fails everything queued behind it. The writer numbers lines and frames them
(it hands :meth:`GroupCommit.commit` the function that does, called under the one mutex so
that numbers and places in the file agree); the file writes them; this module keeps who
waits and who leads.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

from prime_runs_spool.errors import SegmentGoneError, SpoolWriteError, WriterClosedError
from prime_runs_spool.spool.durable_file import DurableFile, Parts

#: Numbers and frames lines under the commit's mutex: given the caller's lines and how many
#: of them are episodes, returns the first sequence number and the lines' parts.
Number = Callable[[Any, int], tuple[int, Parts]]

#: What an async append calls once its records' fate is known: None, or the error.
Settled = Callable[[Union[BaseException, None]], None]

_allocate_lock = threading.Lock


class Batch:
    """Lines that will reach the disk in one flush, and who waits for them.

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


class GroupCommit:
    """One segment's group commit over its :class:`DurableFile`; see the module docstring.

    Thread-safe. The writer hands it each append's lines with the function that numbers
    them (:meth:`commit`, :meth:`queue_async`); :meth:`close` lets what is queued finish.
    """

    def __init__(self, file: DurableFile, path: Path, thread_name: str) -> None:
        self._file = file
        self._path = path
        self._thread_name = thread_name
        self._mutex = threading.Lock()
        # Everything below is guarded by self._mutex.
        #: True from the moment a caller takes the job of flushing until the chain of
        #: flushes ends with nothing queued: at most one flush runs at a time, so lines
        #: reach the file in sequence order.
        self._flushing = False
        #: Lines queued behind the flush in progress; whoever leads it closes it.
        self._open: Batch | None = None
        self._closing = False
        self._failure: OSError | None = None
        #: close() waits on this for the flush chain to end; notified only when _closers > 0.
        self._idle = threading.Condition(self._mutex)
        self._closers = 0
        #: Flushes for the helper thread, which leads groups of async callers; see _start_helper.
        self._jobs: queue.SimpleQueue[Any] | None = None
        #: The process that opened the segment; another one is a fork (see disown_after_fork).
        self.owner_pid = os.getpid()
        self._forked = False

    @property
    def closed(self) -> bool:
        with self._mutex:
            return self._closing or self._failure is not None

    # A caller that finds nobody flushing takes the job itself (``_flushing``) and writes
    # and syncs its own lines inline: a lone appender costs one synced pwritev, with no
    # other thread, lock hand-off or wake-up involved. Callers that arrive while a flush is
    # in progress queue their lines in the open batch and sleep on their own lock. When a
    # flush ends, its leader hands the job to one member of the open batch (waking it
    # first, so the disk idles as little as possible) and then wakes its own members.

    def commit(self, number: Number, lines: Any, episodes: int, *, last: bool = False) -> int:
        """Number ``lines`` (``number(lines, episodes)``, under the mutex), then lead or join a
        flush; returns the first sequence number once they are durable. ``last``: nothing
        may be appended after them (the seal)."""
        mutex = self._mutex
        leading = False
        try:
            mutex.acquire()  # not ``with``: about half the cost, on every append
            try:
                if self._closing or self._failure is not None:
                    self._check_open()  # raises
                first, parts = number(lines, episodes)
                if last:
                    self._closing = True
                if self._flushing:
                    joined = self._join(parts)
                else:  # nobody flushing: ours to write and sync, inline (the lone appender's path)
                    self._flushing = leading = True
                    joined = None
            finally:
                mutex.release()
            if joined is None:
                error = self._lead(None, parts)
                if error is not None:
                    raise error
                return first
        except BaseException as exc:
            # A KeyboardInterrupt between taking the flushing job and _lead's own handling
            # (at _lead's first line, say) left the job taken forever: every later append
            # queued behind a flush that never came, and hung. Our lines were numbered, not
            # written, so the writer cannot go on (their sequence numbers would be a gap):
            # it fails as after a failed flush, and what is queued fails with it.
            if leading and self._failure is None and not isinstance(exc, SpoolWriteError):
                self._lead_failed(None, exc)  # raises exc again (not an OSError)
            raise
        self._wait(joined)
        return first

    def queue_async(self, number: Number, lines: Any, episodes: int,
                    on_settled: Settled | None) -> tuple[asyncio.Future[None], int]:
        """Number ``lines`` and queue them in the open batch (no await: nothing can cancel
        it half way); returns the future its flush settles and the first sequence number."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._mutex:
            if self._closing or self._failure is not None:
                self._check_open()  # raises
            first, parts = number(lines, episodes)
            batch = self._open
            if batch is None:
                batch = self._open = Batch()
            batch.parts += parts
            batch.futures.append((loop, future))
            if on_settled is not None:
                batch.callbacks.append(on_settled)
            if self._flushing:
                batch = None
            else:
                # Nobody is flushing: the helper thread leads. The batch stays open until
                # the helper starts writing, so the other tasks this loop runs before it
                # next waits join this group instead of each waiting for a sync of its own.
                self._flushing = True
                batch.leader = True
        if batch is not None:
            self._start_helper(self._lead_open, batch)
        return future, first

    def close(self) -> None:
        """Let queued appends finish, then close the file. Idempotent."""
        with self._mutex:
            self._closing = True
            self._closers += 1
            try:
                while self._flushing:
                    self._idle.wait()
            finally:
                self._closers -= 1
            self._release()

    def abandon(self) -> None:
        """Close the file at once (a segment whose header never became durable)."""
        with self._mutex:
            self._closing = True
            self._release()

    def disown_after_fork(self) -> None:
        """In a forked child: let go of the parent's segment without touching it.

        The child got copies of the file descriptors and of every lock's state, possibly
        mid-flush in a parent thread that does not exist here. It gets fresh locks so that
        nothing here waits for a thread that was left behind, never writes, and lets the
        file close its copies (never the writer lock). Every later call raises
        WriterClosedError.
        """
        self._mutex = threading.Lock()
        self._idle = threading.Condition(self._mutex)
        self._forked = True
        self._closing = True
        self._flushing = False
        self._open = None
        self._jobs = None  # the helper thread was not forked
        self._file.disown_after_fork()

    def _check_open(self) -> None:
        if self._forked:
            raise WriterClosedError(
                f"{self._path}: this segment is written by process {self.owner_pid}; "
                f"process {os.getpid()}, a fork of it, cannot append to it, seal it or close it"
            )
        if self._failure is not None:
            raise WriterClosedError(
                f"{self._path}: writer is broken by a disk error ({self._failure}); open a new segment"
            )
        if self._closing:
            raise WriterClosedError(f"{self._path}: writer is sealed or closed")

    def _join(self, parts: Parts) -> tuple[Batch, Any, int]:
        """Queue ``parts`` behind the flush in progress (mutex held); returns the batch, the
        lock its caller waits on and the caller's place among the batch's members."""
        batch = self._open
        if batch is None:
            batch = self._open = Batch()
        batch.parts += parts
        waiter = _allocate_lock()
        waiter.acquire()
        batch.waiters.append(waiter)
        return batch, waiter, len(batch.waiters)

    def _wait(self, joined: tuple[Batch, Any, int]) -> None:
        """Return once the lines ``_join`` queued are durable; raise if their group failed."""
        batch, waiter, after = joined
        interrupted: BaseException | None = None
        while True:  # released when the batch is settled, or when it is ours to lead
            try:
                waiter.acquire()
                break
            except BaseException as exc:  # KeyboardInterrupt: others depend on our part
                interrupted = interrupted or exc
        if batch.leader is waiter:
            self._lead_open(batch)
        elif after < len(batch.waiters):  # no one joins a settled batch: no mutex needed
            batch.waiters[after].release()  # wake the next member (see settle_batch)
        error = batch.error
        if interrupted is not None:
            raise interrupted
        if error is not None:
            raise error

    def _lead_open(self, batch: Batch) -> None:
        """Close the open ``batch`` (everything queued until now is in it) and flush it."""
        with self._mutex:
            self._open = None
        self._lead(batch, batch.parts)

    def _lead(self, batch: Batch | None, parts: Parts) -> SpoolWriteError | None:
        """Write and sync ``parts`` (the caller holds the flushing job), pass the job on to the
        next batch, then settle ``batch`` (``None`` for a lone appender's own lines).

        Returns the error the group failed with (also set on ``batch``), or None."""
        try:
            self._file.write(parts, sum(map(len, parts)), self._closing)
        except BaseException as exc:
            return self._lead_failed(batch, exc)
        mutex = self._mutex
        mutex.acquire()  # not ``with``: about half the cost, on every flush
        try:
            queued = self._open
            if queued is None:  # the chain ends
                self._flushing = False
                if self._closers:
                    self._idle.notify_all()
            else:
                successor = queued.leader = queued.waiters[0] if queued.waiters else True
        finally:
            mutex.release()
        if queued is not None:
            if successor is True:  # only async callers queued: a helper thread leads them
                self._start_helper(self._lead_open, queued)
            else:
                successor.release()
        if batch is not None:
            settle_batch(batch)
        return None

    def _lead_failed(self, batch: Batch | None, exc: BaseException) -> SpoolWriteError:
        """:meth:`_lead` once its flush raised ``exc``: the writer is broken for good, and the
        group and everything queued behind it fail with the error (raised again when it
        was not a disk error: what reached the disk is unknown)."""
        if isinstance(exc, OSError):
            failure, unexpected = exc, None
        else:
            failure, unexpected = OSError(f"flush interrupted by {type(exc).__name__}: {exc}"), exc
        error = self._write_error(failure)
        with self._mutex:
            queued = self._open
            self._failure = failure
            self._release()
            # The chain ends. A failure fails what is queued too: it can never be written.
            self._open = None
            self._flushing = False
            if self._closers:
                self._idle.notify_all()
        if queued is not None:
            queued.error = error
            settle_batch(queued)
        if batch is not None:
            batch.error = error
            settle_batch(batch)
        if unexpected is not None:
            raise unexpected
        return error

    def _write_error(self, failure: OSError) -> SpoolWriteError:
        if isinstance(failure, SegmentGoneError):
            return failure
        error = SpoolWriteError(f"{self._path}: append not durable, segment closed: {failure}")
        error.errno = failure.errno
        return error

    def _start_helper(self, target: Any, *args: Any) -> None:
        """Hand a flush to the writer's helper thread (started on first use).

        One long-lived thread rather than one per flush: starting a thread costs more than
        syncing a small group, and the helper hands itself the next group without a wake-up.
        At most one flush runs at a time (``_flushing``), so the queue never holds more
        than one job.
        """
        jobs = self._jobs
        if jobs is None:
            with self._mutex:
                jobs = self._jobs
                if jobs is None:
                    jobs = self._jobs = queue.SimpleQueue()
                    threading.Thread(target=helper_loop, args=(jobs,), name=self._thread_name,
                                     daemon=True).start()
                    weakref.finalize(self, jobs.put, None)  # dropped without close: let it go
        jobs.put((target, args))

    def _release(self) -> None:
        """Let the helper thread go and close the file (mutex held)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None
        # After a disk error what is in the file is unknown: its padding is left as it is.
        self._file.close(cut=self._failure is None)
