"""Run summary math, against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from prime_runs.metrics import from_episodes
from prime_runs_spool.content.summary import SummaryAccumulator, compute_summary

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reference" / "projection"


def trace(trainable: bool, rewards: dict | None = None, metrics: dict | None = None) -> dict:
    return {"agent": {"name": "a", "trainable": trainable}, "rewards": rewards or {}, "metrics": metrics or {}}


def r(score, weight=1.0) -> dict:
    return {"score": score, "weight": weight}


def test_trainable_traces_only() -> None:
    episodes = [
        {"ok": True, "traces": [trace(True, {"a": r(1.0), "b": r(0.5, 2.0)}, {"m": 2.0}),
                                trace(False, {"j": r(100.0)}, {"m": 100.0, "j": 1.0})]},
        {"ok": False, "traces": [trace(True, {"a": r(0.0)}, {"m": 4.0, "n": 1})]},
        {"ok": True, "traces": []},
    ]
    # Trainable rewards: 1.0 + 0.5*2.0 = 2.0, and 0.0 -> mean 1.0. Judge ignored.
    # avg_metrics: the rewards' own scores (unweighted) and the metrics, trainable only.
    assert compute_summary(episodes) == {
        "avg_reward": 1.0,
        "avg_metrics": {"a": 0.5, "b": 0.5, "m": 3.0, "n": 1.0},
        "avg_error": 1 / 3,
    }


def test_fallback_to_all_traces_is_per_run() -> None:
    no_trainable = [
        {"ok": True, "traces": [trace(False, {"a": r(1.0)}, {"m": 1.0})]},
        {"ok": True, "traces": [trace(False, {"a": r(0.0)}, {"m": 3.0}), trace(False, {}, {})]},
    ]
    # All traces: rewards 1.0, 0.0 and 0 (no rewards) -> 1/3.
    assert compute_summary(no_trainable) == {"avg_reward": 1 / 3, "avg_metrics": {"a": 0.5, "m": 2.0}, "avg_error": 0.0}
    # One trainable trace anywhere in the run: only it counts, even for the other episodes.
    mixed = no_trainable + [{"ok": True, "traces": [trace(True, {"a": r(0.25)}, {"k": 5})]}]
    assert compute_summary(mixed) == {"avg_reward": 0.25, "avg_metrics": {"a": 0.25, "k": 5.0}, "avg_error": 0.0}


def test_non_finite_and_non_numeric_values_are_dropped() -> None:
    episodes = [
        {"ok": True, "traces": [trace(True, {"a": r(float("nan"))}, {"m": float("inf"), "s": "x"})]},
        {"ok": True, "traces": [trace(True, {"a": r(0.5), "z": None}, {"m": 1.0, "s": None, "b": True})]},
        {"ok": True, "traces": [trace(True, {"a": r(1.0, float("-inf"))}, {"m": float("nan")})]},
    ]
    # reward a's scores: NaN (dropped), 0.5 and 1.0 (its -inf weight drops only the reward)
    assert compute_summary(episodes) == {"avg_reward": 0.5, "avg_metrics": {"a": 0.75, "m": 1.0}, "avg_error": 0.0}


def test_a_trainable_trace_with_only_dropped_values_still_decides_the_population() -> None:
    episodes = [
        {"ok": True, "traces": [trace(True, {"a": r(float("nan"))})]},
        {"ok": True, "traces": [trace(False, {"a": r(1.0)})]},
    ]
    assert compute_summary(episodes)["avg_reward"] is None


def test_error_share_counts_missing_ok_as_error() -> None:
    episodes = [{"ok": True}, {"ok": False}, {}, {"ok": "yes"}]
    assert compute_summary(episodes)["avg_error"] == 0.75


def test_empty_run_is_what_the_sdk_reports() -> None:
    assert compute_summary([]) == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}


def test_accumulator_is_incremental_and_matches_the_function() -> None:
    text = (FIXTURES / "episodes.jsonl").read_text(encoding="utf-8")
    episodes = [json.loads(line) for line in text.split("\n") if line]
    accumulator = SummaryAccumulator()
    accumulator.add(episodes[0])
    assert accumulator.result() == {"avg_reward": 1.0, "avg_metrics": {"correct": 1.0}, "avg_error": 0.0}
    for episode in episodes[1:]:
        accumulator.add(episode)
    # Trainable traces' rewards: 1.0, 1.0 (solver: 1*0 + 1*1), 0.0, 1.0; the judge is left out.
    expected = {"avg_reward": 0.75, "avg_metrics": {"correct": 0.75, "judge": 1.0, "judge/solved": 1.0,
                                                    "num_branches": 2.0}, "avg_error": 0.0}
    assert expected == from_episodes(_sdk_view(episodes))
    assert accumulator.result() == expected
    assert compute_summary(iter(episodes)) == expected


@pytest.mark.parametrize("score", ["high", [1]])
def test_non_numeric_score_is_dropped_not_fatal(score) -> None:
    episodes = [{"ok": True, "traces": [trace(True, {"a": r(score)}), trace(True, {"a": r(1.0)})]}]
    assert compute_summary(episodes)["avg_reward"] == 1.0


# -- parity with the SDK: prime_runs.metrics.from_episodes, the function verifiers 0.4.0 seals with


def _sdk_view(episodes: list[dict]) -> list[SimpleNamespace]:
    """Episode records as the attribute objects the SDK's duck-typed function reads
    (verifiers' ``Trace.reward`` is the sum of ``score * weight``: ``RewardScore.value``)."""
    def reward(value: dict | None) -> SimpleNamespace | None:
        if value is None or value.get("score") is None:
            return None
        return SimpleNamespace(score=value["score"], value=value["score"] * value.get("weight", 1.0))

    def trace_view(trace: dict) -> SimpleNamespace:
        rewards = {name: reward(value) for name, value in (trace.get("rewards") or {}).items()}
        return SimpleNamespace(agent=SimpleNamespace(trainable=bool((trace.get("agent") or {}).get("trainable"))),
                               rewards=rewards, metrics=dict(trace.get("metrics") or {}),
                               reward=sum(r.value for r in rewards.values() if r is not None))

    return [SimpleNamespace(ok=episode.get("ok") is True, traces=[trace_view(t) for t in episode.get("traces") or ()])
            for episode in episodes]


finite = st.floats(min_value=-10, max_value=10, allow_nan=False).map(lambda x: round(x, 3))
names = st.sampled_from(["a", "b", "m"])
traces_strategy = st.lists(st.fixed_dictionaries({
    "agent": st.fixed_dictionaries({"trainable": st.booleans()}),
    "rewards": st.dictionaries(names, st.one_of(st.none(), st.fixed_dictionaries(
        {"score": finite, "weight": st.sampled_from([0.5, 1.0, 2.0])}))),
    "metrics": st.dictionaries(names, st.one_of(st.none(), finite)),
}), max_size=3)
episodes_strategy = st.lists(st.fixed_dictionaries({"ok": st.booleans(), "traces": traces_strategy}), max_size=5)


@settings(max_examples=200, deadline=None)
@given(episodes_strategy)
def test_summary_equals_the_sdks_from_episodes(episodes: list[dict]) -> None:
    ours = compute_summary(episodes)
    sdk = from_episodes(_sdk_view(episodes))
    assert ours["avg_reward"] == pytest.approx(sdk["avg_reward"])
    assert ours["avg_error"] == pytest.approx(sdk["avg_error"])
    assert ours["avg_metrics"].keys() == sdk["avg_metrics"].keys()
    for name, value in sdk["avg_metrics"].items():
        assert ours["avg_metrics"][name] == pytest.approx(value)
