"""What masking changes under a container, as data: a plan, and how a plan is applied.

The walk (content/masking.py) finds what to change once and its memo keeps it as a plan; a
plan holds keys and replacement strings only, never an input value, so applying a memoized
plan to an equal input is exactly a fresh walk. The writer's loops (content/mask_fragments.py)
apply the memo's plans too, and the report of which locations a config sets reads them
(content/set_tables.py).
"""

from __future__ import annotations

from typing import Any, Union

from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.content.written_form import container_copy as _copy

# A plan says what changes under a container: for each key, either the string that
# replaces the value (MASK, or a URL with its userinfo masked) or the plan below it;
# and under :data:`KEYS`, the keys in a URL scope that are renamed because they hold a
# URL's userinfo (old key to new). ``None`` means nothing changes.
Plan = dict[Union[str, int, object], Union[str, "Plan", dict[str, str]]]


class _RenamedKeys:
    """The type of :data:`KEYS`, a plan key no mapping key can equal."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "KEYS"


#: The largest subtree (its serialization, bytes) whose plan the memo keeps (content/masking.py),
#: and whose own copy it keeps to know a runtime record by (content/mask_beside.py): a larger
#: one is walked each time, and the memo's memory stays bounded whatever a record holds.
MAX_PLAN_BYTES = 64 * 1024

#: Where a plan keeps its renamed keys: a key is written as well as its value, so a URL
#: used as a key (``{"https://user:token@host": ...}``) has its userinfo masked too.
KEYS: Any = _RenamedKeys()


def apply_plan(obj: Any, plan: Plan) -> Any:
    """A copy of the container ``obj`` along the plan; everything else shared. (A dict is
    copied without a call, a leaf set before the keys' check: mask's answer from the memo is
    mostly this copy, about 3k instructions a level.)"""
    out: Any = obj.copy() if type(obj) is dict else _copy(obj)
    renamed = None
    for key, change in plan.items():
        # A plan's leaves are exact str (MASK, a masked URL); everything else is a plan.
        if type(change) is str:
            out[key] = change
        elif key is KEYS:
            renamed = change
        else:
            out[key] = apply_plan(out[key], change)
    if renamed is not None:  # keys in place, in order; two that mask alike keep the later value
        out = {renamed.get(key, key) if type(key) is str else key: value for key, value in out.items()}
    return out


def is_mask(value: Any) -> bool:
    """Whether ``value`` is already :data:`MASK` (masked again, it stays as it is)."""
    return type(value) is str and value == MASK
