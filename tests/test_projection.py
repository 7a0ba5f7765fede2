"""The v0 projection: golden pairs byte for byte, run.id replacement, the size fallback."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from prime_runs_spool.errors import SampleTooLargeError
from prime_runs_spool.content.episodes import NO_ROW, RolloutCounter, rollout_key
from prime_runs_spool.platform_api.v0 import (
    ENVELOPE_BYTES,
    FIXED_KEYS,
    build_samples,
    project_episode,
    project_episode_encoded,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reference" / "projection"


def _lines(name: str) -> list[str]:
    # Split on "\n" only: records may hold a raw U+2028, which str.splitlines() splits on.
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line]


@pytest.fixture(scope="module")
def episodes() -> list[dict]:
    return [json.loads(line) for line in _lines("episodes.jsonl")]


def _upstream_size(row: dict) -> int:
    return len(json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()) + ENVELOPE_BYTES


def test_golden_pairs_byte_for_byte(episodes: list[dict]) -> None:
    expected = _lines("samples.jsonl")
    rows = build_samples(episodes)
    assert len(rows) == len(expected) == 4
    for row, line in zip(rows, expected):
        assert json.dumps(row, ensure_ascii=False) == line


def test_projection_does_not_mutate_records(episodes: list[dict]) -> None:
    before = copy.deepcopy(episodes)
    build_samples(episodes, evaluation_id="eval-123")
    assert episodes == before


def test_evaluation_id_replaces_run_id_on_episode_and_member_traces(episodes: list[dict]) -> None:
    record = copy.deepcopy(episodes[1])
    for trace in record["traces"]:
        trace["run"] = {"type": "eval", "id": record["run"]["id"]}
    original = copy.deepcopy(record)
    (row,) = project_episode(record, 1, evaluation_id="eval-123")
    wrapper = row["info"]["native_wrapper"]
    assert wrapper["run"] == {**original["run"], "id": "eval-123"}
    assert [t["run"]["id"] for t in wrapper["traces"]] == ["eval-123", "eval-123"]
    assert record == original
    # Apart from the ids, the wrapper is the record itself.
    wrapper_ids_restored = copy.deepcopy(wrapper)
    wrapper_ids_restored["run"]["id"] = original["run"]["id"]
    for trace in wrapper_ids_restored["traces"]:
        trace["run"]["id"] = original["run"]["id"]
    assert wrapper_ids_restored == original


def test_evaluation_id_is_stamped_where_there_was_no_run(episodes: list[dict]) -> None:
    record = episodes[2]
    assert "run" not in record
    (row,) = project_episode(record, 2, evaluation_id="eval-123")
    wrapper = row["info"]["native_wrapper"]
    assert wrapper["run"] == {"id": "eval-123"}
    assert all("run" not in trace for trace in wrapper["traces"])
    without_ids = {key: value for key, value in wrapper.items() if key != "run"}
    assert without_ids == record
    assert "run" not in record


def test_member_traces_without_run_stay_without_as_upstreams_rows(episodes: list[dict]) -> None:
    """prime-runs 0.1.4's rows wrap ``episode.to_record()``: a trace without a run gets none."""
    record = episodes[1]
    assert all("run" not in trace for trace in record["traces"])
    (row,) = project_episode(record, 1, evaluation_id="eval-9")
    wrapper = row["info"]["native_wrapper"]
    assert wrapper["traces"] == record["traces"]


def test_without_evaluation_id_the_wrapper_is_the_record(episodes: list[dict]) -> None:
    (row,) = project_episode(episodes[0], 1)
    assert row["info"]["native_wrapper"] is episodes[0]


