"""Masking by location: a property test over generated configs and episodes, plus the
reference examples."""

from __future__ import annotations

import copy
import enum
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings, strategies as st, HealthCheck

from prime_runs_spool import open_run
from prime_runs_spool.content.mask_locations import MASK, TRACE_CONFIG, TRACE_ROOTS, is_env_var_name, is_secret_name
from prime_runs_spool.content.mask_text import mask_text, masked_arguments
from prime_runs_spool.content.mask_fragments import _list_route, mask_for_writing, only_inside
from prime_runs_spool.content.masking import MaskRules, mask, parse_pattern
from prime_runs_spool.content.set_tables import find_set_tables
from support.files import all_bytes_under
from support.spelling import spelled

from support.threads import run_in_threads

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reference"

# Free keys and values are lowercase; secrets are uppercase, so neither can fake the other.
RESERVED = {"client", "headers", "judges", "judge", "harness", "env", "traces", "agent", "config", "runtime",
            "extra_headers", "default_headers", "default_query", "extra_query", "env_vars",
            "api_key", "auth_token", "azure_ad_token"}
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


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_config_secrets_never_survive_and_nothing_else_changes(case) -> None:
    config, tables = case
    _property(config, tables, MaskRules.defaults_for_config())


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    # A table given as one value is masked whole (it may be "Authorization: Bearer ...").
    assert mask({"headers": "Authorization: Bearer SECRETD"}, rules) == {"headers": MASK}
    assert mask({"headers": None}, rules) == {"headers": None}
    assert find_set_tables({"a": {"headers": "SECRETE"}}, rules) == ["a.headers"]


@pytest.mark.parametrize("bad", ["", "a..b", "a.**", ()])
def test_invalid_patterns_are_rejected(bad) -> None:
    with pytest.raises(ValueError):
        parse_pattern(bad)


# -- every location, anywhere: secrets placed in arbitrary surrounding structure ------------

#: Each credential location (docs/masking.md): tables, whose every entry is masked (and which
#: are masked whole when given as one value), and single values.
TABLE_LOCATIONS = [("headers",), ("extra_headers",), ("default_headers",), ("default_query",),
                   ("extra_query",), ("harness", "env"), ("runtime", "env"), ("env_vars",)]
VALUE_LOCATIONS = [("api_key",), ("auth_token",), ("azure_ad_token",)]
SECRET_WORD = st.text("ABCDEFGHKLMNPQRSTUVWXYZ0123456789", min_size=6, max_size=10).map(lambda s: "SECRET" + s)
entry_key = st.text("ABCDEFG-_", min_size=1, max_size=8)
free_text = st.text("abcdefghij :/.", max_size=10)  # may hold "://" but never "@"


@st.composite
def table_values(draw) -> tuple[Any, Any]:
    """A credential table in each shape a config gives one: mapping, list, one string."""
    shape = draw(st.sampled_from(["mapping", "list", "string", "nested"]))
    if shape == "mapping":
        table = draw(st.dictionaries(entry_key, SECRET_WORD, min_size=1, max_size=3))
        return table, {key: MASK for key in table}
    if shape == "list":
        table = draw(st.lists(SECRET_WORD.map(lambda s: f"Authorization: Bearer {s}"), min_size=1, max_size=3))
        return table, [MASK] * len(table)
    if shape == "nested":
        table = {draw(entry_key): {"value": draw(SECRET_WORD), "n": 1}}
        return table, {key: MASK for key in table}
    return f"Authorization: Bearer {draw(SECRET_WORD)}", MASK


@st.composite
def urls_with_userinfo(draw) -> tuple[str, str]:
    """A string holding a URL with credentials in its userinfo, and what it must become."""
    scheme = draw(st.sampled_from(["https", "http", "postgresql+psycopg", "redis", "git+ssh"]))
    user = draw(SECRET_WORD)
    password = draw(st.one_of(st.none(), SECRET_WORD, SECRET_WORD.map(lambda s: s[:5] + "/@:" + s[5:])))
    userinfo = user if password is None else f"{user}:{password}"
    host = draw(st.sampled_from(["api.example.com", "10.0.0.1:8000", "[::1]:5432", "h"]))
    tail = draw(st.sampled_from(["", "/", "/v1", "/v1?x=1#f"]))
    before = draw(st.sampled_from(["", "url ", "--index-url="]))
    after = draw(st.sampled_from(["", " and more", "\nnext"]))
    return f"{before}{scheme}://{userinfo}@{host}{tail}{after}", f"{before}{scheme}://{MASK}@{host}{tail}{after}"


def spelled_location(names: tuple[str, ...]):
    return st.tuples(*(spelled(name) for name in names))


