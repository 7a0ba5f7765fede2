"""An episode record as one row of the ``samples`` table, and a run as one row of ``runs``.

A row is read from the episode's **summary trace** (the first trainable trace, else the
first), as the platform's sample row is (platform_api/v0.py): the same reward (the sum of
``score * weight``), the same token usage, the same truncation. The metrics are that
trace's reward scores by name, with a metric of the same name in their place: the reading
the run summary averages (content/summary.py), so a metric column's mean over a run's rows
is its ``avg_metrics`` entry when each episode has one trainable trace.

Values are written as they are stored, masking included: nothing here unmasks or re-masks.
A value a column cannot hold (a non-finite or non-numeric number, a token count that is not
a whole number) is left empty rather than guessed at, and a record of another shape is a
row with only its ids and :data:`UNREADABLE_RECORD` in ``error``: one odd episode never
stops a table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from prime_runs_spool.content.episodes import (UNREADABLE_RECORD, finite_number, reward_and_scores, summary_trace,
                                               task_data)
from prime_runs_spool.content.remask import travelling_error
from prime_runs_spool.export.columns import METRIC_PREFIX
from prime_runs_spool.files import printable
from prime_runs_spool.platform_api.v0 import is_truncated, token_usage


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63 else None


def _text(value: Any) -> str | None:
    """A value as text: a string as it is, anything else as its compact JSON."""
    if value is None or isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return str(value)


def metric_values(trace: Mapping[str, Any]) -> dict[str, float | None]:
    """Each reward's own score by name, then each metric (in a score's place when the names
    are the same), as a finite number or None."""
    try:
        _, scores = reward_and_scores(trace.get("rewards"))
    except (TypeError, AttributeError):
        rewards = trace.get("rewards")
        scores = {str(name): entry.get("score") for name, entry in rewards.items()
                  if isinstance(entry, Mapping)} if isinstance(rewards, Mapping) else {}
    values = {str(name): finite_number(score) for name, score in scores.items()}
    metrics = trace.get("metrics")
    if isinstance(metrics, Mapping):
        for name, value in metrics.items():
            if value is not None or str(name) not in values:  # a null metric leaves a score of its name
                values[str(name)] = finite_number(value)
    return values


def metric_names(record: Any) -> Iterator[str]:
    """The metric names a record's row has (what the first pass over a table collects)."""
    try:
        trace = summary_trace(record)
        if trace is not None:
            yield from metric_values(trace)
    except (AttributeError, TypeError, KeyError, IndexError):
        return


def _content_text(content: Any) -> str | None:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping)]
        texts = [part for part in parts if isinstance(part, str)]
        if texts:
            return "\n".join(texts)
    return _text(content)


def prompt_text(trace: Mapping[str, Any]) -> str | None:
    """The task's prompt: ``task.data.prompt`` (a chat prompt: its user messages), else the
    trace's first user message."""
    prompt = task_data(trace).get("prompt")
    if isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt):
        users = [_content_text(m.get("content")) for m in prompt if m.get("role") == "user"]
        return "\n\n".join(text for text in users if text) or _text(prompt)
    if prompt is not None:
        return _content_text(prompt)
    for node in trace.get("nodes") or ():
        message = node.get("message") if isinstance(node, Mapping) else None
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return None


def final_answer(trace: Mapping[str, Any]) -> str | None:
    """The last assistant message on the path to the trace's last leaf (the completion the
    platform's row shows last)."""
    nodes = trace.get("nodes") or ()
    parents = {node.get("parent") for node in nodes if isinstance(node, Mapping)}
    leaf = next((i for i in range(len(nodes) - 1, -1, -1) if i not in parents), None)
    seen = set()
    while isinstance(leaf, int) and 0 <= leaf < len(nodes) and leaf not in seen:
        seen.add(leaf)
        node = nodes[leaf]
        if not isinstance(node, Mapping):
            return None
        message = node.get("message")
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            return _content_text(message.get("content"))
        leaf = node.get("parent")
    return None


def _error_text(error: Any) -> str | None:
    if error is None or error == {} or error == []:
        return None
    if isinstance(error, Mapping):
        kind, message = error.get("type"), error.get("message")
        return ": ".join(str(part) for part in (kind, message) if part) or _text(dict(error))
    return _text(error)


def _timings(timing: Any) -> tuple[float | None, float | None, float | None, float | None]:
    """(start, seconds from the start to the latest end, model seconds, scoring seconds)."""
    if not isinstance(timing, Mapping):
        return None, None, None, None
    start = finite_number(timing.get("start"))
    latest = finite_number(timing.get("end"))
    for phase in timing.values():
        if isinstance(phase, Mapping):
            end = finite_number(phase.get("end"))
            if end is not None and (latest is None or end > latest):
                latest = end
    duration = None if start is None or latest is None else max(0.0, latest - start)
    agent = timing.get("agent")
    model = agent.get("model") if isinstance(agent, Mapping) else None
    model_s = finite_number(model.get("duration")) if isinstance(model, Mapping) else None
    scoring = timing.get("scoring")
    scoring_s = None
    if isinstance(scoring, Mapping):
        begun, ended = finite_number(scoring.get("start")), finite_number(scoring.get("end"))
        scoring_s = None if begun is None or ended is None else max(0.0, ended - begun)
    return start, duration, model_s, scoring_s


