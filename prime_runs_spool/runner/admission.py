"""What an episode must pass before a run numbers it: made a record, masked, serialized.

Everything here runs outside the run's lock and before anything of the call is numbered,
so an episode that cannot be recorded fails its whole call with one line that says why,
and nothing of that call reaches the spool (docs/integration.md, "What is refused").
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple, NoReturn

from prime_runs_spool.content.episodes import check_episode_keyed, episode_id_of, rollout_key
from prime_runs_spool.content.summary import EpisodeReading, read_episode
from prime_runs_spool.content.mask_locations import TRACE_ROOTS
from prime_runs_spool.content.error_scrub import episode_error_forms, memoized_error_forms, scrub_errors
from prime_runs_spool.content.mask_fragments import mask_for_writing, only_inside
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.errors import (
    EpisodeTooLargeError,
    MalformedEpisodeError,
    RecordNotSerializableError,
    RecordTooLargeError,
    SampleTooLargeError,
)
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES, UNMEASURED_BYTES_BY_NODES, check_sendable
from prime_runs_spool.runner.error_line import describe_error
from prime_runs_spool.spool.format import (EPISODE, MAX_LINE_BYTES, Payload, check_line_fits, find_unserializable,
                                           framing_rest, prepare, serialize, to_jsonable)

#: What a refusal of a value JSON cannot hold adds: a numpy number (even ``float64``, a
#: float) or array, a set, a path, bytes are common in an eval's own loop.
NOT_SERIALIZABLE_ADVICE = ("; nothing of this call was recorded: make it a value JSON holds (float(x), "
                           "x.tolist(), str(x), a list for a set) and log the episodes again")


class Prepared(NamedTuple):
    """An episode ready to be numbered, with what the run's lock then needs of it read
    already, so that the lock is held for a few additions per episode."""

    #: The masked record, as it was serialized (its trace configs possibly as the
    #: ``orjson.Fragment`` of their masked serialization: content/masking.py ``mask_for_writing``).
    record: Mapping[str, Any]
    payload: Payload
    episode_id: str | None
    #: What its rollout number counts by (content/episodes.py ``rollout_key``).
    rollout_key: Any
    #: What the summary counts of it as written (content/summary.py ``read_episode``), or the error
    #: reading it raised: the episode is recorded all the same, and the error logged. None where
    #: the run reads it under its lock once it is durable (``SummaryAccumulator.add``, one pass):
    #: a caller that waits for its append, so nothing can change the record before then.
    reading: EpisodeReading | Exception | None


def prepare_episode(episode: Any, rules: MaskRules, peeked_id: str | None = None, *,
                    plain: bool | None = None, read: bool = True) -> Prepared:
    """``episode`` as it will be written, or the error that says why it cannot be.

    ``peeked_id``: the id the caller already read of a plain-dict ``episode`` (its
    ``episode_id_of``), so it is not read twice. ``plain``: masked with ``mask``, never
    with ``mask_for_writing``'s fragments (for an episode that cannot be written, or whose
    rows are measured, as it is); ``None``: plain only where the rules mask outside trace
    configs (:func:`masks_plainly`, which a caller may ask once for all its episodes).
    ``read``: the summary's reading made here (an async caller, whose task may go on before
    its episodes are counted); else ``reading`` is None.

    An episode without the shape its summary and rows are computed from is a
    :class:`MalformedEpisodeError` naming the field (content/episodes.py). A circular reference or nesting deeper than JSON holds is a
    :class:`RecordNotSerializableError` naming the field, never a ``RecursionError``.
    """
    if type(episode) is dict:  # the common case: a plain dict is its own record
        record = episode
        episode_id = peeked_id if peeked_id is not None else episode_id_of(record)
    else:
        try:
            record = to_jsonable(episode)
        except (ValueError, RecursionError) as exc:  # e.g. pydantic's "Circular reference detected"
            raise RecordNotSerializableError(EPISODE, "", describe_error(exc)) from None
        if not isinstance(record, Mapping):
            raise TypeError(f"an episode must be a mapping or a pydantic model, not {type(episode).__name__}")
        episode_id = episode_id_of(record)
    # The episode's name in a message (_episode_name) is built only on the way to raising one.
    if episode_id is not None and not episode_id.isascii():
        # The run frames the id into the line's meta under its lock, after taking the call's
        # ids (format.episode_rest): an id JSON cannot hold (a lone surrogate, which the id's
        # own str() can give) must be refused here, before anything of the call is taken.
        serialize(episode_id, partial(_episode_id_name, episode_id))
    # The shape the summary, the numbering and the rows read; whether it may hold error
    # text; what its rollout number counts by; and the most nodes a trace holds
    carries_error_text, key, most_nodes = check_episode_keyed(record)
    unmasked = record
    # Where the rules mask only inside trace configs and runtime records, which nothing below
    # reads, their memoized masked serializations go into the line as they are (content/masking.py), and
    # the record as written holds the rollout key read above; masked plainly, it is read again.
    fragments = not (masks_plainly(rules) if plain is None else plain)
    try:
        record = mask_for_writing(record, rules) if fragments else mask(record, rules)
    except RecursionError:  # a cycle, or nesting deeper than Python's stack, in a masked subtree
        path, reason = find_unserializable(record)
        raise RecordNotSerializableError(_episode_name(episode_id), path, reason or "nested too deeply to mask") from None
    try:
        payload = prepare(record, EPISODE)
    except (RecordNotSerializableError, RecordTooLargeError):
        if fragments:  # what cannot be written is named as the plain masked record has it
            return prepare_episode(unmasked, rules, episode_id, plain=True, read=read)
        # Again, to raise the error with the episode's name in it: a name made for every
        # episode (a partial) cost about 1.7k instructions of every append.
        payload = prepare(record, partial(_episode_name, episode_id))
    # Error messages, ok or not, are cleared of what masking took out of the trace configs and
    # runtime records (content/error_scrub.py): an ok episode that holds none where verifiers records one
    # (check_episode's answer), the common case, is neither walked nor asked for the forms
    # it would be searched for.
    if carries_error_text or unmasked.get("ok") is not True:
        scrubbed = _scrubbed(unmasked, record, rules, fragments, episode_id)
        if scrubbed is not record:
            record = scrubbed
            payload = prepare(record, partial(_episode_name, episode_id))
    size = len(payload.data)
    if episode_id is not None and size + 6 * len(episode_id) + _META_BYTES > MAX_LINE_BYTES:
        check_line_fits(payload, framing_rest(EPISODE, {"episode_id": episode_id, "rollout_number": 10**18}),
                        partial(_episode_name, episode_id))
    # Masked for writing, the record holds the lists the shape check counted (only trace
    # configs are masked; clearing error text keeps a list's length): its bound is asked here,
    # without the call. Masked plainly, the rules may name anything: counted again, as written.
    if not fragments or size * (3 + most_nodes) > UNMEASURED_BYTES_BY_NODES:
        try:
            check_sendable(record, size, most_nodes=most_nodes if fragments else None)
        except Exception as exc:
            if fragments:  # the rows of a large episode are measured as the platform will, without fragments
                return prepare_episode(unmasked, rules, episode_id, plain=True, read=read)
            _not_sendable(episode_id, exc)
    reading: EpisodeReading | Exception | None = None
    if read:
        try:
            reading = read_episode(record, payload.data)
        except Exception as exc:  # check_episode keeps it from happening; Run._settle logs it
            reading = exc
    # tuple.__new__: a named tuple's own __new__ is Python code, this is one C call
    return _new_tuple(Prepared, (record, payload, episode_id, key if fragments else rollout_key(record), reading))


_new_tuple = tuple.__new__


def _scrubbed(unmasked: Mapping[str, Any], record: Any, rules: MaskRules, fragments: bool,
              episode_id: str | None) -> Any:
    """``record`` (``unmasked`` masked, for writing where ``fragments``) with its error
    messages cleared of what masking took out of its trace configs; ``record`` itself when
    nothing changes. The forms searched for are read off the episode masked plainly, once
    per set of configs (they repeat in every episode of a run)."""
    plainly = record if not fragments or record is unmasked else None

    def masked_plainly() -> Any:  # once, whether the forms or the walk asks first
        nonlocal plainly
        if plainly is None:
            plainly = mask(unmasked, rules)
        return plainly

    try:
        forms = memoized_error_forms(unmasked, rules, masked_plainly, record if fragments else None)
        if forms is None:  # a config orjson cannot serialize (prepare took it: masked plainly)
            forms = episode_error_forms(unmasked, masked_plainly())
        if not forms:
            return record
        scrubbed = scrub_errors(masked_plainly(), forms)
    except RecursionError:
        path, reason = find_unserializable(unmasked if plainly is None else plainly)
        raise RecordNotSerializableError(_episode_name(episode_id), path, reason or "nested too deeply") from None
    return record if scrubbed is plainly else scrubbed


def masks_plainly(rules: MaskRules) -> bool:
    """Whether episodes are masked with ``mask`` under ``rules``: where they name something
    outside trace configs and runtime records, which the summary, the numbering or the rows
    may read."""
    return not only_inside(rules, TRACE_ROOTS)


def _episode_id_name(episode_id: str) -> str:
    """An id JSON cannot hold, named with its lone surrogates escaped (the message is printable)."""
    return f"{_episode_name(episode_id.encode('utf-8', 'backslashreplace').decode('utf-8'))} id"


def _episode_name(episode_id: str | None) -> str:
    """An episode's name in an error message (``episode ID``): one line, however long the id."""
    if episode_id is None:
        return EPISODE
    shown = episode_id if len(episode_id) <= 100 else f"{episode_id[:60]}...({len(episode_id)} characters)"
    return f"{EPISODE} {shown}"


