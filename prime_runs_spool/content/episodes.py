"""What an episode record is, as everything above the spool reads it: its id, the trace it
is summarised by, its rollout number and its reward.

One home for these so the runner (which stamps rollout numbers and de-duplicates by id),
the run summary and the platform's v0 rows (platform_api/v0.py) can never disagree on them.
"""

from __future__ import annotations

import heapq
import math

from collections.abc import Iterable, Mapping
from typing import Any

from prime_runs_spool.errors import MalformedEpisodeError


class _NoRow:
    """Sentinel type: an episode without traces has no row and takes no rollout number."""

    _instance: _NoRow | None = None

    def __new__(cls) -> _NoRow:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_ROW"


NO_ROW = _NoRow()


def episode_id_of(record: Any) -> str | None:
    """The id an episode record is de-duplicated by (its ``id``), as text; None if it has none."""
    value = record.get("id") if type(record) is dict or isinstance(record, dict) else None
    return value if value is None or type(value) is str else str(value)


def summary_trace_index(record: Mapping[str, Any]) -> int | None:
    """Index of the trace a row is projected from: the first trainable one, else the first."""
    traces = record.get("traces") or ()
    i = 0
    for trace in traces:
        agent = trace.get("agent")
        if agent and agent.get("trainable"):
            return i
        i += 1
    return 0 if traces else None


def summary_trace(record: Any) -> Mapping[str, Any] | None:
    """The trace a row is read from (:func:`summary_trace_index`), or None for a record of
    another shape: the viewer's and the export's rows never raise on one odd episode."""
    if not isinstance(record, Mapping):
        return None
    index = summary_trace_index(record)
    if index is None:
        return None
    trace = record["traces"][index]
    return trace if isinstance(trace, Mapping) else None


#: What a row's error column says of a record whose shape a reader cannot read.
UNREADABLE_RECORD = "the episode record is not shaped like an episode"


def finite_number(value: Any) -> float | None:
    """A metric's value as a float a table can hold: None for a bool, a non-number, NaN or an
    infinity. The exact types first: this runs for every metric of every row."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def rollout_key(record: Mapping[str, Any]) -> Any:
    """What rollout numbers count per: the summary trace's ``task.data.idx``.

    ``None`` is a valid key; an episode without traces returns :data:`NO_ROW`.
    """
    traces = record.get("traces")
    if not traces:
        return NO_ROW
    for trace in traces:  # summary_trace_index's choice, without the call and the index
        agent = trace.get("agent")
        if agent and agent.get("trainable"):
            break
    else:
        trace = traces[0]
    task = trace.get("task")  # task_data(...), without the call
    data = task.get("data") if task else None
    return data.get("idx") if data else None


class RolloutCounter:
    """Numbers episodes 1, 2, 3... per :func:`rollout_key`, in arrival order.

    The spool writer stamps each record with ``next_number(record)`` so sync never
    rescans a spool to number rows; a resumed run seeds the counter with the counts of
    its earlier segments (``seed(counter.counts())`` round-trips).
    """

    def __init__(self) -> None:
        self._counts: dict[Any, int] = {}
        #: Numbers given back per key (a superseded attempt's, content/supersede.py), reused
        #: lowest first, so a run's numbers stay 1..n per task after retried rollouts.
        self._free: dict[Any, list[int]] = {}

    def next_number(self, record: Mapping[str, Any]) -> int | None:
        """The rollout number of the next episode; ``None`` (and no count) without traces.

        The lowest number given back with :meth:`release`, else one past the highest issued.
        """
        return self.next_number_for(rollout_key(record))

    def next_number_for(self, key: Any) -> int | None:
        """:meth:`next_number` given the record's :func:`rollout_key` (read outside a lock)."""
        if key is NO_ROW:
            return None
        free = self._free.get(key)
        if free:
            return heapq.heappop(free)
        number = self._counts.get(key, 0) + 1
        self._counts[key] = number
        return number

    def release(self, key: Any, number: int) -> None:
        """Give ``number`` back: the episode that held it was superseded, its slot is re-run."""
        free = self._free.setdefault(key, [])
        if number not in free:
            heapq.heappush(free, number)

    def observe(self, key: Any, number: int) -> None:
        """Record that an episode with ``key`` already took ``number`` (e.g. on resume)."""
        if number > self._counts.get(key, 0):
            self._counts[key] = number

    def seed(self, counts: Mapping[Any, int] | Iterable[tuple[Any, int]]) -> None:
        """Continue from earlier counts (a mapping or ``(key, count)`` pairs)."""
        pairs = counts.items() if isinstance(counts, Mapping) else counts
        for key, number in pairs:
            self.observe(key, number)

    def counts(self) -> dict[Any, int]:
        """The highest number issued per key (a copy)."""
        return dict(self._counts)


