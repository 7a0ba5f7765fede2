"""Subtrees that repeat but for one value new every time: a runtime record's box id.

verifiers gives every rollout's box a new id, so a memo keyed by a record's exact
serialization never hits, and serializing the record without the id costs a copy and a
dump a trace. :class:`Beside` keeps the last few records seen (own copies, each with its
plan without the id) and knows an equal record but for the id by one ``==``, the id masked
by itself as the walk masks a string (``mask_new_text``): both the writer
(content/mask_fragments.py) and ``mask`` (content/masking.py's memo) ask it first, through
one method (``Beside.masked``), so the records are compared once a call.
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

    def masked(self, obj: Any, rules: Any, states: Any, scoped: bool, as_plan: bool = False) -> Any:
        """``obj``'s answer here (below ``states`` of ``rules``, a ``MaskRules``): the writer's
        (content/mask_fragments.py), ``None`` when nothing changes, else ``obj`` copied along its
        plan, so its keys stay in their order; ``as_plan``: the plan itself (``mask``'s, through
        the memo's ``plan_of``). A dict whose value at ``key`` is a str has a kept record's plan,
        when one equals it but for that value, else the memo's plan of it without that value
        (kept from now on); with the value masked by itself (``mask_new_text``, as the walk
        masks a string) where it is texted. The kept copy takes ``obj``'s value in place before
        ``==``: its other keys never change, so equal means equal but for that value, even when
        another thread set it meanwhile (``==`` then may say unequal: a miss, never a wrong
        answer). ``==`` tells a string from a number, ``None`` from NaN, a list from a tuple, as
        the memo's own check does; a comparison that raises (an array's) is a miss. A subtree of
        another shape (not a dict, its value at ``key`` not a str, a ``value`` key, which a
        ``{name, value}`` pair's rule reads beside its name) has the memo's whole answer. One
        call a trace from the memo and from the writer's loop, where a record repeats."""
        key = self.key
        if type(obj) is not dict or "value" in obj or type(value := obj.get(key)) is not str:
            if as_plan:
                return rules.memoized_plan_of(obj, states, scoped, False)
            return rules.memoized_masked_of()(obj, rules, states, scoped)
        for own, plan in self.kept:
            own[key] = value
            try:
                if own == obj:
                    break
            except Exception:  # noqa: BLE001 (an array's ``==`` has no truth value: a miss)
                pass
        else:
            rest = obj.copy()
            del rest[key]
            plan = rules.memoized_plan_of(rest, states, scoped, False)
            self.keep(obj, plan)
        if self.texted and not_in_id(value) is not None:  # an id as runtimes write them passes the search
            masked = mask_new_text(value)
            if masked is not value:
                plan = {**(plan or {}), key: masked}
        if as_plan or plan is None:
            return plan
        return apply_plan(obj, plan)

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
