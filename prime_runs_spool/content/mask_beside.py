"""Subtrees that repeat but for one value new every time: a runtime record's box id.

verifiers gives every rollout's box a new id, so a memo keyed by a record's exact
serialization never hits, and serializing the record without the id costs a copy and a
dump a trace. :class:`Beside` keeps the last few records seen (own copies, each with its
plan without the id) and knows an equal record but for the id by one ``==``, the id masked
by itself as the walk masks a string (``mask_new_text``): both the writer
(content/mask_fragments.py) and ``mask`` (content/masking.py's memo) ask it first.
"""

from __future__ import annotations

from typing import Any

import orjson

from prime_runs_spool.content.mask_locations import VOLATILE_KEYS
from prime_runs_spool.content.mask_plans import MAX_PLAN_BYTES, apply_plan
from prime_runs_spool.content.mask_text import mask_new_text, not_in_id

#: The records kept to compare with: a run's seats run in a few kinds of boxes.
KEPT = 8


class Beside:
    """The last :data:`KEPT` records below one place, each an own copy holding the key
    ``key``, with its plan (``None``: nothing changes) without that key's change."""

    __slots__ = ("key", "texted", "kept")

    def __init__(self, key: str, texted: bool) -> None:
        self.key = key
        #: Whether the value is masked as a string in a URL scope (else it is left as it is).
        self.texted = texted
        self.kept: tuple[tuple[dict[str, Any], Any], ...] = ()

    def plan_of(self, obj: dict[str, Any], rules: Any, states: Any, scoped: bool) -> Any:
        """The plan of ``obj`` (a dict whose value at ``key`` is a str, below ``states`` of
        ``rules``, a ``MaskRules``): a kept record's, when one equals it but for that value,
        else the memo's plan of it without that value (kept from now on); with the value
        masked by itself (``mask_new_text``, as the walk masks a string) where it is texted.
        The kept copy takes ``obj``'s value in place before ``==``: its other keys never
        change, so equal means equal but for that value, even when another thread set it
        meanwhile (``==`` then may say unequal: a miss, never a wrong answer). ``==`` tells a
        string from a number, ``None`` from NaN, a list from a tuple, as the memo's own check
        does. One call from the memo and from the writer's loop, where a record repeats."""
        key = self.key
        value = obj[key]
        for own, plan in self.kept:
            own[key] = value
            if own == obj:
                break
        else:
            rest = obj.copy()
            del rest[key]
            plan = rules.memoized_plan_of(rest, states, scoped)
            self.keep(obj, plan)
        if self.texted and not_in_id(value) is not None:  # an id as runtimes write them passes the search
            masked = mask_new_text(value)
            if masked is not value:
                return {**(plan or {}), key: masked}
        return plan

    def masked(self, obj: Any, rules: Any, states: Any, scoped: bool) -> Any:
        """The writer's answer for a subtree here (content/mask_fragments.py): ``None`` when
        nothing changes, else ``obj`` copied along its plan, so its keys stay in their order.
        A kept record equal to it and an id the search passes are answered here, one call a
        trace; anything else is :meth:`plan_of`'s, and a subtree of another shape (not a dict,
        its value at ``key`` not a str, a ``value`` key, which a ``{name, value}`` pair's rule
        reads beside its name) the memo's whole answer."""
        key = self.key
        if type(obj) is not dict or "value" in obj or type(value := obj.get(key)) is not str:
            return rules.memoized_masked_of()(obj, rules, states, scoped)
        for own, plan in self.kept:
            own[key] = value
            if own == obj:
                if self.texted and not_in_id(value) is not None:
                    break
                return None if plan is None else apply_plan(obj, plan)
        plan = self.plan_of(obj, rules, states, scoped)
        return None if plan is None else apply_plan(obj, plan)

    def keep(self, obj: dict[str, Any], plan: Any) -> None:
        """Keep an own copy of ``obj`` (plain JSON data only: the caller's lists may change
        in place) with ``plan``, the memo's for ``obj`` without ``key``; not one over
        :data:`MAX_PLAN_BYTES`, as the memo keeps no plan of one (else :data:`KEPT` copies of
        a record of any size, a box's file list, stayed in memory for the rules' life)."""
        try:
            serialized = orjson.dumps(obj)
        except (TypeError, orjson.JSONEncodeError):  # not plain JSON data: not kept
            return
        if len(serialized) > MAX_PLAN_BYTES:
            return
        own = orjson.loads(serialized)
        if type(own) is dict:
            self.kept = ((own, plan), *self.kept[:KEPT - 1])


def volatile_places(rules: Any) -> dict[Any, tuple[str, bool]]:
    """The states of ``rules`` (a ``MaskRules``: content/masking.py imports this module) at
    each subtree :data:`VOLATILE_KEYS` names (a list's index stepped as ``0``), with its key
    and whether a URL scope starts at it; not where the key is a credential location (its
    value masked whole, as the memo's whole answer does)."""
    found = {}
    for path, key in VOLATILE_KEYS.items():
        states = rules._start()[0]
        for segment in path:
            states = rules._step(states, "0" if segment == "*" else segment)[0]
        _after, masked, table, starts_scope = rules._step(states, key)
        if not (masked or table):
            found[states] = (key, starts_scope)
    return found
