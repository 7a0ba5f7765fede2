"""The local platform's Prime Traces service: content-addressed uploads, and the reads the
`prime-traces` client, prime-runs and the dashboard use (docs/local-platform.md, "Prime Traces").

Faithful where the exactly-once proofs need it to be:

- **Content addressing.** ``Idempotency-Key: sha256:<hex>`` must be the SHA-256 of the
  uncompressed JSONL bytes (``digest_mismatch`` otherwise, so a different body under a
  known key is refused). A key already committed replays its receipt and stores nothing;
  the same bytes under another ``X-Prime-Line-Format`` are a 409 ``line_format_conflict``.
- **Whole or nothing.** An upload is validated completely, then stored in one transaction;
  a rejection (400) stores nothing, and validation reads only the bytes, so the same bytes
  always get the same verdict.
- **Copies, not duplicates.** An id twice in one upload is refused (``duplicate_episode_id``,
  ``duplicate_trace_id``). An id already stored by an earlier upload is accepted as a new
  copy (``generation`` + 1) that becomes the current one: reads list each id once, its
  newest copy, and every copy is kept and counted (``copies``) so a test can tell a second
  upload of one episode from none.
- **Off for an account.** Started without traces, every route answers 403
  ``service_not_enabled``, as the service does for an account that has Prime Traces off.

This module is the store: what an upload stores and what a read returns. The routes that
answer over HTTP are local_platform/traces_routes.py.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import orjson
from prime_traces import ErrorCode

from prime_runs_spool.content.episodes import trace_reward
from prime_runs_spool.errors import TracesRejected
from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.platform_api.traces import (
    EPISODE_LINES,
    IDEMPOTENCY_HEADER,
    KEY_PREFIX,
    MAX_BATCH_BYTES,
    MAX_LINE_BYTES,
    SCHEMA_VERSION,
)

_KEY = re.compile(r"sha256:[0-9a-f]{64}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trace_uploads (
    upload_id TEXT PRIMARY KEY,
    line_format TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    context TEXT NOT NULL,
    lines INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    replays INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS trace_episodes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id TEXT NOT NULL,
    upload_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    current INTEGER NOT NULL,
    run_id TEXT,
    summary TEXT NOT NULL,
    envelope TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trace_episodes_by_id ON trace_episodes (episode_id, current);
CREATE INDEX IF NOT EXISTS trace_episodes_by_run ON trace_episodes (run_id, current);
CREATE TABLE IF NOT EXISTS trace_docs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id TEXT NOT NULL,
    episode_id TEXT,
    upload_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    current INTEGER NOT NULL,
    run_id TEXT,
    summary TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trace_docs_by_id ON trace_docs (trace_id, current);
CREATE INDEX IF NOT EXISTS trace_docs_by_run ON trace_docs (run_id, current);
CREATE INDEX IF NOT EXISTS trace_docs_by_episode ON trace_docs (episode_id, current);
"""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _iso(epoch: Any, default: str) -> str:
    if isinstance(epoch, (int, float)) and not isinstance(epoch, bool):
        return datetime.fromtimestamp(float(epoch), timezone.utc).isoformat()
    return default


# -- what a stored document says about itself ----------------------------------------------