@st.composite
def placed_configs(draw) -> tuple[dict, dict, list[str]]:
    """A free config with secrets placed at random credential locations at random depths.

    Returns the config, exactly what masking must make of it, and the secret words placed.
    """
    config = draw(st.dictionaries(free_key, free_tree, max_size=4))
    expected = copy.deepcopy(config)
    for _ in range(draw(st.integers(1, 5))):
        prefix = tuple(draw(st.lists(free_key, max_size=3)))
        kind = draw(st.sampled_from(["table", "value", "url"]))
        if kind == "table":
            path = (*prefix, *draw(st.sampled_from(TABLE_LOCATIONS).flatmap(spelled_location)))
            given_value, expected_value = draw(table_values())
        elif kind == "value":
            path = (*prefix, *draw(st.sampled_from(VALUE_LOCATIONS).flatmap(spelled_location)))
            given_value = draw(st.one_of(SECRET_WORD, st.lists(SECRET_WORD, min_size=1, max_size=2)))
            expected_value = MASK
        else:
            path = (*prefix, draw(free_key))
            given_value, expected_value = draw(urls_with_userinfo())
            if draw(st.booleans()):  # a URL inside a list of strings
                given_value, expected_value = [draw(free_text), given_value], [None, expected_value]
                expected_value[0] = given_value[0]
        _set(config, path, given_value)
        _set(expected, path, expected_value)
    words = [word for word in _words(config) if word.startswith("SECRET")]
    return config, expected, words


def _words(obj: Any) -> list[str]:
    import re

    return re.findall(r"SECRET[A-Z0-9]*", orjson.dumps(obj).decode())


def _exactly(out: Any, expected: Any) -> None:
    """Equal, with the same types everywhere (1 is not True, 1.0 is not 1)."""
    assert out == expected
    assert orjson.dumps(out) == orjson.dumps(expected)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed_configs())
def test_a_secret_at_any_location_never_survives_in_a_config(case) -> None:
    config, expected, words = case
    snapshot = copy.deepcopy(config)
    rules = MaskRules.defaults_for_config()
    out = mask(config, rules)
    assert config == snapshot  # never mutated
    dumped = orjson.dumps(out).decode()
    for word in words:
        assert word[:10] not in dumped
    _exactly(out, expected)
    assert (find_set_tables(config, rules) == []) == (words == [])
    _exactly(mask(config, rules), expected)  # again, now through the memo


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(placed_configs(), min_size=1, max_size=3), st.dictionaries(free_key, free_tree, max_size=3))
def test_a_secret_at_any_location_never_survives_in_an_episode(cases, outside) -> None:
    # The same kinds of values outside the traces' configs are the eval's data: kept.
    lookalike = {"headers": {"H": "visible"}, "api_key": "kept", "url": "https://me:visible@host/"}
    record = {**outside, "info": lookalike, "traces": []}
    expected = {**copy.deepcopy(outside), "info": copy.deepcopy(lookalike), "traces": []}
    for config, expected_config, _ in cases:
        record["traces"].append({"agent": {"config": config, "name": "solver"}, "nodes": [lookalike]})
        expected["traces"].append({"agent": {"config": expected_config, "name": "solver"}, "nodes": [lookalike]})
    snapshot = copy.deepcopy(record)
    rules = MaskRules.defaults_for_episode()
    for _ in range(2):  # the second pass answers from the memo
        out = mask(record, rules)
        assert record == snapshot
        _exactly(out, expected)
        dumped = orjson.dumps(out).decode()
        for _, _, words in cases:
            for word in words:
                assert word[:10] not in dumped


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(free_tree, st.sampled_from(["config", "episode"]))
def test_data_without_credentials_is_returned_as_is(tree, which) -> None:
    obj = {"traces": [{"agent": {"config": {"k": tree}}}]} if which == "episode" else {"k": tree}
    rules = MaskRules.defaults_for_config() if which == "config" else MaskRules.defaults_for_episode()
    assert mask(obj, rules) is obj
    assert find_set_tables(obj, rules) == []


def test_the_locations_that_leaked_in_issue_11() -> None:
    config = {
        "client": {"type": "eval", "base_url": "https://bob:SECRETPW1@vllm.example/v1", "api_key": "SECRETKEY1",
                   "extra_headers": {"X-A": "SECRETX1"}, "default_headers": {"X-B": "SECRETX2"}},
        "sampling_args": {"extra_headers": {"Authorization": "Bearer SECRETX3"}},
        "env": {"solver": {"env_vars": {"TOKEN": "SECRETENV1"},
                           "client": {"headers": "Authorization: Bearer SECRETX4"}}},
    }
    rules = MaskRules.defaults_for_config()
    out = mask(config, rules)
    assert b"SECRET" not in orjson.dumps(out)
    assert out["client"]["base_url"] == "https://***@vllm.example/v1"
    assert out["client"]["api_key"] == MASK and out["client"]["type"] == "eval"
    assert out["env"]["solver"]["client"]["headers"] == MASK
    assert find_set_tables(config, rules) == [
        "client.base_url", "client.api_key", "client.extra_headers", "client.default_headers",
        "sampling_args.extra_headers", "env.solver.env_vars", "env.solver.client.headers",
    ]
    episode = {"id": "e", "traces": [{"agent": {"config": config}}]}
    assert b"SECRET" not in orjson.dumps(mask(episode, MaskRules.defaults_for_episode()))


