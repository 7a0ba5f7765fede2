"""Mask credentials at the locations a rule set names (docs/masking.md).

Locations are data (:class:`MaskRules`): patterns over the path from the root, one
segment per mapping key or list index. A segment is a literal key, ``~name`` (one key
spelling ``name`` in any case, ``_`` and ``-`` aside), ``*`` (exactly one key or index) or
``**`` (any number of segments, including none). A pattern that ends in
``*`` names a table: when the table is given as a single value instead (``headers =
"Authorization: Bearer ..."``), that value is masked whole. URL scopes name the subtrees
in which every string has the userinfo of any URL in it masked. ``docs/masking.md``
lists the defaults and how another producer adds its own.

Episodes repeat their seats' configs from one episode to the next, so the work of
finding what to mask in a config is memoized (:class:`_Memo`), keyed by the subtree's
exact serialization (verified by equality where it holds ``null``): a config that changed
in any way is walked afresh.

What is masked by default (the locations, the by-name rule, the URL scopes) is data, in
``mask_locations``, and what is masked inside a string or an argument list in those scopes
is ``mask_text``'s; this module is the walk that applies a rule set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, Union

import orjson

from prime_runs_spool.content.mask_locations import (ANY_SPELLING, CONFIG_PATTERNS, CONFIG_URL_SCOPES,
                                                     ENV_VAR_NAME, EPISODE_PATTERNS, EPISODE_URL_SCOPES,
                                                     LIST_POSITION, MASK, SECRET_NAME, Pattern,
                                                     is_env_var_name, is_secret_name, parse_pattern, spelling)
from prime_runs_spool.content.mask_beside import Beside, volatile_places
from prime_runs_spool.content.mask_plans import KEYS, MAX_PLAN_BYTES, Plan, apply_plan, is_mask
from prime_runs_spool.content.mask_text import mask_text, mask_url, masked_arguments
from prime_runs_spool.content.written_form import (children as _children, container_copy as _copy, plain_container,
                                                     written_text)

_States = frozenset[tuple[int, int]]
_Derived = TypeVar("_Derived")


# What one step of the automaton yields: the states below the key, whether the value there is
# masked whole, whether it is a table's entry (a scalar there is masked), whether a URL scope starts.
_Step = tuple[_States, bool, bool, bool]


@dataclass(frozen=True)
class MaskRules:
    """An immutable set of location patterns; :meth:`extended` adds a producer's own."""

    patterns: tuple[Pattern, ...]
    url_scopes: tuple[Pattern, ...] = ()
    _memo: _Memo = field(default_factory=lambda: _Memo(), init=False, repr=False, compare=False, hash=False)

    @classmethod
    def of(cls, *patterns: str | Iterable[str]) -> MaskRules:
        return cls(tuple(parse_pattern(p) for p in patterns))

    @classmethod
    def defaults_for_config(cls) -> MaskRules:
        """The verifiers eval-config locations (:data:`CONFIG_PATTERNS`), URLs everywhere."""
        return cls(CONFIG_PATTERNS, CONFIG_URL_SCOPES)

    @classmethod
    def defaults_for_episode(cls) -> MaskRules:
        """The same locations inside each trace's resolved config of an episode record."""
        return cls(EPISODE_PATTERNS, EPISODE_URL_SCOPES)

    def extended(self, patterns: Iterable[str | Iterable[str]] | MaskRules) -> MaskRules:
        """These rules plus ``patterns`` (duplicates dropped, order kept)."""
        if isinstance(patterns, MaskRules):
            extra, scopes = patterns.patterns, patterns.url_scopes
        else:
            extra, scopes = tuple(map(parse_pattern, patterns)), ()
        return MaskRules(tuple(dict.fromkeys((*self.patterns, *extra))), tuple(dict.fromkeys((*self.url_scopes, *scopes))))

    def derived(self, key: Hashable, make: Callable[[MaskRules, Any], _Derived]) -> _Derived:
        """What another module derives from these rules, made by ``make(self, key)`` the
        first time ``key`` is asked and kept as long as the rules: they never change, so it
        never goes stale. One lookup on the append's path (content/mask_fragments.py,
        content/error_scrub.py); a value may be a memo its maker keeps changing."""
        derived = self._memo.derived
        try:
            return derived[key]
        except KeyError:
            found = derived[key] = make(self, key)
            return found

    def memoized_masked_of(self) -> Callable[[Any, MaskRules, _States, bool], Any]:
        """:meth:`_Memo.masked_of`, bound: a memoized subtree masked for writing, which
        content/mask_fragments.py's loops call once per trace config (taken once per rules
        and kept with what they derive: no lookup per append)."""
        return self._memo.masked_of

    def memoized_plan_of(self, obj: Any, states: _States, scoped: bool, beside: bool = True) -> Plan | None:
        """:meth:`_Memo.plan_of` of a container below ``states`` (content/mask_beside.py asks it,
        ``beside`` false, for a record none of those kept equals, without its id)."""
        return self._memo.plan_of(obj, self, states, scoped, beside)

    def memoized_beside(self, states: _States, scoped: bool) -> Beside:
        """The memo's kept records at ``states``, a place :data:`VOLATILE_KEYS` names."""
        return self._memo.beside_of(self, states, scoped)

    # -- matching ------------------------------------------------------------------
    # One automaton runs the mask patterns (indices below len(patterns)) and the URL
    # scopes (the indices after them) side by side.

    def _rule(self, index: int) -> Pattern:
        n = len(self.patterns)
        return self.patterns[index] if index < n else self.url_scopes[index - n]

    def _start(self) -> tuple[_States, bool]:
        """The states at the root, and whether a URL scope covers the root itself."""
        start = self._memo.start
        if start is None:
            states = self._closure((i, 0) for i in range(len(self.patterns) + len(self.url_scopes)))
            start = self._memo.start = (states, () in self.url_scopes)
        return start

    def _closure(self, states: Iterable[tuple[int, int]]) -> _States:
        """Add the states reached by letting each ``**`` match zero segments."""
        out = set()
        for rule, pos in states:
            out.add((rule, pos))
            pattern = self._rule(rule)
            while pos < len(pattern) and pattern[pos] == "**":
                pos += 1
                out.add((rule, pos))
        return frozenset(out)

    def _step(self, states: _States, key: str | int) -> _Step:
        # Keyed by the key's text: ``True`` and ``1`` are equal as dict keys, not as segments.
        text = key if type(key) is str else str(key)
        steps = self._memo.steps
        found = steps.get((states, text))
        if found is None:
            found = self._step_uncached(states, text)
            if len(steps) > _MAX_STEPS:
                steps.clear()
            steps[(states, text)] = found
        return found

    def _step_uncached(self, states: _States, text: str) -> _Step:
        moved = []
        spelled = None  # the key as an ANY_SPELLING segment compares it, made once
        for rule, pos in states:
            pattern = self._rule(rule)
            if pos == len(pattern):
                continue
            segment = pattern[pos]
            if segment == "**":
                moved.append((rule, pos))
            elif (segment == "*" or segment == text or (segment == SECRET_NAME and is_secret_name(text))
                  or (segment == ENV_VAR_NAME and is_env_var_name(text))
                  or (segment == LIST_POSITION and text.isascii() and text.isdigit())):
                moved.append((rule, pos + 1))
            elif segment[0] == ANY_SPELLING:
                if spelled is None:
                    spelled = spelling(text)
                if spelling(segment[1:]) == spelled:
                    moved.append((rule, pos + 1))
        after = self._closure(moved)
        n = len(self.patterns)
        masked = any(rule < n and pos == len(self.patterns[rule]) for rule, pos in after)
        table = any(rule < n and pos == len(self.patterns[rule]) - 1 and self.patterns[rule][-1] == "*"
                    for rule, pos in after)
        scoped = any(rule >= n and pos == len(self._rule(rule)) for rule, pos in after)
        live = frozenset(
            (rule, pos) for rule, pos in after if pos < len(self._rule(rule))
        )
        return live, masked, table, scoped

    def _route(self, states: _States) -> tuple[tuple[str, _States, bool], ...]:
        """The levels below ``states`` at which exactly one key is named and stepping into it
        neither masks nor ends every pattern: each as (key, the states below, whether a URL
        scope starts there), down to the first level that is not one, or a URL scope's start
        (below it the memo answers). Computed once per set of states, for :func:`_masked`."""
        route = []
        while states:
            single = self._shape(states).single
            if single is None:
                break
            key, (after, masked, _table, starts_scope) = single
            if masked or not (after or starts_scope):
                break
            route.append((key, after, starts_scope))
            if starts_scope:
                break
            states = after
        return tuple(route)

    def _shape(self, states: _States) -> _Shape:
        """What the walk needs to know about ``states`` before looking at a container's keys
        (computed once per set of states): see :class:`_Shape`."""
        found = self._memo.shapes.get(states)
        if found is None:
            segments = [self._rule(rule)[pos] for rule, pos in states]
            wild = any(s in ("*", "**", SECRET_NAME, ENV_VAR_NAME, LIST_POSITION) or s[0] == ANY_SPELLING
                       for s in segments)  # every key must be looked at
            literals = None if wild else {key: self._step(states, key) for key in segments}
            # Every key steps alike when no literal is live: one step for all of them.
            uniform = self._step_uncached(states, "*") if all(s in ("*", "**") for s in segments) else None
            single = next(iter(literals.items())) if literals is not None and len(literals) == 1 else None
            found = _Shape(any(s == "**" for s in segments), literals, uniform, single)
            self._memo.shapes[states] = found
        return found


