"""Which earlier episodes a resumed run replaces: the supersede rule for a rewritten results file.

verifiers' ``--resume`` reads the run's ``traces.jsonl``, keeps the rollouts it will not
run again (the env's keep-verdict: normally ``ok``, and only for tasks still selected),
**rewrites the file with only those**, and re-runs every other (example, rollout) slot.
An errored attempt therefore disappears from verifiers' results and a new attempt takes
its slot. The spool is append-only and still holds the errored attempt, so without a rule
the run would end with more episodes than slots (8 for 6, rollout numbers 1-4 for one
task) while verifiers' results have exactly one per slot.

The rule: **when a run is resumed, every episode the spool already holds whose id is not
in the rewritten results file is superseded**: its slot is re-run, and the new attempt is
the slot's episode. The resumed segment's manifest record lists them
(``"supersedes": [episode ids]``, docs/manifest.md), so the decision is durable and made
once, by the process that saw the rewritten file; readers (sync, status, an importer of
rewritten ``traces.jsonl`` files) union the lists of all segments and leave those
episodes out of the run's effective set: each slot once, the latest attempt.

Why the results file and not our own verdict: which attempts verifiers keeps is the env's
decision (``env.complete``), not something this package can recompute; the rewritten
file is where that decision is written down. An episode missing from it for any other
reason (a torn row, a task no longer selected) is re-run by verifiers too, so superseding
it is still what makes the spool agree with verifiers' results.

Bounded memory: the results file is read one line at a time and only ids are kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson


#: verifiers' own results file, beside the spool in the run directory (not ours: read only).
VERIFIERS_TRACES_NAME = "traces.jsonl"


def verifiers_traces_path(run_dir: str | os.PathLike[str]) -> Path:
    """verifiers' ``traces.jsonl`` of a run (its results; ``--resume`` rewrites it)."""
    return Path(run_dir) / VERIFIERS_TRACES_NAME

#: The manifest key of a resumed segment listing the episode ids it supersedes.
SUPERSEDES_KEY = "supersedes"


def kept_episode_ids(results_path: str | os.PathLike[str]) -> set[str]:
    """The episode ids in a (rewritten) ``traces.jsonl``; empty when there is no file.

    A row counts when it is a JSON object with an ``id`` and ``traces`` (what verifiers
    itself requires of a row); anything else was dropped by verifiers too.
    """
    path = Path(results_path)
    kept: set[str] = set()
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return kept
    with handle:
        for line in handle:
            episode_id = _row_id(line)
            if episode_id is not None:
                kept.add(episode_id)
    return kept


def superseded_ids(spool_episode_ids: Iterable[str | None], kept: set[str]) -> list[str]:
    """The spool's episodes that the resume replaces, in spool order, each once."""
    out: list[str] = []
    seen: set[str] = set()
    for episode_id in spool_episode_ids:
        if episode_id is None or episode_id in kept or episode_id in seen:
            continue
        seen.add(episode_id)
        out.append(episode_id)
    return out


def supersedes_of(manifests: Iterable[object]) -> set[str]:
    """The union of the ``supersedes`` lists of a run's segment manifests."""
    out: set[str] = set()
    for manifest in manifests:
        if isinstance(manifest, dict):
            out.update(str(item) for item in manifest.get(SUPERSEDES_KEY) or () if item is not None)
    return out


def effective(episodes: Iterable[tuple[str | None, object]], superseded: set[str]) -> Iterator[object]:
    """``(episode_id, item)`` pairs in spool order, without the superseded ones."""
    for episode_id, item in episodes:
        if episode_id is None or episode_id not in superseded:
            yield item


def supersede_history(manifests: Iterable[object]) -> list[frozenset[str]]:
    """The run's superseded set as it stood after each segment opened, newest first and each
    distinct set once, ending with the empty set (before any resume). A batch announced
    before a later resume was cut under one of these (sync/sinks/addressed.py rebuilds it)."""
    sets: list[frozenset[str]] = [frozenset()]
    for manifest in manifests:
        grown = sets[-1] | supersedes_of([manifest])
        if grown != sets[-1]:
            sets.append(frozenset(grown))
    return sets[::-1]


def supersede_history_in_run(run_dir: str | os.PathLike[str]) -> list[frozenset[str]]:
    """:func:`supersede_history` of the run's segment manifests (two lines read per segment)."""
    from prime_runs_spool.spool.manifests import segment_manifests

    return supersede_history(segment_manifests(run_dir))


def superseded_in_run(run_dir: str | os.PathLike[str]) -> set[str]:
    """Every episode id a resumed segment of the run supersedes (two lines read per segment)."""
    from prime_runs_spool.spool.manifests import segment_manifests

    return supersedes_of(segment_manifests(run_dir))


def is_errored(record: object) -> bool:
    """An episode a retry may replace: its ``ok`` is not ``True`` (what verifiers' resume re-runs)."""
    return not (isinstance(record, dict) and record.get("ok") is True)


def _row_id(line: bytes) -> str | None:
    if not line.strip():
        return None
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(row, dict) or "traces" not in row or row.get("id") is None:
        return None
    return str(row["id"])
