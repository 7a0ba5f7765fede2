"""An episode's error messages, cleared of the credentials its trace configs held.

A model call that fails quotes what it failed on: httpx refuses a header value holding a
line break (a key pasted with its newline) as ``Illegal header value b'<the value>\\n'``, and
verifiers records that message in the call's ``error``, the trace's and the episode's
``errors``. Masking by location replaced the header in ``traces[*].agent.config``, but the
message carried the value to the disk and on to the platform.

So once an episode is masked, whatever its status, every string the masking took out of its
trace configs and runtime records (a header's value, a key, each string of a table masked
whole) is also taken
out of every string under a key named ``error`` or ``errors``, wherever the episode holds
one: as written, without the blanks around it, and as Python quotes it in a message (the
``repr`` of it as text and as bytes), each replaced by :data:`MASK`. Only those messages: the
rest of an episode is the eval's data (docs/masking.md). A value shorter than
:data:`MIN_SECRET_CHARS` is not searched for (a header ``X-Team: 1`` would mask every ``1``).
An ``ok`` episode is searched too: a call that failed on a credential and was retried (the
retry passing) keeps its message in the call's ``error``; it is walked where it holds error
text where verifiers records one, which the shape check tells in the pass it makes
(content/episodes.py ``check_episode``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from prime_runs_spool.content.mask_locations import MASK

#: The shortest value searched for in error messages.
MIN_SECRET_CHARS = 8
#: The keys whose subtrees are error messages.
ERROR_KEYS = frozenset({"error", "errors"})


def scrub_episode_errors(original: Mapping[str, Any], masked: Any) -> Any:
    """``masked`` (``original`` masked, as plain containers) with its error messages cleared
    of what masking took out of its trace configs; the same object when nothing changes."""
    return scrub_errors(masked, episode_error_forms(original, masked))


def episode_error_forms(original: Mapping[str, Any], masked: Any) -> list[str]:
    """What an episode's error messages are searched for: each string masking took out of
    its trace configs and runtime records (``masked``: ``original`` masked, as plain
    containers), as a message may quote it. Nothing, without a walk, when masking took
    nothing out."""
    if masked is original:
        return []
    values: set[str] = set()
    for before, after in zip(_traces(original), _traces(masked)):
        values |= masked_away(_config(before), _config(after))
        values |= masked_away(_runtime(before), _runtime(after))
    return _forms(values)


class _FormsMemo:
    """Key of the memo :func:`memoized_error_forms` keeps with the rules (``MaskRules.derived``)."""


def _new_memo(_rules: Any, _key: object) -> dict[Any, Any]:
    return {}


#: Sets of trace configs whose forms are kept per rules: an eval's configs repeat in every
#: episode, so a handful is the common case; past this many the memo starts afresh.
MEMO_ENTRIES = 256


def memoized_error_forms(original: Mapping[str, Any], rules: Any, masked_plainly: Callable[[], Any],
                         written: Any = None) -> list[str] | None:
    """:func:`episode_error_forms` of ``original``, memoized per rules by its trace configs
    and runtime records: the forms depend on nothing else, and the configs repeat in every
    episode of a run, so the plain masking of the whole episode (``masked_plainly()``) is paid
    only for a set of them not seen before. None when one cannot be serialized (the caller
    masks plainly).

    A config is known by its exact serialization, or, cheaper, where ``written`` (``original``
    masked for writing, content/mask_fragments.py) holds it as the masking memo's fragment,
    by that fragment: the memo gives one fragment to every equal copy of a config, and the
    fragment kept here cannot be freed and its identity reused. A runtime record holds the
    box's id, new in every episode: where ``written`` shows that masking left it as it was
    (the same object), it adds nothing to the forms and is left out of the key."""
    memo = rules.derived(_FormsMemo, _new_memo)
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    fragments = _fragments(original, written) if written is not None else None
    if fragments:
        found = memo.get(tuple(map(id, fragments)))
        if found is not None and found[0] == fragments:  # a fragment equals only itself
            return found[1]
    keys: list[Any] = []
    written_traces = _traces(written) if written is not None else None
    for index, trace in enumerate(_traces(original)):
        config = _config(trace)
        runtime = _runtime(trace)
        if runtime is not None and written_traces is not None and index < len(written_traces) \
                and _runtime(written_traces[index]) is runtime:
            runtime = None  # masking left it as it was: nothing of it to search for
        try:
            if config is not None:
                keys.append(orjson.dumps(config, option=orjson.OPT_NON_STR_KEYS))
            if runtime is not None:  # a 1-tuple: never equal to a config's key
                keys.append((orjson.dumps(runtime, option=orjson.OPT_NON_STR_KEYS),))
        except (orjson.JSONEncodeError, TypeError):
            return None
    if not keys:
        return []
    key = tuple(keys)
    forms = memo.get(key)
    if forms is None:
        forms = memo[key] = episode_error_forms(original, masked_plainly())
    if fragments:
        memo[tuple(map(id, fragments))] = (fragments, forms)
    return forms


def _fragments(original: Any, written: Any) -> tuple[Any, ...] | None:
    """The trace configs of a record masked for writing when each is an ``orjson.Fragment``
    and masking left every runtime record as it was (``original``'s)."""
    found = []
    for before, trace in zip(_traces(original), _traces(written)):
        try:
            config = trace["agent"]["config"]  # masked for writing: plain dicts down to it
        except (KeyError, TypeError):
            return None
        if type(config) is not orjson.Fragment or _runtime(trace) is not _runtime(before):
            return None
        found.append(config)
    return tuple(found) or None


def scrub_errors(masked: Any, forms: list[str]) -> Any:
    """``masked`` with ``forms`` replaced in every string under an error key: one walk of the
    episode, containers copied only on the way to a change."""
    return _scrub(masked, forms, inside=False) if forms else masked


def error_forms(values: Iterable[str]) -> list[str]:
    """What :func:`scrub_text` searches a message for: each value as a message may quote it."""
    return _forms(values)


def scrub_text(text: str, forms: list[str]) -> str:
    """``text`` (a run's error line) with each of ``forms`` replaced by :data:`MASK`."""
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def masked_away(original: Any, masked: Any) -> set[str]:
    """The strings of ``original`` that masking replaced in ``masked``: each string under a
    value masked whole, and each string of a table masked entry by entry."""
    if isinstance(masked, str) and masked == MASK and original != MASK:
        return set(_strings(original))
    if isinstance(masked, str) and isinstance(original, str) and masked != original:
        return _taken_out(original, masked)  # a string masked in part (content/mask_text.py)
    if isinstance(original, Mapping) and isinstance(masked, Mapping):
        found: set[str] = set()
        for key, value in original.items():
            if key in masked and masked[key] is not value:
                found |= masked_away(value, masked[key])
        return found
    if isinstance(original, (list, tuple)) and isinstance(masked, (list, tuple)):
        found = set()
        for before, after in zip(original, masked):
            if before is not after:
                found |= masked_away(before, after)
        return found
    return set()


#: Past this many masks in one string, or this long a string, the whole string is taken as
#: what was masked instead of aligning it (an alignment of many parts can backtrack long).
_MAX_PARTS = 32
_MAX_ALIGNED_CHARS = 65536


def _taken_out(original: str, masked: str) -> set[str]:
    """What masking took out of ``original`` to make ``masked`` (a URL's userinfo, a query
    value, a flag's value: each replaced by :data:`MASK`), read off by aligning the two."""
    parts = masked.split(MASK)
    if len(parts) > _MAX_PARTS or len(original) > _MAX_ALIGNED_CHARS:
        return {original}
    pattern = "(.*?)".join(map(re.escape, parts))
    aligned = re.fullmatch(pattern, original, re.DOTALL)
    if aligned is None:
        return {original}
    return {value for value in aligned.groups() if value and value != MASK}


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _forms(values: Iterable[str]) -> list[str]:
    """Each value as a message may quote it, longest first (a longer form is replaced whole
    before a shorter one inside it)."""
    forms: set[str] = set()
    for value in values:
        for form in (value, value.strip(), *_secret_parts(value)):
            if len(form) >= MIN_SECRET_CHARS:
                forms |= {form, repr(form)[1:-1], repr(form.encode("utf-8", "backslashreplace"))[2:-1]}
    return sorted((form for form in forms if len(form) >= MIN_SECRET_CHARS), key=len, reverse=True)


#: An HTTP authorization header's scheme, before the credential a message may quote alone.
_AUTH_SCHEME = re.compile(r"\s*(?:bearer|basic|token|digest|apikey)\s+(\S.*?)\s*$", re.IGNORECASE | re.DOTALL)


def _secret_parts(value: str) -> tuple[str, ...]:
    """The credential inside a value masked as a unit, as a message may quote it without the
    rest: a URL's userinfo is taken out as ``user:password`` and an ``Authorization`` value as
    ``Bearer TOKEN``, but a driver's 'password authentication failed for ...' or a query
    carrying the token quotes the password or the token alone, which the whole did not
    match."""
    scheme = _AUTH_SCHEME.fullmatch(value)
    if scheme is not None:
        return (scheme.group(1),)
    userinfo = _USERINFO.fullmatch(value)
    return (userinfo.group(1),) if userinfo is not None else ()


#: ``user:password`` as a URL's userinfo is taken out (the user may be empty: ``:pw@redis``).
_USERINFO = re.compile(r"[\w.~%!$&'()*+,;-]*:(\S+)")


def _scrub(value: Any, forms: list[str], *, inside: bool) -> Any:
    """``value`` with ``forms`` replaced in the strings under an error key (``inside``: this
    value is one); containers copied only on the way to a change."""
    if isinstance(value, str):
        return scrub_text(value, forms) if inside else value
    if isinstance(value, Mapping):
        changed = None
        for key, item in value.items():
            new = _scrub(item, forms, inside=inside or key in ERROR_KEYS)
            if new is not item:
                if changed is None:
                    changed = dict(value)
                changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        items = [_scrub(item, forms, inside=inside) for item in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    return value


def _traces(episode: Any) -> list[Any]:
    traces = episode.get("traces") if type(episode) is dict or isinstance(episode, Mapping) else None
    return traces if type(traces) is list or isinstance(traces, list) else []


def _config(trace: Any) -> Any:
    agent = trace.get("agent") if type(trace) is dict or isinstance(trace, Mapping) else None
    return agent.get("config") if type(agent) is dict or isinstance(agent, Mapping) else None


def _runtime(trace: Any) -> Any:
    agent = trace.get("agent") if type(trace) is dict or isinstance(trace, Mapping) else None
    return agent.get("runtime") if type(agent) is dict or isinstance(agent, Mapping) else None
