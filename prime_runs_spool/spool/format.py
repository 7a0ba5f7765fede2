"""The byte format of one spool line (docs/spool-format.md, section 2).

A line is ``{"data":PAYLOAD,"seq":N,"type":"T"[,"meta":M],"crc":"CCCCCCCC"}\\n``. The payload
comes first so that the expensive part, serializing and checksumming a record that may be
megabytes, happens before the writer knows the record's sequence number: the CRC-32C is then
extended over the few bytes that follow once the number is assigned. The checksum sits in
a fixed-width trailer, so a reader verifies a line without parsing or re-serializing it.

It is also the one home of the format's vocabulary: the record types and a run's statuses,
those a seal records and those derived from the segments. This module knows nothing about files; the writer and reader build on it,
and :func:`frame_line` is the only code that assembles a line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Union

import orjson

from prime_runs_spool.errors import RecordNotSerializableError, RecordTooLargeError

#: The version of docs/spool-format.md this code writes and the newest it reads.
FORMAT_VERSION = 1

#: No line may be longer than this (line feed included); bounds a reader's memory.
MAX_LINE_BYTES = 64 * 1024 * 1024
#: A header line is a few hundred bytes; reading this much of a segment always covers it.
HEADER_READ_LIMIT = 64 * 1024

#: ``,"crc":"`` + 8 hex digits + ``"}`` + line feed.
TRAILER_LEN = 19

#: NUL bytes after a segment's last line are *padding*, not data (section 4): no line holds
#: one (JSON text has none, nor has the framing), so a reader tells them apart by the byte.
PAD_BYTE = 0
#: How much padding a writer puts ahead of its lines at a time (section 5, "Padding").
PADDING_BYTES = 1 << 20

#: Record types (docs/spool-format.md, section 3). ``header`` and ``seal`` are written by
#: the writer itself; a run writes ``manifest`` first, then ``episode`` records.
HEADER = "header"
MANIFEST = "manifest"
EPISODE = "episode"
SEAL = "seal"
#: The record types only the writer may write.
WRITER_RECORD_TYPES = (HEADER, SEAL)

#: How a run ended, as its seal records it (section 3, "seal").
COMPLETED = "completed"
FAILED = "failed"
#: Stopped on purpose (Ctrl-C, SIGTERM, a cancelled task), as prime-runs 0.1.4 records it.
CANCELLED = "cancelled"
CRASHED = "crashed"
SEAL_STATUSES = (COMPLETED, FAILED, CANCELLED, CRASHED)
#: The statuses a run can have besides its seal's (section 7): derived from its segments by
#: ``spool.scan.derive_status``. Sync reports ``live`` and ``corrupt`` runs in the same words.
LIVE = "live"
TORN = "torn"
CORRUPT = "corrupt"

_DATA_OPEN = b'{"data":'
#: CRC-32C of ``_DATA_OPEN``: a constant, so that importing this module (every command
#: does, for the vocabulary) loads no checksum library (tests/test_framing.py checks it).
_DATA_OPEN_CRC = 0x28FB163B
_TRAILER_RE = re.compile(rb',"crc":"([0-9a-f]{8})"\}\n\Z')
_TYPE_RE = re.compile(r"[a-z_]+\Z")
#: framing_rest's answer for a record type with no meta, by type: checked and built once, not per append.
_BARE_REST: dict[str, bytes] = {}


def checksum(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` extended from ``value``: crc32c's own, loaded at the first line
    written or read (:func:`_crc32c_function`), then called directly."""
    global checksum
    checksum = _crc32c_function()
    return checksum(data, value)


def _crc32c_function() -> Callable[..., int]:
    """crc32c's C function, loaded from the package's extension module without running the
    package's ``__init__``, which imports argparse, csv, email and importlib.metadata to read
    its own installed version: about 66 M instructions for one function, a tenth of a
    command's start (docs/benchmarks.md, "Start-up"). Where the extension is not where the package
    keeps it, the package is imported as usual."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    name = "crc32c._crc32c"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded.crc32c
    package = importlib.util.find_spec("crc32c")  # finds the package without running it
    for folder in (package.submodule_search_locations or []) if package is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_crc32c" + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader(name, path)
                module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
                loader.exec_module(module)
                sys.modules[name] = module  # the package, imported later, takes this one
                return module.crc32c
    from crc32c import crc32c

    return crc32c


def to_jsonable(record: Any) -> Any:
    """Turn what a caller hands us into something orjson serializes.

    Pydantic models and verifiers' episodes expose ``to_record()`` or ``model_dump``; a
    mapping passes as it is. Anything else is left for orjson to accept or refuse.
    """
    if type(record) is dict:  # the common case, and a plain dict has neither method
        return record
    to_record = getattr(record, "to_record", None)
    if callable(to_record):
        return to_record()
    model_dump = getattr(record, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json")
    return record


#: What a record is called in an error message: the text, or a function that makes it (a
#: caller that builds it from an id only pays for it when something fails).
What = Union[str, Callable[[], str]]


def _what(what: What) -> str:
    return what if isinstance(what, str) else what()


def serialize(value: Any, what: What = "record") -> bytes:
    """Serialize ``value`` with orjson, or raise an error that names the offending field."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        path, reason = find_unserializable(value)
        raise RecordNotSerializableError(_what(what), path, reason or str(exc)) from None


