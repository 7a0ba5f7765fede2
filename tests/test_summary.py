"""Run summary math, against hand-computed values."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings, strategies as st, HealthCheck
from prime_runs.metrics import from_episodes

from prime_runs_spool.content.summary import SummaryAccumulator, compute_summary, read_episode
from prime_runs_spool import open_run
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.scan import read_run

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


@pytest.mark.slow
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


# -- the accumulator reads each trace once: the same result as the reading the docstring states


def _reference_summary(episodes: list[dict]) -> dict:
    """The module docstring's semantics written plainly, one population at a time (the code
    before each trace was read once for both populations): the accumulator must give
    exactly this, key order and signed zeros included."""
    import math

    def finite(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value) if math.isfinite(float(value)) else None

    def trace_numbers(trace):
        try:
            reward = 0
            for entry in (trace.get("rewards") or {}).values():
                if isinstance(entry, dict):
                    if entry.get("score") is None:  # a score JSON could not hold: no reward
                        reward = None
                        continue
                    weight = entry.get("weight")
                    value = entry["score"] * (1.0 if weight is None else weight)
                    if reward is not None:
                        reward += value
        except TypeError:
            reward = None
        values = {name: entry.get("score") for name, entry in (trace.get("rewards") or {}).items()
                  if isinstance(entry, dict)}
        values.update((name, value) for name, value in (trace.get("metrics") or {}).items() if value is not None)
        return finite(reward), values

    def means(traces):
        reward_sum, reward_count, sums, counts = 0.0, 0, {}, {}
        for trace in traces:
            reward, values = trace_numbers(trace)
            if reward is not None:
                reward_sum, reward_count = reward_sum + reward, reward_count + 1
            for name, value in values.items():
                number = finite(value)
                if number is not None:
                    sums[name] = sums.get(name, 0.0) + number
                    counts[name] = counts.get(name, 0) + 1
        return reward_sum, reward_count, {name: sums[name] / counts[name] for name in sums}

    every = [trace for episode in episodes for trace in episode.get("traces") or ()]
    trainable = [trace for trace in every if (trace.get("agent") or {}).get("trainable")]
    pool = trainable or every
    reward_sum, reward_count, metrics = means(pool)
    return {
        "avg_reward": reward_sum / reward_count if reward_count else (0.0 if not pool else None),
        "avg_metrics": metrics,
        "avg_error": sum(episode.get("ok") is not True for episode in episodes) / len(episodes) if episodes else 0.0,
    }


odd_number = st.one_of(finite, st.just(-0.0), st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")),
                       st.integers(-3, 3), st.booleans(), st.none(), st.just("x"))
odd_traces = st.lists(st.fixed_dictionaries({
    "agent": st.fixed_dictionaries({"trainable": st.booleans()}),
    "rewards": st.dictionaries(st.sampled_from(["a", "b", "m", "z"]), st.one_of(
        st.none(), st.just("not a reward"),
        st.fixed_dictionaries({"score": odd_number,
                               "weight": st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0, float("inf")]))}))),
    "metrics": st.dictionaries(st.sampled_from(["m", "a", "n", "b"]), odd_number),
}), max_size=3)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.fixed_dictionaries({"ok": st.one_of(st.booleans(), st.none()), "traces": odd_traces}), max_size=5))
def test_summary_is_exactly_the_plain_reading(episodes: list[dict]) -> None:
    assert repr(compute_summary(episodes)) == repr(_reference_summary(episodes))


def test_finite_values_whose_sum_overflows_are_all_kept() -> None:
    """A trace's values are taken as they are when all are floats and their sum is finite;
    finite values whose sum overflows, and infinities that cancel, take the value-by-value
    reading: each finite one kept, each non-finite dropped."""
    big = 1.5e308
    summary = compute_summary([{"ok": True, "traces": [trace(True, {"a": r(big, 0.0)}, {"m": big, "n": float("inf"),
                                                                                     "o": -float("inf")})]}])
    assert summary["avg_metrics"] == {"a": big, "m": big}
    summary = compute_summary([{"ok": True, "traces": [trace(True, None, {"m": big, "k": big, "z": -big})]}])
    assert summary["avg_metrics"] == {"m": big, "k": big, "z": -big}


# -- a run's reading: the episode as written ----------------------------------------------

any_float = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
written_number = st.one_of(any_float, st.just(-0.0), st.just(5e-324), st.integers(-2**63, 2**63 - 1),
                           st.booleans(), st.none(), st.just("x"))
written_traces = st.lists(st.fixed_dictionaries({
    "agent": st.fixed_dictionaries({"trainable": st.one_of(st.booleans(), any_float, st.none(), st.just(""))}),
    "rewards": st.dictionaries(names, st.one_of(st.none(), st.fixed_dictionaries(
        {"score": written_number, "weight": st.one_of(st.none(), any_float, st.integers(-3, 3))}))),
    "metrics": st.dictionaries(names, written_number),
}), max_size=3)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.fixed_dictionaries({"ok": st.one_of(st.booleans(), st.none()), "traces": written_traces}))
@example({"ok": True, "traces": [trace(True, {"a": r(float("nan"), None)})]})  # each place a value is met
@example({"ok": True, "traces": [trace(True, {"a": r(1.0, float("inf"))})]})
@example({"ok": True, "traces": [trace(True, {"m": r(0.5, None)}, {"m": -float("inf")})]})
@example({"ok": True, "traces": [{"agent": {"trainable": float("nan")}, "rewards": {"a": r(0.25, 2.0)}}]})
@example({"ok": False, "traces": [{"agent": {"trainable": None},  # an infinite score beside a string one
                                   "rewards": {"m": r("x", None), "b": r(float("inf"), None), "a": r(0.0, None)},
                                   "metrics": {"b": -0.0}}]})
def test_the_reading_with_its_serialization_is_the_reading_of_what_it_holds(episode: dict) -> None:
    """The run's reading (runner/admission.py) is the one its spool's line gives, NaN and
    infinities there null; the reading without it, compute_summary's, is left as it is."""
    import orjson

    written = orjson.dumps(episode)
    plain = repr(read_episode(episode))
    assert repr(read_episode(episode, written)) == repr(read_episode(orjson.loads(written)))
    assert repr(read_episode(episode)) == plain


