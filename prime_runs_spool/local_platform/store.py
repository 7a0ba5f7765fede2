"""Durable state of the local platform, in one SQLite database.

Why SQLite in WAL mode with ``synchronous=FULL``: the platform must survive a restart
between a sync's requests and must never acknowledge a write it could lose, because sync's
exactly-once checks read back what the platform says it holds (``NORMAL`` survives a
killed server but not a power cut; docs/local-platform.md says why FULL and what it costs).
WAL lets readers run
while a writer commits; every write is a savepoint of one ``BEGIN IMMEDIATE`` transaction
that the writes queued behind it share, committed once for all (group_commit.py), and every
read that needs two facts (a page of samples and their total) reads them from one snapshot.
Writers in other processes meet in the database.

Reads have a connection per thread (the ASGI app runs store calls in a thread pool), so
they proceed in parallel; the writes share one, taking turns.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from contextvars import ContextVar
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.errors import AlreadyClosed, NotFound, PlatformDatabaseError
from prime_runs_spool.files import make_private, open_private
from prime_runs_spool.local_platform.group_commit import GroupCommit


#: The files SQLite keeps beside a database in WAL mode.
SQLITE_SIDECAR_SUFFIXES = ("-wal", "-shm")


def private_database(path: str | os.PathLike[str]) -> None:
    """Make sure an SQLite database and its WAL sidecars are ``0600`` before SQLite opens
    them: SQLite creates the sidecars with the database file's mode, so creating the
    database ``0600`` first is enough for new files; existing ones are tightened."""
    os.close(open_private(path, os.O_RDWR))
    for suffix in SQLITE_SIDECAR_SUFFIXES:
        sidecar = f"{os.fspath(path)}{suffix}"
        try:
            make_private(sidecar)
        except OSError:
            pass

#: When set (a ``time.monotonic()`` value), no write commits after it: the request that
#: asked for the write has outlived its deadline (``--request-deadline``). It makes the
#: sync protocol's assumption, that a request cannot land later than its lifetime after
#: it was sent, true of this platform by construction (docs/local-platform.md).
write_deadline: ContextVar[float | None] = ContextVar("write_deadline", default=None)


#: Owner given to an environment resolved without ``owner/`` in its name and without a team.
DEFAULT_OWNER = "local"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS environments (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    team_id TEXT,
    created_at TEXT NOT NULL,
    UNIQUE (owner, name)
);
CREATE TABLE IF NOT EXISTS evaluations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    model_name TEXT,
    dataset TEXT,
    framework TEXT,
    description TEXT,
    team_id TEXT,
    environments TEXT NOT NULL,
    tags TEXT NOT NULL,
    metadata TEXT NOT NULL,
    metrics TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    finalized_at TEXT,
    finalize_count INTEGER NOT NULL DEFAULT 0,
    total_samples INTEGER NOT NULL DEFAULT 0,
    error_message TEXT
);
CREATE TABLE IF NOT EXISTS evaluation_environments (
    evaluation_id TEXT NOT NULL,
    environment_id TEXT NOT NULL,
    PRIMARY KEY (evaluation_id, environment_id)
);
CREATE TABLE IF NOT EXISTS samples (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    evaluation_id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_evaluation ON samples (evaluation_id, seq);
"""

_EVALUATION_COLUMNS = (
    "id, name, model_name, dataset, framework, description, team_id, environments, tags, "
    "metadata, metrics, status, created_at, updated_at, finalized_at, finalize_count, "
    "total_samples, error_message"
)
#: The statuses a producer may close an evaluation out with (``PUT /evaluations/{id}``).
CLOSING_STATUSES = ("FAILED", "CANCELLED")
#: Statuses after which a status update is refused with 409, as the platform's status guard does.
CLOSED_STATUSES = ("COMPLETED", "FAILED", "CANCELLED")
#: The platform keeps at most this many characters of ``error_message``.
ERROR_MESSAGE_MAX_CHARS = 4096


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


#: Seconds a write waits for the database's write lock (SQLite's busy timeout, and the
#: queue of this process's own writers) before it fails as SQLite's would, "database is locked".
BUSY_TIMEOUT = 60.0