def test_a_config_mutated_between_episodes_is_masked_afresh() -> None:
    """The memo never trusts an object's identity: the same dict, changed in place, is re-walked."""
    rules = MaskRules.defaults_for_episode()
    config = {"client": {"base_url": "https://api.example/v1", "headers": {"X": "SECRETA1"}}, "model": "m"}
    record = {"id": "e", "traces": [{"agent": {"config": config}}]}
    for _ in range(3):
        assert b"SECRET" not in orjson.dumps(mask(record, rules))
    assert rules._memo.hits >= 1  # the memo now holds this config's plan
    config["client"]["base_url"] = "https://u:SECRETB2@api.example/v1"  # same objects, new secret
    config["client"]["api_key"] = "SECRETC3"
    config["model"] = 1
    out = mask(record, rules)
    assert b"SECRET" not in orjson.dumps(out)
    assert out["traces"][0]["agent"]["config"]["client"]["base_url"] == "https://***@api.example/v1"
    assert out["traces"][0]["agent"]["config"]["model"] == 1
    config["model"] = True  # equal to 1 as a Python value, not as data: not answered from the memo
    assert mask(record, rules)["traces"][0]["agent"]["config"]["model"] is True
    config["client"]["headers"] = {"X": None}
    for _ in range(2):  # memoized: nothing to mask in {"X": null}
        assert mask(record, rules)["traces"][0]["agent"]["config"]["client"]["headers"] == {"X": None}
    config["client"]["headers"] = {"X": float("nan")}  # serializes like None: verified by equality
    assert mask(record, rules)["traces"][0]["agent"]["config"]["client"]["headers"] == {"X": MASK}


def test_masked_output_is_never_shared_with_a_later_episode() -> None:
    """Mutating one masked result cannot change the next: plans hold no input values."""
    rules = MaskRules.defaults_for_episode()
    record = {"traces": [{"agent": {"config": {"client": {"headers": {"X": "SECRETA1"}}}}}]}
    first = mask(record, rules)
    first["traces"][0]["agent"]["config"]["client"]["headers"]["X"] = "SECRETLEAK"
    second = mask(copy.deepcopy(record), rules)
    assert second["traces"][0]["agent"]["config"]["client"]["headers"] == {"X": MASK}


# -- the memo is invisible: same results as a fresh walk, whatever changed in between -------

odd_leaf = st.one_of(
    free_leaf, st.just(float("nan")), st.just(float("inf")), st.just(1), st.just(True), st.just(1.0),
    st.just(MASK), st.just("https://u:SECRETUI1@h/"), st.tuples(st.just("SECRETTUPLE1")),
)


@st.composite
def mutation_sequences(draw) -> list[dict]:
    """A config, then the same config (fresh copies) changed one value at a time."""
    config, _, _ = draw(placed_configs())
    sequence = [copy.deepcopy(config)]
    for _ in range(draw(st.integers(1, 6))):
        config = copy.deepcopy(config)
        if draw(st.booleans()):  # an unchanged copy: answered from the memo
            sequence.append(config)
            continue
        path = list(draw(st.lists(st.sampled_from(["client", "headers", "Headers", "HEADERS", "api_key", "API_KEY",
                                                   "a", "b", 0]),
                                  min_size=1, max_size=3)))
        node: Any = config
        for key in path[:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(key, {}) if isinstance(node.get(key), dict) or key not in node else node[key]
        if isinstance(node, dict):
            node[path[-1]] = draw(st.one_of(odd_leaf, table_values().map(lambda pair: pair[0])))
        sequence.append(config)
    return sequence


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutation_sequences(), st.sampled_from(["config", "episode"]))
def test_the_memo_answers_exactly_what_a_fresh_walk_does(sequence, which) -> None:
    rules = MaskRules.defaults_for_config() if which == "config" else MaskRules.defaults_for_episode()
    for config in sequence:
        obj = config if which == "config" else {"id": "e", "traces": [{"agent": {"config": config}}] * 2}
        memoized, walked = mask(obj, rules), mask(obj, rules, memo=False)
        assert repr(memoized) == repr(walked)  # repr: NaN, 1 vs True vs 1.0, tuples all differ


class _Str(str):
    pass


class _Int(int):
    pass


class _List(list):
    pass


class _Dict(dict):
    pass


