"""What sync reads from the evaluations API's answers (docs/platform-api.md, "Endpoints"),
checked as each answer arrives, before anything acts on it.

Sync decides from these fields what is on the platform: an evaluations listing without its
``total`` read as "no more pages" (the run's evaluation, further on, missed and a second one
created), an evaluation without ``total_samples`` as "no rows yet" (every row sent again),
a created evaluation without its id as the evaluation ``"None"``. A platform (or a proxy
before it) that answered ``{}`` got "internal error: KeyError" per run at best. An answer
lacking a field is an ``UnexpectedAnswer`` (a ``PlatformError``) naming the field: ``FATAL``
for a read (nothing was done; the same answer would come again), ``IN_DOUBT`` for a create,
which may have created an evaluation whose id the answer lost (the protocol settles it as
any lost answer).

Plain checks, not pydantic models: only the fields sync reads are checked (the rest passes
through untouched). An answer to a request that changes the evaluation is first checked for
being an object at all (``acted_on``): a 2xx with no body or another body is not the platform's
answer. A samples request's answer must also carry the platform's ``samples_pushed``
(``samples_answer``), a finalize's the evaluation's ``status`` COMPLETED (``finalized``), a
``PUT``'s the evaluation's ``status`` (``updated``): ``{}`` is no more their answer than an
empty body.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from prime_runs_spool.errors import FailureKind, UnexpectedAnswer
from prime_runs_spool.platform_api.v0 import is_evaluation_id


#: How much of an error answer's body a message quotes.
QUOTED_CHARACTERS = 200
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
#: Where an error answer in JSON states its words, tried in turn: FastAPI's ``detail`` (a
#: string, or its list of validation errors), else ``message`` or ``error`` (Prime Traces'
#: ``{"error": {"code", "message"}}``, docs/platform-api.md).
_WORD_FIELDS = ("detail", "message", "error")
#: How deep in an answer its words are looked for (``{"error": {"message": ...}}`` is 2).
_WORD_DEPTH = 4
#: The longest error body read as JSON for its words; a longer one is quoted as it starts.
_PARSED_CHARACTERS = 1 << 20


def is_success(status: int) -> bool:
    """An answer that says the request was done: a 2xx. A redirect is not one (the sync
    follows none): taken for a success, a gateway's 307 to a samples request counted its
    rows as pushed (platform_api/client.py, ``classify_response``)."""
    return 200 <= status < 300


def is_redirect(status: int | None) -> bool:
    """A 3xx: a redirect, which the sync follows to no address, the platform's or Prime
    Traces' (platform_api/no_answer.py, ``SEE_OTHER``)."""
    return status is not None and 300 <= status < 400


def error_words(text: str) -> str:
    """An error answer's body as words a one-line message can quote: on one line, cut to
    :data:`QUOTED_CHARACTERS`; a JSON answer by the words it states (:data:`_WORD_FIELDS`;
    FastAPI's validation errors each as ``where: what``), not its braces, quotes and field
    names, which took the line's room (``({"detail":"..."})``) and quoted the escapes of the
    words as they were sent; and an HTML page (a proxy's or a gateway's before the service:
    nginx's 413, a load balancer's 502) by its title alone: its markup quoted whole said
    nothing more and took the line. JSON that states none of them is quoted as it was sent.
    The key is scrubbed by the caller, before this reads or cuts (``Secret.scrub`` knows
    JSON's escapes)."""
    text = _json_words(text) or text
    text = " ".join(text.split())
    lowered = text[:QUOTED_CHARACTERS * 5].lower()
    if "<html" in lowered or "<!doctype html" in lowered:
        title = _TITLE.search(text)
        text = f"an HTML page: {' '.join(title.group(1).split())}" if title else "an HTML page"
    return text[:QUOTED_CHARACTERS].rstrip()


def _json_words(text: str) -> str | None:
    """The words a JSON error answer states, or None: not JSON, too long to parse for a
    message, or none of :data:`_WORD_FIELDS` holds words."""
    if len(text) > _PARSED_CHARACTERS or not text.lstrip().startswith("{"):
        return None
    try:
        return _words_in(orjson.loads(text), _WORD_DEPTH)
    except orjson.JSONDecodeError:
        return None