#: The deepest nesting of mappings and lists orjson serializes (the record itself is level 1).
MAX_NESTING = 254
#: A field path longer than this many keys is shortened in messages (its start and its end kept).
_PATH_SHOWN = 10


def find_unserializable(value: Any) -> tuple[str, str]:
    """The first field of ``value`` JSON cannot hold, and why: ``(path, reason)``, or ``("", "")``.

    Only runs after a failure, to name the field. Iterative, with the containers on the
    current path remembered, so neither a circular reference nor nesting thousands of levels
    deep can raise ``RecursionError`` here: both are reported as the field where they start.
    """
    keys: list[str | int] = []
    on_path = {id(value)}
    stack: list[tuple[Any, Any]] = []  # (container, iterator over its children)
    children = _children_of(value)
    if children is None:
        return "", _leaf_problem(value)
    stack.append((value, children))
    while stack:
        container, children = stack[-1]
        step = next(children, None)
        if step is None:
            stack.pop()
            on_path.discard(id(container))
            if keys:
                keys.pop()
            continue
        key, item = step
        if isinstance(container, Mapping) and not isinstance(key, str):
            return _path_text(keys), f"key {key!r} is a {type(key).__name__}, not a string"
        grandchildren = _children_of(item)
        if grandchildren is None:
            problem = _leaf_problem(item)
            if problem:
                return _path_text([*keys, key]), problem
            continue
        keys.append(key)
        if id(item) in on_path:
            return _path_text(keys), "circular reference: the value contains itself"
        if len(keys) + 1 > MAX_NESTING:
            return _path_text(keys), f"nested deeper than {MAX_NESTING} levels, more than JSON here holds"
        on_path.add(id(item))
        stack.append((item, grandchildren))
    return "", ""


def _children_of(value: Any) -> Any:
    if isinstance(value, Mapping):
        return iter(value.items())
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    return None


def _leaf_problem(value: Any) -> str:
    try:
        orjson.dumps(value)
    except TypeError as exc:
        return f"{exc} (a {type(value).__name__})"
    return ""


def _path_text(keys: list[str | int]) -> str:
    """``traces[0].info.a``; a long path keeps its first and last keys around the count left out."""
    def text(part: list[str | int], first: bool) -> str:
        out = ""
        for key in part:
            if isinstance(key, int):
                out += f"[{key}]"
            else:
                out += key if first and not out else f".{key}"
        return out

    if len(keys) <= _PATH_SHOWN:
        return text(keys, True)
    head, tail = keys[: _PATH_SHOWN - 2], keys[-2:]
    return f"{text(head, True)}...({len(keys) - len(head) - len(tail)} more levels){text(tail, False)}"


_new_tuple = tuple.__new__


class Payload(NamedTuple):
    """A record serialized and checksummed, waiting for its sequence number.

    A named tuple, not a frozen dataclass: one is built per append, and a frozen
    dataclass's ``__init__`` costs twice as much (0.59 against 0.29 µs for ``prepare``'s
    ``tuple.__new__``, measured with ``timeit`` Dec 6).
    """

    data: bytes
    #: CRC-32C of ``{"data":`` followed by ``data``: the first part of the line's checksum.
    crc: int


def prepare(record: Any, what: What = "record") -> Payload:
    """Serialize and checksum a record. Safe to call outside any lock, concurrently."""
    value = record if type(record) is dict else to_jsonable(record)
    try:
        data = orjson.dumps(value)
    except TypeError:  # serialize's error, naming the field
        data = serialize(value, what)
    if len(data) + 200 > MAX_LINE_BYTES:
        raise RecordTooLargeError(
            f"{_what(what)} is {len(data)} bytes serialized; a spool line holds at most "
            f"{MAX_LINE_BYTES} bytes"
        )
    # tuple.__new__: a named tuple's own __new__ is Python code, this is one C call
    return _new_tuple(Payload, (data, checksum(data, _DATA_OPEN_CRC)))


#: What a line holds besides its record's data and :func:`framing_rest`'s tail: ``{"data":``,
#: ``,"seq":`` with up to 20 digits, and the trailer.
_FRAME_BYTES = len(_DATA_OPEN) + len(b',"seq":') + 20 + TRAILER_LEN
#: The most a record's data and its :func:`framing_rest` may hold together in one line: a
#: sum under it needs no :func:`check_line_fits` call.
LINE_ROOM = MAX_LINE_BYTES - _FRAME_BYTES


