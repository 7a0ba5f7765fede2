"""Bring a spool written under older masking rules up to today's before it travels.

Masking happens at append, so a spool holds what the rules of its day masked. When a
credential location is added (content/mask_locations.py, :data:`MASKING_VERSION`), a spool
written before then may hold a credential in clear text at the new location; the spool
itself is the user's own file and is left as it is, but nothing of it reaches a
destination unmasked: sync passes its manifest and every episode through here first, and
``prime-runs mirror`` uploads a copy of each such segment whose every record went through here.
A spool recorded under the current version is passed through untouched (masking again
would change nothing and cost a walk of every config), so only old spools pay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prime_runs_spool.content.error_scrub import error_forms, scrub_episode_errors, scrub_text
from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.content.mask_text import mask_text
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.spool.format import EPISODE, MANIFEST, SEAL
from prime_runs_spool.spool.reader import Record
from prime_runs_spool.spool.rewrite import RecordChange

_CONFIG_RULES = MaskRules.defaults_for_config()
_EPISODE_RULES = MaskRules.defaults_for_episode()


def masked_under(manifest: Mapping[str, Any]) -> int:
    """The masking version the spool was written under (0: before versions were recorded)."""
    version = manifest.get("masking_version")
    return version if isinstance(version, int) and not isinstance(version, bool) else 0


def needs_remask(manifest: Mapping[str, Any]) -> bool:
    """Whether the spool's records must be masked again before they travel: unless it says
    exactly today's version. One that claims a later version is masked again too (today's
    rules are a subset of a later version's, so that costs time and never changes a record
    a later version really wrote), and so is anything that is not a version at all."""
    return masked_under(manifest) != MASKING_VERSION


def copy_masking(manifest: Mapping[str, Any]) -> RecordChange | None:
    """How a copy of a segment with this manifest is made (``prime-runs mirror``): ``None``
    when its bytes may be copied as they are (it was masked by today's rules at append),
    else the change that gives each of its records as today's rules would have written it.
    The copy's manifest then says today's version: everything in it was masked by today's
    rules, so whoever reads the copy need not mask it again."""
    if not needs_remask(manifest):
        return None
    forms = error_forms_of(manifest)  # a seal's error quoting the config: cleared in the copy too
    return remasked_record if not forms else lambda record: remasked_record(record, forms)


def remasked_record(record: Record, forms: list[str] | None = None) -> Any:
    """A record's data masked again by today's rules: the same object when nothing in it
    changes, so that its line is copied byte for byte (spool/rewrite.py). ``forms``: what a
    seal's error is cleared of (:func:`error_forms_of` its segment's manifest)."""
    if record.type == EPISODE:
        return remask_episode(record.data)
    if record.type == MANIFEST and isinstance(record.data, Mapping):
        return {**remask_manifest(record.data), "masking_version": MASKING_VERSION}
    if record.type == SEAL and isinstance(record.data, Mapping) and isinstance(record.data.get("error"), str):
        error = travelling_error(record.data["error"], forms)  # sync masks it so before it leaves, too
        return record.data if error == record.data["error"] else {**record.data, "error": error}
    return record.data


def remask_manifest(manifest: Mapping[str, Any], warnings: list[str] | None = None) -> dict[str, Any]:
    """``manifest`` as today's rules would have recorded it: its config masked again, and
    its launch file left out if today's check refuses it (the warning says why)."""
    from prime_runs_spool.content.manifest import checked_config_source  # only old spools pay its imports

    out = dict(manifest)
    config = out.get("config")
    if isinstance(config, Mapping):
        out["config"] = mask(dict(config), _CONFIG_RULES)
    source = out.get("config_source")
    if source is not None:
        out.pop("config_source")
        if isinstance(source, Mapping) and isinstance(source.get("text"), str):
            checked = checked_config_source(source["text"], str(source.get("filename") or "config"),
                                            _CONFIG_RULES, warnings if warnings is not None else [])
            if checked is not None:
                out["config_source"] = checked
    return out


def remask_episode(record: Mapping[str, Any]) -> Any:
    """An episode record masked by today's episode rules (never mutates ``record``), its
    error messages cleared as at append (content/error_scrub.py)."""
    return scrub_episode_errors(record, mask(record, _EPISODE_RULES))


def error_forms_of(manifest: Mapping[str, Any]) -> list[str]:
    """What a run's error line is cleared of when its spool was written under older rules:
    each value today's masking takes out of its config, as a message may quote it. The
    runner clears a seal's error so at the seal; a spool sealed before (or by another
    producer) quoted its client's key there, and the line travels (the evaluation's error
    and metadata, an export's runs row). Read off the manifest as written, before
    :func:`remask_manifest` masks it."""
    from prime_runs_spool.content.manifest import masked_config_values  # only old spools pay its imports

    config = manifest.get("config")
    return error_forms(masked_config_values(dict(config))) if isinstance(config, Mapping) else []


def travelling_error(error: Any, forms: list[str] | None = None) -> Any:
    """A seal's error as it may leave: what "Inside strings" masks masked (a URL's userinfo,
    a flag's value), and ``forms`` (:func:`error_forms_of`) cleared."""
    if not isinstance(error, str):
        return error
    error = mask_text(error)
    return scrub_text(error, forms) if forms else error