class _Shape(NamedTuple):
    """Per set of automaton states: whether a ``**`` is live (the walk below visits every
    node: worth memoizing); when every live segment is a literal, the keys a pattern can
    step into with their steps (else ``None``: every key must be looked at); when none is
    a literal, the one step every key takes (else ``None``: stepped key by key); when
    exactly one literal is live, that key and its step (:meth:`MaskRules._route`)."""

    dense: bool
    literals: dict[str, _Step] | None
    uniform: _Step | None
    single: tuple[str, _Step] | None = None


#: Bounds on the memo: entries, the step cache, and the hashes of subtrees seen once (a plan is
#: kept from a subtree's second sighting); the size of one memoized subtree is MAX_PLAN_BYTES.
_MAX_PLANS = 256
_MAX_STEPS = 65536
_MAX_SEEN = 4096
#: Lookups per window, and how many configs are then walked without the memo when
#: under one in eight of a window's lookups were answered.
_WINDOW = 64
_BYPASS = 448
#: The entries found last at one place, asked before the plans' dict (a place's few seats'
#: configs come in turn): a serialization compared with theirs, not hashed.
_RECENT = 8


class _Memo:
    """Per-rules caches: automaton steps, and the plans of subtrees seen before.

    A plan is keyed by the subtree's exact orjson serialization (keys, order, types and
    string contents), so a subtree that differs in any byte is walked afresh; where that
    serialization holds ``null`` (``None``, never masked, and NaN or an infinity, masked at
    a credential location, print alike) it is checked against an equal copy before use.
    Subtrees written alike otherwise mask alike: the plan holds keys and replacement
    strings only, and a value written like the copy's (a str or int of a subclass, a tuple
    for a list, a dataclass for a dict) is masked as that value is, or more.
    The identity of an object is never a key: an eval may mutate its config in place.
    """

    def __init__(self) -> None:
        self.start: tuple[_States, bool] | None = None
        self.steps: dict[tuple[_States, str], _Step] = {}
        self.shapes: dict[_States, _Shape] = {}
        self.routes: dict[_States, tuple[tuple[str, _States, bool], ...]] = {}
        #: What other modules derive from the rules (:meth:`MaskRules.derived`).
        self.derived: dict[Any, Any] = {}
        self.plans: dict[tuple[_States, bool, bytes], _Entry] = {}
        #: Per place, the last entries found there (:data:`_RECENT`), each with its key's
        #: serialization and scope: an entry evicted from ``plans`` may answer here a while, as
        #: it would have (an entry's answer holds for its key whatever happens to the others).
        self.recent: dict[_States, tuple[tuple[bytes, bool, _Entry], ...]] = {}
        self.seen_once: set[int] = set()
        self.lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # A useless memo costs a serialization per config: after a window of lookups
        # with few hits, the next _BYPASS configs are walked without asking.
        self.window = self.window_start = self.bypass = 0  # (window_start: the hits when it began)
        #: Where a key of VOLATILE_KEYS lies, made on the first lookup: its key and the records
        #: kept there (content/mask_beside.py), outside a URL scope and inside one.
        self.volatile: dict[_States, tuple[str, Beside, Beside]] | None = None

    def plan_of(self, obj: Any, rules: MaskRules, states: _States, scoped: bool, beside: bool = True) -> Plan | None:
        """The plan of ``obj``, a container below ``states``: from the memo when a copy of it
        (written alike; equal, where that holds ``null``) is memoized, else walked (and memoized from its second sighting). A runtime
        record's box id, new in every rollout, is left out of what the memo knows it by: the
        records kept there answer (``beside``: not when they are the ones asking)."""
        if beside:
            places = self.volatile
            volatile = (self._volatile(rules) if places is None else places).get(states)
            if volatile is not None:
                return volatile[2 if scoped else 1].masked(obj, rules, states, scoped, True)
        serialized, found = self._found(obj, states, scoped)
        if serialized is None:
            return _plan(obj, rules, states, scoped, memoize=False)
        if found is not None and (not found[3] or found[0] == obj):  # (the entry's null: see masked_of)
            self.hits += 1
            return found[1]
        return self._missed(obj, rules, states, scoped, serialized, found)[1]

    def beside_of(self, rules: MaskRules, states: _States, scoped: bool) -> Beside:
        """The records kept at ``states``, a place :data:`VOLATILE_KEYS` names."""
        places = self.volatile
        return (self._volatile(rules) if places is None else places)[states][2 if scoped else 1]

    def _volatile(self, rules: MaskRules) -> dict[_States, tuple[str, Beside, Beside]]:
        """:attr:`volatile`, made once (a thread making it too makes an equal one)."""
        self.volatile = {states: (key, Beside(key, starts_scope), Beside(key, True))
                         for states, (key, starts_scope) in volatile_places(rules).items()}
        return self.volatile

    def masked_of(self, obj: Any, rules: MaskRules, states: _States, scoped: bool) -> Any:
        """``obj`` masked for ``mask_for_writing`` (content/mask_fragments.py): ``None`` when
        nothing changes; from the memo, the ``orjson.Fragment`` of its masked serialization;
        else a copy along the plan. Only bytes are used, so a hit needs no ``==`` unless the
        serialization holds ``null`` (the entry knows): subtrees serialized alike mask alike
        but for ``None`` (never masked) against NaN or an infinity, all written ``null``; an
        ``Enum`` member or an ``orjson.Fragment`` is masked as the JSON it is written as."""
        serialized, found = self._found(obj, states, scoped)
        if serialized is None:
            plan = _plan(obj, rules, states, scoped, memoize=False)
            return None if plan is None else apply_plan(obj, plan)
        if found is not None and (not found[3] or found[0] == obj):
            self.hits += 1
            return found[2]
        entry = self._missed(obj, rules, states, scoped, serialized, found)
        plan = entry[1]
        return None if plan is None else apply_plan(obj, plan)

    def _found(self, obj: Any, states: _States, scoped: bool) -> tuple[bytes | None, _Entry | None]:
        """``obj`` serialized, the memo's key (``None`` when the memo is not asked: it is not
        plain JSON data, it is too large, or configs have not been repeating), and the entry
        memoized under it, if any: first among the last found at ``states`` (:data:`_RECENT`;
        bytes compared where the dict would hash all of them, about 3k instructions for a
        config), then in the dict."""
        if self.bypass:  # configs have not been repeating: walk without the serialization
            self.bypass -= 1
            return None, None
        self.window += 1
        if self.window == _WINDOW:
            if (self.hits - self.window_start) * 8 < _WINDOW:  # under one lookup in 8 answered: stop asking
                self.bypass = _BYPASS
            self.window, self.window_start = 0, self.hits
        try:
            serialized = _dumps(obj)
        except (TypeError, orjson.JSONEncodeError):  # not plain JSON data: no memo
            return None, None
        if len(serialized) > MAX_PLAN_BYTES:
            return None, None
        recent = self.recent.get(states, ())
        for seen, in_scope, entry in recent:
            if seen == serialized and in_scope is scoped:
                return serialized, entry
        found = self.plans.get((states, scoped, serialized))
        if found is not None:  # a new tuple in place: a thread reading the old one reads it whole
            if len(self.recent) >= _MAX_PLANS:
                self.recent.clear()
            self.recent[states] = (*recent[1 - _RECENT:], (serialized, scoped, found))
        return serialized, found

    def _missed(self, obj: Any, rules: MaskRules, states: _States, scoped: bool, serialized: bytes,
                found: _Entry | None) -> _Entry:
        """``obj``'s entry, walked: memoized from its second sighting (``found``: the entry
        its serialization found, of a subtree that is not equal to it)."""
        self.misses += 1
        plan = _plan(obj, rules, states, scoped, memoize=False)
        entry = (obj, plan, None, True)
        if found is None:
            # Kept from its second sighting on: a config that never repeats (a per-episode
            # seed) costs a serialization, not a copy and an eviction per episode.
            key = (states, scoped, serialized)
            sighting = hash(key)
            if sighting not in self.seen_once:
                if len(self.seen_once) >= _MAX_SEEN:
                    self.seen_once.clear()
                self.seen_once.add(sighting)
                return entry
            reference = orjson.loads(serialized)  # our own copy: nobody else can mutate it
            # The entry answers for subtrees equal to the reference (or, without a null,
            # serialized alike), so it holds the reference's plan: ``obj``'s own may differ
            # where ``obj`` holds NaN or an infinity (masked at a credential location),
            # which the reference holds as ``None`` (never masked).
            # find, not ``in``: ``bytes in bytes`` first tries the needle as an int,
            # formatting the TypeError that it is not one.
            has_null = serialized.find(b"null") >= 0
            if has_null:
                plan = _plan(reference, rules, states, scoped, memoize=False)
            fragment = None if plan is None else _Fragment(_dumps(apply_plan(reference, plan)))
            with self.lock:
                while len(self.plans) >= _MAX_PLANS:
                    self.plans.pop(next(iter(self.plans)))
                self.plans[key] = (reference, plan, fragment, has_null)
        return entry