def basic_run(run_dir: Path, **kwargs: Any):
    return open_run(run_dir, name="hostile-append", environments=["gsm8k"], model="m", **kwargs)


def test_the_live_summary_is_the_summary_of_what_was_written(tmp_path: Path):
    run = basic_run(tmp_path / "run")
    run.log_episodes([{"id": "a", "ok": True, "traces": [
        {"agent": {"trainable": True}, "rewards": {"r": {"score": float("nan")}}}]}])
    live = run.summary()
    run.finish()
    written = [r.data for r in iter_records(tmp_path / "run") if r.type == "episode"]
    assert compute_summary(written) == live


# Floats of every kind orjson writes otherwise than it holds them (NaN and ±inf as null) or
# exactly (-0.0, huge, subnormal); integers within what JSON here holds; and the values a
# reward's or metric's reading drops or skips anyway.
_any_float = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)


_odd_number = st.one_of(_any_float, st.sampled_from([-0.0, 5e-324, -1.5e308, 1.7976931348623157e308]),
                        st.integers(-2**63, 2**63 - 1), st.booleans(), st.none())


_names = st.sampled_from(["a", "b", "m"])  # a metric and a reward of the same name meet


_traces = st.lists(st.fixed_dictionaries({
    "agent": st.fixed_dictionaries({"trainable": st.one_of(st.booleans(), _any_float, st.none())}),
    "rewards": st.dictionaries(_names, st.one_of(st.none(), st.fixed_dictionaries(
        {"score": _odd_number, "weight": st.one_of(st.none(), _any_float)}))),
    "metrics": st.dictionaries(_names, _odd_number),
}), max_size=3)


_episodes = st.lists(st.fixed_dictionaries({"ok": st.one_of(st.booleans(), st.none()), "traces": _traces}),
                     max_size=6)


def _spool_summary(run_dir: Path) -> dict[str, Any]:
    return compute_summary(read_run(run_dir).episodes())


def _sealed_summary(run_dir: Path) -> Any:
    return [r.data.get("summary") for r in iter_records(run_dir) if r.type == "seal"][-1]


