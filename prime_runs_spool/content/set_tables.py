"""Which credential locations a config sets: their names, for a warning, never their values.

A launch file that holds a credential is not uploaded, and the warning says where in it the
credential sits (content/manifest.py). That is a report over what masking would change, not
masking itself, so it lives beside the walk (content/masking.py) and reads its plans.
"""

from __future__ import annotations

from typing import Any

from prime_runs_spool.content.mask_text import mask_url
from prime_runs_spool.content.mask_plans import KEYS
from prime_runs_spool.content.masking import MaskRules, _plan, _States
from prime_runs_spool.content.written_form import children as _children


def find_set_tables(obj: Any, rules: MaskRules) -> list[str]:
    """Paths of the credential locations in ``obj`` that masking would change.

    Names only, never values: used to explain why a launch file is not uploaded. For a
    table (a pattern ending in ``*``) that is the table (``client.headers``); for any
    other location, the location itself (``client.api_key``, ``client.base_url`` for a
    URL with userinfo). List indices are written ``[i]``: ``env.taskset.task.judges[0].headers``.
    """
    states, scoped = rules._start()
    if _children(obj) is None:
        return []
    found: dict[str, None] = {}
    _find(obj, rules, states, scoped, (), found)
    return list(found)


def _find(
    obj: Any, rules: MaskRules, states: _States, scoped: bool, path: tuple[str | int, ...],
    found: dict[str, None],
) -> None:
    plan = _plan(obj, rules, states, scoped, memoize=False)
    if plan is None:
        return
    for key, change in plan.items():
        if key is KEYS:  # URLs used as keys: each is named, its userinfo masked (_dotted)
            for renamed in change:
                found[_dotted((*path, renamed))] = None
            continue
        after, masked, table, starts_scope = rules._step(states, key)
        value = obj[key]
        if isinstance(change, str):
            if masked and _ends_in_wildcard(rules, states):
                found[_dotted(path)] = None  # an entry of a table: name the table
            else:
                found[_dotted((*path, key))] = None
        else:
            _find(value, rules, after, scoped or starts_scope, (*path, key), found)


def _ends_in_wildcard(rules: MaskRules, states: _States) -> bool:
    """Whether the next key is masked as a table's entry (a pattern ending in ``*``)."""
    n = len(rules.patterns)
    return any(
        rule < n and pos == len(rules.patterns[rule]) - 1 and rules.patterns[rule][-1] == "*"
        for rule, pos in states
    )


def _dotted(path: tuple[str | int, ...]) -> str:
    """The path as a warning names it; a key that is a URL is named without its userinfo."""
    out = ""
    for segment in path:
        if isinstance(segment, int):
            out += f"[{segment}]"
        else:
            out += ("." if out else "") + mask_url(segment)
    return out