class RunFacts:
    """What every row of one run repeats, from its manifest."""

    __slots__ = ("run_id", "run_name", "model", "environment")

    def __init__(self, manifest: Mapping[str, Any], run_id: str | None) -> None:
        self.run_id = _text(manifest.get("run_id")) or run_id
        self.run_name = _text(manifest.get("name"))
        self.model = _text(manifest.get("model"))
        environments = manifest.get("environments")
        self.environment = (_text(environments[0]) if isinstance(environments, list) and len(environments) == 1
                            else None)


def sample_row(run: RunFacts, record: Any, rollout: Any) -> dict[str, Any]:
    """The ``samples`` row of one episode record (never raises)."""
    row: dict[str, Any] = {"run_id": run.run_id, "run_name": run.run_name, "model": run.model,
                           "environment": run.environment, "rollout": _whole(rollout)}
    try:
        row.update(_episode_fields(record, run))
    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
        row["episode_id"] = _text(record.get("id")) if isinstance(record, Mapping) else None
        row["error"] = UNREADABLE_RECORD
    return row


def _episode_fields(record: Mapping[str, Any], run: RunFacts) -> dict[str, Any]:
    trace = summary_trace(record) or {}
    env = record.get("env")
    data = task_data(trace) if trace else {}
    try:
        reward = finite_number(reward_and_scores(trace.get("rewards"))[0]) if trace else None
    except TypeError:
        reward = None
    errors = trace.get("errors") or record.get("errors") or ()
    usage = token_usage(trace.get("calls") or ()) or {}
    started, duration, model_s, scoring_s = _timings(trace.get("timing"))
    idx = data.get("idx")
    fields: dict[str, Any] = {
        "environment": _text(env.get("id")) if isinstance(env, Mapping) and env.get("id") is not None
        else run.environment,
        "episode_id": _text(record.get("id")),
        "example_id": None if idx is None else _text(idx),
        "reward": reward,
        "ok": record.get("ok") is True,
        "error": _error_text(errors[-1]) if errors else None,
        "stop_condition": _text(trace.get("stop_condition")),
        "is_truncated": bool(trace) and is_truncated(trace),
        "prompt_tokens": _whole(usage.get("prompt_tokens")),
        "completion_tokens": _whole(usage.get("completion_tokens")),
        "reasoning_tokens": _whole(usage.get("reasoning_tokens")),
        "started_at": started, "duration_s": duration, "model_s": model_s, "scoring_s": scoring_s,
        "prompt": prompt_text(trace) if trace else None,
        "final_answer": final_answer(trace) if trace else None,
        "reference_answer": _text(data.get("answer")),
    }
    for name, value in (metric_values(trace) if trace else {}).items():
        fields[METRIC_PREFIX + name] = value
    return fields


def run_row(manifest: Mapping[str, Any], run_id: str | None, *, status: str, episodes: int,
            summary: Mapping[str, Any], seal: Mapping[str, Any] | None, path: str,
            error_forms: list[str] | None = None) -> dict[str, Any]:
    """The ``runs`` row of one run: its manifest, status, episode count and summary;
    ``error_forms``: what its error line is cleared of (content/remask.py, ``error_forms_of``)."""
    environments = manifest.get("environments")
    row: dict[str, Any] = {
        "run_id": _text(manifest.get("run_id")) or run_id,
        "run_name": _text(manifest.get("name")),
        "model": _text(manifest.get("model")),
        "environments": ",".join(str(e) for e in environments) if isinstance(environments, list) else None,
        "framework": _text(manifest.get("framework")),
        "created_at": _text(manifest.get("created_at")),
        "status": status,
        "episodes": episodes,
        "avg_reward": finite_number(summary.get("avg_reward")),
        "avg_error": finite_number(summary.get("avg_error")),
        "finished_at": _text((seal or {}).get("finished_at")),
        # masked at the seal today; a spool sealed before may quote a URL with its credentials
        "error": _text(travelling_error((seal or {}).get("error"), error_forms)),
        "path": printable(path),  # a folder name that is not UTF-8: no file format holds its surrogates
        "config": _text(manifest.get("config")),
    }
    averages = summary.get("avg_metrics")
    if isinstance(averages, Mapping):
        for name, value in averages.items():
            row[METRIC_PREFIX + str(name)] = finite_number(value)
    return row