def check_line_fits(payload: Payload, rest: bytes, what: What = "record") -> None:
    """Raise :class:`RecordTooLargeError` when the line of ``payload`` with ``rest`` (its
    type and meta) would be longer than ``MAX_LINE_BYTES``. :func:`prepare` leaves 200
    bytes for the framing, which a long meta (an episode id of megabytes repeats in it) can
    overrun: such a line was written, and every reader then stopped at it as corrupt, with
    every record after it."""
    size = _FRAME_BYTES + len(payload.data) + len(rest)
    if size > MAX_LINE_BYTES:
        raise RecordTooLargeError(f"{_what(what)} makes a line of {size} bytes with its meta; a spool line holds "
                                  f"at most {MAX_LINE_BYTES} bytes")


def framing_rest(record_type: str, meta: Mapping[str, Any] | None = None) -> bytes:
    """What follows the sequence number in a line: ``,"type":"T"`` and ``,"meta":M`` if any.

    It does not depend on the sequence number, so the writer builds it outside its lock.
    """
    bare = _BARE_REST.get(record_type)
    if bare is None:
        if not _TYPE_RE.match(record_type):
            raise ValueError(f"record type {record_type!r} must be lowercase letters and '_'")
        bare = b',"type":"%s"' % record_type.encode("ascii")
        if len(_BARE_REST) < 64:
            _BARE_REST[record_type] = bare
    if meta is None:
        return bare
    return bare + b',"meta":' + serialize(meta, f"{record_type} meta")


_EPISODE_META_OPEN = b',"type":"%s","meta":{"episode_id":' % EPISODE.encode("ascii")


def episode_rest(episode_id: str | None, rollout_number: int | None) -> bytes:
    """``framing_rest(EPISODE, {"episode_id": episode_id, "rollout_number": rollout_number})``,
    byte for byte, without building the meta mapping or serializing it whole: the run calls
    it once per episode, under its lock (tests/test_framing.py holds the two equal)."""
    if rollout_number is None:
        return b'%s%s,"rollout_number":null}' % (_EPISODE_META_OPEN, orjson.dumps(episode_id))
    return b'%s%s,"rollout_number":%d}' % (_EPISODE_META_OPEN, orjson.dumps(episode_id), rollout_number)


def frame_line(payload: Payload, seq: int, rest: bytes) -> tuple[bytes, bytes, bytes]:
    """The parts of one line from a prepared payload and :func:`framing_rest`'s ``rest``,
    ready for ``os.writev`` (no copy of the payload is made). The only encoder of a line:
    the writer calls it under its lock, where only this short tail is left to build."""
    middle = b',"seq":%d%s' % (seq, rest)
    return _DATA_OPEN, payload.data, b'%s,"crc":"%08x"}\n' % (middle, checksum(middle, payload.crc))


def frame(payload: Payload, seq: int, record_type: str, meta: Mapping[str, Any] | None = None) -> list[bytes]:
    """The parts of one line, ready for ``os.writev``: no copy of the payload is made."""
    return list(frame_line(payload, seq, framing_rest(record_type, meta)))


def encode_line(record: Any, seq: int, record_type: str, meta: Mapping[str, Any] | None = None) -> bytes:
    """One whole line; for tests and tools. The writer uses :func:`prepare` and :func:`frame`."""
    return b"".join(frame(prepare(record), seq, record_type, meta))


class Line(NamedTuple):
    """An intact line, parsed. A named tuple, as :class:`Payload` is: one is built per line read."""

    seq: int
    type: str
    data: Any
    meta: dict[str, Any] | None


def parse_line(line: bytes) -> Line | None:
    """Return the parsed line if it is intact (docs/spool-format.md, section 4), else None.

    The checksum is verified on the raw bytes before anything is parsed: a damaged line is
    never handed to the JSON parser's mercy, and never re-serialized.
    """
    if len(line) > MAX_LINE_BYTES or len(line) < TRAILER_LEN + len(_DATA_OPEN):
        return None
    match = _TRAILER_RE.search(line, len(line) - TRAILER_LEN)
    if match is None or not line.startswith(_DATA_OPEN):
        return None
    body_end = len(line) - TRAILER_LEN
    if checksum(memoryview(line)[:body_end]) != int(match.group(1), 16):
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or "data" not in obj:
        return None
    seq, record_type, meta = obj.get("seq"), obj.get("type"), obj.get("meta")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(record_type, str):
        return None
    if meta is not None and not isinstance(meta, dict):
        return None
    return _new_tuple(Line, (seq, record_type, obj["data"], meta))