_examples = itertools.count()


nan, inf = float("nan"), float("inf")


def _scored(trainable: Any, rewards: dict[str, tuple[Any, Any]], metrics: dict[str, Any] | None = None) -> dict:
    return {"agent": {"trainable": trainable}, "metrics": metrics or {},
            "rewards": {name: {"score": score, "weight": weight} for name, (score, weight) in rewards.items()}}


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_episodes, st.integers(0, 6))
@example([{"ok": True, "traces": [_scored(True, {"a": (nan, None)})]},  # each way a non-finite value reads
          {"ok": True, "traces": [_scored(True, {"a": (1.0, inf)})]},  # otherwise than its null, one an episode
          {"ok": True, "traces": [_scored(True, {"m": (0.5, None)}, {"m": -inf})]},
          {"ok": True, "traces": [_scored(nan, {"a": (0.25, 2.0)})]}], 2)
@example([{"ok": False, "traces": [{"agent": {"trainable": True}, "metrics": {"m": -1.5e308}}] * 2}], 1)  # overflows
def test_the_live_summary_is_the_spools_for_any_floats_and_after_a_resume(
        tmp_path: Path, episodes: list[dict[str, Any]], split: int):
    # repr: NaN equals itself and -0.0 differs from 0.0 (a mean of finite values can overflow to inf or NaN)
    run_dir = tmp_path / f"run-{next(_examples)}"
    episodes = [{"id": f"e{i}", **episode} for i, episode in enumerate(episodes)]
    first = basic_run(run_dir)
    first.log_episodes(episodes[:split])
    assert repr(first.summary()) == repr(_spool_summary(run_dir))
    first.abort(KeyboardInterrupt())
    second = basic_run(run_dir)  # resumed: its summary continues from the spool
    assert second.resumed
    assert second.log_episodes(episodes) == len(episodes[split:])  # the kept ones are skipped
    assert repr(second.summary()) == repr(_spool_summary(run_dir))
    sealed = second.finish()
    assert repr(sealed) == repr(_spool_summary(run_dir))
    # the seal holds it as JSON does: a mean whose finite values' sum overflowed (to ±inf) as null
    assert _sealed_summary(run_dir) == orjson.loads(orjson.dumps(sealed))


# -- the one-pass count: add() is add_reading(read_episode()) exactly ------------------------

_plain_float = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True)
# mostly what verifiers writes (every key there, finite floats, bools); now and then anything
# the two-pass reading must take over from: a key missing, an int, a NaN, a huge value
_one_pass_number = st.one_of(_plain_float, _plain_float, st.none(), _odd_number, st.sampled_from([1.5e308, -0.0]))
_one_pass_reward = st.one_of(
    st.fixed_dictionaries({"score": _one_pass_number, "weight": st.one_of(st.none(), _plain_float, _any_float)}),
    st.fixed_dictionaries({}, optional={"score": _one_pass_number, "weight": _plain_float}),
    st.none())
_one_pass_traces = st.lists(st.one_of(
    st.fixed_dictionaries({
        "agent": st.fixed_dictionaries({"trainable": st.one_of(st.booleans(), st.booleans(), _any_float, st.none())}),
        "rewards": st.dictionaries(_names, _one_pass_reward, max_size=3),
        "metrics": st.dictionaries(st.sampled_from(["a", "b", "m", "n"]), _one_pass_number, max_size=3),
    }),
    st.fixed_dictionaries({}, optional={"agent": st.one_of(st.none(), st.just({}), st.just({"trainable": True})),
                                        "rewards": st.one_of(st.none(), st.dictionaries(_names, _one_pass_reward)),
                                        "metrics": st.one_of(st.none(), st.dictionaries(_names, _one_pass_number))}),
), max_size=3)
_one_pass_episodes = st.lists(st.fixed_dictionaries({"ok": st.one_of(st.booleans(), st.none())},
                                                    optional={"traces": _one_pass_traces}), max_size=6)