#: A memo entry: an equal copy of the subtree (nobody else holds it), its plan, its masked
#: serialization as an ``orjson.Fragment`` (``None``: nothing changes), and whether its
#: serialization holds ``null`` (see ``masked_of``).
_Entry = tuple[Any, Union["Plan", None], Any, bool]
_dumps = orjson.dumps


def mask(obj: Any, rules: MaskRules, *, memo: bool = True) -> Any:
    """``obj`` with every value at a credential location replaced by :data:`MASK`.

    Never mutates ``obj``: only the mappings and lists on the way to a masked value are
    copied; every other subtree is shared with the input, so masking a large episode
    costs a walk of its config subtrees, not a deep copy. ``None`` is never masked (it
    carries nothing), nor a value that already is :data:`MASK`. ``memo=False`` walks
    every config afresh instead of consulting the rules' memo (the benchmark's baseline);
    the result is the same.
    """
    states, scoped = rules._start()
    if _children(obj) is None:
        return mask_text(obj) if scoped and isinstance(obj, str) else obj
    if memo:
        out = _masked(obj, rules, states, scoped)
        return obj if out is None else out
    plan = _plan(obj, rules, states, scoped, memoize=False)
    return obj if plan is None else apply_plan(obj, plan)


_Fragment = orjson.Fragment
_STR_ONLY = frozenset((str,))
#: Leaves never written as a string, passed without written_text's checks (an enum's is slow).
_NUMBERS = frozenset((int, float, bool))