def task_data(trace: Mapping[str, Any]) -> Mapping[str, Any]:
    return (trace.get("task") or {}).get("data") or {}


def trace_reward(trace: Mapping[str, Any]) -> Any:
    """Sum of ``score * weight`` over the trace's non-null rewards, in order (int 0 if none);
    None when one of them has no score (a NaN or an infinity, written as null).

    Shared with the run summary so the dashboard's ``avg_reward`` agrees with the rows.
    """
    return reward_and_scores(trace.get("rewards"))[0]


def reward_and_scores(rewards: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """:func:`trace_reward` of a trace with these ``rewards``, and each non-null reward's
    own ``score`` by name, in order: read in one pass (the run summary needs both of each
    episode). Raises ``TypeError`` as the sum does for a non-numeric score or weight.

    A reward whose ``score`` is null is one whose score JSON could not hold: verifiers' score
    is a float, so a NaN or an infinity (a judge that failed), which a line holds as null. Its
    trace's reward is then None, not the sum of the others: prime-runs 0.1.4 sums the NaN into
    the trace's reward and sends the row's ``reward`` (and that score's own key) as null, and a
    0.0 there is a reward the run never had. A null reward (not a mapping) is skipped, as
    upstream skips a reward that is None."""
    total: Any = 0
    scores: dict[str, Any] = {}
    if not rewards:
        return total, scores
    for name, reward in rewards.items():
        if type(reward) is not dict and not isinstance(reward, Mapping):  # an exact dict first: an ABC check costs more
            continue
        score = reward.get("score")
        scores[name] = score
        if score is None:
            total = None
        else:
            weight = reward.get("weight")
            value = score * (1.0 if weight is None else weight)  # a TypeError whatever came before
            if total is not None:
                total += value
    return total, scores


#: What a ``task.data.idx`` may be: a JSON scalar, so rollout numbers can count by it.
_IDX_TYPES = (str, int, float, bool)
_IDX_EXACT = frozenset(_IDX_TYPES)


def _is_idx(idx: Any) -> bool:
    """Whether an ``idx`` of a subclass of :data:`_IDX_TYPES` can be counted by: the rollout
    counter keys a dict by it under the run's lock, where an unhashable one (a str subclass
    with ``__hash__ = None``) once raised after the call's ids were taken."""
    if not isinstance(idx, _IDX_TYPES):
        return False
    try:
        hash(idx)
    except TypeError:
        return False
    return True


#: What a reward's ``score`` and ``weight`` may be when set: numbers the rows and the summary add up.
_NUMBER_TYPES = (int, float)


def check_episode(record: Mapping[str, Any]) -> bool:
    """Raise :class:`MalformedEpisodeError` unless ``record`` has the shape the run summary,
    the rollout numbering and the v0 rows read; return whether it may hold error text
    (:func:`check_episode_keyed`, which also reads its rollout key)."""
    return check_episode_keyed(record)[0]


def check_episode_keyed(record: Mapping[str, Any]) -> tuple[bool, Any, int]:
    """Raise :class:`MalformedEpisodeError` unless ``record`` has the shape the run summary,
    the rollout numbering and the v0 rows read; return whether it may hold error text, its
    :func:`rollout_key`, and the most nodes one of its traces holds.

    Only the fields those read are checked, and only their kind (a mapping where a mapping
    is read, a list where a list is read): everything else in an episode is free-form. Run
    before anything is numbered, so a malformed episode is refused whole, never half
    recorded: a ``metrics`` that is a list once reached the spool and then broke the
    summary.

    The answer: true where the episode holds an error message where verifiers records one
    (the episode's ``errors``, a trace's ``errors``, a model call's ``error``: a call that
    failed and was retried leaves it in an ``ok`` episode), or where a trace or its
    ``calls`` is of a type this pass does not look into; false only when none holds one.
    Read in the same pass as the shape, on the lists the check reads anyway: a pass of its
    own over the traces cost about 9k instructions an append, and the clearing of error
    messages (content/error_scrub.py) walks an ``ok`` episode only where it is true.

    The rollout key is read in the same pass, from the fields the check reads anyway (a pass
    of its own cost about 3.8k instructions an append), and so are the nodes a trace holds at
    most, which bound the size of its rows (platform_api/v0.py ``check_sendable``: a pass of
    its own there cost about 3.6k).
    """
    episode_id = record.get("id")
    traces = record.get("traces")
    carries = bool(record.get("errors"))
    if traces is None:
        return carries, NO_ROW, 0
    if type(traces) is not list and not isinstance(traces, (list, tuple)):
        _malformed(episode_id, "traces", "a list of traces", traces)
    # rollout_key's choice: the first trainable trace's idx, else the first trace's
    key: Any = NO_ROW
    keyed = False  # a trainable trace's idx is the key
    most_nodes = 0
    # Exact dict and list first: an ABC check costs more than the rest of a field's check.
    for i, trace in enumerate(traces):
        if type(trace) is not dict:
            if not isinstance(trace, Mapping):
                _malformed(episode_id, f"traces[{i}]", "a mapping (one trace)", trace)
            carries = True  # a mapping of another type: the walk decides
        get = trace.get
        # The common case, unrolled (every field an exact dict, list or None: no loop over
        # the names, no ABC check); anything else is looked at field by field, in the same
        # order, by _check_kinds. Keep the names in step with _TRACE_MAPPINGS and _TRACE_LISTS.
        if not (type(task := get("task")) in _DICT_OR_NONE and type(agent := get("agent")) in _DICT_OR_NONE
                and type(get("rewards")) in _DICT_OR_NONE and type(get("metrics")) in _DICT_OR_NONE
                and type(get("info")) in _DICT_OR_NONE and type(nodes := get("nodes")) in _LIST_OR_NONE
                and type(calls := get("calls")) in _LIST_OR_NONE and type(errors := get("errors")) in _LIST_OR_NONE
                and type(get("tools")) in _LIST_OR_NONE):
            _check_kinds(episode_id, i, get)
            agent = get("agent")  # the condition may have stopped before reading them
            nodes = get("nodes")
            carries = True  # a list of another type: the walk decides
        elif not carries:  # calls and errors: each a list or None
            if errors:
                carries = True
            elif calls:
                for call in calls:
                    if type(call) is not dict or call.get("error"):
                        carries = True
                        break
        if nodes and len(nodes) > most_nodes:
            most_nodes = len(nodes)
        data = (task or {}).get("data")
        if data is not None:
            if type(data) is not dict and not isinstance(data, Mapping):
                _malformed(episode_id, f"traces[{i}].task.data", "a mapping (idx, prompt, answer...)", data)
            idx = data.get("idx")
            if idx is not None and type(idx) not in _IDX_EXACT and not _is_idx(idx):
                _malformed(episode_id, f"traces[{i}].task.data.idx", "a string or a number (the example's index)",
                           idx)
        else:
            idx = None
        if not keyed:
            if agent and agent.get("trainable"):
                key = idx
                keyed = True
            elif not i:
                key = idx
        rewards = get("rewards")
        if rewards:
            for name, reward in rewards.items():
                if type(reward) is dict:  # the common case: float or null score and weight
                    score = reward.get("score")
                    weight = reward.get("weight")
                    if (score is None or type(score) is float) and (weight is None or type(weight) is float):
                        continue
                elif not isinstance(reward, Mapping):
                    continue  # read as a null reward by the summary and the rows alike
                for part in ("score", "weight"):
                    number = reward.get(part)
                    if number is not None and type(number) is not float and not isinstance(number, _NUMBER_TYPES):
                        _malformed(episode_id, f"traces[{i}].rewards.{name}.{part}", "a number or null", number)
    return carries, key, most_nodes


#: The fields of a trace that are read as mappings, and what each holds (for the message).
_TRACE_MAPPINGS = (("agent", "a mapping (name, trainable, config)"), ("task", "a mapping (type, data)"),
                   ("rewards", "a mapping (reward name -> {score, weight})"),
                   ("metrics", "a mapping (metric name -> number)"), ("info", "a mapping"))
#: The fields of a trace that are read as lists.
_TRACE_LISTS = ("nodes", "calls", "errors", "tools")
_DICT_OR_NONE = frozenset((dict, type(None)))
_LIST_OR_NONE = frozenset((list, type(None)))


def _check_kinds(episode_id: Any, i: int, get: Any) -> None:
    """The kinds of trace ``i``'s mapping and list fields, one by one (``get``: the trace's
    ``get``): a mapping or list of another type passes, anything else is refused."""
    for key, meaning in _TRACE_MAPPINGS:
        value = get(key)
        if value is not None and type(value) is not dict and not isinstance(value, Mapping):
            _malformed(episode_id, f"traces[{i}].{key}", meaning, value)
    for key in _TRACE_LISTS:
        value = get(key)
        if value is not None and type(value) is not list and not isinstance(value, (list, tuple)):
            _malformed(episode_id, f"traces[{i}].{key}", "a list", value)


def _malformed(episode_id: Any, field: str, expected: str, found: Any) -> None:
    raise MalformedEpisodeError(
        f"episode {episode_id}: {field} must be {expected}, not a {type(found).__name__}; "
        "nothing of this call was recorded: fix the episode and log it again"
    )
