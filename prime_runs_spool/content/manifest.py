"""The run manifest: who the run is, what it was configured with, and its launch file.

Written first in a spool, before any episode, and later sent as the evaluation's
metadata. Two rules keep it safe to ship (see docs/masking.md):

- ``config`` carries only the fields somebody set, with every credential table masked
  by location; the API key is never an input here at all.
- ``config_source`` (the launch file as written) is attached only when parsing the
  file finds nothing to mask. A verbatim file cannot be masked without ceasing to be
  verbatim, so a file with a secret in it is left out whole, and the warning names the
  location, never a value. What the parse cannot see cannot be checked, so it does not
  travel: a TOML file's comments are dropped (every other byte is kept, and the result
  must parse to the same thing), and a JSON file that repeats a key is left out.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from prime_runs_spool._version import __version__
from prime_runs_spool.plural import plural
from prime_runs_spool.files import printable, printable_data
from prime_runs_spool.spool.format import FORMAT_VERSION
from prime_runs_spool.content.environments import environment_list, environment_problem
from prime_runs_spool.content.error_scrub import masked_away
from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.content.mask_text import mask_url
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.content.set_tables import find_set_tables
from prime_runs_spool.content.toml_comments import drop_comments

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: How each note about a launch file kept out of the manifest begins: a note, not a fault
#: (the run is whole without it), so the runner logs it as one info line.
CONFIG_SOURCE_NOTE = "config_source left out"
#: How such a line ends when the file could not be read at all: a path that is wrong or may
#: not be read is the caller's mistake, not the masking at work, so it is a warning.
_UNREADABLE = re.compile(r" cannot be read \([^()]*\)\Z")

#: A launch file larger than this is not uploaded verbatim.
MAX_CONFIG_SOURCE_BYTES = 256 * 1024


def build_manifest(
    *,
    run_id: str,
    name: str,
    environments: Sequence[str],
    model: str,
    framework: str,
    config: Any,
    config_file: str | os.PathLike[str] | None,
    num_examples: int | None,
    rollouts_per_example: int | None,
    created_at: dt.datetime | str | None = None,
    extra_rules: MaskRules | Iterable[str | Iterable[str]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The manifest record and the warnings to show the user (never containing a value).

    ``config`` is a pydantic model (dumped with ``exclude_unset``) or a mapping. The v0
    keys are then set in it from the explicit arguments, which win over what the config
    holds: they are what the runner actually ran (``num_examples`` is the selected task
    count, ``-1`` when unknown), while the config may hold an alias or a default. An
    argument left ``None`` keeps the config's value if it has one, else the v0 default
    (``-1`` examples, ``1`` rollout).

    A name, model, framework or environment name the platform cannot take (not a string, an
    environment name over its limit) raises here, before anything is written: the platform
    refuses to create such an evaluation, so a run opened with ``model=3`` could never be
    synced, and every episode acknowledged into it would wait forever (:func:`identity_problem`).
    So do counts that are not whole numbers and a ``created_at`` that is not a time
    (:func:`counts_problem`, :func:`_iso_utc`): ``num_examples="10"`` was recorded as text the
    dashboard's count reads as no count, and ``created_at="yesterday"`` as given, a run no
    listing could place in time.
    """
    problem = identity_problem(name=name, model=model, framework=framework)
    if problem is not None:
        raise TypeError(f"open_run: {problem}")
    problem = counts_problem(num_examples=num_examples, rollouts_per_example=rollouts_per_example)
    if problem is not None:
        raise (TypeError if "not a whole number" in problem else ValueError)(f"open_run: {problem}")
    created = _iso_utc(created_at)
    problem = environment_problem(environments)
    if problem is not None:
        raise (TypeError if "not a string" in problem else ValueError)(
            f"open_run: {problem}; the platform cannot create the evaluation, so the run could never be synced")
    rules = MaskRules.defaults_for_config()
    if extra_rules is not None:
        rules = rules.extended(extra_rules)
    dumped = mask(_config_dump(config), rules)
    for key, value, default in (
        ("model", model, None),
        ("num_examples", num_examples, _COUNT_FLOORS["num_examples"]),
        ("rollouts_per_example", rollouts_per_example, _COUNT_FLOORS["rollouts_per_example"]),
    ):
        if value is not None:
            dumped[key] = value
        elif dumped.get(key) is None:
            dumped[key] = default

    warnings: list[str] = []
    manifest: dict[str, Any] = {
        "run_id": run_id,
        "name": name,
        "environments": environment_list(environments),
        "model": model,
        "framework": framework,
        "created_at": created,
        "package_version": __version__,
        "format_version": FORMAT_VERSION,
        "masking_version": MASKING_VERSION,
        "config": dumped,
    }
    if config_file is not None:
        source = read_config_source(config_file, rules, warnings)
        if source is not None:
            manifest["config_source"] = source
    return manifest, warnings