def _words_in(value: Any, depth: int) -> str | None:
    if isinstance(value, str):
        return value if value.strip() else None
    if depth == 0:
        return None
    if isinstance(value, Mapping):
        return next(filter(None, (_words_in(value.get(field), depth - 1) for field in _WORD_FIELDS)), None)
    if isinstance(value, list):  # FastAPI's validation errors: each where and what, until the line is full
        said: list[str] = []
        for item in value:
            words = _validation_error(item, depth - 1)
            if words:
                said.append(words)
            if sum(map(len, said)) > QUOTED_CHARACTERS:
                break
        return "; ".join(said) or None
    return None


def _validation_error(item: Any, depth: int) -> str | None:
    """One of FastAPI's validation errors, ``{"loc": ["body", "name"], "msg": "Field
    required", "input": ...}``, as ``body.name: Field required``: never its ``input``, which
    echoes what the request sent."""
    if not isinstance(item, Mapping) or not isinstance(item.get("msg"), str):
        return _words_in(item, depth)
    where = item.get("loc")
    where = ".".join(map(str, where)) if isinstance(where, list) else ""
    return f"{where}: {item['msg']}" if where else item["msg"]


def lacks(what: str, where: str, kind: FailureKind = FailureKind.FATAL) -> UnexpectedAnswer:
    """The error for an answer to ``where`` (``METHOD /path``) without ``what``."""
    return UnexpectedAnswer(kind, f"{where}: the platform's answer lacks {what} (docs/platform-api.md)")


def _object(answer: Any, where: str, what: str, kind: FailureKind = FailureKind.FATAL) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise lacks(what, where, kind)
    return answer


def _count(answer: Mapping[str, Any], field: str) -> bool:
    value = answer.get(field)
    return type(value) is int and value >= 0


def _evaluation_id(item: Mapping[str, Any]) -> Any:
    return item.get("evaluation_id") or item.get("id")


def environment_id(answer: Any, where: str) -> str:
    """``{data: {id}}`` of ``POST /environmentshub/resolve``: the id."""
    data = _object(answer, where, "data.id").get("data")
    found = data.get("id") if isinstance(data, Mapping) else None
    if isinstance(found, bool) or not isinstance(found, (str, int)) or found == "":
        raise lacks("data.id (the environment's id)", where)
    return str(found)


def acted_on(answer: Any, where: str) -> dict[str, Any]:
    """The answer to a request that changes the evaluation (a samples request's
    ``{evaluation_id, samples_pushed, status}``, a finalize's or a ``PUT``'s evaluation):
    an object, or the request is in doubt. An empty body (a 204, a proxy's bare 200 that never
    passed the request on) or JSON that is not an object (``null`` in place of the platform's
    answer) says nothing of the request: taken for the platform's yes, a proxy that never
    sent it on had the run said synced with none of its rows there (its evaluation never
    finalized, or never closed out FAILED), and every later sync up to date. In doubt, a read
    settles it, or (a ``PUT``) it is sent again (docs/sync.md, "The protocol, per run")."""
    if not isinstance(answer, dict):
        raise UnexpectedAnswer(FailureKind.IN_DOUBT, f"{where}: answered without the platform's answer (an empty "
                               "body, or JSON that is not an object), so it is not taken as done")
    return answer


def samples_answer(answer: Any, where: str) -> dict[str, Any]:
    """A samples request's answer, ``{evaluation_id, samples_pushed, status}``
    (docs/platform-api.md): an object carrying ``samples_pushed`` (a count), or the request is
    in doubt. The platform states the count in every answer (the local platform likewise);
    an object without it (``{}``: a stub, a proxy or gateway answering for a request it may
    never have passed on) says nothing of the request, as an empty body does (``acted_on``),
    and taken for a yes it had the run said synced with none of its rows there. In doubt
    costs one read of the evaluation's count, which settles it (sync/reconcile.py)."""
    body = acted_on(answer, where)
    if not _count(body, "samples_pushed"):
        raise UnexpectedAnswer(FailureKind.IN_DOUBT, f"{where}: answered without the platform's answer (an object "
                               "without samples_pushed), so it is not taken as done")
    return body