def _state(accumulator: SummaryAccumulator) -> str:
    """Everything an accumulator holds, both populations with their names' order: exactly."""
    return repr((vars(accumulator._trainable), vars(accumulator._others), accumulator.counts,
                 accumulator._errors, accumulator._trainable_traces, accumulator.result()))


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(_one_pass_episodes, st.booleans())
@example([{"ok": True, "traces": [_scored(False, {"a": (0.5, None)}, {"m": 1.0}),  # read, then not averaged
                                  _scored(True, {"m": (0.25, 2.0), "b": (None, 1.0)}, {"m": 0.75, "b": 2.0}),
                                  _scored(False, {"a": (nan, None)})]}], True)
@example([{"ok": True, "traces": [_scored(True, {"a": (1.5e308, 1.0), "b": (1.5e308, 1.0)})]}], False)  # sum overflows
@example([{"ok": True, "traces": [_scored(True, {"a": (1.0, 2.0)}, {"m": 1.5e308, "n": 1.5e308})]}], True)
def test_the_one_pass_count_is_the_reading_added(episodes: list[dict[str, Any]], as_written: bool) -> None:
    """A run counts each episode under its lock in one pass (``add``, runner/run.py): the
    sums, the counts and the order of the means' names are those of the reading added, as
    written (a run's) or as in memory (compute_summary's)."""
    one_pass, two_pass = SummaryAccumulator(), SummaryAccumulator()
    for episode in episodes:
        written = orjson.dumps(episode) if as_written else None
        one_pass.add(episode, written)
        two_pass.add_reading(read_episode(episode, written))
        assert _state(one_pass) == _state(two_pass)


def test_finite_rewards_whose_sum_overflows_have_a_finite_mean(tmp_path: Path) -> None:
    """Two rewards of 1.5e308 sum past the largest float: ``avg_reward`` was ``inf``, shown
    live as "inf" and sealed as null, though the mean of finite rewards is finite. Now it
    is the mean, live and sealed, and the viewer's mean of the same numbers is the same."""
    from prime_runs_spool.viewer.spans import mean

    rewards = [1.5e308, 1.5e308, 1e308, -0.5]
    run = basic_run(tmp_path / "run")
    run.log_episodes([{"id": f"e{n}", "ok": True, "traces": [trace(True, {"r": r(reward)})]}
                      for n, reward in enumerate(rewards)])
    live = run.summary()["avg_reward"]
    run.finish()
    sealed = [rec.data for rec in iter_records(tmp_path / "run") if rec.type == "seal"][-1]["summary"]["avg_reward"]
    assert live == sealed == mean(rewards) == pytest.approx(sum(reward / 4 for reward in rewards), rel=1e-15)
    assert compute_summary([{"ok": True, "traces": [trace(True, {"r": r(reward)})]} for reward in rewards[:2]])[
        "avg_reward"] == 1.5e308


def test_finite_metrics_whose_sum_overflows_have_a_finite_mean(tmp_path: Path) -> None:
    """As ``avg_reward``: two metrics (or reward scores, averaged by name) of 1.5e308 summed
    past the largest float, so ``avg_metrics`` held ``inf``, live and, sealed, null. Each
    is the finite mean, summed as content/means.py sums, whichever way an episode is read
    (the one-pass ``add`` and the two-pass ``add_reading``)."""
    from prime_runs_spool.viewer.spans import mean

    values = [1.5e308, 1.5e308, 1e308, -0.5]
    episodes = [{"id": f"e{n}", "ok": True, "traces": [trace(True, {"s": r(value, 0.0)}, {"m": value})]}
                for n, value in enumerate(values)]
    run = basic_run(tmp_path / "run")
    run.log_episodes(episodes)
    live = run.summary()["avg_metrics"]
    run.finish()
    sealed = [rec.data for rec in iter_records(tmp_path / "run") if rec.type == "seal"][-1]["summary"]["avg_metrics"]
    assert live == sealed == {"s": mean(values), "m": mean(values)}, (live, sealed)
    assert mean(values) == pytest.approx(sum(value / 4 for value in values), rel=1e-15)
    read_apart = SummaryAccumulator()
    for episode in episodes:
        read_apart.add_reading(read_episode(episode))
    assert read_apart.result()["avg_metrics"] == live
    assert compute_summary(episodes[:2])["avg_metrics"] == {"s": 1.5e308, "m": 1.5e308}