def _plan(obj: Any, rules: MaskRules, states: _States, scoped: bool, *, memoize: bool) -> Plan | None:
    """What changes under the container ``obj`` (``None``: nothing)."""
    if not states and not scoped:
        return None
    if scoped:  # every string below is looked at: each key is stepped
        if memoize:
            return rules._memo.plan_of(obj, rules, states, scoped)
        literals = uniform = None
    else:
        shape = rules._shape(states)
        if memoize and shape.dense:
            return rules._memo.plan_of(obj, rules, states, scoped)
        literals, uniform = shape.literals, shape.uniform
    plan: Plan = {}
    if literals is not None and type(obj) is dict and _STR_ONLY >= set(map(type, obj)):
        # Look up the few keys a pattern names (only with str keys: 0 would match "0").
        children: Any = [(key, obj[key]) for key in literals if key in obj]
    else:
        children = _children(obj)
        literals = None
    renamed: dict[str, str] | None = None
    # An argument list in a URL scope: what follows a flag named like a secret; a {name, value} pair (mask_text.py),
    # read in the container as written: a dict subclass's pair had no rule where the walk, not the memo, read it.
    arguments = None
    if scoped:
        written = obj if type(obj) is dict or type(obj) is list else plain_container(obj)
        if type(written) is dict and len(written) == 2 and "value" in written or (
                type(written) is list and len(written) > 1):
            arguments = masked_arguments(written)
    for key, value in children:
        if scoped and type(key) is str and "://" in key:  # a key is written too: a URL there is masked
            masked_key = mask_url(key)
            if masked_key is not key:
                if renamed is None:
                    renamed = plan[KEYS] = {}
                renamed[key] = masked_key
        if value is None:
            continue
        after, masked, table, starts_scope = (
            uniform or (literals[key] if literals is not None else rules._step(states, key)))
        if masked:
            if not is_mask(value):
                plan[key] = MASK
            continue
        if arguments is not None and key in arguments:
            plan[key] = arguments[key]
            continue
        below = scoped or starts_scope
        if not after and not below and not table:
            continue  # no pattern reaches below this key
        if _children(value) is not None:
            sub = _plan(value, rules, after, below, memoize=memoize)
            if sub is not None:
                plan[key] = sub
        elif table:  # a table given as one value: all of it may be the credential
            if not is_mask(value):
                plan[key] = MASK
        elif below and isinstance(value, str):
            masked_text = mask_text(value)
            if masked_text is not value:
                plan[key] = masked_text
        elif below and type(value) not in _NUMBERS and (text := written_text(value)) is not None:
            if (masked_text := mask_text(text)) is not text:  # an enum's value, a fragment: written as a str
                plan[key] = masked_text
    return plan or None