@st.composite
def _alike(draw, tree: Any) -> Any:
    """``tree`` with values orjson writes alike but ``==`` or the walk may not take alike: a
    str, int, list or dict of a subclass, a list as a tuple, ``None`` as NaN or an infinity."""
    if isinstance(tree, dict):
        out = {key: draw(_alike(value)) for key, value in tree.items()}
        return _Dict(out) if draw(st.booleans()) else out
    if isinstance(tree, list):
        items = [draw(_alike(value)) for value in tree]
        return draw(st.sampled_from([list, tuple, _List]))(items)
    if tree is None:
        return draw(st.sampled_from([None, float("nan"), float("inf")]))
    if type(tree) is str:
        return _Str(tree) if draw(st.booleans()) else tree
    if type(tree) is int:
        return _Int(tree) if draw(st.booleans()) else tree
    return tree


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(placed_configs(), st.data())
def test_a_memo_hit_masks_a_config_written_alike_as_a_fresh_walk_masks_it(case, data) -> None:
    """A memo hit is taken without ``==`` with the memo's copy unless the serialization holds
    ``null``, for ``mask`` as for the writer: a config that serializes as one memoized (its
    values of subclasses, a tuple for a list, NaN for ``None``) is written byte for byte as a
    fresh walk masks it, and no secret survives."""
    config, _expected, words = case
    for place in data.draw(st.lists(st.sampled_from([("api_key",), ("client", "api_key"), ("headers",)]), max_size=2)):
        _set(config, place, None)  # None where a NaN is masked: the entry must be checked there
    rules = MaskRules.defaults_for_config()
    for _ in range(2):  # kept from the second sighting, answered from the third
        mask(config, rules)
    variant = data.draw(_alike(config))
    assert orjson.dumps(variant) == orjson.dumps(config)
    out = orjson.dumps(mask(variant, rules))
    assert out == orjson.dumps(mask(variant, rules, memo=False))
    assert [word for word in words if word[:10].encode() in out] == []


def test_values_that_are_not_plain_json_are_walked() -> None:
    """No serialization, no memo: tuples, non-str keys and huge ints are walked every time."""
    rules = MaskRules.defaults_for_config()
    odd = {"client": {"headers": ("SECRETT1",), "api_key": "SECRETK1"}, 0: {"env_vars": {1: "SECRETI1"}},
           "big": 2**80}
    for _ in range(2):
        out = mask(odd, rules)
        assert "SECRET" not in repr(out) and out["big"] == 2**80
    assert rules._memo.hits == 0


class _Endpoint(enum.Enum):
    GATEWAY = "https://svc:SECRETENUM1@gw.internal/v1"


def test_a_value_written_as_a_string_is_masked_inside_as_a_string_is(tmp_path: Path) -> None:
    """An ``Enum`` member whose value is a URL with its password, or an ``orjson.Fragment``
    of one, in a config or a runtime record: orjson writes the string, but the walk took the
    leaf for no string and left it, so the password reached the disk and every sync in clear
    (walked, through the memo, and through ``Run.log_episodes``)."""
    fragment = orjson.Fragment(b'"https://svc:SECRETFRAG1@gw.internal/v1"')
    config = {"client": {"base_url": _Endpoint.GATEWAY}, "notes": [fragment, "plain"], "seat": _Endpoint.GATEWAY}
    rules = MaskRules.defaults_for_config()
    for _ in range(3):  # walked, kept from the second sighting, answered from the third
        for out in (mask(config, rules), mask(config, rules, memo=False)):
            assert orjson.dumps(out) == (b'{"client":{"base_url":"https://***@gw.internal/v1"},'
                                         b'"notes":["https://***@gw.internal/v1","plain"],'
                                         b'"seat":"https://***@gw.internal/v1"}')
    with open_run(tmp_path / "run", name="written-as", model="m") as run:
        for number in range(3):
            runtime = {"id": f"vf-{number:08x}", "api_base_url": _Endpoint.GATEWAY, "start": fragment}
            run.log_episodes([{"id": f"e{number}", "traces": [{"agent": {"config": config, "runtime": runtime}}]}])
    assert b"SECRET" not in all_bytes_under(tmp_path / "run")


def test_threads_sharing_one_memo_each_get_their_own_answer() -> None:
    """Many threads masking different configs through one rules object (as a Run's 64
    appender threads do) each get exactly what a fresh walk gives for their own config."""
    rules = MaskRules.defaults_for_episode()
    configs = [{"client": {"base_url": f"https://u{n}:SECRET{n:04d}@h/v1", "headers": {f"K{n}": "SECRETH"},
                           "model": n}} for n in range(300)]  # more than the memo holds
    expected = [orjson.dumps(mask({"traces": [{"agent": {"config": c}}]}, rules, memo=False)) for c in configs]
    failures: list[int] = []

    def worker(offset: int) -> None:
        for i in range(400):
            n = (i * 7 + offset) % len(configs)
            out = mask({"traces": [{"agent": {"config": copy.deepcopy(configs[n])}}]}, rules)
            if orjson.dumps(out) != expected[n]:
                failures.append(n)

    run_in_threads(worker, 8)
    assert failures == [] and rules._memo.hits > 0
    assert b"SECRET" not in b"".join(expected)


def test_a_memo_that_never_hits_steps_aside_then_tries_again() -> None:
    """Configs that never repeat make the memo walk without serializing for a while;
    configs that then repeat are memoized again. Every answer is a fresh walk's."""
    rules = MaskRules.defaults_for_config()
    for n in range(64):
        assert mask({"seed": n, "headers": {"X": "SECRETQ"}}, rules) == {"seed": n, "headers": {"X": MASK}}
    assert rules._memo.bypass > 0
    repeated = {"client": {"base_url": "https://u:SECRETP@h/"}, "seed": -1}
    for _ in range(600):
        assert mask(repeated, rules) == {"client": {"base_url": "https://***@h/"}, "seed": -1}
    assert rules._memo.bypass == 0 and rules._memo.hits > 0



