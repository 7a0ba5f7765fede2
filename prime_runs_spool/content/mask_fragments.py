"""Masking a record that is only serialized afterwards: its memoized subtrees as fragments.

An episode is masked and then written with ``orjson.dumps``. Masking's memo already holds
each trace config it has seen twice, with its plan (content/masking.py); here it also gives
that config's masked serialization, made once, as an ``orjson.Fragment``, which the record's
serialization copies as it is: the config is neither copied along the plan nor serialized a
second time. Above the configs, where the rules name their keys at each level (``traces``, a
trace's ``agent``, its ``config`` and its ``runtime``), the walk is a loop over the traces,
not a call per level. A runtime record's box id is new in every rollout: the memo knows the
record without it (``Beside.masked``, content/mask_beside.py).

The result is written byte for byte as :func:`~prime_runs_spool.content.masking.mask`'s
(tests/test_masking.py), and only for writing: a reader of the record must not read inside a
memoized subtree (:func:`only_inside` says where those can be).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from prime_runs_spool.content.mask_locations import VOLATILE_KEYS, Pattern
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


def only_inside(rules: MaskRules, prefixes: tuple[Pattern, ...]) -> bool:
    """Whether every pattern and URL scope of ``rules`` lies inside the subtrees one of
    ``prefixes`` names (patterns without ``**``): masking then changes nothing outside them,
    and :func:`mask_for_writing` puts no fragment anywhere else. Computed once per prefixes."""
    return rules.derived(prefixes, _lies_inside)


def _lies_inside(rules: MaskRules, prefixes: tuple[Pattern, ...]) -> bool:
    """:func:`only_inside`, computed."""
    return all("**" not in prefix for prefix in prefixes) and all(
        any(rule[:len(prefix)] == prefix for prefix in prefixes) for rule in (*rules.patterns, *rules.url_scopes))


#: How a memoized subtree is masked for writing: ``(subtree, rules, states, scoped)`` to
#: ``None`` (nothing changes) or what is written in its place (``MaskRules.memoized_masked_of``,
#: or ``Beside.masked`` for a subtree with a key of :data:`VOLATILE_KEYS`).
_MaskedOf = Callable[[Any, MaskRules, _States, bool], Any]


class _ListRoute(NamedTuple):
    """See :func:`_list_route`: the keys down to the list; for each of its elements, every
    subtree the memo answers, as the keys from the element down to it (``tails``: a trace's
    ``agent.config`` and ``agent.runtime``) with the automaton's states and scope there and
    how it is masked; ``fork``: where the head is one key and every tail two keys with the
    same first, that key and each second key with the rest of its tail
    (:func:`_masked_along_fork`'s loop), else ``None``."""

    head: tuple[str, ...]
    tails: tuple[tuple[tuple[str, ...], _States, bool, _MaskedOf], ...]
    fork: tuple[str, tuple[tuple[str, _States, bool, _MaskedOf], ...]] | None


#: What :func:`_masked_along` answers for data off its route: the full walk decides.
_UNSURE: Any = object()


def _along(rules: MaskRules, _key: object) -> tuple[Any, _ListRoute | None]:
    """The loop :func:`mask_for_writing` takes for ``rules`` and its route (``None``: none),
    derived once per rules (:meth:`MaskRules.derived`)."""
    route = _list_route(rules)
    return (_masked_along if route is None or route.fork is None else _masked_along_fork), route


def _list_route(rules: MaskRules) -> _ListRoute | None:
    """The route :func:`_masked_along` takes when ``rules`` mask only inside the elements of
    one list that one-key levels lead to, below levels of each element that name their keys
    (literals, none of them masked), in subtrees the memo answers (an episode's ``traces``,
    each trace's ``agent``, its ``config`` and its ``runtime``); else ``None``. Read off the
    rules' automaton (``MaskRules._route``, ``_shape``)."""
    states, scoped = rules._start()
    head = _plain_route(rules, states) if states and not scoped else None
    if not head:
        return None
    shape = rules._shape(head[-1][1])
    step = shape.uniform  # every element steps alike, masking nothing, reaching further down
    if shape.dense or step is None or not step[0] or any(step[1:]):
        return None
    found = _memo_tails(rules, step[0], ())
    if not found:
        return None
    keys_down = tuple(key for key, _ in head)
    tails = tuple((keys, states, scoped, _masked_of(rules, (*keys_down, "*", *keys), states, scoped))
                  for keys, states, scoped in found)
    first = tails[0][0][0]
    fork = None
    if len(head) == 1 and all(len(keys) == 2 and keys[0] == first for keys, *_ in tails):
        fork = (first, tuple((keys[1], *rest) for keys, *rest in tails))
    return _ListRoute(keys_down, tails, fork)


def _masked_of(rules: MaskRules, path: Pattern, states: _States, scoped: bool) -> _MaskedOf:
    """How the memoized subtree at ``path`` is masked for writing: the memo's answer for the
    whole subtree, or, where :data:`VOLATILE_KEYS` names a key of it whose value is not
    masked whole there, the records kept there (``Beside.masked``: the memo's plan of the
    subtree known without that value, a runtime record's box id, applied to the subtree)."""
    volatile = VOLATILE_KEYS.get(path)
    if volatile is None:
        return rules.memoized_masked_of()
    _after, masked, table, _starts_scope = rules._step(states, volatile)
    if masked or table:  # a credential location: the memo's whole answer
        return rules.memoized_masked_of()
    return rules.memoized_beside(states, scoped).masked


def _plain_route(rules: MaskRules, states: _States) -> list[tuple[str, _States]] | None:
    """``MaskRules._route`` from ``states`` as (key, states below), when no step of it makes
    a table's entry (where a scalar would be masked) and it starts no URL scope; else ``None``."""
    route = rules._route(states)
    if not route or route[-1][2]:
        return None
    here = states
    for key, after, _starts_scope in route:
        if rules._shape(here).literals[key][2]:  # a table's entry
            return None
        here = after
    return [(key, after) for key, after, _ in route]


def _memo_tails(rules: MaskRules, states: _States, keys: tuple[str, ...]
                ) -> list[tuple[tuple[str, ...], _States, bool]] | None:
    """Below ``states`` (reached by ``keys``), every subtree the memo answers (a URL scope's
    start or a live ``**``), as (keys, states there, scoped), when every level above them
    names its keys (literals) and masks none of them whole or as a table's entry; else
    ``None``."""
    literals = rules._shape(states).literals
    if literals is None:
        return None
    tails = []
    for key, (after, masked, table, starts_scope) in literals.items():
        if masked or table:
            return None
        if starts_scope or (after and rules._shape(after).dense):
            tails.append(((*keys, key), after, starts_scope))
        elif after:
            below = _memo_tails(rules, after, (*keys, key))
            if below is None:
                return None
            tails.extend(below)
    return tails


def _masked_along(obj: dict[str, Any], rules: MaskRules, route: _ListRoute) -> Any:
    """The full walk's answer for ``obj`` along ``route``, in loops: ``None`` when nothing
    changes, else the copy with what changed; :data:`_UNSURE` at anything the route does not
    cover (a level that is not a plain dict, a list that is not a list, a memoized subtree
    that is neither a dict nor a list), which the full walk then takes."""
    head, tails, _fork = route
    parents, elements = _down(obj, head)
    if elements is None or elements is _UNSURE:
        return elements
    if type(elements) is not list:
        return _UNSURE
    copied_elements = None
    for index, element in enumerate(elements):
        if element is None:
            continue
        changed = element
        for tail, states, scoped, masked_of in tails:
            chain, node = _down(changed, tail)
            if node is None:
                continue
            if node is _UNSURE or (type(node) is not dict and type(node) is not list):
                return _UNSURE
            change = masked_of(node, rules, states, scoped)
            if change is not None:
                changed = _up(chain, tail, change)
        if changed is element:
            continue
        if copied_elements is None:
            copied_elements = elements.copy()
        copied_elements[index] = changed
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


def _masked_along_fork(obj: dict[str, Any], rules: MaskRules, route: _ListRoute) -> Any:
    """:func:`_masked_along` for a route of one key to the list and, below each of its
    elements, one key and then each of a few (an episode's ``traces``, a trace's ``agent``,
    then its ``config`` and its ``runtime``), unrolled: the same answers, in a third of the
    steps."""
    (key,), _tails, (first, seconds) = route
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
        copied = None
        for second, states, scoped, masked_of in seconds:
            inner = outer.get(second)
            if inner is None:
                continue
            if type(inner) is not dict and type(inner) is not list:
                return _UNSURE
            change = masked_of(inner, rules, states, scoped)
            if change is None:
                continue
            if copied is None:
                copied = outer.copy()
            copied[second] = change
        if copied is None:
            continue
        element = element.copy()
        element[first] = copied
        if copied_elements is None:
            copied_elements = elements.copy()
        copied_elements[index] = element
    if copied_elements is None:
        return None
    out = obj.copy()
    out[key] = copied_elements
    return out
