"""Episode records -> v0 sample rows, exactly as the upstream projection builds them.

The platform's dashboard reads the v0 row format, and the upstream SDK
(``prime_runs.projection.build_samples``) defines it. We reproduce that projection from
episode *records* (plain mappings, as they sit in the spool), so that a spool synced
later lands on the platform exactly as a live upload would have. The golden pairs in
``fixtures/reference/projection/`` pin the behaviour; ``docs/projection.md`` describes it.

The only deliberate differences from upstream: ``run.id`` can be replaced by the
evaluation id (the spool keeps the local id; see docs/platform-api.md, "Identity"), and the
records we project were masked when they were spooled.

Sync projects one episode at a time, with the rollout number the spool writer stamped on
it, so the pieces are separate: :func:`rollout_key` and :class:`RolloutCounter` number
episodes, :func:`project_episode` builds the rows, :func:`build_samples` composes the two
for a whole ordered list.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from prime_runs_spool.errors import SampleTooLargeError
from prime_runs_spool.spool.format import CANCELLED, CRASHED, FAILED
from prime_runs_spool.content.environments import environment_list, environment_problem
from prime_runs_spool.platform_api.row_size import (ENVELOPE_BYTES, encode_within, measure_within, parts_size,
                                                   upstream_size)
from prime_runs_spool.content.episodes import (
    RolloutCounter,
    reward_and_scores,
    summary_trace_index,
    task_data,
)

#: The platform's ceiling on one request body (25 MiB, docs/platform-api.md): the one
#: definition; the client, sync's batching, the CLI and the local platform all read it.
MAX_REQUEST_BYTES = 26_214_400
#: The platform status a run that did not complete is closed out with, by seal status
#: (prime-runs 0.1.4: a crash arrives as FAILED, with its reason in ``error_message``).
TERMINAL_PLATFORM_STATUS = {FAILED: "FAILED", CANCELLED: "CANCELLED", CRASHED: "FAILED"}
#: ``error_message`` is capped at this many characters (the platform caps it server-side too).
ERROR_MESSAGE_MAX_CHARS = 4096
#: The metadata keys the dashboard's evaluation list reads unconditionally.
V0_KEYS = ("model", "num_examples", "rollouts_per_example")

#: Stop conditions that mean the trace was cut short.
_TRUNCATING_STOPS = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length"}
)

#: Keys every row has, in order; a reward is never flattened onto one of these.
FIXED_KEYS = (
    "sample_id",
    "example_id",
    "rollout_number",
    "episode_id",
    "agent",
    "trainable",
    "task",
    "prompt",
    "completion",
    "answer",
    "tool_defs",
    "reward",
    "timing",
    "is_completed",
    "is_truncated",
    "metrics",
    "error",
    "stop_condition",
    "trajectory",
    "token_usage",
    "info",
)
_FIXED = frozenset(FIXED_KEYS)


class EncodedRow(NamedTuple):
    """A row and its compact JSON encoding, so a caller never serializes a row twice."""

    row: dict[str, Any]
    body: bytes


# --------------------------------------------------------------------------- projection


def build_samples(
    episodes: Iterable[Mapping[str, Any]], *, evaluation_id: str | None = None
) -> list[dict[str, Any]]:
    """Project an ordered list of episode records, numbering rollouts as they arrive."""
    counter = RolloutCounter()
    rows: list[dict[str, Any]] = []
    for record in episodes:
        number = counter.next_number(record)
        if number is not None:
            rows.extend(project_episode(record, number, evaluation_id=evaluation_id))
    return rows


def project_episode(
    record: Mapping[str, Any],
    rollout_number: int,
    *,
    evaluation_id: str | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> list[dict[str, Any]]:
    """The rows of one episode: one row, or one per trace when that one would not fit."""
    return [
        encoded.row
        for encoded in project_episode_encoded(
            record,
            rollout_number,
            evaluation_id=evaluation_id,
            max_request_bytes=max_request_bytes,
        )
    ]


def project_episode_encoded(
    record: Mapping[str, Any],
    rollout_number: int,
    *,
    evaluation_id: str | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    _measure: Callable[[Mapping[str, Any], int], tuple[bytes, bool]] | None = None,
) -> list[EncodedRow]:
    """Like :func:`project_episode`, with each row's compact JSON ``body`` (UTF-8).

    A row fits when its compact JSON plus the 14-byte ``{"samples":[]}`` envelope is at
    most ``max_request_bytes`` (inclusive), measured as upstream measures it. Raises
    :class:`SampleTooLargeError` when a per-trace row cannot fit either.

    ``_measure``: :func:`check_sendable`'s (platform_api/row_size.py ``measure_within``),
    which measures each row without encoding it whole and keeps no body (``body`` is empty).
    """
    measure = encode_within if _measure is None else _measure
    traces: Sequence[Mapping[str, Any]] = record.get("traces") or ()
    if not traces:
        return []
    wrapper = _with_run_id(record, evaluation_id) if evaluation_id is not None else record
    index = summary_trace_index(record)
    assert index is not None
    trace = traces[index]
    info = dict(trace.get("info") or {})
    info["native_wrapper"] = wrapper
    info["native_trace_index"] = index
    row = _trace_row(trace, record.get("id"), record.get("id"), rollout_number, info)
    body, fits = measure(row, max_request_bytes)
    if fits:
        return [EncodedRow(row, body)]
    del body, row, info  # the whole episode's row: not held beside the next one

    out = []
    for trace in traces:
        row = _trace_row(trace, trace.get("id"), record.get("id"), rollout_number, trace.get("info"))
        body, fits = measure(row, max_request_bytes)
        if not fits:
            size = max(len(body) or parts_size(row), upstream_size(row)) + ENVELOPE_BYTES
            raise SampleTooLargeError(record.get("id"), trace.get("id"), size, max_request_bytes)
        out.append(EncodedRow(row, body))
    return out


#: An evaluation id as sync accepts one: the platform's are UUIDs (Prime Traces' are run
#: ids), and each goes into request paths (``/evaluations/{id}/samples``), so it must be one
#: plain path segment (no ``/``, ``?``, ``%``, no ``.`` or ``..``) and no longer than the row
#: budget below assumes. A sync state received with a spool (a CI artifact) is not trusted to
#: aim the user's key at another path of the API.
MAX_EVALUATION_ID_CHARS = 64
_EVALUATION_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_EVALUATION_ID_CHARS - 1}}}")


def is_evaluation_id(value: object) -> bool:
    return isinstance(value, str) and _EVALUATION_ID.fullmatch(value) is not None


#: Stand-ins for what is only known at sync time, each as long as it can plausibly get, so a
#: row measured with them is never smaller than the row sync will build.
_LONGEST_EVALUATION_ID = "x" * MAX_EVALUATION_ID_CHARS
_LARGEST_ROLLOUT_NUMBER = 10**12
#: What a row holds besides the parts of its record (its keys, counts and the envelope).
_ROW_OVERHEAD_BYTES = 64 * 1024
#: :func:`check_sendable`'s bound at the platform's limit, for a caller that would otherwise
#: call it for every episode (the runner): an episode whose serialized bytes times (3 + the
#: most nodes one trace holds) are at most this can reach no request's limit.
UNMEASURED_BYTES_BY_NODES = (MAX_REQUEST_BYTES - _ROW_OVERHEAD_BYTES) // 2


def check_sendable(record: Mapping[str, Any], serialized_bytes: int, max_request_bytes: int = MAX_REQUEST_BYTES,
                   most_nodes: int | None = None) -> None:
    """Raise :class:`SampleTooLargeError` if one of ``record``'s rows could never be sent.

    For the runner, which refuses such an episode at append rather than let it block its
    run's sync forever. A row repeats its record at most this often: the record itself
    (``native_wrapper``), its trace's ``info``, and the trace's messages once per branch
    (a branch per node at most), with numbers up to twice as long as the upstream measure
    prints them. An episode whose ``serialized_bytes`` cannot reach the limit that way is
    accepted without building a row (the common case: it costs nothing); a larger one is
    projected exactly as sync will project it.

    ``most_nodes``: the most nodes one trace of ``record`` holds, where the caller counted
    them already (the runner, in the shape check's pass: content/episodes.py
    ``check_episode_keyed``); else they are counted here.
    """
    nodes = most_nodes
    if nodes is None:
        nodes = 0  # a loop: max() of a generator costs more than the check
        for trace in record.get("traces") or ():
            count = len(trace.get("nodes") or ())
            if count > nodes:
                nodes = count
    if serialized_bytes * (3 + nodes) <= (max_request_bytes - _ROW_OVERHEAD_BYTES) // 2:  # twice the bytes, and the rest
        return
    project_episode_encoded(record, _LARGEST_ROLLOUT_NUMBER, evaluation_id=_LONGEST_EVALUATION_ID,
                            max_request_bytes=max_request_bytes, _measure=measure_within)


def _with_run_id(record: Mapping[str, Any], evaluation_id: str) -> dict[str, Any]:
    """A copy of ``record`` whose ``run.id``, and that of every member trace that has a ``run``, is ``evaluation_id``.

    prime-runs 0.1.4's sample rows wrap ``episode.to_record()`` of an episode the runner
    stamped with the evaluation's id, so the wrapper's ``run.id`` is the evaluation id; a
    member trace keeps what it had (verifiers 0.4.0 traces carry no ``run``: copying the
    episode's onto each trace is the Prime Traces sink's doing, not the sample table's).
    A record without a ``run`` gets ``{"id": evaluation_id}``. Only the ``run`` objects and
    the containers leading to them are copied; everything else is shared with the record.
    """
    out = dict(record)
    run = record.get("run")
    out["run"] = {**run, "id": evaluation_id} if _is_mapping(run) else {"id": evaluation_id}
    traces = record.get("traces")
    if traces and _any_run(traces):
        out["traces"] = [
            {**trace, "run": {**trace["run"], "id": evaluation_id}} if isinstance(trace.get("run"), Mapping) else trace
            for trace in traces
        ]
    return out


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # an exact dict first: no ABC check


def _any_run(traces: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a trace carries a ``run`` object (verifiers 0.4.0's carry none)."""
    for trace in traces:
        run = trace.get("run")
        if run is not None and _is_mapping(run):
            return True
    return False


def _trace_row(
    trace: Mapping[str, Any],
    sample_id: Any,
    episode_id: Any,
    rollout_number: int,
    info: Any,
) -> dict[str, Any]:
    """One v0 row from one trace (see docs/platform-api.md, "The v0 sample row")."""
    data = task_data(trace)
    agent = trace.get("agent") or {}
    nodes = trace.get("nodes") or ()
    calls = trace.get("calls") or ()
    branches = _branches(nodes, calls) if nodes else []
    tools = trace.get("tools")
    errors = trace.get("errors") or ()
    reward, scores = reward_and_scores(trace.get("rewards"))
    row: dict[str, Any] = {
        "sample_id": sample_id,
        "example_id": data.get("idx"),
        "rollout_number": rollout_number,
        "episode_id": episode_id,
        "agent": agent.get("name"),
        "trainable": agent.get("trainable"),
        "task": _drop_none(data),
        "prompt": [],
        "completion": branches[-1]["messages"] if branches else [],
        "answer": data.get("answer"),
        "tool_defs": [_drop_none(tool) for tool in tools] if tools else None,
        "reward": reward,
        "timing": _drop_none_deep(trace.get("timing")),
        "is_completed": trace.get("is_completed"),
        "is_truncated": is_truncated(trace),
        "metrics": trace.get("metrics") or {},
        "error": _drop_none(errors[-1]) if errors else None,
        "stop_condition": trace.get("stop_condition"),
        "trajectory": branches,
        "token_usage": token_usage(calls),
        "info": info,
    }
    for name, score in scores.items():
        if name not in _FIXED:
            row[name] = score
    return row


def is_truncated(trace: Mapping[str, Any]) -> bool:
    """Whether the trace was cut short: a truncating stop condition, or a last call that hit
    its length limit (the row's ``is_truncated``; the viewer's index reads it too)."""
    if trace.get("stop_condition") in _TRUNCATING_STOPS:
        return True
    for call in reversed(trace.get("calls") or ()):
        if not call.get("error"):
            return call.get("finish_reason") == "length"
    return False


def _paths(nodes: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Root-to-leaf node index paths, leaves in index order."""
    parents = {node.get("parent") for node in nodes}
    paths = []
    for leaf in range(len(nodes)):
        if leaf in parents:
            continue
        path = []
        current: int | None = leaf
        while current is not None:
            path.append(current)
            current = nodes[current].get("parent")
        path.reverse()
        paths.append(path)
    return paths


def _branches(nodes: Sequence[Mapping[str, Any]], calls: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The trajectory: one branch per root-to-leaf path. Each node's message is projected
    once, however many branches share it, and the calls are indexed by node once per trace."""
    by_node: dict[int, Mapping[str, Any]] = {}
    for call in calls:
        node = call.get("node")
        if node is not None:
            by_node[node] = call
    messages: dict[int, Any] = {}
    branches = []
    for path in _paths(nodes):
        num_input = 0
        num_output = 0
        previous_total = 0
        if by_node:
            for index in path:
                call = by_node.get(index)
                usage = call.get("usage") if call is not None else None
                if not usage:
                    continue
                current_input = _call_input(usage)
                num_input += max(0, current_input - previous_total)
                num_output += usage.get("completion_tokens", 0)
                previous_total = current_input + usage.get("completion_tokens", 0)
        branch_messages = []
        for index in path:
            message = messages.get(index, _UNSEEN)
            if message is _UNSEEN:
                message = messages[index] = _message(nodes[index].get("message"))
            branch_messages.append(message)
        branches.append({"messages": branch_messages, "num_input_tokens": num_input,
                         "num_output_tokens": num_output})
    return branches


_UNSEEN = object()


def _call_input(usage: Mapping[str, Any]) -> int:
    return usage.get("prompt_tokens", 0) + (usage.get("cached_input_tokens") or 0)


def _message(message: Any) -> Any:
    """A message with its model fields' nulls dropped (tool calls and content parts too)."""
    if type(message) is not dict and not isinstance(message, Mapping):
        return message
    out = {key: item for key, item in message.items() if item is not None}
    for key in ("tool_calls", "content"):
        value = out.get(key)
        if value.__class__ is not str and isinstance(value, list):
            out[key] = [_drop_none(item) if type(item) is dict or isinstance(item, Mapping) else item
                        for item in value]
    return out


_OPTIONAL_USAGE = ("cached_input_tokens", "reasoning_tokens", "cost")


def token_usage(calls: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Usage summed over every call that has any (never ``extra_usage``)."""
    totals: dict[str, Any] | None = None
    optional: dict[str, Any] = {}
    for call in calls:
        usage = call.get("usage")
        if not usage:
            continue
        if totals is None:
            totals = {"prompt_tokens": 0, "completion_tokens": 0}
        totals["prompt_tokens"] += usage.get("prompt_tokens", 0)
        totals["completion_tokens"] += usage.get("completion_tokens", 0)
        for key in _OPTIONAL_USAGE:
            value = usage.get(key)
            if value is not None:
                optional[key] = optional.get(key, 0) + value
    if totals is None:
        return None
    for key in _OPTIONAL_USAGE:
        if key in optional:
            totals[key] = optional[key]
    return totals


def _drop_none(value: Any) -> Any:
    """A model's dump without its ``None`` fields; nested free-form dicts keep theirs."""
    if type(value) is not dict and not isinstance(value, Mapping):  # an exact dict first: no ABC check
        return value
    return {key: item for key, item in value.items() if item is not None}


def _drop_none_deep(value: Any) -> Any:
    """For structures made only of models (timing): drop ``None`` fields at every level."""
    if type(value) is not dict and not isinstance(value, Mapping):
        return value
    return {key: item if item.__class__ in _SCALARS else _drop_none_deep(item)
            for key, item in value.items() if item is not None}


#: What :func:`_drop_none_deep` returns as it is without a call (a timing's numbers).
_SCALARS = frozenset({float, int, str, bool})


# --------------------------------------------------------------------------- evaluations


def manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """Why a run's manifest cannot become an evaluation (its create body and metadata), or
    None: what :func:`v0_metadata` and :func:`create_body` take as given. A manifest comes
    from whoever wrote the spool (a foreign producer, an edit): a ``config`` of ``[1, 2]``
    or ``tags`` of ``5`` ended that run's sync in "internal error: TypeError", one without a
    ``run_id`` in "internal error: KeyError" (and every such run was local run "None")."""
    run_id = manifest.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return f"its run_id is {str(run_id)[:40]!r}, not a run id"
    config = manifest.get("config")
    if config is not None and not isinstance(config, Mapping):
        return f"its config is {type(config).__name__} {str(config)[:40]!r}, not an object"
    tags = manifest.get("tags")
    if tags is not None and not isinstance(tags, str) and not (
            isinstance(tags, list) and all(isinstance(tag, str) for tag in tags)):
        return f"its tags are {str(tags)[:40]!r}, not a list of strings"
    return environment_problem(manifest.get("environments"))


def v0_metadata(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation metadata sync sends for a run.

    The masked config at top level (that is where the dashboard looks for the v0 keys
    and its structured Config view), the v0 keys, ``config_source`` when the launch file
    was clean, and ``local_run_id`` so the evaluation leads back to the spool.
    """
    config = manifest.get("config") or {}
    metadata = dict(config)
    for key in V0_KEYS:
        metadata[key] = config.get(key, manifest.get(key))
    if "config_source" in manifest:
        metadata["config_source"] = manifest["config_source"]
    metadata["local_run_id"] = manifest["run_id"]
    return metadata


def create_body(manifest: Mapping[str, Any], *, name: str, environment_ids: list[str], tags: list[str],
                metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The body of ``POST /evaluations/`` for a run (docs/platform-api.md): None fields left
    out, ``dataset`` the manifest's or else its first environment."""
    body: dict[str, Any] = {
        "name": name,
        "environments": [{"id": env_id} for env_id in environment_ids],
        "tags": tags,
        "model_name": manifest.get("model"),
        "framework": manifest.get("framework"),
        "metadata": dict(metadata),
    }
    dataset = manifest.get("dataset") or next(iter(environment_list(manifest.get("environments"))), None)
    if dataset:
        body["dataset"] = dataset
    return {key: value for key, value in body.items() if value is not None}


def terminal_status_body(status: str, error: str | None) -> dict[str, Any]:
    """``PUT /evaluations/{id}``'s body closing out a run that did not complete.

    As prime-runs 0.1.4 sends it: ``{"status": "FAILED" | "CANCELLED", "error_message": ...}``,
    the message at most :data:`ERROR_MESSAGE_MAX_CHARS` characters; a crash is ``FAILED``
    with ``crashed: <reason>`` (or ``crashed``); no message is sent when there is none.
    """
    if status not in TERMINAL_PLATFORM_STATUS:
        raise ValueError(f"no platform status for a run that ended {status!r}")
    message = error
    if status == CRASHED:
        message = f"{CRASHED}: {error}" if error else CRASHED
    body: dict[str, Any] = {"status": TERMINAL_PLATFORM_STATUS[status]}
    if message:
        body["error_message"] = message[:ERROR_MESSAGE_MAX_CHARS]
    return body
