"""Run summary math, against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    assert compute_summary(episodes) == {
        "avg_reward": 1.0,
        "avg_metrics": {"m": 3.0, "n": 1.0},
        "avg_error": 1 / 3,
    }


def test_fallback_to_all_traces_is_per_run() -> None:
    no_trainable = [
        {"ok": True, "traces": [trace(False, {"a": r(1.0)}, {"m": 1.0})]},
        {"ok": True, "traces": [trace(False, {"a": r(0.0)}, {"m": 3.0}), trace(False, {}, {})]},
    ]
    # All traces: rewards 1.0, 0.0 and 0 (no rewards) -> 1/3.
    assert compute_summary(no_trainable) == {"avg_reward": 1 / 3, "avg_metrics": {"m": 2.0}, "avg_error": 0.0}
    # One trainable trace anywhere in the run: only it counts, even for the other episodes.
    mixed = no_trainable + [{"ok": True, "traces": [trace(True, {"a": r(0.25)}, {"k": 5})]}]
    assert compute_summary(mixed) == {"avg_reward": 0.25, "avg_metrics": {"k": 5.0}, "avg_error": 0.0}


def test_non_finite_and_non_numeric_values_are_dropped() -> None:
    episodes = [
        {"ok": True, "traces": [trace(True, {"a": r(float("nan"))}, {"m": float("inf"), "s": "x"})]},
        {"ok": True, "traces": [trace(True, {"a": r(0.5), "z": None}, {"m": 1.0, "s": None, "b": True})]},
        {"ok": True, "traces": [trace(True, {"a": r(1.0, float("-inf"))}, {"m": float("nan")})]},
    ]
    assert compute_summary(episodes) == {"avg_reward": 0.5, "avg_metrics": {"m": 1.0}, "avg_error": 0.0}


def test_a_trainable_trace_with_only_dropped_values_still_decides_the_population() -> None:
    episodes = [
        {"ok": True, "traces": [trace(True, {"a": r(float("nan"))})]},
        {"ok": True, "traces": [trace(False, {"a": r(1.0)})]},
    ]
    assert compute_summary(episodes)["avg_reward"] is None


def test_error_share_counts_missing_ok_as_error() -> None:
    episodes = [{"ok": True}, {"ok": False}, {}, {"ok": "yes"}]
    assert compute_summary(episodes)["avg_error"] == 0.75


def test_empty_run() -> None:
    assert compute_summary([]) == {"avg_reward": None, "avg_metrics": {}, "avg_error": None}


def test_accumulator_is_incremental_and_matches_the_function() -> None:
    text = (FIXTURES / "episodes.jsonl").read_text(encoding="utf-8")
    episodes = [json.loads(line) for line in text.split("\n") if line]
    accumulator = SummaryAccumulator()
    accumulator.add(episodes[0])
    assert accumulator.result() == {"avg_reward": 1.0, "avg_metrics": {}, "avg_error": 0.0}
    for episode in episodes[1:]:
        accumulator.add(episode)
    # Trainable traces' rewards: 1.0, 1.0 (solver: 1*0 + 1*1), 0.0, 1.0; the judge is left out.
    expected = {"avg_reward": 0.75, "avg_metrics": {"judge/solved": 1.0, "num_branches": 2.0}, "avg_error": 0.0}
    assert accumulator.result() == expected
    assert compute_summary(iter(episodes)) == expected


@pytest.mark.parametrize("score", ["high", [1]])
def test_non_numeric_score_is_dropped_not_fatal(score) -> None:
    episodes = [{"ok": True, "traces": [trace(True, {"a": r(score)}), trace(True, {"a": r(1.0)})]}]
    assert compute_summary(episodes)["avg_reward"] == 1.0
