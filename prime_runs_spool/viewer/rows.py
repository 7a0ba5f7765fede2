"""One table row per episode: the few facts the sample table sorts and filters on.

The index keeps one :class:`Row` per episode, never the episode itself: a row is a
handful of numbers and short strings, so a run of 100,000 episodes costs tens of
megabytes, not the gigabytes its records may hold. The record is read again, from its
position, only when an episode page asks for it.

A row is built from either an episode record (a spool) or a v0 sample row (the local
platform's evaluations), with the same meaning for each column as the platform's v0 row
(``platform_api/v0.py``): the summary trace's example id, reward, metrics, stop condition,
truncation and token usage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prime_runs_spool.content.episodes import UNREADABLE_RECORD, finite_number, summary_trace, task_data, trace_reward
from prime_runs_spool.platform_api.v0 import is_truncated, token_usage

#: How much of an example's prompt the index keeps for text search (characters).
SEARCH_CHARS = 2000
#: An error message in the table is cut to this many characters (the episode page has it whole).
ERROR_CHARS = 200


class Row:
    """The table's view of one episode. ``number`` is its 1-based place in the run."""

    __slots__ = ("number", "where", "example_id", "rollout", "reward", "metrics", "error",
                 "truncated", "stop", "tokens", "duration")

    def __init__(self, number: int, where: Any, example_id: Any, rollout: int | None, reward: float | None,
                 metrics: dict[str, float], error: str | None, truncated: bool, stop: str | None,
                 tokens: int | None, duration: float | None) -> None:
        self.number = number
        #: How the source finds the full record again (a spool Position, a sample offset).
        self.where = where
        self.example_id = example_id
        self.rollout = rollout
        self.reward = reward
        self.metrics = metrics
        self.error = error
        self.truncated = truncated
        self.stop = stop
        self.tokens = tokens
        self.duration = duration


def _example_id(value: Any) -> Any:
    """An example id as rows keep it: a plain value as it is, anything else (a list, a
    mapping) as its text. The index keys its search text by example id: an idx of ``[1]``
    raised "unhashable type" there, and every page of the run answered 500 after it."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


def _metrics(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for name, value in raw.items():
        number = finite_number(value)
        if number is not None:
            out[str(name)] = number
    return out


def _error_text(error: Any) -> str | None:
    if error is None or error == {} or error == []:
        return None
    if isinstance(error, Mapping):
        kind, message = error.get("type"), error.get("message")
        text = ": ".join(str(part) for part in (kind, message) if part) or str(dict(error))
    else:
        text = str(error)
    return text[:ERROR_CHARS]


def _tokens(usage: Any) -> int | None:
    if not isinstance(usage, Mapping):
        return None
    total = 0
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
    return total


def _duration(timing: Any) -> float | None:
    """Seconds from the trace's start to the latest ``end`` of it or of its phases.

    Two levels only (the trace's timing and its phases, as verifiers writes them): this
    runs once per episode while a run is indexed, so it must stay cheap.
    """
    if not isinstance(timing, dict):
        return None
    start = finite_number(timing.get("start"))
    if start is None:
        return None
    latest = finite_number(timing.get("end"))
    for phase in timing.values():
        if isinstance(phase, dict):
            end = finite_number(phase.get("end"))
            if end is not None and (latest is None or end > latest):
                latest = end
    if latest is None:
        return None
    span = latest - start  # inf for an end of 1e308 after a start of -1e308: no time a table holds
    return max(0.0, span) if math.isfinite(span) else None


def prompt_text(trace: Mapping[str, Any]) -> str:
    """The task prompt of a trace, as text: ``task.data.prompt``, else its first user message."""
    prompt = task_data(trace).get("prompt")
    if prompt is None:
        for node in trace.get("nodes") or ():
            message = node.get("message") if isinstance(node, Mapping) else None
            if isinstance(message, Mapping) and message.get("role") == "user":
                prompt = message.get("content")
                break
    return prompt if isinstance(prompt, str) else ("" if prompt is None else str(prompt))


def row_of_episode(number: int, where: Any, record: Any, rollout: int | None) -> tuple[Row, str]:
    """The row of a spooled episode record and its prompt text (for the search index).

    Never raises: a record of another shape is a row with only its error set, so one odd
    episode cannot stop a run's index.
    """
    try:
        return _row_of_episode(number, where, record, rollout)
    except (AttributeError, TypeError, KeyError, IndexError):
        return Row(number, where, None, rollout, None, {}, UNREADABLE_RECORD, False, None, None, None), ""


def _row_of_episode(number: int, where: Any, record: Any, rollout: int | None) -> tuple[Row, str]:
    trace = summary_trace(record) or {}
    try:
        reward = finite_number(trace_reward(trace)) if trace else None
    except TypeError:
        reward = None
    errors = trace.get("errors") or ()
    record_errors = record.get("errors") if isinstance(record, Mapping) else None
    error = _error_text(errors[-1]) if errors else (_error_text(record_errors[-1]) if record_errors else None)
    ok = record.get("ok") if isinstance(record, Mapping) else None
    if error is None and ok is not True:
        error = "not ok"
    try:
        usage = token_usage(trace.get("calls") or ())
        truncated = bool(trace) and is_truncated(trace)
    except (AttributeError, TypeError):
        usage, truncated = None, False
    stop = trace.get("stop_condition")
    row = Row(number, where, _example_id(task_data(trace).get("idx")) if trace else None, rollout, reward,
              _metrics(trace.get("metrics")), error, truncated, None if stop is None else str(stop),
              _tokens(usage), _duration(trace.get("timing")))
    return row, prompt_text(trace) if trace else ""


def row_of_sample(number: int, where: Any, sample: Any) -> tuple[Row, str]:
    """The row of a v0 sample row (the local platform stores these), and its prompt text."""
    if not isinstance(sample, Mapping):
        return Row(number, where, None, None, None, {}, None, False, None, None, None), ""
    task = sample.get("task") if isinstance(sample.get("task"), Mapping) else {}
    prompt = task.get("prompt")
    rollout = sample.get("rollout_number")
    stop = sample.get("stop_condition")
    row = Row(number, where, _example_id(sample.get("example_id")), rollout if isinstance(rollout, int) else None,
              finite_number(sample.get("reward")), _metrics(sample.get("metrics")), _error_text(sample.get("error")),
              sample.get("is_truncated") is True, None if stop is None else str(stop),
              _tokens(sample.get("token_usage")), _duration(sample.get("timing")))
    return row, prompt if isinstance(prompt, str) else ""