def _masked(obj: Any, rules: MaskRules, states: _States, scoped: bool, fragments: bool = False) -> Any:
    """``apply_plan(obj, _plan(obj, ..., memoize=True))`` in one pass, or ``None`` when nothing
    changes: above the memoized subtrees (an episode's root, its traces, their agents) the
    walk copies as it goes instead of building a plan to walk again.

    Where the patterns name exactly one key at each of a few levels (``traces``, a trace's
    ``agent``: :meth:`MaskRules._route`), the walk steps down them in a loop, as long as each
    is a plain dict with str keys and the value there a dict or list, copying the dicts it
    passed once something below changed. Anything else at a level is its full step.

    ``fragments``: ``mask_for_writing``'s walk (content/mask_fragments.py: a memoized
    subtree comes back as an ``orjson.Fragment``)."""
    if scoped or not states:
        return _masked_here(obj, rules, states, scoped, fragments)
    routes = rules._memo.routes
    route = routes.get(states)
    if route is None:
        route = routes[states] = rules._route(states)
    chain = None  # the dicts passed on the way down, with the key taken in each
    for key, after, starts_scope in route:
        if type(obj) is not dict or not _STR_ONLY >= set(map(type, obj)):
            break  # (only str keys: 0 would match "0", and is stepped by its text below)
        value = obj.get(key)
        if value is None:  # absent, or None (never masked): nothing below changes
            return None
        if type(value) is not dict and type(value) is not list:
            break
        if chain is None:
            chain = [(obj, key)]
        else:
            chain.append((obj, key))
        obj, states, scoped = value, after, starts_scope
    out = _masked_here(obj, rules, states, scoped, fragments)
    if out is None or chain is None:
        return out
    for parent, key in reversed(chain):
        copied = parent.copy()
        copied[key] = out
        out = copied
    return out