#: The line's framing and meta besides the id (which JSON makes at most 6 bytes a character):
#: only an episode whose line could then pass ``MAX_LINE_BYTES`` (one near the limit, or with
#: an id of megabytes) is checked with the meta it will get, before it is numbered (the
#: writer would refuse it only after). The rest cost one addition.
_META_BYTES = 256


def _not_sendable(episode_id: str | None, exc: Exception) -> NoReturn:
    """Refuse an episode no platform request could carry (platform_api/v0.py's
    ``check_sendable`` raised ``exc``).

    Accepted, it would block its run's sync forever at that row: refusing it here, where
    the eval can still shrink it, is the one place the loss is not silent.
    """
    if isinstance(exc, SampleTooLargeError):
        raise EpisodeTooLargeError(
            f"{_episode_name(episode_id)} cannot be recorded: the row of its trace {exc.trace_id} needs "
            f"{exc.size} bytes, over the platform's {MAX_REQUEST_BYTES}-byte request limit, so it could never be "
            "uploaded; nothing of this call was recorded: shrink the episode (its largest fields) "
            "and log it again"
        ) from None
    # the rows sync would build from it cannot be built at all
    raise MalformedEpisodeError(
        f"{_episode_name(episode_id)}: its platform rows cannot be built ({describe_error(exc)}); "
        "nothing of this call was recorded: fix the episode and log it again"
    ) from None


def peek_id(episode: Any) -> str | None:
    """An episode's id without serializing it (a mapping's ``id`` or an object's ``.id``)."""
    value = episode.get("id") if type(episode) is dict or isinstance(episode, Mapping) else getattr(episode, "id", None)
    return None if value is None else str(value)


def extra_rules(mask_rules: Any) -> MaskRules | None:
    """``open_run``'s ``mask_rules`` (a :class:`MaskRules`, locations, or None) as rules."""
    if mask_rules is None:
        return None
    if isinstance(mask_rules, MaskRules):
        return mask_rules
    return MaskRules.of(*mask_rules)