class Store:
    """The platform's evaluations, environments and samples, in SQLite at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._writes = GroupCommit(lambda: self._connect(), BUSY_TIMEOUT, write_deadline.get)  # _write
        try:
            private_database(self.path)  # it holds episodes and errors: 0600, like the spool
            self._conn().executescript(_SCHEMA)
            self._add_missing_columns()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise PlatformDatabaseError(f"cannot open database {self.path}: {exc}") from None

    def _add_missing_columns(self) -> None:
        """A database written before ``error_message`` existed gets the column (NULL)."""
        conn = self._conn()
        columns = {row[1] for row in conn.execute("PRAGMA table_info(evaluations)")}
        if "error_message" not in columns:
            conn.execute("ALTER TABLE evaluations ADD COLUMN error_message TEXT")

    # -- connections -------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, for reads (and the schema)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
        with self._lock:
            self._all.append(conn)
        return conn

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction, committed with the writes queued behind it, answered once
        committed (group_commit.py says why). This process's writers take turns before
        SQLite's lock: its busy handler waits for a held write lock by sleeping (1, 2, 5, 10
        ms and longer), so with several requests at once the lock sat free while its waiters
        slept (docs/benchmarks.md)."""
        return self._writes.write()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read snapshot, so facts read together agree with each other."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close every thread's connection (called once the server has stopped)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()

    # -- environments ------------------------------------------------------------------

    def resolve_environment(self, name: str, team_id: str | None) -> dict[str, Any]:
        """Get or create the environment ``owner/name`` (owner: the team, else ``local``)."""
        owner, _, short = name.rpartition("/")
        owner = owner or team_id or DEFAULT_OWNER
        with self._write() as conn:
            row = conn.execute(
                "SELECT id, owner, name, team_id, created_at FROM environments"
                " WHERE owner = ? AND name = ?",
                (owner, short),
            ).fetchone()
            if row is None:
                row = (str(uuid.uuid4()), owner, short, team_id, _now())
                conn.execute("INSERT INTO environments VALUES (?, ?, ?, ?, ?)", row)
        return _environment(row)

    def get_environment(self, owner: str, name: str) -> dict[str, Any]:
        with self._read() as conn:
            row = conn.execute(
                "SELECT id, owner, name, team_id, created_at FROM environments"
                " WHERE owner = ? AND name = ?",
                (owner, name),
            ).fetchone()
        if row is None:
            raise NotFound(f"environment {owner}/{name} not found")
        return _environment(row)

    # -- evaluations -------------------------------------------------------------------

    def create_evaluation(
        self,
        *,
        name: str,
        environments: list[dict[str, Any]],
        tags: list[str],
        model_name: str | None = None,
        dataset: str | None = None,
        framework: str | None = None,
        description: str | None = None,
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        team_id: str | None = None,
    ) -> dict[str, Any]:
        """Insert a new evaluation; every call creates one, as the real platform does."""
        evaluation_id = str(uuid.uuid4())
        now = _now()
        with self._write() as conn:
            for env in environments:
                found = conn.execute(
                    "SELECT 1 FROM environments WHERE id = ?", (env["id"],)
                ).fetchone()
                if found is None:
                    raise NotFound(f"environment {env['id']} not found")
            conn.execute(
                "INSERT INTO evaluations (id, name, model_name, dataset, framework,"
                " description, team_id, environments, tags, metadata, metrics, status,"
                " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,'RUNNING',?,?)",
                (
                    evaluation_id, name, model_name, dataset, framework, description,
                    team_id, _json(environments), _json(tags), _json(metadata or {}),
                    _json(metrics or {}), now, now,
                ),
            )
            conn.executemany(
                "INSERT OR IGNORE INTO evaluation_environments VALUES (?, ?)",
                [(evaluation_id, env["id"]) for env in environments],
            )
            return self._evaluation(conn, evaluation_id)

    def append_samples(self, evaluation_id: str, bodies: list[str]) -> dict[str, Any]:
        """Append sample rows (JSON texts) in order. No deduplication, by design."""
        with self._write() as conn:
            self._require(conn, evaluation_id)
            conn.executemany(
                "INSERT INTO samples (evaluation_id, body) VALUES (?, ?)",
                [(evaluation_id, body) for body in bodies],
            )
            conn.execute(
                "UPDATE evaluations SET total_samples = total_samples + ?, updated_at = ?"
                " WHERE id = ?",
                (len(bodies), _now(), evaluation_id),
            )
            return self._evaluation(conn, evaluation_id)

    def update_evaluation(
        self,
        evaluation_id: str,
        *,
        metadata: dict[str, Any] | None,
        metrics: dict[str, Any] | None,
        status: str | None = None,
        error_message: str | None = None,
    ) -> dict[str, Any]:
        """Replace ``metadata`` and/or ``metrics`` whole (a field left out is kept).

        ``status`` (``FAILED`` or ``CANCELLED``, checked by the app) closes the evaluation
        out, with ``error_message`` capped at 4,096 characters. An evaluation already
        closed refuses the whole update (:class:`AlreadyClosed`, a 409), nothing written,
        as the platform's status guard does; finalizing it later is still accepted (a
        resumed run that completes).
        """
        with self._write() as conn:
            (current,) = self._require(conn, evaluation_id, "status")
            if status is not None:
                if current in CLOSED_STATUSES:
                    raise AlreadyClosed(f"evaluation {evaluation_id} is already {current}")
                conn.execute(
                    "UPDATE evaluations SET status = ?, error_message = ? WHERE id = ?",
                    (status, None if error_message is None else error_message[:ERROR_MESSAGE_MAX_CHARS],
                     evaluation_id),
                )
            if metadata is not None:
                conn.execute(
                    "UPDATE evaluations SET metadata = ? WHERE id = ?",
                    (_json(metadata), evaluation_id),
                )
            if metrics is not None:
                conn.execute(
                    "UPDATE evaluations SET metrics = ? WHERE id = ?",
                    (_json(metrics), evaluation_id),
                )
            conn.execute(
                "UPDATE evaluations SET updated_at = ? WHERE id = ?", (_now(), evaluation_id)
            )
            return self._evaluation(conn, evaluation_id)

    def finalize(self, evaluation_id: str, metrics: dict[str, Any]) -> dict[str, Any]:
        """Mark COMPLETED and merge ``metrics`` in; a repeat is counted, never refused.

        A completed evaluation has no ``error_message``: one a closed-out attempt left (a
        cancelled run resumed to completion) is cleared, not shown beside COMPLETED.

        ``finalize_count`` stands in for the statistics job the real platform enqueues on
        every finalize: tests assert it is exactly one after a sync.
        """
        with self._write() as conn:
            row = self._require(conn, evaluation_id)
            merged = {**orjson.loads(row[0]), **metrics}
            now = _now()
            conn.execute(
                "UPDATE evaluations SET status = 'COMPLETED', error_message = NULL, metrics = ?,"
                " finalized_at = ?, updated_at = ?, finalize_count = finalize_count + 1 WHERE id = ?",
                (_json(merged), now, now, evaluation_id),
            )
            return self._evaluation(conn, evaluation_id)

    def get_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        with self._read() as conn:
            return self._evaluation(conn, evaluation_id)

    def list_evaluations(
        self,
        *,
        skip: int,
        limit: int,
        environment_name: str | None = None,
        team_id: str | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of evaluations, newest first, and how many match in all."""
        where, args = ["1 = 1"], []
        if environment_name is not None:
            # Per evaluation, one lookup in evaluation_environments' key: a page newest first
            # reads only its own rows, where "id IN (every evaluation of the environment)"
            # built that whole list for every page (2 ms a page at 2,000 evaluations, and a
            # sync of 2,000 new runs reads the head of the listing once or twice a run).
            where.append(
                "EXISTS (SELECT 1 FROM evaluation_environments ee WHERE ee.evaluation_id = evaluations.id"
                " AND ee.environment_id IN (SELECT e.id FROM environments e"
                " WHERE e.name = ? OR e.owner || '/' || e.name = ?))"
            )
            args += [environment_name, environment_name]
        if team_id is not None:
            where.append("team_id = ?")
            args.append(team_id)
        clause = " AND ".join(where)
        with self._read() as conn:
            (total,) = conn.execute(
                f"SELECT COUNT(*) FROM evaluations WHERE {clause}", args
            ).fetchone()
            rows = conn.execute(
                f"SELECT {_EVALUATION_COLUMNS} FROM evaluations WHERE {clause}"
                " ORDER BY seq DESC LIMIT ? OFFSET ?",
                [*args, limit, skip],
            ).fetchall()
        return [_evaluation(row) for row in rows], total

    def list_samples(
        self, evaluation_id: str, *, offset: int, limit: int
    ) -> tuple[list[str], int]:
        """A slice of an evaluation's sample rows (JSON texts, insertion order) and the total."""
        with self._read() as conn:
            (total,) = self._require(conn, evaluation_id, "total_samples")
            rows = conn.execute(
                "SELECT body FROM samples WHERE evaluation_id = ? ORDER BY seq LIMIT ? OFFSET ?",
                (evaluation_id, limit, offset),
            ).fetchall()
        return [body for (body,) in rows], total

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _require(
        conn: sqlite3.Connection, evaluation_id: str, column: str = "metrics"
    ) -> tuple[Any, ...]:
        row = conn.execute(
            f"SELECT {column} FROM evaluations WHERE id = ?", (evaluation_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"evaluation {evaluation_id} not found")
        return row

    @staticmethod
    def _evaluation(conn: sqlite3.Connection, evaluation_id: str) -> dict[str, Any]:
        row = conn.execute(
            f"SELECT {_EVALUATION_COLUMNS} FROM evaluations WHERE id = ?", (evaluation_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"evaluation {evaluation_id} not found")
        return _evaluation(row)


def _environment(row: tuple[Any, ...]) -> dict[str, Any]:
    env_id, owner, name, team_id, created_at = row
    return {
        "id": env_id,
        "owner": owner,
        "name": name,
        "full_name": f"{owner}/{name}",
        "team_id": team_id,
        "created_at": created_at,
    }


def _evaluation(row: tuple[Any, ...]) -> dict[str, Any]:
    (
        evaluation_id, name, model_name, dataset, framework, description, team_id,
        environments, tags, metadata, metrics, status, created_at, updated_at,
        finalized_at, finalize_count, total_samples, error_message,
    ) = row
    return {
        "evaluation_id": evaluation_id,
        "id": evaluation_id,
        "name": name,
        "model_name": model_name,
        "dataset": dataset,
        "framework": framework,
        "description": description,
        "team_id": team_id,
        "environments": orjson.loads(environments),
        "tags": orjson.loads(tags),
        "metadata": orjson.loads(metadata),
        "metrics": orjson.loads(metrics),
        "status": status,
        "created_at": created_at,
        "updated_at": updated_at,
        "finalized_at": finalized_at,
        "finalize_count": finalize_count,
        "total_samples": total_samples,
        "error_message": error_message,
    }
