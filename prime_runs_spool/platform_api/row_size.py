"""A sample row's size, as the platform's request limit is checked against it.

A row fits one request when its compact JSON with the ``{"samples":[]}`` envelope is within
the limit, measured both as upstream measures it (``json.dumps``) and as the bytes sync
sends (orjson). Sync needs each row's body anyway; the runner, which only decides whether an
episode could ever be sent (platform_api/v0.py ``check_sendable``), measures a row a part at
a time and holds no body: an episode of tens of megabytes is appended in a bounded multiple
of its size (tests/test_append_memory.py), where each row encoded whole held it several times.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

#: ``{"samples":[]}``: the envelope the upstream size check adds to a row.
ENVELOPE_BYTES = 14

#: Upstream's measure of a row (compact ``json.dumps``), its text made a piece at a time.
_UPSTREAM_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def upstream_size(row: Mapping[str, Any]) -> int:
    """Bytes of the row as upstream measures it: compact ``json.dumps``, UTF-8.

    Summed over the encoder's pieces, never the whole text: ``json.dumps`` of a 20 MB row
    held its pieces, their joined text and its UTF-8 bytes at once (three copies of the row).
    A piece is a value's text (a string's whole, escaped) or punctuation."""
    size = 0
    for piece in _UPSTREAM_ENCODER.iterencode(row):
        size += len(piece) if piece.isascii() else len(piece.encode("utf-8"))
    return size


#: How deep :func:`parts_size` takes a row apart: the row, its values (``info``,
#: ``trajectory``, ``completion``), theirs (the episode's ``native_wrapper``, a branch, a
#: message), and theirs (the episode's ``traces``, a branch's ``messages``), each item below
#: encoded whole: the most held at once is one trace, or one message, never the row.
_PARTS_DEPTH = 4
#: Below the row itself, a container of more parts than this is encoded whole: its parts
#: are many and small on the whole (a long conversation's messages), where taking each
#: apart costs a call a part (twice to four times the whole encoding's time for 100 to
#: 400 messages) and saves little; the large parts come few (traces, long messages).
_SPLIT_MOST = 64


def parts_size(value: Any, stop_above: int | None = None, depth: int = _PARTS_DEPTH) -> int:
    """Bytes of :func:`encode_row` of ``value`` (compact JSON), measured a part at a time:
    ``{``, ``"key":value`` pairs joined by ``,``, ``}`` (``[``, items, ``]`` for a list),
    each value taken apart in turn down to ``depth`` levels. Stops as soon as the count
    passes ``stop_above`` (a row already too large is not measured to its end). A row
    orjson cannot encode is sent as ``json.dumps`` makes it: its upstream size."""
    try:
        return _sized(value, depth, stop_above)
    except TypeError:  # orjson.JSONEncodeError subclasses TypeError: encode_row's json fallback
        return upstream_size(value)


def _sized(value: Any, depth: int, stop_above: int | None) -> int:
    kind = type(value)
    if depth and (kind is dict or kind is list) and value and (depth == _PARTS_DEPTH or len(value) <= _SPLIT_MOST):
        size = 1 + len(value)  # the brackets, and a comma between each two parts
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str:  # orjson's own rules for other keys: measured whole
                    return len(orjson.dumps(value))
                size += len(orjson.dumps(key)) + 1 + _sized(item, depth - 1, stop_above)
                if stop_above is not None and size > stop_above:
                    return size
        else:
            for item in value:
                size += _sized(item, depth - 1, stop_above)
                if stop_above is not None and size > stop_above:
                    return size
        return size
    return len(orjson.dumps(value))


def measure_within(row: Mapping[str, Any], limit: int) -> tuple[bytes, bool]:
    """:func:`encode_within`'s decision for a caller that needs no body (the runner's
    ``check_sendable``, platform_api/v0.py): the row is measured value by value (:func:`parts_size`), so
    at most its largest value's encoding is held, where the body was the whole row (for a
    trace of one long message: the message three times, with the episode's wrapper)."""
    budget = limit - ENVELOPE_BYTES
    size = parts_size(row, stop_above=budget)
    if size > budget:
        return b"", False
    return b"", 3 * size <= budget or upstream_size(row) <= budget


def encode_row(row: Mapping[str, Any]) -> bytes:
    """Compact JSON of a row (orjson; stdlib json for what orjson refuses, e.g. huge ints)."""
    try:
        return orjson.dumps(row)
    except TypeError:  # orjson.JSONEncodeError subclasses TypeError
        return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_within(row: Mapping[str, Any], limit: int) -> tuple[bytes, bool]:
    """Encode ``row`` and decide whether it fits one request with the envelope.

    A row fits when both the upstream measure (compact ``json.dumps``) and the bytes we
    actually send (orjson) fit. The two agree byte for byte except on some floats (either
    can print shorter: ``1e-05`` vs ``0.00001``) and non-finite ones (orjson writes
    ``null`` where json writes ``-Infinity``); such a number, with the delimiter that
    follows it, is never more than twice as long in json as in orjson. So the exact,
    slower upstream measure is only needed when orjson's size is above a third of the
    budget (a third, not a half, for margin) and within it.
    """
    body = encode_row(row)
    budget = limit - ENVELOPE_BYTES
    size = len(body)
    if size > budget:
        return body, False
    if 3 * size <= budget:
        return body, True
    return body, upstream_size(row) <= budget
