"""The local platform's writes, committed in groups: one fsync for the writers that queued.

Why: every write is fsync'd before its answer (``synchronous=FULL``, store.py says why),
and SQLite holds its write lock through that fsync, so concurrent requests (a sync's jobs)
each waited for a whole commit, fsync included, of every request ahead of them: the
platform's CPU a run was a third fsyncs (docs/benchmarks.md, the first sync's floor). A
database server commits concurrent transactions together; so does this one. The writers
take turns on one connection: each runs in a savepoint of the open transaction, and the
last of those that queued behind each other commits them all, once; every one of them is
answered only after that commit, so an answer still promises only what is on disk.

A write that fails is taken back to its savepoint, the others' kept. A commit that fails
fails every write of its group (none is answered as stored). A group whose request outlived
its deadline (``write_deadline``) is not committed: nothing of it is written, and each of
its writes is refused as that one is.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prime_runs_spool.errors import DeadlineExceeded

#: At most this many writes wait for one commit: each is answered only after it.
MAX_GROUP = 16

DEADLINE_MESSAGE = "the request outlived its deadline; nothing was written"


class _Group:
    """The writes of one open transaction, and how its commit went."""

    def __init__(self) -> None:
        self.writes = 0
        self.deadline = float("inf")  # the earliest of its writes' deadlines
        self.error: BaseException | None = None
        self.done = threading.Event()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()

    def outcome(self) -> None:
        """Once the group is committed: nothing; else its error, raised anew in this thread."""
        self.done.wait()
        error = self.error
        if error is None:
            return
        if isinstance(error, DeadlineExceeded):
            raise DeadlineExceeded(DEADLINE_MESSAGE)
        try:
            copy = type(error)(*error.args)
        except Exception:  # an exception that cannot be made again from its args
            copy = sqlite3.OperationalError(str(error))
        raise copy


class GroupCommit:
    """Write transactions of one process on ``connection``, committed in groups."""

    def __init__(self, connection: Callable[[], sqlite3.Connection], timeout: float,
                 deadline: Callable[[], float | None]) -> None:
        self._connect = connection
        self._conn: sqlite3.Connection | None = None
        self._timeout = timeout
        self._deadline = deadline
        self._turn = threading.Condition(threading.Lock())
        self._busy = False  # a writer holds the turn
        self._queued = 0  # writers waiting for it
        self._group: _Group | None = None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write, in a savepoint of the group's transaction; returns once committed."""
        group, conn = self._take_turn()
        try:
            deadline = None
            try:
                conn.execute("SAVEPOINT write")
                yield conn
                deadline = self._deadline()
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded(DEADLINE_MESSAGE)
                conn.execute("RELEASE write")
            except BaseException as exc:
                self._undo(conn, group, exc)
                raise
            group.writes += 1
            if deadline is not None:
                group.deadline = min(group.deadline, deadline)
        finally:
            self._end_turn()
        group.outcome()

    def _take_turn(self) -> tuple[_Group, sqlite3.Connection]:
        """The turn (writers queue for it in this process: SQLite's busy handler sleeps,
        docs/benchmarks.md), and the group's transaction, begun if none is open."""
        with self._turn:
            self._queued += 1
            try:
                free = self._turn.wait_for(lambda: not self._busy, self._timeout)
            finally:
                self._queued -= 1
            if not free:
                raise sqlite3.OperationalError("database is locked")
            self._busy = True
        try:
            if self._conn is None:
                self._conn = self._connect()
            if self._group is None:
                self._conn.execute("BEGIN IMMEDIATE")
                self._group = _Group()
            return self._group, self._conn
        except BaseException:
            self._release()
            raise

    def _undo(self, conn: sqlite3.Connection, group: _Group, error: BaseException) -> None:
        """A failed write taken back to its savepoint; where SQLite rolled the whole
        transaction back (or cannot take this one back), the group fails with it."""
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK TO write")
                conn.execute("RELEASE write")
                return
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        self._group = None
        group.fail(error)

    def _end_turn(self) -> None:
        """The turn handed to the next writer queued, the group left open for it; else the
        group committed (the turn held meanwhile: no write joins a commit under way)."""
        with self._turn:
            group = self._group
            if group is not None and self._queued and group.writes < MAX_GROUP:
                self._busy = False
                self._turn.notify()
                return
            self._group = None
        try:
            if group is not None:
                self._commit(group)
        finally:
            self._release()

    def _commit(self, group: _Group) -> None:
        conn = self._conn
        assert conn is not None
        try:
            if group.writes == 0:
                conn.execute("ROLLBACK")
            elif time.monotonic() > group.deadline:  # one of its requests outlived its deadline
                conn.execute("ROLLBACK")
                group.error = DeadlineExceeded(DEADLINE_MESSAGE)
            else:
                conn.execute("COMMIT")
        except BaseException as exc:
            group.error = exc
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        finally:
            group.done.set()

    def _release(self) -> None:
        with self._turn:
            self._busy = False
            self._turn.notify()