def updated(answer: Any, where: str) -> dict[str, Any]:
    """A ``PUT``'s answer, the evaluation (docs/platform-api.md): an object carrying its
    ``status``, or the PUT is in doubt and, being idempotent, sent again. ``{}`` (a stub, a
    proxy answering for a request it never passed on) counted as done: a failed run's end
    was said recorded while the evaluation stayed RUNNING without it, the metadata the
    state says sent (its sink, its end) never sent again (tests/test_client.py)."""
    body = acted_on(answer, where)
    if not isinstance(body.get("status"), str):
        raise UnexpectedAnswer(FailureKind.IN_DOUBT, f"{where}: answered without the platform's answer (an object "
                               "without the evaluation's status), so it is not taken as done")
    return body


def finalized(answer: Any, where: str) -> dict[str, Any]:
    """A finalize's answer, the evaluation "now COMPLETED" (docs/platform-api.md): an object
    whose ``status`` says so, or the finalize is in doubt, settled as any lost answer by the
    evaluation's status. An object that is not that evaluation (``{}``: a stub, a proxy
    answering for a request it never passed on; an error envelope answered 200) counted as
    done: the state said finalized, the evaluation stayed RUNNING without its metrics, and
    every later sync said up to date (tests/test_client.py)."""
    body = acted_on(answer, where)
    if body.get("status") != "COMPLETED":
        raise UnexpectedAnswer(FailureKind.IN_DOUBT, f"{where}: answered without the platform's answer (an object "
                               "whose status is not COMPLETED), so it is not taken as done")
    return body


def created_evaluation(answer: Any, where: str) -> dict[str, Any]:
    """``POST /evaluations/``'s answer, which must carry the new evaluation's id."""
    body = _object(answer, where, "evaluation_id", FailureKind.IN_DOUBT)
    if not is_evaluation_id(_evaluation_id(body)):
        raise lacks("evaluation_id (the evaluation it may have created)", where, FailureKind.IN_DOUBT)
    return body  # type: ignore[return-value]


def evaluation(answer: Any, where: str) -> dict[str, Any]:
    """``GET /evaluations/{id}``: its ``status`` and ``total_samples`` (a count)."""
    body = _object(answer, where, "status and total_samples")
    if not isinstance(body.get("status"), str):
        raise lacks("status", where)
    if not _count(body, "total_samples"):
        raise lacks("total_samples (a count)", where)
    return body  # type: ignore[return-value]


def evaluations_page(answer: Any, where: str) -> dict[str, Any]:
    """``GET /evaluations/``: ``evaluations`` (each an object with its id) and ``total``."""
    body = _object(answer, where, "evaluations and total")
    items = body.get("evaluations")
    if not isinstance(items, list):
        raise lacks("evaluations (a list)", where)
    if not _count(body, "total"):
        raise lacks("total (a count)", where)
    for item in items:
        if not isinstance(item, Mapping) or not is_evaluation_id(_evaluation_id(item)):
            raise lacks("an evaluation_id in every item of evaluations", where)
    return body  # type: ignore[return-value]


def samples_page(answer: Any, where: str) -> dict[str, Any]:
    """``GET /evaluations/{id}/samples``: ``samples``, each an object."""
    body = _object(answer, where, "samples")
    items = body.get("samples")
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise lacks("samples (a list of objects)", where)
    return body  # type: ignore[return-value]


def trace_episodes_page(response: Any, where: str) -> dict[str, Any]:
    """A page of Prime Traces' episode listing (``{items: [{episode_id}], next_cursor}``):
    its episode ids and the cursor of the next page (None: the last)."""
    try:
        body = _object(response.json(), where, "items")
    except ValueError:
        raise lacks("a JSON body", where) from None
    items = body.get("items")
    cursor = body.get("next_cursor")
    if not isinstance(items, list) or not all(isinstance(item, Mapping) and isinstance(item.get("episode_id"), str)
                                              for item in items):
        raise lacks("items[].episode_id", where)
    if cursor is not None and not isinstance(cursor, str):
        raise lacks("next_cursor (a string or null)", where)
    return {"ids": [item["episode_id"] for item in items], "next_cursor": cursor or None}