def test_what_is_derived_from_rules_is_made_once_per_key_and_kept_per_rules() -> None:
    """``MaskRules.derived``: the maker runs on the first ask of a key only, each key and
    each rules object its own (equal rules do not share: the memo is the object's)."""
    made: list[object] = []

    def make(rules: MaskRules, key: object) -> list[object]:
        made.append(key)
        return [rules.patterns, key]

    rules = MaskRules.defaults_for_config()
    first = rules.derived("a", make)
    assert rules.derived("a", make) is first and first == [rules.patterns, "a"]
    assert rules.derived("b", make) == [rules.patterns, "b"] and made == ["a", "b"]
    assert MaskRules.defaults_for_config().derived("a", make) is not first and made == ["a", "b", "a"]
    assert rules.derived(("falsy",), lambda _rules, _key: False) is False
    assert rules.derived(("falsy",), make) is False  # a falsy value is kept, not made again

# -- the one-pass walk above the memoized subtrees is the plan-then-copy walk ----------------

segment = st.sampled_from(["a", "b", "0", "1", "*", "traces", "headers"])
rule_patterns = st.lists(st.lists(st.one_of(segment, segment, segment, st.just("**")), min_size=1, max_size=4)
                         .filter(lambda p: p[-1] != "**"), min_size=1, max_size=3)
odd_key = st.one_of(st.sampled_from(["a", "b", "0", "1", "traces", "headers", "x"]), st.integers(0, 1))
odd_tree = st.recursive(
    st.one_of(free_leaf, st.just(MASK), secret_text, st.just("https://u:SECRETURL1@h/")),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(odd_key, inner, max_size=4)),
    max_leaves=16,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_tree, rule_patterns, st.lists(st.sampled_from([(), ("a",), ("b", "*")]), max_size=2))
def test_any_rules_mask_alike_walked_or_memoized(tree, patterns, scopes) -> None:
    """Whatever the rules (literals, ``*``, ``**``, URL scopes) and the data (int keys,
    tuples, masks already there), ``mask`` answers what the plain walk does, through the
    memo or not, and never changes its input."""
    rules = MaskRules(tuple(tuple(p) for p in patterns), tuple(scopes))
    before = repr(tree)
    walked = repr(mask(tree, rules, memo=False))
    for _ in range(3):  # the second sighting on is answered from the memo where it can be
        assert repr(mask(tree, rules)) == walked
        assert repr(mask(copy.deepcopy(tree), rules)) == walked
    assert repr(tree) == before


@given(st.lists(st.tuples(secret_text, secret_text, secret_text), min_size=2, max_size=12))
def test_same_structure_new_secrets_are_always_masked(secrets) -> None:
    """Episodes whose configs have one structure and differ only in the secrets at the
    masked locations: through one rules object (its memo warm after the first two), no
    secret of any episode survives, and everything else is kept."""
    rules = MaskRules.defaults_for_episode()
    for key, header, password in secrets:
        config = {"client": {"base_url": f"https://user:{password}@api.example/v1", "api_key": key,
                             "headers": {"Authorization": header}}, "model": "m", "harness": {"env": {"T": key}}}
        episode = {"id": "e", "traces": [{"agent": {"config": config, "name": "solver"}, "info": {"k": "v"}}]}
        out = orjson.dumps(mask(episode, rules))
        assert b"SECRET" not in out
        assert orjson.loads(out)["traces"][0]["agent"]["config"]["client"]["base_url"] == "https://***@api.example/v1"
        assert b'"model":"m"' in out and b'"info":{"k":"v"}' in out


def test_a_one_key_descent_steps_non_str_keys_by_their_text() -> None:
    """The walk steps down a key a pattern names without a call (``_masked``'s loop): a key
    that is not a str but reads as the literal (``0`` for ``"0"``) is still stepped into,
    and a value there that is masked whole, a scalar or None takes the full step."""
    by_text = MaskRules.of(("0", "a"))
    assert mask({0: {"a": "SECRETINT"}}, by_text) == {0: {"a": MASK}}
    assert mask({"0": {"a": "SECRETSTR"}, 0: {"a": "SECRETINT"}}, by_text) == {"0": {"a": MASK}, 0: {"a": MASK}}
    rules = MaskRules.of(("b", "c"))
    assert mask({"b": {"c": {"d": "SECRETDICT"}}}, rules) == {"b": {"c": MASK}}
    assert mask({"b": None, "x": 1}, rules) == {"b": None, "x": 1}
    for tree in ({"0": {"a": "SECRETX"}}, {"b": ({"c": "k"},)}, {"b": {"c": None}}, {"b": "plain"}):
        assert mask(tree, rules) == mask(tree, rules, memo=False)


