"""Masking a record that is only serialized afterwards: its memoized subtrees as fragments.

An episode is masked and then written with ``orjson.dumps``. Masking's memo already holds
each trace config it has seen twice, with its plan (content/masking.py); here it also gives
that config's masked serialization, made once, as an ``orjson.Fragment``, which the record's
serialization copies as it is: the config is neither copied along the plan nor serialized a
second time. Above the configs, where the rules name one key at a level (``traces``, a
trace's ``agent``, its ``config``), the walk is a loop over the traces, not a call per level.

The result is written byte for byte as :func:`~prime_runs_spool.content.masking.mask`'s
(tests/test_masking.py), and only for writing: a reader of the record must not read inside a
memoized subtree (:func:`only_inside` says where those can be).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from prime_runs_spool.content.mask_locations import Pattern
from prime_runs_spool.content.mask_text import mask_text
from prime_runs_spool.content.masking import MaskRules, _masked, _States
from prime_runs_spool.content.written_form import children as _children


def mask_for_writing(obj: Any, rules: MaskRules) -> Any:
    """``mask(obj, rules)`` for ``orjson.dumps``: a memoized subtree that masking changes is
    the ``orjson.Fragment`` of its masked serialization; everything else is what ``mask``
    returns (shared with ``obj`` where nothing changes, never mutated).

    Keys on the loop's route are looked up, not stepped by their text: a dict there with a
    key that is not a str may be masked otherwise than by ``mask``, and cannot be written
    either (orjson refuses it); a caller that must name what cannot be written masks such a
    record with ``mask``.
    """
    walk, route = rules.derived(_ListRoute, _along)
    if route is not None and type(obj) is dict:
        out = walk(obj, rules, route)
        if out is not _UNSURE:
            return obj if out is None else out
    states, scoped = rules._start()
    if _children(obj) is None:
        return mask_text(obj) if scoped and isinstance(obj, str) else obj
    out = _masked(obj, rules, states, scoped, True)
    return obj if out is None else out


def only_inside(rules: MaskRules, prefix: Pattern) -> bool:
    """Whether every pattern and URL scope of ``rules`` lies inside the subtrees ``prefix``
    names (a pattern without ``**``): masking then changes nothing outside them, and
    :func:`mask_for_writing` puts no fragment anywhere else. Computed once per prefix."""
    return rules.derived(prefix, _lies_inside)


def _lies_inside(rules: MaskRules, prefix: Pattern) -> bool:
    """:func:`only_inside`, computed."""
    return "**" not in prefix and all(rule[:len(prefix)] == prefix for rule in (*rules.patterns, *rules.url_scopes))


class _ListRoute(NamedTuple):
    """See :func:`_list_route`: the keys down to the list, the keys from each of its
    elements down to the memoized subtree, the automaton's states and scope there, and the
    memo's lookup of such a subtree (``MaskRules.memoized_masked_of``)."""

    head: tuple[str, ...]
    tail: tuple[str, ...]
    states: _States
    scoped: bool
    masked_of: Callable[[Any, MaskRules, _States, bool], Any]


#: What :func:`_masked_along` answers for data off its route: the full walk decides.
_UNSURE: Any = object()


def _along(rules: MaskRules, _key: object) -> tuple[Any, _ListRoute | None]:
    """The loop :func:`mask_for_writing` takes for ``rules`` and its route (``None``: none),
    derived once per rules (:meth:`MaskRules.derived`)."""
    route = _list_route(rules)
    walk = _masked_along_two if route is not None and len(route.head) == 1 and len(route.tail) == 2 else _masked_along
    return walk, route


def _list_route(rules: MaskRules) -> _ListRoute | None:
    """The route :func:`_masked_along` takes when ``rules`` mask only inside the elements of
    one list that one-key levels lead to, below one-key levels of each element, in a subtree
    the memo answers (an episode's ``traces``, each trace's ``agent``, its ``config``); else
    ``None``. Read off the rules' automaton (``MaskRules._route``, ``_shape``)."""
    states, scoped = rules._start()
    head = _plain_route(rules, states) if states and not scoped else None
    if not head:
        return None
    shape = rules._shape(head[-1][1])
    step = shape.uniform  # every element steps alike, masking nothing, reaching further down
    if shape.dense or step is None or not step[0] or any(step[1:]):
        return None
    tail = _plain_route(rules, step[0], to_memo=True)
    if not tail:
        return None
    return _ListRoute(tuple(key for key, _ in head), tuple(key for key, _ in tail), tail[-1][1],
                      rules._route(step[0])[-1][2], rules.memoized_masked_of())


