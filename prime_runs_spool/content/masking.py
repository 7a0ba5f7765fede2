"""Mask credentials by *location*, never by key name.

A verifiers config (and every trace's resolved seat config) has exactly two kinds of
free-form string tables that can carry a credential: a client's or judge's ``headers``
and a harness's ``env``. Whatever a key in them is called, its value may be a secret, and
no key-name heuristic can be trusted to spot one, so every value at those locations is
replaced by :data:`MASK`; keys stay, so a reader still sees that a header was set.

Locations are data (:class:`MaskRules`): patterns over the path from the root, one
segment per mapping key or list index. A segment is a literal key, ``*`` (exactly one key
or index) or ``**`` (any number of segments, including none). ``docs/masking.md`` lists
the defaults and how another producer adds its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: What a masked value becomes.
MASK = "***"

Pattern = tuple[str, ...]
_States = frozenset[tuple[int, int]]

#: Where credentials sit in a verifiers eval config (docs/masking.md, "Where credentials sit"), generalized
#: so any seat and any nesting works: a ``headers`` table under any client or judge, and
#: an ``env`` table under any harness.
CONFIG_PATTERNS: tuple[Pattern, ...] = (
    ("**", "client", "headers", "*"),
    ("**", "judges", "*", "headers", "*"),
    ("**", "judge", "headers", "*"),
    ("**", "harness", "env", "*"),
)

#: Each trace of an episode record stores its seat's resolved config under
#: ``agent.config``: the same locations, below that root.
EPISODE_PATTERNS: tuple[Pattern, ...] = tuple(
    ("traces", "*", "agent", "config", *pattern) for pattern in CONFIG_PATTERNS
)


def parse_pattern(pattern: str | Iterable[str]) -> Pattern:
    """A pattern from dotted text (``"env.*.harness.env.*"``) or a sequence of segments.

    Use the sequence form for a key that itself contains a dot.
    """
    segments = tuple(pattern.split(".")) if isinstance(pattern, str) else tuple(pattern)
    if not segments or any(not isinstance(s, str) or s == "" for s in segments):
        raise ValueError(f"invalid mask pattern: {pattern!r}")
    if segments[-1] == "**":
        raise ValueError(f"a mask pattern cannot end in '**': {pattern!r}")
    return segments


@dataclass(frozen=True)
class MaskRules:
    """An immutable set of location patterns; :meth:`extended` adds a producer's own."""

    patterns: tuple[Pattern, ...]

    @classmethod
    def of(cls, *patterns: str | Iterable[str]) -> MaskRules:
        return cls(tuple(parse_pattern(p) for p in patterns))

    @classmethod
    def defaults_for_config(cls) -> MaskRules:
        """The verifiers eval-config locations (:data:`CONFIG_PATTERNS`)."""
        return cls(CONFIG_PATTERNS)

    @classmethod
    def defaults_for_episode(cls) -> MaskRules:
        """The same locations inside each trace of an episode record."""
        return cls(EPISODE_PATTERNS)

    def extended(self, patterns: Iterable[str | Iterable[str]] | MaskRules) -> MaskRules:
        """These rules plus ``patterns`` (duplicates dropped, order kept)."""
        extra = patterns.patterns if isinstance(patterns, MaskRules) else map(parse_pattern, patterns)
        merged = dict.fromkeys((*self.patterns, *extra))
        return MaskRules(tuple(merged))

    # -- matching ------------------------------------------------------------------

    def _start(self) -> _States:
        return self._closure((i, 0) for i in range(len(self.patterns)))

    def _closure(self, states: Iterable[tuple[int, int]]) -> _States:
        """Add the states reached by letting each ``**`` match zero segments."""
        out = set()
        for rule, pos in states:
            out.add((rule, pos))
            pattern = self.patterns[rule]
            while pos < len(pattern) and pattern[pos] == "**":
                pos += 1
                out.add((rule, pos))
        return frozenset(out)

    def _step(self, states: _States, key: str | int) -> tuple[_States, bool]:
        """States after descending into ``key``, and whether that location is masked."""
        return _cached_step(self, states, key)

    def _step_uncached(self, states: _States, key: str | int) -> tuple[_States, bool]:
        text = key if isinstance(key, str) else str(key)
        moved = []
        for rule, pos in states:
            pattern = self.patterns[rule]
            if pos == len(pattern):
                continue
            segment = pattern[pos]
            if segment == "**":
                moved.append((rule, pos))
            elif segment == "*" or segment == text:
                moved.append((rule, pos + 1))
        after = self._closure(moved)
        matched = any(pos == len(self.patterns[rule]) for rule, pos in after)
        return after, matched


@lru_cache(maxsize=4096)
def _cached_step(rules: MaskRules, states: _States, key: str | int) -> tuple[_States, bool]:
    # Configs repeat the same keys in every trace of every episode: memoize the automaton.
    return rules._step_uncached(states, key)


def mask(obj: Any, rules: MaskRules) -> Any:
    """``obj`` with every value at a credential location replaced by :data:`MASK`.

    Never mutates ``obj``: only the mappings and lists on the way to a masked value are
    copied; every other subtree is shared with the input, so masking a large episode
    costs a walk of its config subtrees, not a deep copy.
    """
    return _mask(obj, rules, rules._start())


def _children(obj: Any) -> Iterable[tuple[str | int, Any]] | None:
    if isinstance(obj, Mapping):
        return obj.items()
    if isinstance(obj, (list, tuple)):
        return enumerate(obj)
    return None


def _mask(obj: Any, rules: MaskRules, states: _States) -> Any:
    children = _children(obj)
    if children is None or not states:
        return obj
    changed: dict[str | int, Any] = {}
    for key, value in children:
        after, matched = rules._step(states, key)
        if matched:
            changed[key] = MASK
        elif after:
            new = _mask(value, rules, after)
            if new is not value:
                changed[key] = new
    if not changed:
        return obj
    if isinstance(obj, Mapping):
        return {key: changed.get(key, value) for key, value in obj.items()}
    return [changed.get(i, value) for i, value in enumerate(obj)]


def find_set_tables(obj: Any, rules: MaskRules) -> list[str]:
    """Paths of the credential tables in ``obj`` that hold at least one entry.

    Names only, never values: used to explain why a launch file is not uploaded. A
    table is the container of the masked values (``client.headers``); for a pattern
    that ends in a literal key, the location itself when it holds a non-empty value.
    List indices are written ``[i]``: ``env.taskset.task.judges[0].headers``.
    """
    found: dict[str, None] = {}
    _find(obj, rules, rules._start(), (), found)
    return list(found)


def _find(
    obj: Any, rules: MaskRules, states: _States, path: tuple[str | int, ...], found: dict[str, None]
) -> None:
    children = _children(obj)
    if children is None or not states:
        return
    for key, value in children:
        after, matched = rules._step(states, key)
        if matched:
            ends_in_wildcard = any(
                pos == len(rules.patterns[rule]) and rules.patterns[rule][-1] == "*"
                for rule, pos in after
            )
            if ends_in_wildcard:
                found[_dotted(path)] = None
            elif value not in (None, "", {}, []):
                found[_dotted((*path, key))] = None
        elif after:
            _find(value, rules, after, (*path, key), found)


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for segment in path:
        if isinstance(segment, int):
            out += f"[{segment}]"
        else:
            out += ("." if out else "") + segment
    return out