def _trace_summary(trace: Mapping[str, Any], episode: Mapping[str, Any] | None, upload_id: str,
                   context: Mapping[str, str], ingested_at: str, size: int) -> dict[str, Any]:
    """The service's extracted columns for one trace, from a verifiers trace document."""
    agent = trace.get("agent") if isinstance(trace.get("agent"), Mapping) else {}
    config = agent.get("config") if isinstance(agent.get("config"), Mapping) else {}
    task = trace.get("task") if isinstance(trace.get("task"), Mapping) else {}
    data = task.get("data") if isinstance(task.get("data"), Mapping) else {}
    timing = trace.get("timing") if isinstance(trace.get("timing"), Mapping) else {}
    run = trace.get("run") if isinstance(trace.get("run"), Mapping) else {}
    env = (episode or trace).get("env")
    start, end = timing.get("start"), timing.get("end")
    tokens = 0
    for call in trace.get("calls") or ():
        usage = call.get("usage") if isinstance(call, Mapping) else None
        if isinstance(usage, Mapping):
            tokens += int(usage.get("total_tokens") or
                          (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0))
    reward = trace_reward(trace)
    duration = (end - start) * 1000 if isinstance(start, (int, float)) and isinstance(end, (int, float)) else 0
    return {
        "trace_id": str(trace.get("id")),
        "upload_id": upload_id,
        "episode_id": None if episode is None else str(episode.get("id")),
        "created_at": _iso(start, ingested_at),
        "ingested_at": ingested_at,
        "run_id": None if run.get("id") is None else str(run.get("id")),
        "environment_id": env.get("id") if isinstance(env, Mapping) else None,
        "model": {"provider": None, "id": config.get("model")},
        "task_id": None if data.get("idx") is None else str(data.get("idx")),
        "agent_name": agent.get("name"),
        "score": {"reward": reward if isinstance(reward, (int, float)) else None, "outcome": None},
        "execution": {"has_error": bool(trace.get("errors")) or trace.get("ok") is False,
                      "is_truncated": bool(trace.get("is_truncated"))},
        "duration_ms": int(max(0, duration)),
        "total_tokens": tokens,
        "size_bytes": size,
        "context": dict(context),
    }


def _episode_summary(episode: Mapping[str, Any], traces: list[dict[str, Any]], upload_id: str,
                     ingested_at: str) -> dict[str, Any]:
    errors = episode.get("errors") or []
    first = errors[0] if errors and isinstance(errors[0], Mapping) else {}
    run = episode.get("run") if isinstance(episode.get("run"), Mapping) else {}
    env = episode.get("env") if isinstance(episode.get("env"), Mapping) else {}
    created = min((t["created_at"] for t in traces), default=ingested_at)
    return {
        "episode_id": str(episode.get("id")),
        "upload_id": upload_id,
        "schema_version": SCHEMA_VERSION,
        "created_at": created,
        "ingested_at": ingested_at,
        "run_id": None if run.get("id") is None else str(run.get("id")),
        "environment_id": env.get("id"),
        "outcome": None,
        "has_error": bool(errors) or episode.get("ok") is False,
        "error": {"type": first.get("type"), "message": first.get("message")},
    }


# -- the upload ------------------------------------------------------------------------------


def _gunzip(data: bytes) -> bytes:
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(data, MAX_BATCH_BYTES + 1)
    except zlib.error:
        raise TracesRejected(400, ErrorCode.MALFORMED_ENCODING, "traces.jsonl is not valid gzip") from None
    if len(out) > MAX_BATCH_BYTES or inflate.unconsumed_tail:
        raise TracesRejected(400, ErrorCode.UPLOAD_TOO_LARGE, f"over {MAX_BATCH_BYTES} uncompressed bytes")
    return out


def _metadata(raw: bytes | None) -> tuple[int, dict[str, str]]:
    if raw is None:
        raise TracesRejected(400, ErrorCode.INVALID_METADATA, "the metadata part is missing")
    try:
        metadata = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise TracesRejected(400, ErrorCode.INVALID_METADATA, "the metadata part is not JSON") from None
    context = metadata.get("context") or {} if isinstance(metadata, dict) else None
    if not isinstance(metadata, dict) or not isinstance(context, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in context.items()):
        raise TracesRejected(400, ErrorCode.INVALID_METADATA, "metadata must be {schema_version, context: {str: str}}")
    if metadata.get("schema_version") != SCHEMA_VERSION:
        raise TracesRejected(400, ErrorCode.UNSUPPORTED_SCHEMA_VERSION,
                       f"schema_version {metadata.get('schema_version')!r} is not supported")
    return SCHEMA_VERSION, context