def _matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether ``path`` (key texts) matches ``pattern`` whole: ``*`` one segment, ``**`` any."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and _segment_matches(head, path[0]) and _matches(rest, path[1:])


def _segment_matches(segment: str, key: str) -> bool:
    """One segment against one key's text: ``*``, a literal, or a segment that names a shape
    of key (``{secret}``, ``{envvar}``, ``{index}``; docs/masking.md, the pattern language)."""
    if segment == "{secret}":
        return is_secret_name(key)
    if segment == "{envvar}":
        return is_env_var_name(key)
    if segment == "{index}":
        return key.isascii() and key.isdigit()
    if segment.startswith("~"):  # a name in any spelling: case, "_" and "-" aside
        return _letters(segment[1:]) == _letters(key)
    return segment == "*" or segment == key


def _letters(name: str) -> str:
    return "".join(c for c in name.casefold() if c not in "_-")


def _text(key: Any) -> str:
    return key if type(key) is str else str(key)


def _is_container(value: Any) -> bool:
    return isinstance(value, (Mapping, list, tuple))


def reference_mask(obj: Any, rules: MaskRules) -> Any:
    """The masked copy of ``obj``, by the rules read plainly, or ``obj`` itself when nothing
    changes (unchanged subtrees are shared)."""

    def in_scope(path: tuple[str, ...]) -> bool:
        return any(_matches(scope, path[:i]) for scope in rules.url_scopes for i in range(len(path) + 1))

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if not _is_container(value):
            return value
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        # an argument list in a URL scope: what follows a flag named like a secret
        arguments = (masked_arguments(value) if not isinstance(value, Mapping) and in_scope(path) else None) or {}
        changes = {}
        for key, child in items:
            if child is None:
                continue
            below = (*path, _text(key))
            masked = any(_matches(p, below) for p in rules.patterns)
            table = any(p[-1] == "*" and _matches(p[:-1], below) for p in rules.patterns)
            if masked or (table and not _is_container(child)):
                new = child if type(child) is str and child == MASK else MASK
            elif key in arguments:
                new = arguments[key]
            elif _is_container(child):
                new = walk(child, below)
            elif isinstance(child, str) and in_scope(below):
                new = mask_text(child)
                new = child if new == child else new
            else:
                new = child
            if new is not child:
                changes[key] = new
        if not changes:
            return value
        out = value.copy() if type(value) in (dict, list) else dict(value) if isinstance(value, Mapping) else list(value)
        for key, new in changes.items():
            out[key] = new
        return out

    if not _is_container(obj):
        return mask_text(obj) if isinstance(obj, str) and in_scope(()) else obj
    return walk(obj, ())


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types, key order and NaNs."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return [(type(k), k) for k in a] == [(type(k), k) for k in b] and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


class Key(str):
    """A str-subclass key: stepped by its text, like a plain one."""


_WORDS = ["traces", "agent", "config", "runtime", "headers", "api_key", "harness", "env", "extra_headers", "env_vars",
          "base_url", "auth_token", "0", "1", "x", "data",
          # location names in other spellings (and "Traces", which the episode's prefix never matches)
          "Headers", "HEADERS", "extraHeaders", "Extra-Headers", "ENV", "Harness", "Env_Vars", "API-KEY", "Traces"]


_keys = st.one_of(st.sampled_from(_WORDS), st.sampled_from(_WORDS).map(Key),
                  st.sampled_from([0, 1, True, False, 2.5]), st.text(max_size=3))


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                     st.sampled_from([MASK, "sk-secret", "https://user:pw@host/x", "see http://a@b and ftp://c:d@e f"]),
                     st.text(max_size=4))


_trees = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=16)


_config = st.dictionaries(_keys, _trees, max_size=5)


_agent = st.one_of(st.fixed_dictionaries({"config": st.one_of(_config, _trees)},
                                         optional={"runtime": st.one_of(_config, _trees), "name": _scalars,
                                                   "trainable": _scalars}), _trees)


_trace = st.one_of(st.fixed_dictionaries({}, optional={"agent": _agent, "task": _trees, "x": _trees}), _trees)


_episode = st.one_of(
    st.fixed_dictionaries({"traces": st.one_of(st.lists(_trace, max_size=3), _trace,
                                               st.dictionaries(_keys, _trace, max_size=3))},
                          optional={"id": _scalars, "agent": _trees}),
    st.dictionaries(_keys, _trees, max_size=3), _trees)


_EXTRA: list[tuple[str, ...]] = [(), ("traces.agent.config.token",), ("traces.0.agent",), ("traces",), ("traces.*",),
                                 ("traces.*.agent",), ("**.data",), ("traces.*.agent.config",), ("0.agent",)]


_RULES = {(kind, extra): (MaskRules.defaults_for_episode() if kind == "episode" else MaskRules.defaults_for_config())
          .extended(extra) for kind in ("episode", "config") for extra in _EXTRA}


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(episode=_episode, kind=st.sampled_from(["episode", "config"]), extra=st.sampled_from(_EXTRA),
       repeats=st.integers(1, 3))