def test_limit_is_inclusive_then_falls_back_to_per_trace_rows(episodes: list[dict]) -> None:
    record = episodes[1]  # a trainable solver and a non-trainable judge
    (whole,) = project_episode(record, 7)
    exact = _upstream_size(whole)
    assert project_episode(record, 7, max_request_bytes=exact) == [whole]

    rows = project_episode(record, 7, max_request_bytes=exact - 1)
    assert [r["sample_id"] for r in rows] == [t["id"] for t in record["traces"]]
    assert [r["agent"] for r in rows] == ["solver", "judge"]
    for row, trace in zip(rows, record["traces"]):
        assert list(row)[: len(FIXED_KEYS)] == list(FIXED_KEYS)
        assert row["episode_id"] == record["id"]
        assert row["rollout_number"] == 7
        assert row["info"] == trace["info"]
        assert "native_wrapper" not in json.dumps(row)
    assert rows[1]["info"]["verdict"]["verdicts"][0]["verdict"] == "yes"
    # The summary trace's per-trace row matches the whole row apart from id and info.
    assert {k: v for k, v in rows[0].items() if k not in ("sample_id", "info")} == {
        k: v for k, v in whole.items() if k not in ("sample_id", "info")
    }


def test_trace_that_cannot_fit_raises_naming_episode_and_trace(episodes: list[dict]) -> None:
    record = episodes[1]
    with pytest.raises(SampleTooLargeError) as caught:
        project_episode(record, 1, max_request_bytes=2_000)
    message = str(caught.value)
    assert record["id"] in message and record["traces"][0]["id"] in message
    assert caught.value.limit == 2_000 and caught.value.size > 2_000


def test_encoded_bodies_are_the_rows_compact_json(episodes: list[dict]) -> None:
    for encoded in project_episode_encoded(episodes[3], 1, max_request_bytes=30_000):
        assert encoded.body == orjson.dumps(encoded.row)
        assert orjson.loads(encoded.body) == encoded.row


def _float_heavy(record: dict, value: float, count: int) -> dict:
    record = copy.deepcopy(record)
    record["traces"][0]["metrics"] = {f"m{i}": value for i in range(count)}
    return record


@pytest.mark.slow
@pytest.mark.parametrize("value", [1e-09, 0.00001, 0.000015212603486793025])
def test_size_is_exact_where_orjson_and_json_print_floats_differently(
    episodes: list[dict], value: float
) -> None:
    record = _float_heavy(episodes[0], value, 3_000)
    (row,) = project_episode(record, 1)
    json_size = _upstream_size(row)
    orjson_size = len(orjson.dumps(row)) + ENVELOPE_BYTES
    assert json_size != orjson_size  # the case this test is about
    needed = max(json_size, orjson_size)  # both what upstream measures and what we send
    assert len(project_episode(record, 1, max_request_bytes=needed)) == 1
    fallback = project_episode(record, 1, max_request_bytes=needed - 1)
    assert [r["sample_id"] for r in fallback] == [record["traces"][0]["id"]]


def test_episode_without_traces_has_no_row_and_no_number() -> None:
    record = {"id": "e0", "ok": False, "errors": [], "traces": []}
    assert project_episode(record, 1) == []
    assert rollout_key(record) is NO_ROW
    counter = RolloutCounter()
    assert counter.next_number(record) is None
    assert counter.counts() == {}


def _episode(idx, *, trainable=True, first_idx=None) -> dict:
    traces = []
    if first_idx is not None:
        traces.append({"id": "t0", "agent": {"name": "judge", "trainable": False},
                       "task": {"data": {"idx": first_idx}}})
    traces.append({"id": "t1", "agent": {"name": "agent", "trainable": trainable},
                   "task": {"data": {"idx": idx}}})
    return {"id": f"e-{idx}-{first_idx}", "ok": True, "traces": traces}


def test_rollout_numbers_count_per_summary_trace_idx_in_arrival_order() -> None:
    stream = [
        _episode(0),
        _episode(None),
        _episode(0),
        {"id": "empty", "traces": []},
        _episode(None),
        _episode(5, first_idx=9),  # summary trace: the trainable one (idx 5)
        _episode(5, trainable=False, first_idx=9),  # none trainable: the first (idx 9)
        _episode(0),
    ]
    counter = RolloutCounter()
    assert [counter.next_number(r) for r in stream] == [1, 1, 2, None, 2, 1, 1, 3]
    assert counter.counts() == {0: 3, None: 2, 5: 1, 9: 1}
    rows = build_samples(stream)
    assert [(r["example_id"], r["rollout_number"]) for r in rows] == [
        (0, 1), (None, 1), (0, 2), (None, 2), (5, 1), (9, 1), (0, 3)
    ]


