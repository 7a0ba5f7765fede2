"""Two runs' manifests side by side, key by key: the config diff of the compare page.

Both manifests are the ones the runs' pages show (masked as stored, the config masked
again on reading): a diff is built from them and from nothing else, so it never shows a
value unmasked. Nested objects are walked into dotted keys (``config.sampling.temperature``),
lists into ``[i]``, so one changed setting is one line however deep it sits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

#: Keys that differ between any two runs and say nothing of how they were run.
IDENTITY_KEYS = frozenset({"run_id", "created_at", "name", "evaluation_id", "local_run_id", "finalized_at",
                           "total_samples"})
#: A value is shown up to this many characters (its whole text is in the run's page).
VALUE_CHARS = 400
#: At most this many keys are walked per manifest (a config of 50,000 keys stays a page).
MAX_KEYS = 5000
ABSENT = "(absent)"


@dataclass(frozen=True)
class ConfigLine:
    key: str
    a: str
    b: str

    @property
    def same(self) -> bool:
        return self.a == self.b


def _text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            text = repr(value)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def flatten(value: Any, prefix: str = "", out: dict[str, str] | None = None) -> dict[str, str]:
    """``value`` as ``{dotted key: value's text}``; an empty object or list is one line."""
    out = {} if out is None else out
    if len(out) >= MAX_KEYS:
        return out
    if isinstance(value, Mapping) and value:
        for key, inner in value.items():
            flatten(inner, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, (list, tuple)) and value:
        for index, inner in enumerate(value):
            flatten(inner, f"{prefix}[{index}]", out)
    else:
        out[prefix or "(value)"] = _text(value)
    return out


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[ConfigLine]:
    """Every key of either manifest (but the runs' own identity), in ``a``'s order then
    ``b``'s new ones, with each side's value (``(absent)`` where it has none)."""
    left = flatten({k: v for k, v in a.items() if k not in IDENTITY_KEYS})
    right = flatten({k: v for k, v in b.items() if k not in IDENTITY_KEYS})
    return [ConfigLine(key, left.get(key, ABSENT), right.get(key, ABSENT)) for key in dict.fromkeys([*left, *right])]
