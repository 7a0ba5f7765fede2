"""Build a dataclass from a parsed JSON document, checking every value against its annotations.

Why not pydantic: the sync state is the only model a sync reads, and importing pydantic and
building its models cost about 0.1 s of CPU, a third of a no-op ``prime-runs sync``
(Dec 1, benchmarks/startup.py). The annotations stay the one definition of the
file's shape; this module reads them.

Strict on JSON's own types, stricter than pydantic's lax mode: an ``int`` is a JSON integer
(not a boolean, a float or a numeric string), a ``float`` a JSON number, a ``str`` a string, a
``bool`` ``true`` or ``false``. Keys the dataclass does not name are ignored (a later version's
fields; :func:`unknown_keys` names them); a missing field takes its default, and one without a
default is an error.

Supported annotations, all the state file uses: ``int``, ``float``, ``str``, ``bool``, ``None``,
``Any`` and ``object`` (anything), ``X | Y``, ``Literal[...]``, ``list[X]``, ``dict[str, X]`` and
nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, Union

from prime_runs_spool.errors import DocumentError

T = TypeVar("T")


_HINTS: dict[type, list[tuple[dataclasses.Field[Any], Any]]] = {}


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """``cls``'s init fields with their resolved annotations (resolved once per class)."""
    known = _HINTS.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = _HINTS[cls] = [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]
    return known


#: Per annotation, ``(origin, args)``: asked of ``typing`` once, not for every value.
_SHAPES: dict[Any, tuple[Any, tuple[Any, ...]]] = {}

#: Where a value sits in the document, rendered only for an error message: ``"$"``, or
#: ``(parent, key)`` for a field or mapping key, ``(parent, index)`` for an array item. A
#: no-op sync reads a state per run; building every path as a string cost more than the check.
Where = Any


def _shape(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    known = _SHAPES.get(hint)
    if known is None:
        known = _SHAPES[hint] = (typing.get_origin(hint), typing.get_args(hint))
    return known


def _at(where: Where) -> str:
    """``where`` as a path: ``$.segments.1``, ``$.uploads[0]``."""
    parts: list[str] = []
    while isinstance(where, tuple):
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return str(where) + "".join(reversed(parts))


def build(cls: type[T], document: Any) -> T:
    """``cls`` from ``document`` (what ``orjson.loads`` gave); :class:`DocumentError` if any
    value is not what its annotation says."""
    return _value(cls, document, "$")


def unknown_keys(cls: type, document: Any) -> list[str]:
    """The keys of ``document`` that no field of ``cls`` (or of a dataclass nested in it)
    names, as paths (``$.cursor.offsft``): what :func:`build` ignores, for a reader that
    must tell a later version's field from a key name damaged in a file that cannot tell."""
    if type(document) is not dict:
        return []
    found: list[str] = []
    pending: list[tuple[type, dict[str, Any], Where]] = [(cls, document, "$")]
    while pending:
        model, value, where = pending.pop()
        fields = {field.name: hint for field, hint in _fields(model)}
        for key, item in value.items():
            hint = fields.get(key)
            if hint is None:
                found.append(_at((where, key)))
                continue
            origin, args = _shape(hint)
            nested = [option for option in args if dataclasses.is_dataclass(option)] if origin in (
                Union, types.UnionType) else [hint] if dataclasses.is_dataclass(hint) else []
            if len(nested) == 1 and type(item) is dict:
                pending.append((nested[0], item, (where, key)))
    return found


def _value(hint: Any, value: Any, where: Where) -> Any:
    if hint is Any or hint is object:
        return value
    if hint is None or hint is type(None):
        if value is None:
            return None
        raise DocumentError(f"{_at(where)}: expected null")
    if hint is bool:
        if value is True or value is False:
            return value
        raise DocumentError(f"{_at(where)}: expected a boolean")
    if hint is int:
        if type(value) is int:
            return value
        raise DocumentError(f"{_at(where)}: expected an integer")
    if hint is float:
        if type(value) in (int, float):
            return float(value)
        raise DocumentError(f"{_at(where)}: expected a number")
    if hint is str:
        if type(value) is str:
            return value
        raise DocumentError(f"{_at(where)}: expected a string")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(hint, value, where)
    origin, args = _shape(hint)
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [option for option in args if option is not type(None)]
        if len(options) == 1:  # X | None, not null: X's own complaint says the most
            return _value(options[0], value, where)
        for option in options:
            try:
                return _value(option, value, where)
            except DocumentError:
                continue
        raise DocumentError(f"{_at(where)}: matches none of {hint}")
    if origin is Literal:
        if any(value == allowed and type(value) is type(allowed) for allowed in args):
            return value
        raise DocumentError(f"{_at(where)}: expected one of {list(args)}")
    if origin is list:
        if type(value) is not list:
            raise DocumentError(f"{_at(where)}: expected an array")
        (item,) = args
        return [_value(item, v, (where, i)) for i, v in enumerate(value)]
    if origin is dict:
        if type(value) is not dict:
            raise DocumentError(f"{_at(where)}: expected an object")
        key, item = args
        if key is not str:
            raise TypeError(f"unsupported key type {key} at {_at(where)}")
        return {k: _value(item, v, (where, k)) for k, v in value.items()}
    raise TypeError(f"unsupported annotation {hint!r} at {_at(where)}")


def _dataclass(cls: type, value: Any, where: Where) -> Any:
    if type(value) is not dict:
        raise DocumentError(f"{_at(where)}: expected an object")
    given = {}
    for field, hint in _fields(cls):
        if field.name in value:
            given[field.name] = _value(hint, value[field.name], (where, field.name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise DocumentError(f"{_at(where)}: {field.name} is missing")
    return cls(**given)
