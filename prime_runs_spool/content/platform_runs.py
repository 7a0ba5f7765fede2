"""Which platform runs already hold a run's episodes: what plain vf-eval pushed on its own.

verifiers' ``vf-eval`` pushes by default: it opens a run on the platform (an evaluation,
whose id is also the Prime Traces run id) and stamps that id on every episode it writes to
``traces.jsonl`` (``run.id``). With pushing off, or when it could not open one, the id is
a local one, ``disabled-<hex>``, which names nothing on any platform.

When such episodes are spooled (``prime-runs import``, or a spool the eval wrote caught up
with its ``traces.jsonl``), the segment's manifest lists the platform run ids found on
them, in the order they first appear (``"platform_runs": [ids]``). Sync then syncs the run
into that evaluation rather than a second one (docs/sync.md, "Runs vf-eval pushed"): each
``--resume`` of a pushing vf-eval opens a new platform run holding every episode kept so
far, so the newest one is tried first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

#: The manifest key listing the platform run ids found on a segment's episodes.
PLATFORM_RUNS_KEY = "platform_runs"
#: verifiers' (prime-runs') local run ids, when pushing is off: never a platform's.
DISABLED_PREFIX = "disabled-"


def is_platform_run_id(value: object) -> bool:
    """A run id vf-eval got from a platform (not a ``disabled-`` one, not empty)."""
    return isinstance(value, str) and bool(value) and not value.startswith(DISABLED_PREFIX)


def platform_runs_of(manifests: Iterable[object]) -> list[str]:
    """The platform run ids the run's segment manifests list, newest first, each once."""
    found: list[str] = []
    for manifest in manifests:
        if isinstance(manifest, dict):
            found += [str(item) for item in manifest.get(PLATFORM_RUNS_KEY) or () if is_platform_run_id(item)]
    return list(dict.fromkeys(reversed(found)))


def episode_run_id(row: object) -> str | None:
    """The run id vf-eval stamped on an episode (``run.id``), if it is a string."""
    run = row.get("run") if isinstance(row, dict) else None
    run_id = run.get("id") if isinstance(run, dict) else None
    return run_id if isinstance(run_id, str) else None


def _json_rows_in(results_path: str | os.PathLike[str]) -> Iterator[object]:
    """Each line of a ``traces.jsonl`` that parses as JSON, decoded, one line held at a
    time; a line that does not parse is passed over, as verifiers itself does, and a file
    that is not there has none. The one read both look-ups below share."""
    try:
        handle = Path(results_path).open("rb")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                continue


def first_run_id_in(results_path: str | os.PathLike[str]) -> str | None:
    """The run id of a ``traces.jsonl`` written without a spool: the one on its first
    episode, as an import takes it (importer/traces_file.py). ``prime-runs eval --resume``
    of such a folder takes it too, so its spool and any import of the folder (under
    ``--state-dir``, from a copy) are one run, synced into one evaluation. None when no
    episode has one."""
    for row in _json_rows_in(results_path):
        if isinstance(row, dict) and isinstance(row.get("id"), str) and isinstance(row.get("traces"), list):
            run_id = episode_run_id(row)
            if run_id is not None:
                return run_id
    return None


def platform_runs_in(results_path: str | os.PathLike[str]) -> list[str]:
    """The platform run ids on the episodes of a ``traces.jsonl``, in the order they first
    appear (empty when there is no file); a line that is not an episode has none."""
    found: list[str] = []
    for row in _json_rows_in(results_path):
        run_id = episode_run_id(row)
        if is_platform_run_id(run_id) and run_id not in found:
            found.append(run_id)
    return found
