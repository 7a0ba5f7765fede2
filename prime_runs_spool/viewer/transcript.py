"""An episode record made ready to show: its traces, turn by turn, with scoring and timing.

Pages never walk raw records themselves: this module turns one record into plain lists
and strings (escaping is the template engine's job, and it does it everywhere). It reads
records as verifiers writes them (``traces[].nodes[].message``, ``calls``, ``rewards``);
a sample row from the platform is turned back into its episode (``info.native_wrapper``)
or, when it was uploaded per trace, shown from its own ``completion``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_runs_spool.content.episodes import summary_trace_index, trace_reward


@dataclass
class ToolCall:
    id: str | None
    name: str
    arguments: str


@dataclass
class Turn:
    index: int
    role: str
    text: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    parent: int | None = None


@dataclass
class TraceView:
    name: str
    trainable: bool
    turns: list[Turn]
    rewards: list[tuple[str, Any, Any]]
    reward: Any
    metrics: dict[str, Any]
    stop_condition: Any
    errors: list[Any]
    timing: list[tuple[str, str]]
    calls: list[dict[str, Any]]
    judge_answer: str | None
    task_prompt: str | None
    answer: Any
    call_columns: list[tuple[str, str, bool]] = field(default_factory=list)

    @property
    def silence(self) -> str:
        """Why the transcript is empty, when it is: the trace's last error, else its stop."""
        if self.errors:
            return f"the episode failed before any message was recorded: {error_text(self.errors[-1])}"
        if self.stop_condition:
            return f"no message was recorded (it stopped: {self.stop_condition})"
        return "this trace recorded no messages"


def episode_of(record: Any) -> Any:
    """The episode record behind what a source stored (a spool record or a v0 sample row)."""
    if isinstance(record, Mapping) and "traces" in record:
        return record
    if isinstance(record, Mapping):
        info = record.get("info")
        wrapper = info.get("native_wrapper") if isinstance(info, Mapping) else None
        if isinstance(wrapper, Mapping) and "traces" in wrapper:
            return wrapper
        completion = record.get("completion") if isinstance(record.get("completion"), list) else []
        trace = {
            "agent": {"name": record.get("agent") or "sample", "trainable": record.get("trainable")},
            "task": {"data": record.get("task") if isinstance(record.get("task"), Mapping) else {}},
            "nodes": [{"message": m} for m in completion],
            "rewards": {}, "metrics": record.get("metrics") or {},
            "stop_condition": record.get("stop_condition"),
            "errors": [record["error"]] if record.get("error") else [],
            "timing": record.get("timing"),
        }
        return {"id": record.get("episode_id"), "ok": record.get("error") is None, "traces": [trace],
                "_reward": record.get("reward")}
    return {"traces": []}


def _seq(value: Any) -> list[Any] | tuple[Any, ...]:
    """``value`` when it is a list, else nothing: a record of another shape (``"traces": 5``,
    ``"metrics": [1]``, from a foreign producer) shows what it can, never a 500 page."""
    return value if isinstance(value, (list, tuple)) else ()


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (see :func:`_seq`)."""
    return value if isinstance(value, Mapping) else {}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(pretty(part))
        return "\n".join(parts)
    return pretty(content)


def pretty(value: Any) -> str:
    """Indented JSON of anything a record holds (non-JSON values as text)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()
    except TypeError:
        return str(value)