def test_every_walk_masks_what_the_reference_masks(episode: Any, kind: str, extra: tuple[str, ...], repeats: int):
    rules = _RULES[(kind, extra)]
    before = repr(episode)
    want = reference_mask(episode, rules)
    for _ in range(repeats):  # the memo keeps a plan from a subtree's second sighting on
        assert same(mask(episode, rules), want)
    assert same(mask(episode, rules, memo=False), want)
    assert repr(episode) == before  # never mutated
    if want is episode:
        assert mask(episode, rules) is episode  # nothing changed: nothing copied


def test_the_route_masks_below_str_subclass_keys_and_skips_what_is_not_a_dict():
    rules = MaskRules.defaults_for_episode()
    episode = {Key("traces"): [{"agent": {Key("config"): {"api_key": "sk"}}}]}
    assert mask(episode, rules) == {"traces": [{"agent": {"config": {"api_key": MASK}}}]}
    for odd in ([{"agent": None}], [{"agent": "sk"}], [{"agent": [{"config": {"api_key": "sk"}}]}], None, "x"):
        assert mask({"traces": odd}, rules) == {"traces": odd}
    assert mask({"traces": [{"agent": {"config": "https://u:p@h"}}]}, rules) == {
        "traces": [{"agent": {"config": "https://***@h"}}]}


# -- the record for writing: serialized, the masked record byte for byte ------------------


def _written(obj: Any) -> bytes | None:
    """``obj`` as the spool writes it (orjson), or None where it cannot be written."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return None


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(episode=_episode, kind=st.sampled_from(["episode", "config"]), extra=st.sampled_from(_EXTRA),
       repeats=st.integers(1, 3))
def test_the_record_for_writing_is_written_as_the_masked_record(episode: Any, kind: str, extra: tuple[str, ...],
                                                                 repeats: int):
    """Whatever the rules and the data (int and str-subclass keys, tuples, NaN, masks in
    place), ``mask_for_writing`` is written byte for byte as the reference's masked record,
    through the memo (copies seen again) or not, and never changes its input."""
    rules = _RULES[(kind, extra)]
    before = repr(episode)
    want = _written(reference_mask(episode, rules))
    for _ in range(repeats + 1):  # a subtree's second sighting on: answered by the memo, as a fragment
        assert _written(mask_for_writing(episode, rules)) == want
        assert _written(mask_for_writing(copy.deepcopy(episode), rules)) == want
    assert repr(episode) == before


def _deeper(pattern: tuple[str, ...]) -> tuple[str, ...]:
    """An episode's pattern (``traces.*.agent.config...``) below a ``run`` key, with an
    ``inner`` level in each trace: a route longer than an episode's on both sides of the list."""
    return ("run", *pattern[:2], "inner", *pattern[2:])


_DEEPER_RULES = MaskRules(tuple(map(_deeper, MaskRules.defaults_for_episode().patterns)),
                          tuple(map(_deeper, MaskRules.defaults_for_episode().url_scopes)))


def _deeper_episode(episode: Any) -> dict:
    """``episode`` as :data:`_DEEPER_RULES` read it: under ``run``, each listed trace under ``inner``."""
    if type(episode) is dict and type(episode.get("traces")) is list:
        episode = {**episode, "traces": [{"inner": trace} for trace in episode["traces"]]}
    return {"run": episode}


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(episode=_episode.map(_deeper_episode), repeats=st.integers(1, 3))
@example(episode=_deeper_episode({"traces": [None, {"agent": {"config": {"client": {"headers": {"X": "sk"}}}}}, {}]}),
         repeats=1)
def test_the_record_for_writing_is_the_masked_record_along_any_route(episode: Any, repeats: int):
    """Along a route of other lengths than an episode's (the loop that is not unrolled),
    ``mask_for_writing`` is written byte for byte as the reference's masked record."""
    route = _list_route(_DEEPER_RULES)
    assert (route.head, sorted(keys for keys, *_ in route.tails), route.fork) == (
        ("run", "traces"), [("inner", "agent", "config"), ("inner", "agent", "runtime")], None)
    before = repr(episode)
    want = _written(reference_mask(episode, _DEEPER_RULES))
    for _ in range(repeats + 1):
        assert _written(mask_for_writing(episode, _DEEPER_RULES)) == want
        assert _written(mask_for_writing(copy.deepcopy(episode), _DEEPER_RULES)) == want
    assert repr(episode) == before


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutation_sequences(), st.integers(1, 3))
@example([{"headers": {"A": "SECRET000000"}, "a": {"a": {"headers": float("nan")}}},
          {"headers": {"A": "SECRET000000"}, "a": {"a": {"headers": None}}}], 1)  # found by Hypothesis