def identity_problem(**fields: Any) -> str | None:
    """Why one of the run's identifying texts (``name``, ``model``, ``framework``: each None
    or a string) cannot be recorded, saying what to pass instead; None when all can."""
    for field, value in fields.items():
        if value is not None and not isinstance(value, str):
            return (f"{field} is {type(value).__name__} {str(value)[:40]!r}, not a string: the platform "
                    f"cannot create an evaluation with it, so the run could never be synced; pass "
                    f"{field}=str(...) or None")
    return None


#: The least each count may be, which is also what the manifest records when it is not
#: given: ``num_examples`` is ``-1`` when unknown (as verifiers records it), one rollout.
_COUNT_FLOORS = {"num_examples": -1, "rollouts_per_example": 1}


def counts_problem(**fields: Any) -> str | None:
    """Why ``num_examples`` or ``rollouts_per_example`` (each None or a whole number, at least
    its floor) cannot be recorded, saying what to pass instead; None when both can."""
    for field, value in fields.items():
        if value is None:
            continue
        floor = _COUNT_FLOORS[field]
        unknown = " (-1 or None when unknown)" if floor < 0 else " or None"
        if type(value) is bool or not isinstance(value, int):
            return (f"{field} is {type(value).__name__} {str(value)[:40]!r}, not a whole number; pass "
                    f"{field}=int(...){unknown}")
        if value < floor:
            return f"{field} is {value}, less than {floor}; pass a count of at least {max(floor, 0)}{unknown}"
    return None


def recordable_count(field: str, value: Any) -> int | None:
    """``value`` when ``open_run`` records it as ``field``, else None (unknown): for a reader of
    another producer's outputs (``prime-runs import``), whose counts are read, not promised."""
    return value if value is not None and counts_problem(**{field: value}) is None else None


def is_config_source_note(warning: str) -> bool:
    """Whether ``warning`` is a note (a launch file kept out for what it holds: info, the run
    is whole) rather than a warning (anything else, a launch file that cannot be read
    included, which would otherwise go unseen)."""
    return warning.startswith(CONFIG_SOURCE_NOTE) and not _UNREADABLE.search(warning)


def read_config_source(
    config_file: str | os.PathLike[str], rules: MaskRules, warnings: list[str]
) -> dict[str, str] | None:
    """``{format, text, filename}`` for a clean launch file, else ``None`` plus a warning."""
    # printable: a name that is not UTF-8 (its bytes as lone surrogates) is no JSON string
    filename = printable(os.path.basename(os.fsdecode(config_file)))
    prefix = f"{CONFIG_SOURCE_NOTE}: {filename}"
    try:
        with open(config_file, "rb") as handle:
            raw = handle.read(MAX_CONFIG_SOURCE_BYTES + 1)
    except OSError as exc:
        warnings.append(f"{prefix} cannot be read ({exc.strerror or type(exc).__name__})")
        return None
    if len(raw) > MAX_CONFIG_SOURCE_BYTES:
        warnings.append(f"{prefix} is over {MAX_CONFIG_SOURCE_BYTES // 1024} KiB")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        warnings.append(f"{prefix} is not UTF-8")
        return None
    return checked_config_source(text, filename, rules, warnings)