def _plain_route(rules: MaskRules, states: _States, to_memo: bool = False) -> list[tuple[str, _States]] | None:
    """``MaskRules._route`` from ``states`` as (key, states below), when no step of it makes
    a table's entry (where a scalar would be masked) and it ends where the memo answers
    (``to_memo``: a URL scope's start or a live ``**``) or else at no URL scope; else ``None``."""
    route = rules._route(states)
    if not route:
        return None
    here = states
    for key, after, _starts_scope in route:
        if rules._shape(here).literals[key][2]:  # a table's entry
            return None
        here = after
    ends_in_scope = route[-1][2]
    if to_memo and not (ends_in_scope or rules._shape(here).dense):
        return None
    if not to_memo and ends_in_scope:
        return None
    return [(key, after) for key, after, _ in route]


def _masked_along(obj: dict[str, Any], rules: MaskRules, route: _ListRoute) -> Any:
    """The full walk's answer for ``obj`` along ``route``, in loops: ``None`` when nothing
    changes, else the copy with what changed; :data:`_UNSURE` at anything the route does not
    cover (a level that is not a plain dict, a list that is not a list, a memoized subtree
    that is neither a dict nor a list), which the full walk then takes."""
    head, tail, states, scoped, masked_of = route
    parents, elements = _down(obj, head)
    if elements is None or elements is _UNSURE:
        return elements
    if type(elements) is not list:
        return _UNSURE
    copied_elements = None
    for index, element in enumerate(elements):
        if element is None:
            continue
        chain, node = _down(element, tail)
        if node is None:
            continue
        if node is _UNSURE or (type(node) is not dict and type(node) is not list):
            return _UNSURE
        change = masked_of(node, rules, states, scoped)
        if change is None:
            continue
        if copied_elements is None:
            copied_elements = elements.copy()
        copied_elements[index] = _up(chain, tail, change)
    if copied_elements is None:
        return None
    return _up(parents, head, copied_elements)


def _down(node: Any, keys: tuple[str, ...]) -> tuple[list[dict[str, Any]], Any]:
    """The dicts ``keys`` lead through from ``node``, and what the last key holds: ``None``
    where a key is absent or holds None (never masked: nothing below changes), :data:`_UNSURE`
    where a level is not a plain dict."""
    chain = []
    for key in keys:
        if type(node) is not dict:
            return chain, _UNSURE
        chain.append(node)
        node = node.get(key)
        if node is None:
            return chain, None
    return chain, node


def _up(chain: list[dict[str, Any]], keys: tuple[str, ...], change: Any) -> Any:
    """``change`` put in place of what ``keys`` lead to, in copies of the dicts of ``chain``
    (:func:`_down`'s), the first of them returned."""
    for position in range(len(keys) - 1, -1, -1):
        copied = chain[position].copy()
        copied[keys[position]] = change
        change = copied
    return change


def _masked_along_two(obj: dict[str, Any], rules: MaskRules, route: _ListRoute) -> Any:
    """:func:`_masked_along` for a route of one key to the list and two keys below each of
    its elements (an episode's ``traces``, a trace's ``agent`` and ``config``), unrolled:
    the same answers, in a third of the steps."""
    (key,), (first, second), states, scoped, masked_of = route
    elements = obj.get(key)
    if elements is None:
        return None
    if type(elements) is not list:
        return _UNSURE
    copied_elements = None
    index = -1
    for element in elements:
        index += 1
        if element is None:
            continue
        if type(element) is not dict:
            return _UNSURE
        outer = element.get(first)
        if outer is None:
            continue
        if type(outer) is not dict:
            return _UNSURE
        inner = outer.get(second)
        if inner is None:
            continue
        if type(inner) is not dict and type(inner) is not list:
            return _UNSURE
        change = masked_of(inner, rules, states, scoped)
        if change is None:
            continue
        outer = outer.copy()
        outer[second] = change
        element = element.copy()
        element[first] = outer
        if copied_elements is None:
            copied_elements = elements.copy()
        copied_elements[index] = element
    if copied_elements is None:
        return None
    out = obj.copy()
    out[key] = copied_elements
    return out