def _arguments(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            return pretty(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return raw
    return pretty(raw)


def turns_of(trace: Mapping[str, Any]) -> list[Turn]:
    turns = []
    for index, node in enumerate(_seq(trace.get("nodes"))):
        if not isinstance(node, Mapping):
            continue
        message = node.get("message") if isinstance(node.get("message"), Mapping) else {}
        calls = []
        for call in _seq(message.get("tool_calls")):
            if isinstance(call, Mapping):
                function = call.get("function") if isinstance(call.get("function"), Mapping) else call
                calls.append(ToolCall(call.get("id"), str(function.get("name") or "?"),
                                      _arguments(function.get("arguments"))))
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        parent = node.get("parent")
        turns.append(Turn(index, str(message.get("role") or "?"), _text(message.get("content")),
                          _text(reasoning) if reasoning else None, calls, message.get("tool_call_id"),
                          message.get("name"), parent if isinstance(parent, int) else None))
    return turns


def _timing(timing: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Timing flattened to ``(phase, "12.34 s")`` rows: durations, or end - start."""
    out: list[tuple[str, str]] = []
    if not isinstance(timing, Mapping):
        return out
    start, end = timing.get("start"), timing.get("end")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        out.append((prefix or "total", f"{end - start:.2f} s"))
    duration = timing.get("duration")
    if isinstance(duration, (int, float)):
        out.append((prefix or "total", f"{duration:.2f} s"))
    for key, value in timing.items():
        if isinstance(value, Mapping):
            out += _timing(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def _calls(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for call in _seq(trace.get("calls")):
        if not isinstance(call, Mapping):
            continue
        usage = call.get("usage") if isinstance(call.get("usage"), Mapping) else {}
        time = call.get("time") if isinstance(call.get("time"), Mapping) else {}
        seconds = None
        if isinstance(time.get("start"), (int, float)) and isinstance(time.get("end"), (int, float)):
            seconds = time["end"] - time["start"]
        out.append({"node": call.get("node"), "model": call.get("model"), "endpoint": call.get("endpoint"),
                    "finish": call.get("finish_reason"), "prompt": usage.get("prompt_tokens"),
                    "completion": usage.get("completion_tokens"), "cached": usage.get("cached_input_tokens"),
                    "reasoning": usage.get("reasoning_tokens"), "seconds": seconds,
                    "error": error_text(call.get("error")) if call.get("error") else None})
    return out


#: The model-call table's columns: (key in a call, heading, numeric). A column no call has a
#: value for is left out: a failed call records a model, a time and an error, no usage.
CALL_COLUMNS = (("node", "node", True), ("model", "model", False), ("endpoint", "endpoint", False),
                ("finish", "finish", False), ("prompt", "prompt", True), ("completion", "completion", True),
                ("cached", "cached", True), ("reasoning", "reasoning", True), ("seconds", "time", True),
                ("error", "error", False))


def call_columns(calls: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [column for column in CALL_COLUMNS if any(call.get(column[0]) is not None for call in calls)]


def error_text(error: Any) -> str:
    """An error as one line: ``Type: message (status 503)`` for verifiers' error objects."""
    if isinstance(error, Mapping):
        kind, message, status = error.get("type"), error.get("message"), error.get("status_code")
        text = ": ".join(str(part) for part in (kind, message) if part)
        if status is not None:
            text += f" (status {status})"
        return text or pretty(dict(error))
    return str(error)


def trace_views(episode: Any) -> list[TraceView]:
    views = []
    for trace in _seq(episode.get("traces") if isinstance(episode, Mapping) else None):
        if not isinstance(trace, Mapping):
            continue
        agent = trace.get("agent") if isinstance(trace.get("agent"), Mapping) else {}
        rewards = []
        for name, reward in _map(trace.get("rewards")).items():
            if isinstance(reward, Mapping):
                rewards.append((str(name), reward.get("score"), reward.get("weight")))
            else:
                rewards.append((str(name), reward, None))
        try:
            total = trace_reward(trace)
        except (TypeError, AttributeError):
            total = None
        if not rewards and isinstance(episode, Mapping) and "_reward" in episode:
            total = episode["_reward"]
        turns = turns_of(trace)
        calls = _calls(trace)
        name = str(agent.get("name") or "trace")
        judge = None
        if "judge" in name.lower() or (agent.get("trainable") is False and len(_seq(episode.get("traces"))) > 1):
            answers = [t.text for t in turns if t.role == "assistant" and t.text]
            judge = answers[-1] if answers else None
        data = (trace.get("task") or {}).get("data") if isinstance(trace.get("task"), Mapping) else None
        data = data if isinstance(data, Mapping) else {}
        views.append(TraceView(
            name=name, trainable=bool(agent.get("trainable")), turns=turns, rewards=rewards, reward=total,
            metrics=dict(_map(trace.get("metrics"))), stop_condition=trace.get("stop_condition"),
            errors=list(_seq(trace.get("errors"))), timing=_timing(trace.get("timing")), calls=calls,
            judge_answer=judge, task_prompt=_prompt_of(data.get("prompt")) if data.get("prompt") is not None else None,
            answer=data.get("answer"), call_columns=call_columns(calls),
        ))
    return views


def final_answer(episode: Any) -> str:
    """The last assistant message of the episode's summary trace (for the group view)."""
    try:
        index = summary_trace_index(episode) if isinstance(episode, Mapping) else None
    except (AttributeError, TypeError):  # traces that are not mappings: nothing to show
        return ""
    views = trace_views(episode)
    if index is None or index >= len(views):
        return ""
    for turn in reversed(views[index].turns):
        if turn.role == "assistant" and (turn.text or turn.tool_calls):
            return turn.text or ", ".join(c.name for c in turn.tool_calls)
    return ""


#: The sample table shows this many characters of a prompt and of an answer in a row; an
#: expanded row shows the answer up to ANSWER_CHARS (the episode page has it whole).
GLANCE_CHARS = 140
ANSWER_CHARS = 20_000


@dataclass
class Glance:
    """What a table row shows of its episode beyond the index's figures."""

    prompt: str
    answer: str

    @property
    def prompt_start(self) -> str:
        return _start(self.prompt)

    @property
    def answer_start(self) -> str:
        return _start(self.answer)

    @property
    def answer_cut(self) -> bool:
        return len(self.answer) >= ANSWER_CHARS


def _start(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= GLANCE_CHARS else flat[:GLANCE_CHARS - 1] + "…"


def _prompt_of(prompt: Any) -> str:
    """A task prompt as text: a string as it is, a list of messages as its last user message."""
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return _text(users[-1].get("content"))
    return _text(prompt)


def glance(episode: Any) -> Glance:
    """The prompt and final answer of ``episode``'s summary trace (the row's trace). Only
    that trace is walked: a table page asks this of each of its rows."""
    traces = _seq(episode.get("traces")) if isinstance(episode, Mapping) else ()
    try:
        index = summary_trace_index(episode) if traces else None
    except (AttributeError, TypeError):
        index = None
    trace = traces[index] if index is not None and index < len(traces) else None
    if not isinstance(trace, Mapping):
        return Glance("", "")
    turns = turns_of(trace)
    data = _map(_map(trace.get("task")).get("data"))
    prompt = _prompt_of(data["prompt"]) if data.get("prompt") is not None else ""
    if not prompt:
        prompt = next((turn.text for turn in turns if turn.role == "user"), "")
    answer = ""
    for turn in reversed(turns):
        if turn.role == "assistant" and (turn.text or turn.tool_calls):
            answer = turn.text or ", ".join(call.name for call in turn.tool_calls)
            break
    return Glance(prompt, answer[:ANSWER_CHARS])
