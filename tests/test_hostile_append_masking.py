"""Masking's fast walks (the memo, the one-key route down ``traces``/``agent``/``config``)
against a reference masker written here from docs/masking.md's rules, on arbitrary
episodes: nested dicts, lists and tuples, str-subclass and non-str keys (``0`` and
``"0"``), keys named like the route's parts anywhere, scalars, None and lists where the
route expects a dict, values already ``***``, URLs with userinfo. An unmasked secret and
an over-masked value are both a difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool.content.masking import MASK, MaskRules, mask, mask_url_userinfo


def _matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether ``path`` (key texts) matches ``pattern`` whole: ``*`` one segment, ``**`` any."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and (head == "*" or head == path[0]) and _matches(rest, path[1:])


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
        changes = {}
        for key, child in items:
            if child is None:
                continue
            below = (*path, _text(key))
            masked = any(_matches(p, below) for p in rules.patterns)
            table = any(p[-1] == "*" and _matches(p[:-1], below) for p in rules.patterns)
            if masked or (table and not _is_container(child)):
                new = child if type(child) is str and child == MASK else MASK
            elif _is_container(child):
                new = walk(child, below)
            elif isinstance(child, str) and in_scope(below):
                new = mask_url_userinfo(child)
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
        return mask_url_userinfo(obj) if isinstance(obj, str) and in_scope(()) else obj
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


_WORDS = ["traces", "agent", "config", "headers", "api_key", "harness", "env", "extra_headers", "env_vars",
          "base_url", "auth_token", "0", "1", "x", "data"]
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
                                         optional={"name": _scalars, "trainable": _scalars}), _trees)
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
