"""The older output layout: ``metadata.json`` + ``results.jsonl``, one v0 row per rollout.

This is what verifiers' legacy eval wrote and what ``prime eval push`` reads. A v0 row is
already a projection (``example_id``, ``prompt``, ``completion``, ``answer``, ``reward``,
each reward function's score, ``info``...), not an episode, so each row becomes a minimal
episode record whose projection gives the row's content back (docs/integration.md,
"Importing", lists the mapping):

- one trace; ``task.data`` = ``{idx: example_id, prompt, answer}``;
- the message graph: the prompt's messages, then the completion's, as one branch;
- ``rewards = {"reward": {score: row.reward, weight: 1}}``, so the projected reward is the
  row's; every other numeric top-level value (each reward function's score) goes into
  ``metrics``; ``info`` is kept; ``error`` (if any) makes the episode not ok.

The layout carries no ids, so they are derived, stably: the run id from the content of
``metadata.json`` (a copy of the folder elsewhere is the same run), each episode's id from
the run id and the row's line number.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prime_runs_spool.content.manifest import recordable_count
from prime_runs_spool.errors import ImportSourceError, MissingMetadataError
from prime_runs_spool.files import read_regular_file
from prime_runs_spool.importer.outcome import v0_outcome
from prime_runs_spool.importer.paths import v0_paths
from prime_runs_spool.importer.source import V0, ConfigIdentity, SourceRun, unreadable_json
from prime_runs_spool.importer.traces_file import CorruptOutputError

#: Row keys that are not a reward function's score.
_ROW_KEYS = frozenset({"id", "example_id", "prompt", "completion", "answer", "reward", "task", "info",
                       "error", "rollout_number", "timing", "state", "metadata", "sample_id", "is_completed",
                       "is_truncated", "stop_condition"})
_NAMESPACE = uuid.UUID("8f1c6a52-3f9e-4d6b-9a57-2f0c1f7e4b11")


def read_metadata(output_dir: Path) -> tuple[bytes, dict[str, Any]]:
    """``metadata.json``'s bytes and object; :class:`ImportSourceError` when it is not one."""
    metadata_path, results_path = v0_paths(output_dir)
    if not os.path.lexists(metadata_path):
        raise MissingMetadataError(metadata_path, results_path.name)
    try:
        raw = read_regular_file(metadata_path)
        metadata = json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise unreadable_json(metadata_path, exc) from None
    if not isinstance(metadata, dict):
        raise ImportSourceError(f"{metadata_path}: not a JSON object; nothing of this run was imported")
    return raw, metadata


def metadata_identity(output_dir: Path, metadata: dict[str, Any]) -> ConfigIdentity:
    """The run's name, model and environment as the metadata gives them."""
    env_id = metadata.get("env_id") or metadata.get("env")
    model = metadata.get("model")
    return ConfigIdentity(name=f"{env_id or output_dir.name}--{model or 'unknown-model'}",
                          model=model if isinstance(model, str) else None,
                          environments=[str(env_id)] if env_id else [])


def metadata_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The run's config: the metadata without its averages (those are results)."""
    return {key: value for key, value in metadata.items() if not key.startswith("avg_")}


def read_v0(output_dir: Path) -> SourceRun:
    _, results_path = v0_paths(output_dir)
    raw, metadata = read_metadata(output_dir)
    run_id = str(uuid.uuid5(_NAMESPACE, hashlib.sha256(raw).hexdigest()))
    rows, end = _check_rows(results_path)
    identity = metadata_identity(output_dir, metadata)
    ids = [_episode_id(run_id, line) for line in rows]
    config = metadata_config(metadata)
    return SourceRun(
        path=output_dir,
        layout=V0,
        run_id=run_id,
        name=identity.name or output_dir.name,
        model=identity.model,
        environments=identity.environments,
        config=config,
        config_file=None,
        num_examples=recordable_count("num_examples", metadata.get("num_examples")),
        rollouts_per_example=recordable_count("rollouts_per_example", metadata.get("rollouts_per_example")),
        created_at=None,
        ids=ids,
        episodes=lambda: _episodes(results_path, end, run_id, metadata),
        outcome=v0_outcome(len(rows), metadata.get("num_examples"), metadata.get("rollouts_per_example")),
        size=end,
    )


def _episode_id(run_id: str, line: int) -> str:
    return uuid.uuid5(uuid.UUID(run_id), f"results.jsonl:{line}").hex


def _check_rows(path: Path) -> tuple[list[int], int]:
    """Line numbers of the rows and where they end; the same torn-tail and corruption rules
    as ``traces.jsonl`` (``importer/traces_file.py``)."""
    lines: list[int] = []
    end = offset = 0
    pending: tuple[int, str] | None = None
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            offset += len(raw)
            if not raw.strip():
                continue
            if pending is not None:
                raise CorruptOutputError(path, *pending)
            reason = _row_problem(raw)
            if reason:
                if raw.endswith(b"\n"):
                    raise CorruptOutputError(path, number, reason, whole=True)
                pending = (number, reason)
                continue
            lines.append(number)
            end = offset
    return lines, end


def _row_problem(raw: bytes) -> str:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "not JSON"
    return "" if isinstance(value, dict) else f"a JSON {type(value).__name__}, not a row object"


def _episodes(path: Path, end: int, run_id: str, metadata: dict[str, Any]) -> Iterator[dict[str, Any]]:
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if offset >= end:
                return
            offset += len(raw)
            if raw.strip():
                yield row_to_episode(json.loads(raw), _episode_id(run_id, number), run_id, metadata)


def _messages(value: Any) -> list[dict[str, Any]]:
    """A row's prompt or completion as messages: a string is one, a list holds them; any
    other value (a number: "internal error: TypeError" before) is none, and stays in the
    task data as the row had it."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def row_to_episode(row: dict[str, Any], episode_id: str, run_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """A v0 row as a minimal episode record (see the module docstring)."""
    messages = _messages(row.get("prompt")) + [
        m if m.get("role") else {"role": "assistant", **m} for m in _messages(row.get("completion"))
        if not isinstance(row.get("completion"), str)
    ]
    if isinstance(row.get("completion"), str):
        messages.append({"role": "assistant", "content": row["completion"]})
    nodes = [{"message": message, **({"parent": i - 1} if i else {})} for i, message in enumerate(messages)]
    data = {"idx": row.get("example_id"), "prompt": row.get("prompt"), "answer": row.get("answer")}
    reward = row.get("reward")
    metrics = {key: value for key, value in row.items()
               if key not in _ROW_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)}
    error = row.get("error")
    ok = not error
    trace: dict[str, Any] = {
        "id": episode_id,
        "task": {"data": data},
        "agent": {"name": "agent", "trainable": True},
        "nodes": nodes,
        "rewards": {"reward": {"score": reward, "weight": 1.0}} if isinstance(reward, (int, float)) else {},
        "metrics": metrics,
        "info": row.get("info") if isinstance(row.get("info"), dict) else {},
        "is_completed": True,
        "ok": ok,
        "errors": [str(error)] if error else [],
    }
    env_id = metadata.get("env_id") or metadata.get("env")
    return {
        "id": episode_id,
        "env": {"id": env_id},
        "task": {"data": data},
        "run": {"id": run_id},
        "ok": ok,
        "errors": trace["errors"],
        "traces": [trace],
    }