def checked_config_source(text: str, filename: str, rules: MaskRules, warnings: list[str]) -> dict[str, str] | None:
    """``{format, text, filename}`` when ``text`` may travel under ``rules``, else ``None``
    plus a warning. The one check, used when a run records its launch file and again
    when sync sends one recorded under older rules (content/remask.py)."""
    prefix = f"{CONFIG_SOURCE_NOTE}: {filename}"
    fmt = _format_of(filename, text)
    if fmt is None:
        warnings.append(f"{prefix} is neither TOML nor JSON, so it cannot be checked for credentials")
        return None
    repeated: list[str] = []
    try:
        parsed = tomllib.loads(text) if fmt == "toml" else json.loads(
            text, object_pairs_hook=lambda pairs: _object_noting_repeats(pairs, repeated))
    except tomllib.TOMLDecodeError as exc:
        warnings.append(f"{prefix} does not parse as TOML ({exc})")
        return None
    except json.JSONDecodeError as exc:
        warnings.append(f"{prefix} does not parse as JSON (line {exc.lineno}, column {exc.colno})")
        return None
    if repeated:  # json keeps the last: an earlier value would travel unchecked
        named = sorted({mask_url(key) for key in repeated})  # a key can be a URL with a token in it
        warnings.append(f"{prefix} gives the {plural(len(named), 'key')} {', '.join(named)} twice in one object")
        return None
    tables = find_set_tables(parsed, rules)
    if tables:
        warnings.append(f"{prefix} sets the credential {plural(len(tables), 'table')} {', '.join(tables)}")
        return None
    if fmt == "toml":
        # A comment is not in the parse, so nothing above checked it: it does not travel.
        uncommented = drop_comments(text)
        if uncommented is not text and not _same_parse(uncommented, parsed):
            warnings.append(f"{prefix}: its comments cannot be dropped without changing what it says")
            return None
        text = uncommented
    return {"format": fmt, "text": text, "filename": filename}


def _object_noting_repeats(pairs: list[tuple[str, Any]], repeated: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            repeated.append(key)
        out[key] = value
    return out


def _same_parse(text: str, parsed: Any) -> bool:
    """Whether ``text`` parses as TOML to exactly ``parsed`` (a NaN never compares equal)."""
    try:
        return tomllib.loads(text) == parsed
    except tomllib.TOMLDecodeError:
        return False


def _format_of(filename: str, text: str) -> str | None:
    extension = os.path.splitext(filename)[1].lower()
    if extension == ".toml":
        return "toml"
    if extension == ".json":
        return "json"
    if extension in (".yaml", ".yml"):
        return None
    return "json" if text.lstrip().startswith(("{", "[")) else "toml"


def masked_config_values(config: Any, extra_rules: MaskRules | Iterable[str | Iterable[str]] | None = None) -> set[str]:
    """The strings masking takes out of ``config`` as :func:`build_manifest` records it: what
    a run's error line must not quote either (content/error_scrub.py)."""
    rules = MaskRules.defaults_for_config()
    if extra_rules is not None:
        rules = rules.extended(extra_rules)
    original = _config_dump(config)
    return masked_away(original, mask(original, rules))


def _config_dump(config: Any) -> dict[str, Any]:
    """The fields set on ``config``, as plain JSON data (never aliasing the input)."""
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        dumped = config.model_dump(mode="json", exclude_unset=True)
    elif isinstance(config, Mapping):
        dumped = dict(config)
    else:
        raise TypeError(f"config must be a pydantic model or a mapping, not {type(config).__name__}")
    # Through JSON once: a fresh copy, holding exactly what any reader of the spool will see.
    try:
        return orjson.loads(orjson.dumps(dumped, default=_jsonable, option=orjson.OPT_NON_STR_KEYS))
    except TypeError:  # a path whose name is not UTF-8 (--output-dir): its odd bytes as \xNN
        return orjson.loads(orjson.dumps(printable_data(dumped), default=_jsonable, option=orjson.OPT_NON_STR_KEYS))


def _jsonable(value: Any) -> Any:
    """orjson's fallback for what a hand-built config mapping may hold."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    return str(value)


def _iso_utc(created_at: dt.datetime | str | None) -> str:
    """``created_at`` as the manifest records it: an ISO 8601 time in UTC, ``Z``-suffixed.

    A string is read as ISO 8601 and must name its timezone, as a ``datetime`` must: a time
    without one (or ``"yesterday"``) is refused, not recorded for every reader to misplace.
    """
    advice = ("; pass a timezone-aware datetime, an ISO 8601 string with its timezone "
              "(2026-01-15T12:00:00Z), or None for now")
    if isinstance(created_at, str):
        text = created_at[:-1] + "+00:00" if created_at.endswith(("Z", "z")) else created_at
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"open_run: created_at is {created_at[:40]!r}, not an ISO 8601 time{advice}") from None
    elif created_at is None:
        when = dt.datetime.now(dt.timezone.utc)
    elif isinstance(created_at, dt.datetime):
        when = created_at
    else:
        raise TypeError(f"open_run: created_at is {type(created_at).__name__} {str(created_at)[:40]!r}, "
                        f"not a time{advice}")
    if when.tzinfo is None:
        raise ValueError(f"open_run: created_at {str(created_at)[:40]!r} names no timezone{advice}")
    return when.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
