"""The rollout key admission reads in the shape check's pass is ``rollout_key``'s, for every
episode the check accepts, and the rollout numbers a run writes count by it; the nodes it
counts there are the most one trace holds, which bound its rows (``check_sendable``)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson
from hypothesis import example, given, settings, strategies as st

from prime_runs_spool import open_run
from prime_runs_spool.content.episodes import NO_ROW, check_episode, check_episode_keyed, rollout_key
from prime_runs_spool.errors import MalformedEpisodeError
from prime_runs_spool.spool.reader import iter_records

trainable = st.one_of(st.booleans(), st.none(), st.sampled_from([0, 1, "", "yes", 0.0]))
agents = st.one_of(
    st.none(), st.just({}),
    st.fixed_dictionaries({}, optional={"trainable": trainable, "name": st.just("a")}),
    st.builds(lambda agent: MappingProxyType(agent), st.fixed_dictionaries({"trainable": trainable})),
)
idxs = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["a", "b", ""]), st.booleans(), st.just(1.5))
datas = st.one_of(st.none(), st.just({}), st.fixed_dictionaries({}, optional={"idx": idxs, "prompt": st.just("p")}),
                  st.builds(lambda data: MappingProxyType(data), st.fixed_dictionaries({"idx": idxs})))
tasks = st.one_of(st.none(), st.just({}), st.fixed_dictionaries({}, optional={"data": datas}),
                  st.builds(lambda task: MappingProxyType(task), st.fixed_dictionaries({"data": datas})))
traces = st.lists(st.fixed_dictionaries({}, optional={
    "agent": agents, "task": tasks,
    # a field of another kind sends the check down its field-by-field path
    "nodes": st.one_of(st.none(), st.just([]), st.just(()), st.lists(st.just({}), max_size=3),
                       st.lists(st.just({}), max_size=3).map(tuple)),
}), max_size=4)
episodes = st.fixed_dictionaries({"id": st.just("e")}, optional={"traces": st.one_of(st.none(), traces, traces.map(tuple))})


@settings(max_examples=400, deadline=None)
@given(episodes)
@example({"id": "e", "traces": [{"agent": {"trainable": False}, "task": {"data": {"idx": 1}}},
                                {"agent": {"trainable": True}, "task": {"data": {"idx": 2}}}]})
@example({"id": "e", "traces": [{"task": MappingProxyType({"data": {"idx": 1}}), "agent": {"trainable": True}}]})
@example({"id": "e", "traces": [{"nodes": (), "agent": {"trainable": 1}, "task": {"data": {"idx": 3}}}]})
@example({"id": "e", "traces": []})
def test_the_key_read_with_the_shape_is_rollout_keys(episode: dict[str, Any]) -> None:
    try:
        carries, key, most_nodes = check_episode_keyed(episode)
    except MalformedEpisodeError:
        return
    assert carries == check_episode(episode)
    expected = rollout_key(episode)
    assert (key is NO_ROW) == (expected is NO_ROW)
    assert repr(key) == repr(expected)
    # what check_sendable counted in a loop of its own before
    assert most_nodes == max((len(trace.get("nodes") or ()) for trace in episode.get("traces") or ()), default=0)


def test_a_run_numbers_its_episodes_by_the_summary_traces_idx(tmp_path: Path) -> None:
    """Through a whole run: the first trainable trace's idx, else the first trace's, counts."""
    def episode(episode_id: str, idx_by_trace: list[tuple[Any, bool]]) -> dict[str, Any]:
        return {"id": episode_id, "ok": True, "traces": [
            {"agent": {"trainable": flag}, "task": {"data": {"idx": idx}}} for idx, flag in idx_by_trace]}

    run = open_run(tmp_path / "run", name="keys", environments=["gsm8k"], model="m")
    run.log_episodes([episode("a", [(7, False), (1, True)]), episode("b", [(1, False), (7, False)]),
                      episode("c", [(9, False), (1, True)]), episode("d", [(7, True)]),
                      {"id": "e", "ok": True, "traces": []}, episode("f", [(1, False)])])
    run.finish()
    numbers = {record.meta["episode_id"]: record.meta["rollout_number"]
               for record in iter_records(tmp_path / "run") if record.type == "episode"}
    # key 1: a, b, c, f; key 7: d; no traces: no number
    assert numbers == {"a": 1, "b": 2, "c": 3, "d": 1, "e": None, "f": 4}
    written = [orjson.loads(orjson.dumps(record.data)) for record in iter_records(tmp_path / "run")
               if record.type == "episode"]
    assert [repr(rollout_key(data)) for data in written] == ["1", "1", "1", "7", repr(NO_ROW), "1"]