def _parse_lines(data: bytes, line_format: str) -> list[tuple[Mapping[str, Any] | None, list[Any]]]:
    """Every line as (its episode, its traces), validated whole: the same bytes always get
    the same verdict, and nothing is stored unless every line passes."""
    parsed = []
    episodes: set[str] = set()
    traces: set[str] = set()
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise TracesRejected(400, ErrorCode.TRACE_TOO_LARGE, f"line {number} is over {MAX_LINE_BYTES} bytes")
        try:
            document = orjson.loads(line)
        except orjson.JSONDecodeError:
            code = ErrorCode.INVALID_TRACE
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                code = ErrorCode.MALFORMED_ENCODING
            raise TracesRejected(400, code, f"line {number} is not a JSON document") from None
        if not isinstance(document, dict) or document.get("id") is None:
            raise TracesRejected(400, ErrorCode.INVALID_TRACE, f"line {number} has no id")
        if line_format == EPISODE_LINES.value:
            members = document.get("traces")
            if not isinstance(members, list) or not all(isinstance(m, dict) and m.get("id") is not None
                                                        for m in members):
                raise TracesRejected(400, ErrorCode.INVALID_TRACE, f"line {number}: traces must be trace documents")
            episode_id = str(document["id"])
            if episode_id in episodes:
                raise TracesRejected(400, ErrorCode.DUPLICATE_EPISODE_ID, f"episode {episode_id} twice in one upload")
            episodes.add(episode_id)
            parsed.append((document, members))
        else:
            parsed.append((None, [document]))
        for trace in parsed[-1][1]:
            if str(trace["id"]) in traces:
                raise TracesRejected(400, ErrorCode.DUPLICATE_TRACE_ID, f"trace {trace['id']} twice in one upload")
            traces.add(str(trace["id"]))
    return parsed