def test_the_record_for_writing_follows_every_change_of_a_config(sequence, traces) -> None:
    """Episodes whose trace configs repeat and change one value at a time (NaN where a null
    was, 1 where True was, a tuple, a mask already in place): each written as its plain walk."""
    rules = MaskRules.defaults_for_episode()
    for config in sequence:
        for _ in range(3):
            episode = {"id": "e", "traces": [{"agent": {"config": copy.deepcopy(config), "trainable": True},
                                              "task": {"data": {"idx": 0}}} for _ in range(traces)]}
            assert _written(mask_for_writing(episode, rules)) == _written(mask(episode, rules, memo=False))


def test_a_config_memoized_holding_nan_answers_none_at_that_place_as_none() -> None:
    """A config holding NaN at a credential key, seen often enough to be memoized, then the
    same config holding ``None`` there (serialized alike, ``null``): the memo's entry held the
    NaN config's plan, which masks the NaN, so ``None`` was written ``"***"`` (by both
    ``mask`` and ``mask_for_writing``); ``None`` is never masked."""
    rules = MaskRules.defaults_for_episode()

    def episode(value: Any) -> dict:
        return {"traces": [{"agent": {"config": {"headers": {"A": "SECRET000000"}, "a": {"headers": value}}}}]}

    for _ in range(3):
        mask_for_writing(episode(float("nan")), rules)
        mask(episode(float("nan")), rules)
    for masked in (mask_for_writing(episode(None), rules), mask(episode(None), rules)):
        assert orjson.loads(orjson.dumps(masked))["traces"][0]["agent"]["config"]["a"] == {"headers": None}
    assert orjson.dumps(mask_for_writing(episode(None), rules)) == orjson.dumps(mask(episode(None), rules, memo=False))


_NULLISH_LEAF = st.sampled_from([None, float("nan"), float("inf"), -float("inf"), "SECRETX", 1, 1.0, True, MASK])
_NULLISH_CONFIG = st.recursive(_NULLISH_LEAF, lambda inner: st.dictionaries(
    st.sampled_from(["headers", "Headers", "HEADERS", "api_key", "Api_Key", "a", "client", "env", "ENV", "x"]), inner,
    max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_NULLISH_CONFIG, st.integers(1, 3)), min_size=1, max_size=6))
@example([({"headers": float("nan")}, 1), ({"headers": None}, 1)])  # found by this property
def test_configs_whose_values_serialize_alike_are_each_masked_as_a_fresh_walk_masks_them(sequence) -> None:
    """Configs drawn where the memo's key (the serialization) cannot tell values apart: None,
    NaN and the infinities all written ``null``, 1 and 1.0 and True each their own, a mask
    already in place; each seen one to three times in turn. ``mask`` and ``mask_for_writing``
    each answer as a fresh walk does (the memo once masked a None after a NaN)."""
    rules = MaskRules.defaults_for_episode()
    for config, times in sequence:
        for _ in range(times):
            episode = {"id": "e", "traces": [{"agent": {"config": copy.deepcopy(config)}}]}
            walked = mask(episode, rules, memo=False)
            assert repr(mask(episode, rules)) == repr(walked)
            assert _written(mask_for_writing(episode, rules)) == _written(walked)


def test_a_null_in_a_memoized_config_is_told_from_nan() -> None:
    """orjson writes None, NaN and infinities alike (``null``): a config serialized as the
    memoized one is answered without a comparison only when its serialization holds no null."""
    rules = MaskRules.defaults_for_episode()

    def episode(value: Any) -> dict:
        return {"traces": [{"agent": {"config": {"client": {"headers": {"X": value}, "n": 1}}}}]}

    for _ in range(3):
        assert b"***" not in orjson.dumps(mask_for_writing(episode(None), rules))
    assert rules._memo.hits >= 1
    for odd in (float("nan"), float("inf"), -float("inf")):
        assert orjson.loads(orjson.dumps(mask_for_writing(episode(odd), rules))) == episode(MASK)
    assert orjson.dumps(mask_for_writing(episode(None), rules)) == orjson.dumps(episode(None))


def test_the_route_for_writing_takes_what_is_off_it_to_the_full_walk() -> None:
    """Data the loop along traces/agent/config does not cover (a trace that is not a dict, a
    tuple of traces, a config given as a URL) is masked by the full walk, as ``mask`` does."""
    rules = MaskRules.defaults_for_episode()
    for odd in ([{"agent": None}], [{"agent": "sk"}], [None, {"agent": {"config": {"api_key": "sk"}}}],
                [{"agent": [{"config": {"api_key": "sk"}}]}], ({"agent": {"config": {"api_key": "sk"}}},),
                [{"agent": {"config": "https://u:p@h"}}], ["x", {"agent": {"config": ({"api_key": "sk"},)}}]):
        for _ in range(3):
            assert orjson.dumps(mask_for_writing({"traces": odd}, rules)) == orjson.dumps(mask({"traces": odd}, rules))
    # Only trace configs and runtime records are answered as fragments: masking anywhere else
    # walks as mask does.
    assert not only_inside(rules.extended(["traces.*.info.api_key"]), TRACE_ROOTS)
    assert only_inside(rules, TRACE_ROOTS)
    assert not only_inside(rules, (TRACE_CONFIG,))
