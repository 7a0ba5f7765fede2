"""A container as orjson writes it, for the masking walk: what is written is what is masked.

orjson writes a dataclass as the mapping of its public fields, an ``Enum`` member as its
value and an ``orjson.Fragment`` as its bytes; a walk that took these for leaves would let a
secret under them reach the disk. Kept apart from ``masking`` so the walk's rules read in
one place and the types it must see through in another.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

import orjson

_Fragment = orjson.Fragment


def children(obj: Any) -> Iterable[tuple[str | int, Any]] | None:
    """The keys and values a container holds as it is written; None for a leaf."""
    kind = type(obj)
    if kind is dict:  # the common cases first: an ABC check costs more than the rest of a step
        return obj.items()
    if kind is list:
        return enumerate(obj)
    if kind is str or obj is None or kind is int or kind is float or kind is bool:
        return None
    if isinstance(obj, Mapping):
        return obj.items()
    if isinstance(obj, (list, tuple)):
        return enumerate(obj)
    if hasattr(kind, "__dataclass_fields__") and not isinstance(obj, type):  # orjson writes its public fields
        return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name[:1] != "_"}.items()
    written = written_as(obj)
    return None if written is obj else children(written)


def plain_container(obj: Any) -> list[Any] | dict[Any, Any] | None:
    """``obj`` as the plain list or dict orjson writes it as (a tuple, a list or dict subclass,
    a ``Mapping``, a dataclass, an enum member's or a fragment's container), None for a leaf:
    for a rule that reads a container whole (a ``{name, value}`` pair), which must read a
    subclass's as it reads the plain one it is written as."""
    written = written_as(obj)
    if isinstance(written, (list, tuple)):
        return list(written)
    pairs = children(written)
    return None if pairs is None else dict(pairs)


def written_as(obj: Any) -> Any:
    """What orjson writes in place of ``obj``: an ``Enum`` member's value, a ``Fragment``'s
    JSON read back; ``obj`` itself for anything else. Masking looks inside what is written,
    so a secret under a mapping an enum or a fragment holds is masked like any other."""
    if isinstance(obj, enum.Enum) and not isinstance(obj, (str, int, float)):
        return written_as(obj.value)
    if type(obj) is _Fragment:  # its bytes are only readable as written
        try:
            return orjson.loads(orjson.dumps(obj))
        except orjson.JSONDecodeError:  # written as it is, not JSON: nothing a mask can read
            return obj
    return obj


def written_text(obj: Any) -> str | None:
    """The string orjson writes for ``obj``, a leaf that is not a str (an ``Enum`` member
    whose value is a str, a ``Fragment`` of a JSON string), else None: masking reads
    it as the string it is written as, or a URL's password in an enum's value reached the
    disk in clear."""
    written = written_as(obj)
    return written if isinstance(written, str) else None


def container_copy(obj: Any) -> Any:
    """A shallow copy of a container, as masking returns it: a mapping or a dataclass as a
    dict, a tuple as a list, an enum member or a fragment as what it holds."""
    if type(obj) is dict or type(obj) is list:
        return obj.copy()
    if isinstance(obj, Mapping):
        return dict(obj)
    written = written_as(obj)
    if written is not obj:
        return container_copy(written)
    return list(obj) if isinstance(obj, (list, tuple)) else dict(children(obj))