def test_counter_seeded_from_earlier_counts_continues() -> None:
    first = RolloutCounter()
    for record in [_episode(0), _episode(1), _episode(0)]:
        first.next_number(record)
    resumed = RolloutCounter()
    resumed.seed(first.counts())
    assert resumed.next_number(_episode(0)) == 3
    assert resumed.next_number(_episode(2)) == 1
    pairs = RolloutCounter()
    pairs.seed([(0, 4), (0, 2), (None, 1)])  # pairs; the highest number wins
    assert pairs.next_number(_episode(0)) == 5
    assert pairs.next_number(_episode(None)) == 2


def test_row_derivations_on_a_synthetic_trace() -> None:
    """Branches, usage, truncation, errors and reward flattening, against hand values."""
    trace = {
        "id": "t",
        "agent": {"name": "a", "trainable": True},
        "task": {"data": {"idx": 3, "answer": None, "extra": {"k": None}}},
        "nodes": [
            {"message": {"role": "user", "content": "q"}},
            {"parent": 0, "message": {"role": "assistant", "content": None, "name": "x"}},
            {"parent": 0, "message": {"role": "assistant", "content": "b"}},
        ],
        "calls": [
            {"node": 1, "finish_reason": "stop", "usage": {"prompt_tokens": 10, "completion_tokens": 5}},
            {"node": 2, "finish_reason": "stop", "usage": {"prompt_tokens": 8, "completion_tokens": 1}},
            {"usage": {"prompt_tokens": 1, "completion_tokens": 1}},  # tied to no node
            {"node": 2, "finish_reason": "length",
             "usage": {"prompt_tokens": 4, "completion_tokens": 2, "cached_input_tokens": 6, "cost": 0.5}},
            {"finish_reason": "stop", "error": {"type": "Timeout"}},
        ],
        "rewards": {"a": {"score": 0.5, "weight": 2.0}, "reward": {"score": 3.0, "weight": 1.0},
                    "gone": None, "b": {"score": 1.0, "weight": 0.0}},
        "metrics": {"m": None},
        "errors": [{"type": "First"}, {"type": "Last", "detail": None}],
        "timing": {"start": 1.0, "agent": {"end": None, "start": 2.0}},
        "stop_condition": "agent_completed",
        "is_completed": False,
        "info": {"z": None},
    }
    (row,) = project_episode({"id": "e", "traces": [trace]}, 1)
    assert row["completion"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]
    assert row["trajectory"][0]["messages"][1] == {"role": "assistant", "name": "x"}
    assert [(b["num_input_tokens"], b["num_output_tokens"]) for b in row["trajectory"]] == [(10, 5), (10, 2)]
    assert row["token_usage"] == {"prompt_tokens": 23, "completion_tokens": 9,
                                  "cached_input_tokens": 6, "cost": 0.5}
    assert row["is_truncated"] is True  # the last call without an error hit the length limit
    assert row["error"] == {"type": "Last"}
    assert row["timing"] == {"start": 1.0, "agent": {"start": 2.0}}
    assert row["task"] == {"idx": 3, "extra": {"k": None}}
    assert row["answer"] is None and row["tool_defs"] is None
    assert row["metrics"] == {"m": None}
    assert row["info"]["z"] is None and row["info"]["native_trace_index"] == 0
    assert row["reward"] == 0.5 * 2.0 + 3.0 + 0.0
    assert list(row)[len(FIXED_KEYS):] == ["a", "b"]  # "reward" collides; None is not flattened
    assert row["a"] == 0.5


def test_reward_without_rewards_is_integer_zero_and_usage_null() -> None:
    trace = {"id": "t", "agent": {"name": "a", "trainable": False}, "task": {"data": {"idx": 1}},
             "calls": [{"node": 0}], "stop_condition": "max_turns"}
    (row,) = project_episode({"id": "e", "traces": [trace]}, 1)
    assert row["reward"] == 0 and isinstance(row["reward"], int)
    assert row["token_usage"] is None and row["trajectory"] == [] and row["completion"] == []
    assert row["is_truncated"] is True


