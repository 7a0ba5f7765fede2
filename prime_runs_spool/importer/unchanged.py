"""Eval outputs found imported and up to date before, passed over again from ``stat`` calls
alone (docs/sync.md, the paragraph before "Guarantees").

``prime-runs sync`` refreshes every imported spool from its source before it syncs: a
source that grew (a run still writing, a ``--resume``) adds a segment. Done by reading, a
no-op re-sync of plain vf-eval outputs read every ``traces.jsonl`` in full, with the spool
it was imported into, and checked the API key first, where a spool the eval wrote is
answered from a few ``stat`` calls (sync/unchanged.py). So for every source an import found
up to date, this machine keeps the files that answer rested on, each by device, inode, size,
modification and change time: the output folder (its times move when a file is added,
removed or renamed in, as a ``--resume`` renames its new ``traces.jsonl`` in), the episode
file (``traces.jsonl``, or ``metadata.json`` and ``results.jsonl``), the logs the verdict
reads (``logs/`` and each attempt's log), and the imported spool's folder and segments.
While they all match, the source is not imported again: no file opened, no request.

Why matching files hold what they held, the settling rule and the blind spot are those of
sync/unchanged.py, whose rule (:data:`~prime_runs_spool.sync.unchanged.SETTLED`) and cache
folder this shares. A cache and nothing more: lost, stale or damaged, it costs the read.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.files import is_utf8, joined, replace_private
from prime_runs_spool.importer.paths import LOGS_DIRNAME, attempt_log_paths, v0_paths
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, list_segments
from prime_runs_spool.sync import unchanged as sync_unchanged
from prime_runs_spool.sync.unchanged import UNCHANGED_DIRNAME, fingerprint
from prime_runs_spool.sync.user_cache import private_folder

#: Changes when what an entry means does: an entry of another number is not used.
ENTRY_VERSION = 1
#: At most this many sources are kept; those this process did not see go first.
MAX_ENTRIES = 50_000


def _key(output_dir: Path, state_dir: Path | None) -> str:
    return f"{os.path.abspath(output_dir)}\0{'' if state_dir is None else os.path.abspath(state_dir)}"


def source_files(output_dir: Path) -> list[str]:
    """The source's files an import's verdict rests on, the folder first (before the rest:
    a change after it moves it)."""
    folder = os.fspath(output_dir)
    traces = verifiers_traces_path(output_dir)
    if traces.is_file():
        logs = joined(folder, LOGS_DIRNAME)
        return [folder, os.fspath(traces), *([logs] if os.path.isdir(logs) else []),
                *(os.fspath(p) for p in attempt_log_paths(output_dir))]
    return [folder, *(os.fspath(p) for p in v0_paths(output_dir))]


def spool_files(run_dir: Path) -> list[str]:
    """The imported spool's folder (first) and its segments."""
    return [joined(run_dir, SPOOL_DIRNAME), *(os.fspath(p) for _, p in list_segments(run_dir))]


def fingerprints(paths: Iterable[str]) -> list[list[Any]] | None:
    """``[path, *fingerprint]`` of each path, or None when one cannot be looked at."""
    try:
        return [[path, *fingerprint(os.stat(path))] for path in paths]
    except OSError:
        return None


class ImportsUnchanged:
    """The sources this machine found imported and up to date, loaded once per process."""

    def __init__(self, folder: Path | None = None) -> None:
        self._entries: dict[str, list[list[Any]]] = {}
        self._seen: set[str] = set()
        self._learned = False
        self._path: Path | None = None
        try:
            self._path = (folder or private_folder(UNCHANGED_DIRNAME)) / f"imports-v{ENTRY_VERSION}.json"
            self._entries = self._read(self._path)
        except OSError:
            pass  # no cache folder: every source is read

    @staticmethod
    def _read(path: Path) -> dict[str, list[list[Any]]]:
        try:
            document = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if not isinstance(document, dict) or document.get("version") != ENTRY_VERSION:
            return {}
        runs = document.get("sources")
        return runs if isinstance(runs, dict) else {}

    def holds(self, output_dir: Path, state_dir: Path | None) -> bool:
        """Whether ``output_dir``'s files (and its spool's) are those an up-to-date import was kept for."""
        key = _key(output_dir, state_dir)
        kept = self._entries.get(key)
        if not kept:
            return False
        try:
            for path, *before in kept:
                if fingerprint(os.stat(path)) != before:
                    return False
        except (OSError, TypeError, ValueError):
            return False
        self._seen.add(key)
        return True

    def learn(self, output_dir: Path, state_dir: Path | None, before: list[list[Any]] | None) -> None:
        """Keep an up-to-date import's answer, resting on the files as ``before`` found them."""
        if not before or not all(is_utf8(found[0]) for found in before) or not is_utf8(_key(output_dir, state_dir)):
            return  # none, or a name orjson cannot write (not UTF-8): read each time
        newest = max(found[5] for found in before)  # change times
        if newest / 1e9 >= time.time() - sync_unchanged.SETTLED:
            return
        key = _key(output_dir, state_dir)
        self._entries[key] = before
        self._seen.add(key)
        self._learned = True

    def forget(self, output_dir: Path, state_dir: Path | None) -> None:
        self._entries.pop(_key(output_dir, state_dir), None)

    def save(self) -> None:
        """Write what this process learned, over what another may have written meanwhile."""
        if not self._learned or self._path is None:
            return
        sources = {**self._read(self._path), **{key: self._entries[key] for key in self._seen if key in self._entries}}
        if len(sources) > MAX_ENTRIES:
            ours = [key for key in sources if key in self._seen]
            others = [key for key in sources if key not in self._seen]
            sources = {key: sources[key] for key in [*others[len(sources) - MAX_ENTRIES:], *ours][-MAX_ENTRIES:]}
        with contextlib.suppress(OSError):  # a cache: a sync that cannot keep it only reads again
            replace_private(self._path, orjson.dumps({"version": ENTRY_VERSION, "sources": sources}), durable=False)
        self._learned = False


_loaded: ImportsUnchanged | None = None


def imports_unchanged() -> ImportsUnchanged:
    """This process's one view of the cache (``sync`` asks before it imports, then imports)."""
    global _loaded
    if _loaded is None:
        _loaded = ImportsUnchanged()
    return _loaded
