"""Eval outputs written without a spool, shown read-only as verifiers wrote them.

A folder holding verifiers' ``traces.jsonl`` (or the older ``metadata.json`` +
``results.jsonl``) and no spool is a run its user has, so the viewer lists it: marked
``not spooled``, with the command that spools it (``importer/places.py`` says which), and
its episodes browsable like a spool's. Nothing is written: not the folder, not a spool.

The file is read forward from the byte after the last whole line read, one line at a time,
with the same time budget as a spool's index. A line without its line feed is not read yet
(verifiers may be writing it; a killed eval leaves it torn for good); a whole line that is
not an episode ends the reading there and says so (the importer refuses such a file, for
the same reason: nothing after it can be trusted). verifiers' ``--resume`` rewrites the
file; a file shorter than what was read is read again from its start.

Unlike a spool's, these records were never masked before the disk: every page masks what
it shows (the run's config, each episode) with the default locations, and so is what the
full-text search index (``search.py``, in the user's cache, never in the outputs folder)
is built from.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.content.episodes import RolloutCounter
from prime_runs_spool.content.remask import remask_episode
from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.errors import CorruptSpoolError, ImportSourceError
from prime_runs_spool.importer.paths import v0_paths
from prime_runs_spool.importer.source import config_identity, resolved_config
from prime_runs_spool.importer.v0_layout import metadata_config, metadata_identity, read_metadata, row_to_episode
from prime_runs_spool.viewer.index import MIN_RECORDS_PER_REFRESH, RunIndex, masked_manifest
from prime_runs_spool.viewer.rows import Row, row_of_episode
from prime_runs_spool.viewer.search import SearchIndex

#: The status the viewer shows for eval outputs with no spool (``prime-runs status`` says the same).
NOT_SPOOLED = "not spooled"


class PlainIndex(RunIndex):
    """The index of one eval output folder with no spool. ``fix`` is the command that spools it."""

    def __init__(self, key: str, output_dir: Path, fix: str) -> None:
        super().__init__(key)
        self.output_dir = output_dir
        self.fix = fix
        self.v0 = not verifiers_traces_path(output_dir).is_file()
        self.results_path = v0_paths(output_dir)[1] if self.v0 else verifiers_traces_path(output_dir)
        self._metadata: dict[str, Any] = {}
        self._identity_read = False
        #: Bytes of the file read (whole lines only) and the lines they held.
        self._offset = 0
        self._lines = 0
        self._stopped = False
        self._summary = SummaryAccumulator()
        self._summary_lock = threading.Lock()
        #: Numbers rollouts per task as the spool's writer would (verifiers writes none).
        self._rollouts = RolloutCounter()
        self._search: SearchIndex | None = None
        self._search_failed = False

    @property
    def status(self) -> str:
        return NOT_SPOOLED

    @property
    def live(self) -> bool:
        return False

    @property
    def summary(self) -> dict[str, Any]:
        with self._summary_lock:
            return self._summary.result()

    def record(self, row: Any) -> Any:
        offset, line = row.where
        try:
            with open(self.results_path, "rb") as handle:
                handle.seek(offset)
                raw = handle.readline()
        except OSError as exc:
            raise CorruptSpoolError(self.results_path, offset, f"cannot be read ({exc.strerror or exc})") from None
        episode = self._episode(raw, line)
        if episode is None:
            raise CorruptSpoolError(self.results_path, offset, "the episode is no longer where it was read "
                                                               "(the file was rewritten)")
        return remask_episode(episode)

    def records(self, rows: list[Row]) -> Iterator[tuple[Row, Any]]:
        """The rows' records from one open of the file (the search index reads them in
        chunks), a :class:`CorruptSpoolError` in place of one no longer where it was read."""
        try:
            handle = open(self.results_path, "rb")
        except OSError:
            yield from super().records(rows)  # each says why
            return
        with handle:
            for row in rows:
                offset, line = row.where
                handle.seek(offset)
                episode = self._episode(handle.readline(), line)
                if episode is None:
                    yield row, CorruptSpoolError(self.results_path, offset, "the episode is no longer where it "
                                                                            "was read (the file was rewritten)")
                else:
                    yield row, remask_episode(episode)

    searchable = True

    def _search_key(self) -> str:
        """What the search index holds: this file as it is now. A file rewritten since
        (``--resume``: another inode or modification time, also between two viewers) is
        indexed again; the file of its index keeps its place (:meth:`search`)."""
        try:
            stat = self.results_path.stat()
            version = f"{stat.st_ino}|{stat.st_mtime_ns}"
        except OSError:
            version = ""
        return f"plain|{self.results_path.resolve()}|{version}"

    def search(self) -> SearchIndex | None:
        with self._lock:
            if self._search is None and not self._search_failed:
                try:
                    self._search = SearchIndex(self, self._search_key(), f"plain|{self.results_path.resolve()}")
                except (OSError, sqlite3.Error):
                    self._search_failed = True  # no cache folder to write: the search box is left out
            return self._search

    def _episode(self, raw: bytes, line: int) -> dict[str, Any] | None:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(value, dict):
            return None
        if self.v0:
            return row_to_episode(value, f"results.jsonl:{line}", "", self._metadata)
        return value if isinstance(value.get("traces"), list) else None

    def _read_identity(self) -> None:
        """The run's name, model, environment and config, from its config files (small)."""
        self._identity_read = True
        try:
            if self.v0:
                _, self._metadata = read_metadata(self.output_dir)
                identity, config = metadata_identity(self.output_dir, self._metadata), metadata_config(self._metadata)
            else:
                config = resolved_config(self.output_dir)
                identity = config_identity(config)
        except ImportSourceError as exc:
            self.error = str(exc)
            return
        self.manifest = masked_manifest({
            "name": identity.name or self.output_dir.name, "model": identity.model,
            "environments": identity.environments, "config": config or None, "created_at": None,
        })

    def _reset(self) -> None:
        """The file was rewritten (``--resume``): what was read of it no longer holds."""
        self.rows = []
        self.prompts = {}
        self.prompt_heads = {}
        self.metric_names = {}
        self._offset = self._lines = 0
        self._stopped = False
        self.error = None
        self._rollouts = RolloutCounter()
        with self._summary_lock:
            self._summary = SummaryAccumulator()
        if self._search is not None:
            self._search.reset(self._search_key())

    def _read(self, deadline: float) -> None:
        if not self._identity_read:
            self._read_identity()
        try:
            size = self.results_path.stat().st_size
        except OSError as exc:
            self.error = f"{self.results_path}: cannot be read ({exc.strerror or exc})"
            self.behind = False
            return
        if size < self._offset:
            self._reset()
        if self._stopped or size == self._offset:
            self.behind = False
            return
        behind, read = False, 0
        try:
            with open(self.results_path, "rb") as handle:
                handle.seek(self._offset)
                for raw in handle:
                    if not raw.endswith(b"\n"):
                        break  # not whole yet, or torn for good: not an episode either way
                    line = self._lines + 1
                    if raw.strip():
                        episode = self._episode(raw, line)
                        if episode is None:
                            self.error = (f"{self.results_path}: line {line} is not an episode; "
                                          "nothing after it is shown")
                            self._stopped = True
                            break
                        self._add_episode(episode, (self._offset, line))
                        read += 1
                    self._offset += len(raw)
                    self._lines = line
                    if read >= MIN_RECORDS_PER_REFRESH and time.monotonic() > deadline:
                        behind = True
                        break
        except OSError as exc:
            self.error = f"{self.results_path}: cannot be read ({exc.strerror or exc})"
        self.behind = behind

    def _add_episode(self, episode: Mapping[str, Any], where: tuple[int, int]) -> None:
        try:
            rollout = self._rollouts.next_number(episode)
        except (AttributeError, TypeError, KeyError, IndexError):
            rollout = None  # a record of another shape: shown, not numbered
        row, prompt = row_of_episode(len(self.rows) + 1, where, remask_episode(episode), rollout)  # written in clear
        if not self.rows and self.manifest.get("created_at") is None:
            self.manifest = {**self.manifest, "created_at": _started(episode)}
        self._add(row, prompt)
        with self._summary_lock:
            try:
                self._summary.add(episode)
            except (AttributeError, TypeError):
                pass  # an odd record counts in the table, not in the means


def _started(episode: Mapping[str, Any]) -> str | None:
    """When the first episode's earliest trace started (ISO, UTC): the run's start as far
    as its outputs tell (verifiers records no start of its own)."""
    starts = []
    for trace in episode.get("traces") or ():
        timing = trace.get("timing") if isinstance(trace, Mapping) else None
        start = timing.get("start") if isinstance(timing, Mapping) else None
        if isinstance(start, (int, float)) and not isinstance(start, bool):
            starts.append(start)
    if not starts:
        return None
    try:
        when = dt.datetime.fromtimestamp(min(starts), dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return when.isoformat().replace("+00:00", "Z")