@pytest.mark.parametrize("name", [
    "projection/episodes.jsonl", "projection/samples.jsonl", "episode_example.json", "eval_example.toml",
])
def test_committed_fixtures_match_their_recorded_checksums(name: str) -> None:
    """The golden files are copies of upstream outputs; their SHA-256, recorded in
    fixtures/reference/projection/README.md when they were copied, pins them."""
    recorded = {}
    for line in (FIXTURES / "README.md").read_text().splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        if len(cells) == 2 and len(cells[1]) == 64:
            recorded[cells[0]] = cells[1]
    assert name in recorded, f"no checksum recorded for {name}"
    assert hashlib.sha256((FIXTURES.parent / name).read_bytes()).hexdigest() == recorded[name]


_truthiness = st.sampled_from([True, False, None, 1, 0, "", "yes", 0.0, float("nan")])
_trace_for_key = st.fixed_dictionaries({}, optional={
    "agent": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"trainable": _truthiness})),
    "task": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "data": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
            "idx": st.one_of(st.none(), st.integers(0, 5), st.text(max_size=2))}))})),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(_trace_for_key, max_size=4))
def test_the_rollout_key_is_the_idx_of_the_trace_the_row_is_read_from(traces: list[dict]) -> None:
    """Rollout numbers count by the ``task.data.idx`` of the trace a row is projected from
    (``summary_trace_index``: the first trainable trace, by truth, else the first), whatever
    is missing or null on the way; an episode without traces takes no number."""
    from prime_runs_spool.content.episodes import summary_trace_index, task_data

    record = {"id": "e", "traces": traces}
    index = summary_trace_index(record)
    expected = NO_ROW if index is None else task_data(traces[index]).get("idx")
    assert rollout_key(record) == expected


@pytest.mark.slow  # imports verifiers and prime-runs: seconds, the first case
@pytest.mark.parametrize("score", [float("nan"), float("inf"), 0.25])
def test_a_score_json_cannot_hold_is_projected_as_prime_runs_projects_it(tmp_path: Path, score: float) -> None:
    """A NaN (or infinite) score is a null in the line; its row's ``reward`` was 0.5 (the
    other reward alone) and its own key missing. prime-runs 0.1.4 sums the NaN into the
    trace's reward and sends both as null: the row of the episode read back from the spool
    holds what upstream's row of the episode in memory holds."""
    from prime_runs.projection import episode_to_samples
    from verifiers.v1.episode import Episode

    from prime_runs_spool import open_run, read_run

    task = {"type": "t", "data": {"idx": 0}}
    episode = Episode.model_validate({"id": "e", "ok": True, "task": task, "traces": [{
        "task": task, "agent": {"name": "solver", "config": {}, "trainable": True},
        "rewards": {"correct": {"score": score, "weight": 2.0}, "style": {"score": 0.5}}}]})
    with open_run(tmp_path / "r", name="nan-judge") as run:
        run.log_episodes([episode])
    record = next(r.data for r in read_run(tmp_path / "r").records() if r.type == "episode")
    ours = project_episode(record, 1)[0]
    upstream = episode_to_samples(episode, 1)[0]
    assert {key: ours.get(key, "missing") for key in ("reward", "correct", "style")} == {
        key: upstream.get(key, "missing") for key in ("reward", "correct", "style")}
    assert ours["reward"] == (None if score != 0.25 else 1.0)


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                       st.text(max_size=8))
_json_value = st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner,
                                                 max_size=4)), max_leaves=30)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _json_value, max_size=6))
def test_a_row_measured_part_by_part_is_the_size_of_its_body(row: dict) -> None:
    """The runner measures a large episode's rows a part at a time, never holding a row's
    body (platform_api/row_size.py parts_size): the count is the body's length, byte for byte,
    and stopped early only past the bound it was given."""
    from prime_runs_spool.platform_api.row_size import encode_row, parts_size

    size = len(encode_row(row))
    assert parts_size(row) == size
    assert parts_size(row, stop_above=size) == size
    assert parts_size(row, stop_above=size // 2) > size // 2