def _masked_here(obj: Any, rules: MaskRules, states: _States, scoped: bool, fragments: bool = False) -> Any:
    """One container of :func:`_masked`'s walk, its children stepped one by one."""
    if not states and not scoped:
        return None
    shape = None if scoped else (rules._memo.shapes.get(states) or rules._shape(states))
    if shape is None or shape.dense:  # a URL scope or a live ``**``: the memo answers
        if fragments:
            return rules._memo.masked_of(obj, rules, states, scoped)
        plan = rules._memo.plan_of(obj, rules, states, scoped)
        return None if plan is None else apply_plan(obj, plan)
    literals, uniform = shape.literals, shape.uniform
    if literals is not None and type(obj) is dict and _STR_ONLY >= set(map(type, obj)):
        # Look up the few keys a pattern names (only with str keys: 0 would match "0").
        # An absent key reads as None, which the loop skips as it skips None (no comprehension:
        # its function and frame cost more than the pairs, 4.2k instructions for an agent's two).
        children: Any = zip(literals, map(obj.get, literals))
    else:
        children = obj.items() if type(obj) is dict else enumerate(obj) if type(obj) is list else _children(obj)
        literals = None
    out: Any = None
    for key, value in children:  # _plan's steps, with ``scoped`` false
        if value is None:
            continue
        after, masked, table, starts_scope = (
            uniform or (literals[key] if literals is not None else rules._step(states, key)))
        if masked:
            if is_mask(value):
                continue
            change: Any = MASK
        elif not after and not starts_scope and not table:
            continue  # no pattern reaches below this key
        elif starts_scope and (type(value) is dict or type(value) is list):  # a URL scope (a trace's config,
            memo = rules._memo  # its runtime record): the memo answers as in _masked_here, two calls fewer
            change = memo.masked_of(value, rules, after, True) if fragments else (
                None if (plan := memo.plan_of(value, rules, after, True)) is None else apply_plan(value, plan))
            if change is None:
                continue
        elif type(value) is dict or type(value) is list or _children(value) is not None:
            change = _masked(value, rules, after, starts_scope, fragments)
            if change is None:
                continue
        elif table:  # a table given as one value: all of it may be the credential
            if is_mask(value):
                continue
            change = MASK
        elif starts_scope and isinstance(value, str):
            change = mask_text(value)
            if change is value:
                continue
        elif starts_scope and type(value) not in _NUMBERS and (text := written_text(value)) is not None:
            change = mask_text(text)
            if change is text:
                continue
        else:
            continue
        if out is None:
            out = obj.copy() if type(obj) is dict or type(obj) is list else _copy(obj)
        out[key] = change
    return out
