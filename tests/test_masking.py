"""Masking by location: a property test over generated configs and episodes, plus the
reference examples."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool.content.masking import MASK, MaskRules, find_set_tables, mask, parse_pattern

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reference"

# Free keys and values are lowercase; secrets are uppercase, so neither can fake the other.
RESERVED = {"client", "headers", "judges", "judge", "harness", "env", "traces", "agent", "config"}
free_key = st.text("abcdefghij", min_size=1, max_size=6).filter(lambda k: k not in RESERVED)
free_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False), st.text("abcdefghij \u2028é", max_size=8),
)
free_tree = st.recursive(
    free_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(free_key, inner, max_size=3)),
    max_leaves=12,
)
secret_text = st.text("ABCDEF0123456789", min_size=6, max_size=12).map(lambda s: "SECRET" + s)
secret_value = st.one_of(
    secret_text,
    st.lists(secret_text, min_size=1, max_size=2),
    st.dictionaries(free_key, secret_text, min_size=1, max_size=2),
)
secret_table = st.dictionaries(
    st.text("ABCDEFG-_abc", min_size=1, max_size=10), secret_value, min_size=1, max_size=3
)


def _set(root: dict, path: tuple, value: Any) -> None:
    node = root
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def configs(draw) -> tuple[dict, set[tuple]]:
    """A config-like tree with secrets at every kind of credential location."""
    config = draw(st.dictionaries(free_key, free_tree, max_size=4))
    tables: set[tuple] = set()

    def put(path: tuple) -> None:
        _set(config, path, draw(secret_table))
        tables.add(path)

    if draw(st.booleans()):
        put(("client", "headers"))
    for seat in draw(st.lists(free_key, unique=True, max_size=3)):
        if draw(st.booleans()):
            put(("env", seat, "client", "headers"))
        if draw(st.booleans()):
            put(("env", seat, "harness", "env"))
        _set(config, ("env", seat, "other"), draw(free_tree))
    judges = []
    for i in range(draw(st.integers(0, 3))):
        judge = draw(st.dictionaries(free_key, free_tree, max_size=2))
        judge["headers"] = draw(secret_table)
        tables.add(("env", "taskset", "task", "judges", i, "headers"))
        judges.append(judge)
    if judges:
        _set(config, ("env", "taskset", "task", "judges"), judges)
    for prefix in draw(st.lists(st.lists(free_key, min_size=1, max_size=3).map(tuple), max_size=2)):
        put((*prefix, *draw(st.sampled_from([("client", "headers"), ("harness", "env")]))))
    return config, tables


@st.composite
def episodes(draw) -> tuple[dict, set[tuple]]:
    record = draw(st.dictionaries(free_key, free_tree, max_size=3))
    record["info"] = {"client": {"headers": {"h": "visible"}}}  # outside traces: not masked
    tables: set[tuple] = set()
    traces = []
    for i in range(draw(st.integers(0, 3))):
        config, config_tables = draw(configs())
        trace = draw(st.dictionaries(free_key, free_tree, max_size=3))
        trace["agent"] = {"name": draw(free_key), "config": config}
        tables |= {("traces", i, "agent", "config", *path) for path in config_tables}
        traces.append(trace)
    record["traces"] = traces
    return record, tables


def _secrets(obj: Any, tables: set[tuple], path: tuple = ()) -> list[str]:
    out = []
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return [obj] if isinstance(obj, str) and obj.startswith("SECRET") else []
    for key, value in items:
        out += _secrets(value, tables, (*path, key))
    return out


def _check(before: Any, after: Any, tables: set[tuple], path: tuple = ()) -> None:
    """Masked exactly at the tables' entries; every other value unchanged; keys kept."""
    if path[:-1] in tables:
        assert after == MASK, path
        return
    if isinstance(before, dict):
        assert isinstance(after, dict) and list(after) == list(before), path
        for key in before:
            _check(before[key], after[key], tables, (*path, key))
    elif isinstance(before, list):
        assert isinstance(after, list) and len(after) == len(before), path
        for i, value in enumerate(before):
            _check(value, after[i], tables, (*path, i))
    else:
        assert after == before and type(after) is type(before), path