class TracesStore:
    """The service's uploads, episodes and traces, in the local platform's database."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # The same connections, transactions and write deadline as the evaluations' tables.
        store._conn().executescript(_SCHEMA)

    def upload(self, key: str, line_format: str, metadata: bytes | None,
               traces: tuple[dict[str, str], bytes] | None) -> tuple[dict[str, Any], bool]:
        """Commit one upload (or replay it): (the receipt, whether it was new)."""
        if not _KEY.fullmatch(key or ""):
            raise TracesRejected(400, ErrorCode.INVALID_IDEMPOTENCY_KEY, f"{IDEMPOTENCY_HEADER} must be sha256:<64 hex>")
        if traces is None:
            raise TracesRejected(400, ErrorCode.INVALID_TRACE, "the traces part is missing")
        headers, data = traces
        if headers.get("content-encoding", "").lower() == "gzip":
            data = _gunzip(data)
        elif len(data) > MAX_BATCH_BYTES:
            raise TracesRejected(400, ErrorCode.UPLOAD_TOO_LARGE, f"over {MAX_BATCH_BYTES} bytes")
        digest = hashlib.sha256(data).hexdigest()
        if key != KEY_PREFIX + digest:
            raise TracesRejected(400, ErrorCode.DIGEST_MISMATCH, "the body's SHA-256 is not its idempotency key")
        schema_version, context = _metadata(metadata)
        receipt = {"upload_id": digest, "status": "committed"}
        if self._replayed(digest, line_format):
            return receipt, False
        parsed = _parse_lines(data, line_format)
        now = _now()
        with self.store._write() as conn:
            if self._known(conn, digest, line_format):  # committed meanwhile by a racing request
                conn.execute("UPDATE trace_uploads SET replays = replays + 1 WHERE upload_id = ?", (digest,))
                return receipt, False
            for episode, members in parsed:
                summaries = []
                for trace in members:
                    body = orjson.dumps(trace)
                    summary = _trace_summary(trace, episode, digest, context, now, len(body))
                    summaries.append(summary)
                    self._insert(conn, "trace_docs", "trace_id", summary["trace_id"], digest,
                                 summary["run_id"], summary, body.decode(), episode=summary["episode_id"])
                if episode is not None:
                    summary = _episode_summary(episode, summaries, digest, now)
                    envelope = {**episode, "traces": [s["trace_id"] for s in summaries]}
                    self._insert(conn, "trace_episodes", "episode_id", summary["episode_id"], digest,
                                 summary["run_id"], summary, orjson.dumps(envelope).decode())
            conn.execute("INSERT INTO trace_uploads VALUES (?,?,?,?,?,?,?,0)",
                         (digest, line_format, schema_version, orjson.dumps(context).decode(),
                          len(parsed), len(data), now))
        return receipt, True

    def _replayed(self, digest: str, line_format: str) -> bool:
        with self.store._write() as conn:
            if not self._known(conn, digest, line_format):
                return False
            conn.execute("UPDATE trace_uploads SET replays = replays + 1 WHERE upload_id = ?", (digest,))
            return True

    @staticmethod
    def _known(conn: Any, digest: str, line_format: str) -> bool:
        row = conn.execute("SELECT line_format FROM trace_uploads WHERE upload_id = ?", (digest,)).fetchone()
        if row is not None and row[0] != line_format:
            raise TracesRejected(409, ErrorCode.LINE_FORMAT_CONFLICT,
                           f"these bytes were uploaded as {row[0]!r} lines, not {line_format!r}")
        return row is not None

    @staticmethod
    def _insert(conn: Any, table: str, id_column: str, item_id: str, upload_id: str, run_id: str | None,
                summary: dict[str, Any], body: str, episode: str | None = None) -> None:
        (generation,) = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {id_column} = ?", (item_id,)).fetchone()
        conn.execute(f"UPDATE {table} SET current = 0 WHERE {id_column} = ? AND current = 1", (item_id,))
        summary["generation"] = generation + 1
        columns = "episode_id, " if table == "trace_docs" else ""
        values = (episode,) if table == "trace_docs" else ()
        conn.execute(
            f"INSERT INTO {table} ({id_column}, {columns}upload_id, generation, current, run_id, summary, "
            f"{'body' if table == 'trace_docs' else 'envelope'}) VALUES (?, {'?, ' * len(values)}?, ?, 1, ?, ?, ?)",
            (item_id, *values, upload_id, generation + 1, run_id, orjson.dumps(summary).decode(), body))

    # -- reads ---------------------------------------------------------------------------

    def page(self, table: str, where: dict[str, Any], uploads: list[str], offset: int,
             limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Current copies matching ``where`` (and any of ``uploads``), newest first."""
        clause, args = ["current = 1"], []
        for column, value in where.items():
            clause.append(f"{column} = ?")
            args.append(value)
        if uploads:
            clause.append(f"upload_id IN ({','.join('?' * len(uploads))})")
            args += uploads
        with self.store._read() as conn:
            rows = conn.execute(f"SELECT summary FROM {table} WHERE {' AND '.join(clause)}"
                                " ORDER BY seq DESC LIMIT ? OFFSET ?", [*args, limit + 1, offset]).fetchall()
        return [orjson.loads(summary) for (summary,) in rows[:limit]], len(rows) > limit

    def one(self, table: str, id_column: str, item_id: str) -> tuple[dict[str, Any], str] | None:
        body = "body" if table == "trace_docs" else "envelope"
        with self.store._read() as conn:
            row = conn.execute(f"SELECT summary, {body} FROM {table} WHERE {id_column} = ? AND current = 1",
                               (item_id,)).fetchone()
        return None if row is None else (orjson.loads(row[0]), row[1])

    def run_traces(self, run_id: str | None = None) -> list[dict[str, Any]]:
        with self.store._read() as conn:
            if run_id is None:
                rows = conn.execute("SELECT summary FROM trace_docs WHERE current = 1 ORDER BY seq").fetchall()
            else:
                rows = conn.execute("SELECT summary FROM trace_docs WHERE current = 1 AND run_id = ? ORDER BY seq",
                                    (run_id,)).fetchall()
        return [orjson.loads(summary) for (summary,) in rows]

    def counts(self, run_id: str) -> dict[str, int]:
        """What one run holds, for the dashboard and the tests: current episodes and traces,
        and every stored copy of them (a copy beyond one per id means a second upload)."""
        with self.store._read() as conn:
            episodes, copies = conn.execute(
                "SELECT COALESCE(SUM(current), 0), COUNT(*) FROM trace_episodes WHERE run_id = ?",
                (run_id,)).fetchone()
            (traces,) = conn.execute("SELECT COUNT(*) FROM trace_docs WHERE current = 1 AND run_id = ?",
                                     (run_id,)).fetchone()
            uploads = conn.execute("SELECT COUNT(DISTINCT upload_id) FROM trace_episodes WHERE run_id = ?",
                                   (run_id,)).fetchone()[0]
        return {"episodes": episodes, "episode_copies": copies, "traces": traces, "uploads": uploads}

    def episode_runs(self) -> list[str]:
        """Every run id the current episodes name, newest run (by its first episode) first:
        what the dashboard lists beside the evaluations. Read from the run index alone, as
        the dashboard asks it at every refresh of its runs page."""
        with self.store._read() as conn:
            rows = conn.execute("SELECT run_id, MIN(seq) AS first FROM trace_episodes"
                                " WHERE run_id IS NOT NULL AND current = 1 GROUP BY run_id ORDER BY first DESC").fetchall()
        return [run_id for run_id, _ in rows]

    def run_started(self, run_id: str) -> str | None:
        """When the first upload holding one of the run's current episodes came."""
        with self.store._read() as conn:
            row = conn.execute("SELECT MIN(u.created_at) FROM trace_episodes e JOIN trace_uploads u"
                               " ON u.upload_id = e.upload_id WHERE e.run_id = ? AND e.current = 1",
                               (run_id,)).fetchone()
        return row[0] if row else None

    def run_episodes(self, run_id: str, after: int, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """The run's current episodes stored after ``after`` (their ``seq``), oldest first,
        each whole again: what the dashboard lists for a run that went to Prime Traces
        (a position, not an offset, so an episode moved to another run meanwhile shifts nothing)."""
        with self.store._read() as conn:
            rows = conn.execute("SELECT seq, upload_id, envelope FROM trace_episodes WHERE run_id = ? AND current = 1"
                                " AND seq > ? ORDER BY seq LIMIT ?", (run_id, after, limit)).fetchall()
            return [(seq, self._whole(conn, upload_id, envelope)) for seq, upload_id, envelope in rows]

    def episode_at(self, seq: int) -> dict[str, Any] | None:
        """One stored episode by its ``seq``, whole (None when there is none)."""
        with self.store._read() as conn:
            row = conn.execute("SELECT upload_id, envelope FROM trace_episodes WHERE seq = ?", (seq,)).fetchone()
            return None if row is None else self._whole(conn, row[0], row[1])

    @staticmethod
    def _whole(conn: Any, upload_id: str, envelope: str) -> dict[str, Any]:
        """An episode's envelope with its traces' documents (of the same upload) in place of
        their ids."""
        episode = orjson.loads(envelope)
        traces = []
        for trace_id in episode.get("traces") or []:
            row = conn.execute("SELECT body FROM trace_docs WHERE trace_id = ? AND upload_id = ?",
                               (trace_id, upload_id)).fetchone()
            if row is not None:
                traces.append(orjson.loads(row[0]))
        episode["traces"] = traces
        return episode

    def upload_replays(self) -> dict[str, int]:
        with self.store._read() as conn:
            return dict(conn.execute("SELECT upload_id, replays FROM trace_uploads").fetchall())