def _property(obj: Any, tables: set[tuple], rules: MaskRules) -> None:
    snapshot = copy.deepcopy(obj)
    out = mask(obj, rules)
    assert obj == snapshot and orjson.dumps(obj) == orjson.dumps(snapshot)  # not mutated
    dumped = orjson.dumps(out)
    for secret in _secrets(obj, tables):
        assert secret.encode() not in dumped
    _check(obj, out, tables)
    expected_tables = {
        path for path in tables if _lookup(obj, path) not in ({}, None)
    }
    assert set(find_set_tables(obj, rules)) == {_dotted(p) for p in expected_tables}


def _lookup(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _dotted(path: tuple) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else ("." if out else "") + key
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_config_secrets_never_survive_and_nothing_else_changes(case) -> None:
    config, tables = case
    _property(config, tables, MaskRules.defaults_for_config())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_episode_secrets_never_survive_and_nothing_else_changes(case) -> None:
    record, tables = case
    _property(record, tables, MaskRules.defaults_for_episode())
    assert mask(record, MaskRules.defaults_for_episode())["info"] == {"client": {"headers": {"h": "visible"}}}


def test_eval_example_toml() -> None:
    config = tomllib.loads((FIXTURES / "eval_example.toml").read_text(encoding="utf-8"))
    rules = MaskRules.defaults_for_config()
    out = mask(config, rules)
    assert out["client"]["headers"] == {"CF-Access-Client-Id": MASK, "CF-Access-Client-Secret": MASK}
    assert out["env"]["solver"]["harness"]["env"] == {"HF_TOKEN": MASK, "PIP_INDEX_URL": MASK}
    assert out["env"]["solver"]["harness"]["forward_env"] == ["GITHUB_TOKEN"]
    assert out["client"]["api_key_var"] == "VLLM_API_KEY"
    assert b"EXAMPLE_NOT_A_REAL" not in orjson.dumps(out)
    assert find_set_tables(config, rules) == ["client.headers", "env.solver.harness.env"]
    assert out["sampling"] is config["sampling"]  # untouched subtrees are shared


def test_episode_example() -> None:
    record = json.loads((FIXTURES / "episode_example.json").read_text(encoding="utf-8"))
    snapshot = copy.deepcopy(record)
    out = mask(record, MaskRules.defaults_for_episode())
    assert record == snapshot
    dumped = orjson.dumps(out)
    assert b"hf_EXAMPLE" not in dumped and b"team_0123456789abcdef" not in dumped
    for before, after in zip(record["traces"], out["traces"]):
        assert after["agent"]["config"]["client"]["headers"] == {"X-Prime-Team-ID": MASK}
        assert after["agent"]["config"]["harness"]["env"] == {"HF_TOKEN": MASK}
        assert after["nodes"] is before["nodes"]  # structural sharing off the masked paths
        assert after["agent"]["config"]["runtime"] is before["agent"]["config"]["runtime"]
    clean = {"id": "x", "traces": [{"agent": {"config": {"client": {"headers": {}}}}}]}
    assert mask(clean, MaskRules.defaults_for_episode()) is clean
    assert find_set_tables(clean, MaskRules.defaults_for_episode()) == []


def test_producer_rules_extend_the_defaults() -> None:
    rules = MaskRules.defaults_for_config().extended(["**.auth.token", ("a.b", "*")])
    obj = {"x": {"auth": {"token": "SECRETX", "user": "u"}}, "a.b": {"k": "SECRETY"}, "a": {"b": {"k": "v"}}}
    out = mask(obj, rules)
    assert out == {"x": {"auth": {"token": MASK, "user": "u"}}, "a.b": {"k": MASK}, "a": {"b": {"k": "v"}}}
    assert find_set_tables(obj, rules) == ["x.auth.token", "a.b"]
    assert len(rules.extended(["**.auth.token"]).patterns) == len(rules.patterns)
    assert MaskRules.of("client.headers.*").patterns == (("client", "headers", "*"),)


def test_star_matches_list_indices_and_double_star_matches_zero_segments() -> None:
    rules = MaskRules.of("**.headers.*")
    assert mask({"headers": ["SECRETA", "SECRETB"]}, rules) == {"headers": [MASK, MASK]}
    assert mask([{"headers": {"k": "SECRETC"}}], rules) == [{"headers": {"k": MASK}}]
    assert mask({"headers": "not a table"}, rules) == {"headers": "not a table"}


@pytest.mark.parametrize("bad", ["", "a..b", "a.**", ()])
def test_invalid_patterns_are_rejected(bad) -> None:
    with pytest.raises(ValueError):
        parse_pattern(bad)
