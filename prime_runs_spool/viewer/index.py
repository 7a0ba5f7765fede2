"""A run's table index, kept up to date by reading forward from where it stopped.

Why an index at all: the sample table sorts and filters a whole run, and must open a run of
100,000 episodes as fast as one of 100. So each run gets one small :class:`~.rows.Row` per
episode (never the episode itself), built by streaming the spool through the reader API
(``iter_records`` from the last :class:`Position`): a growing spool costs only its new
lines, and an episode page re-reads one record from its position.

Why a time budget: the first look at a big run must not wait for the whole spool. Each
``refresh`` reads for at most ``budget`` seconds (and at least a page's worth of records)
and says whether it is still ``behind``; the first table page (in spool order) is ready as
soon as its rows are, a background thread reads the rest, and the page keeps polling until
the index has caught up.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.content.environments import environment_list
from prime_runs_spool.content.masking import MaskRules
from prime_runs_spool.content.remask import needs_remask, remask_episode, remask_manifest
from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.errors import CorruptSpoolError, SpoolError, corruption_message
from prime_runs_spool.files import unreadable_message
from prime_runs_spool.spool.format import EPISODE, LIVE, MANIFEST, SEAL
from prime_runs_spool.spool.header import read_header
from prime_runs_spool.spool.layout import is_run_dir, list_segments, segment_path, segment_version
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.reader import Position, iter_records, torn_after
from prime_runs_spool.spool.scan import derive_status, scan_segment
from prime_runs_spool.spool.writer_state import writer_alive
from prime_runs_spool.sync.state import state_home, sync_command
from prime_runs_spool.viewer.rows import SEARCH_CHARS, Row, row_of_episode, row_of_sample
from prime_runs_spool.viewer.search import SearchIndex
from prime_runs_spool.viewer.standing import Standing, SyncStates, standing

#: An index that caught up is not re-read more often than this (seconds): a page of many
#: runs polled every second must not re-open every spool on every poll.
MIN_REFRESH_INTERVAL = 0.25
#: The status of a run that cannot be read at all (a newer format): the reason is in ``error``.
UNREADABLE = "error"
#: A refresh reads at least this many records whatever its budget: every poll makes
#: progress, and the first table page is there after the first one.
MIN_RECORDS_PER_REFRESH = 100
#: How much of each example's prompt compare shows (characters).
PROMPT_HEAD_CHARS = 160
#: How many platform sample rows are fetched per store call while indexing.
PLATFORM_PAGE = 200

CONFIG_RULES = MaskRules.defaults_for_config()
# Episodes were masked before they reached the disk; masking again what a page shows
# (content/remask.py, remask_episode: today's rules, and the error messages cleared of what
# they take out) costs a walk of the config subtrees and keeps an older or foreign
# producer's slip off the screen.
#: At most this many runs are read in the background at once (a tree of many big runs
#: opened together must not start as many threads fighting over two cores).
_BACKGROUND_READERS = threading.BoundedSemaphore(2)


class RunIndex:
    """What the viewer knows about one run; subclasses fill it from a spool or the platform."""

    #: The command that would spool this run, for a run shown without a spool (else None).
    fix: str | None = None

    def __init__(self, key: str) -> None:
        self.key = key
        self.rows: list[Row] = []
        #: The prompt text of each example id (first seen), lowercased and cut to SEARCH_CHARS.
        self.prompts: dict[Any, str] = {}
        #: The same prompts' starts as written (compare shows them), cut to PROMPT_HEAD_CHARS.
        self.prompt_heads: dict[Any, str] = {}
        self.metric_names: dict[str, None] = {}
        self.manifest: dict[str, Any] = {}
        #: Written under older masking rules: each row is made of its episode masked again
        #: (an error message in the table quoted a header an older writer left in clear).
        self._remask = False
        self.behind = True
        self.error: str | None = None
        self._lock = threading.Lock()
        self._refreshed_at = -1.0
        self._catcher: threading.Thread | None = None

    # -- what pages read ---------------------------------------------------------------

    @property
    def status(self) -> str:
        raise NotImplementedError

    @property
    def live(self) -> bool:
        return self.status == LIVE

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.key)

    @property
    def model(self) -> str | None:
        """The manifest's model as text: a manifest holds what its producer wrote (an older
        ``open_run`` took ``model=123``), and a page sorting runs by model must not compare
        a number with a string."""
        model = self.manifest.get("model")
        return None if model is None else str(model)

    @property
    def environments(self) -> list[str]:
        envs = environment_list(self.manifest.get("environments"))
        return [str(e.get("id") if isinstance(e, Mapping) else e) for e in envs]

    @property
    def started(self) -> str | None:
        return self.manifest.get("created_at")

    @property
    def config(self) -> Any:
        return self.manifest.get("config")

    @property
    def summary(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def episodes(self) -> int:
        return len(self.rows)

    def record(self, row: Row) -> Any:
        """The full stored record of ``row`` (masked as stored), read again from its source."""
        raise NotImplementedError

    #: Where a platform run's episodes are ("samples table", "Prime Traces"); None for a spool's.
    store_name: str | None = None

    #: Whether :meth:`search` can give an index (the page offers the search box then).
    searchable = False

    def search(self) -> SearchIndex | None:
        """The run's full-text index (``search.py``); None where there is none (eval outputs
        with no spool, the platform's runs, or a cache folder that cannot be written)."""
        return None

    def standing(self) -> Standing | None:
        """Where the run stands (``standing.Standing``): written and synced; None when the
        source keeps no such figures (eval outputs with no spool, the platform's own runs)."""
        return None

    def records(self, rows: list[Row]) -> Iterator[tuple[Row, Any]]:
        """Each of ``rows`` with its record, one at a time (a :class:`SpoolError` for a row
        that cannot be read is yielded in its place, a segment the OS refuses, e.g. made
        unreadable after its rows were indexed, too: it stopped the search's thread)."""
        for row in rows:
            try:
                yield row, self.record(row)
            except SpoolError as exc:
                yield row, exc
            except OSError as exc:
                yield row, SpoolError(f"episode {row.number} cannot be read: {exc.strerror or exc}"
                                      + (f": {exc.filename}" if exc.filename else ""))

    # -- indexing ----------------------------------------------------------------------

    def refresh(self, budget: float = 0.25) -> None:
        """Read what is new, for at most about ``budget`` seconds (thread-safe)."""
        with self._lock:
            now = time.monotonic()
            if not self.behind and now - self._refreshed_at < MIN_REFRESH_INTERVAL:
                return
            self._read(now + budget)
            self._refreshed_at = time.monotonic()

    def catch_up_in_background(self, chunk: float = 0.25) -> None:
        """While the index is behind, keep reading in a daemon thread (one per index), in
        chunks of ``chunk`` seconds so requests get the lock in between."""
        with self._lock:
            if not self.behind or (self._catcher is not None and self._catcher.is_alive()):
                return

            def run() -> None:
                while self.behind:
                    with _BACKGROUND_READERS:
                        self.refresh(chunk)

            self._catcher = threading.Thread(target=run, name=f"viewer-index-{self.key}", daemon=True)
            self._catcher.start()

    def _read(self, deadline: float) -> None:
        raise NotImplementedError

    def _add(self, row: Row, prompt: str) -> None:
        # Pages read these while the background thread adds to them: the list only grows
        # (safe to iterate), the metric names are replaced, never changed in place.
        self.rows.append(row)
        new = [name for name in row.metrics if name not in self.metric_names]
        if new:
            self.metric_names = {**self.metric_names, **dict.fromkeys(new)}
        if row.example_id not in self.prompts:
            self.prompts[row.example_id] = prompt[:SEARCH_CHARS].lower()
            self.prompt_heads[row.example_id] = " ".join(prompt[:PROMPT_HEAD_CHARS * 2].split())[:PROMPT_HEAD_CHARS]


class SpoolIndex(RunIndex):
    """The index of one run directory's spool, read only through the spool reader."""

    def __init__(self, key: str, run_dir: Path, state_dir: Path | None = None) -> None:
        super().__init__(key)
        self.run_dir = run_dir
        #: The id of the first segment read here: a run deleted and written again at its path
        #: is another spool (:meth:`is_another_spool`), whatever inode its folder got.
        self._first_segment: tuple[tuple[int, int, int], str | None] | None = None
        self._first_id = self._first_segment_id()
        #: Where the syncs of a read-only spool kept its states (``--state-dir``).
        self.state_dir = state_dir
        self._position: Position | None = None
        self._seal: tuple[int, dict[str, Any]] | None = None
        self._summary = SummaryAccumulator()
        self._summary_lock = threading.Lock()  # the accumulator is read while it is added to
        self._corrupt = False
        #: The last answer to "torn?" for a dead writer's last segment, with the file it was for.
        self._torn_seen: tuple[tuple[Any, ...], bool] | None = None
        self._seen_shape: tuple[tuple[int, ...], int, int, bool] | None = None
        self._status = derive_status(corrupt=False, last_sealed=None, live=False, torn=False)
        self._sync_states: SyncStates | None = None
        self._search: SearchIndex | None = None
        self._search_failed = False

    @property
    def status(self) -> str:
        return UNREADABLE if self.error is not None and not self._corrupt else self._status

    searchable = True

    def search(self) -> SearchIndex | None:
        with self._lock:
            if self._search is None and not self._search_failed:
                key = f"spool|{self.run_dir.resolve()}|{self.manifest.get('run_id') or ''}"
                try:
                    self._search = SearchIndex(self, key)
                except (OSError, sqlite3.Error):
                    self._search_failed = True  # no cache folder to write: the search box is left out
            return self._search

    @property
    def sync_command(self) -> str:
        """The command the page offers to ship the run, shell-quoted: with the viewer's
        ``--state-dir`` where the spool folder is read-only, so that the sync keeps its state
        where this page reads it (without it the sync refuses, asking for the flag)."""
        if self.state_dir is not None and state_home(self.run_dir, self.state_dir) != self.run_dir:
            return sync_command(str(self.run_dir), None, None, "--state-dir", str(self.state_dir))
        return sync_command(str(self.run_dir), None, None)

    def standing(self) -> Standing:
        if self._sync_states is None:
            self._sync_states = SyncStates(self.run_dir, self.state_dir)
        shape = self._seen_shape
        segments = len(shape[0]) if shape else 0
        seal = self._seal
        sealed = None
        if seal is not None and shape and shape[0] and seal[0] == shape[0][-1]:  # no segment: deleted since
            sealed = str(seal[1].get("status")) if seal[1].get("status") is not None else None
        return standing(self.rows, segments, sealed, self._sync_states.read())

    @property
    def summary(self) -> dict[str, Any]:
        seal = self._seal[1] if self._seal else {}
        sealed = seal.get("summary") if isinstance(seal, Mapping) else None
        if isinstance(sealed, Mapping) and not self.behind:
            return dict(sealed)
        with self._summary_lock:
            return self._summary.result()

    def record(self, row: Row) -> Any:
        for record in iter_records(self.run_dir, row.where):
            return remask_episode(record.data)
        raise CorruptSpoolError(self.run_dir, row.where.offset, "the episode is no longer where it was read")

    def records(self, rows: list[Row]) -> Iterator[tuple[Row, Any]]:
        """Rows that follow each other in the run (a table page in spool order) are read in
        one pass of the reader, not one open and verified start per row."""
        i = 0
        while i < len(rows):
            j = i + 1
            while j < len(rows) and rows[j].number == rows[j - 1].number + 1:
                j += 1
            if j - i == 1:
                yield from super().records(rows[i:j])
            else:
                yield from self._consecutive(rows[i:j])
            i = j

    def _consecutive(self, rows: list[Row]) -> Iterator[tuple[Row, Any]]:
        wanted = iter(rows)
        row = next(wanted, None)
        try:
            for record in iter_records(self.run_dir, rows[0].where):
                if row is None:
                    return
                if record.type != EPISODE:
                    continue
                if record.position != row.where:  # not what the index read there: ask row by row
                    break
                yield row, remask_episode(record.data)
                row = next(wanted, None)
        except (SpoolError, OSError):  # the rest row by row: each says why
            pass
        rest = [] if row is None else [row, *wanted]
        yield from super().records(rest)

    def is_another_spool(self) -> bool:
        """Whether the spool at the run's path is no longer the one this index read: its
        first segment has another id (an eval run again into the same folder). Read on
        from where the old one ended, it showed the old run's episodes and called the new
        one corrupt ("bytes ... have changed since") until the viewer was restarted."""
        found = self._first_segment_id()
        if self._first_id is None:
            self._first_id = found
            return False
        return found is not None and found != self._first_id

    def _first_segment_id(self) -> str | None:
        """The ``segment_id`` in the header of the run's first segment (None: none yet), read
        again only when the file's identity or modification time changed."""
        path = segment_path(self.run_dir, 1)
        try:
            info = os.stat(path)
        except OSError:
            return None
        seen = (info.st_dev, info.st_ino, info.st_mtime_ns)
        if self._first_segment is not None and self._first_segment[0] == seen:
            return self._first_segment[1]
        try:
            header = read_header(path)
        except OSError:
            return None
        found = None if header is None else header.get("segment_id")
        self._first_segment = (seen, None if found is None else str(found))
        return self._first_segment[1]

    def _read(self, deadline: float) -> None:
        try:
            self._read_spool(deadline)
        except OSError as exc:  # another user's segment, a folder made unreadable under the viewer
            # The run says so (status "error"), not every page listing it: the runs page and
            # the across-runs page refresh each run, and answered "Cannot read this run" for all.
            self.error = unreadable_message(exc, self.run_dir)
            self.behind = False
            self._seen_shape = None  # asked again at the next refresh: a file readable again is read
            self._status = UNREADABLE

    def _read_spool(self, deadline: float) -> None:
        if self._corrupt:
            self.behind = False
            return
        shape = self._shape()
        if shape == self._seen_shape and not self.behind:
            self._status = self._derive()  # nothing new on disk; only a writer may have gone
            return
        behind = False  # published at the end: a reader polling ``behind`` sees no half-read state
        read = 0
        try:
            for record in iter_records(self.run_dir, self._position):
                self._position = record.after
                read += 1
                if record.type == EPISODE:
                    meta = record.meta or {}
                    rollout = meta.get("rollout_number")
                    row, prompt = row_of_episode(len(self.rows) + 1, record.position,
                                                 remask_episode(record.data) if self._remask else record.data,
                                                 rollout if isinstance(rollout, int) else None)
                    self._add(row, prompt)
                    if isinstance(record.data, Mapping):
                        with self._summary_lock:
                            try:
                                self._summary.add(record.data)
                            except (AttributeError, TypeError):
                                pass  # an odd record counts in the table, not in the means
                elif record.type == MANIFEST and not self.manifest and isinstance(record.data, Mapping):
                    self.manifest = masked_manifest(record.data)
                    self._remask = needs_remask(record.data)
                elif record.type == SEAL:
                    self._seal = (record.segment_index, record.data if isinstance(record.data, dict) else {})
                if read >= MIN_RECORDS_PER_REFRESH and time.monotonic() > deadline:
                    behind = True
                    break
        except CorruptSpoolError as exc:
            self._corrupt = True
            self.error = corruption_message(exc.path, exc.offset, exc.reason)
        except SpoolError as exc:  # a newer format version: nothing of it can be read
            self.error = str(exc)
        else:
            if not self._corrupt:
                self.error = None
        self.behind = behind
        self._seen_shape = shape
        self._status = self._derive()

    def _shape(self) -> tuple[tuple[int, ...], int, int, bool]:
        """The run's segments, the last one's size, its durable mark and whether its writer
        is alive: unchanged means nothing to read. The mark, because a live writer writes
        its lines into padding that is already there (docs/spool-format.md, section 5): its
        file does not grow. Its writer's death, because the mark is written at most every
        10 ms (spool/durable_mark.py): a writer killed within that time of its last lines
        changed neither size nor mark. Taken before reading, so what a writer wrote before
        it died is read by the first look after."""
        segments = list_segments(self.run_dir)
        if not segments:
            is_run_dir(self.run_dir)  # SegmentsGoneError when they were deleted: the run says so (_read)
            return (), 0, 0, False
        last = segments[-1][1]
        alive = writer_alive(last)
        try:
            size = last.stat().st_size
        except OSError:
            size = -1
        return tuple(index for index, _ in segments), size, durable_mark(last), alive

    def _derive(self) -> str:
        segments = list_segments(self.run_dir)
        if self._corrupt or not segments:
            return derive_status(corrupt=self._corrupt, last_sealed=None, live=False, torn=False)
        last_index, last_path = segments[-1]
        sealed = None
        if self._seal is not None and self._seal[0] == last_index:
            sealed = self._seal[1].get("status")
            sealed = None if sealed is None else str(sealed)
        live = sealed is None and writer_alive(last_path)
        torn = False
        if sealed is None and not live and not self.behind:
            position = self._position
            here = position is not None and position.segment_index == last_index
            try:  # the answer holds while the file is the same: a dead writer's padding is not read again
                key = (last_index, position.offset if here else None, segment_version(last_path),
                       last_path.stat().st_size)
            except OSError:
                key = None
            if key is not None and self._torn_seen is not None and self._torn_seen[0] == key:
                torn = self._torn_seen[1]
            else:
                if here:
                    torn = torn_after(last_path, position.offset)  # bytes after the last good line, not padding
                else:  # nothing read yet from the last segment: ask the reader about it (it is short)
                    torn = scan_segment(last_path).torn_offset is not None
                self._torn_seen = None if key is None else (key, torn)
        return derive_status(corrupt=False, last_sealed=sealed, live=live, torn=torn)


def masked_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest as stored, its config masked again and its launch file (``config_source``,
    shown as written) checked again, left out when today's rules refuse it: a spool from an
    older or foreign producer may have missed a location, and the viewer must never be the
    one to show it."""
    return remask_manifest(manifest)


def _masked_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation's metadata, shown as its config: masked, and its launch file
    (``config_source``, which another producer may have sent unchecked: prime-runs' own
    client sends it as written) checked as a manifest's is (:func:`masked_manifest`)."""
    shown = masked_manifest({"config": {k: v for k, v in metadata.items() if k != "config_source"},
                             "config_source": metadata.get("config_source")})
    config = shown["config"]
    if isinstance(shown.get("config_source"), Mapping):
        config["config_source"] = shown["config_source"]
    return config


def _masked_sample(sample: Any) -> Any:
    """A v0 sample row with the episode it carries (``info.native_wrapper``) masked."""
    info = sample.get("info") if isinstance(sample, Mapping) else None
    if not isinstance(info, Mapping) or not isinstance(info.get("native_wrapper"), Mapping):
        return sample
    return {**sample, "info": {**info, "native_wrapper": remask_episode(info["native_wrapper"])}}


@dataclass(frozen=True)
class InTraces:
    """Where a dashboard row's episode is when its run went to Prime Traces: its position
    in the platform's Prime Traces store (a sample row's is its offset)."""

    seq: int


class PlatformIndex(RunIndex):
    """The index of one local-platform evaluation: its v0 sample rows in upload order, or,
    for a run that went to Prime Traces (no samples), its episodes there in upload order."""

    def __init__(self, store: Any, evaluation: Mapping[str, Any], traces: Any = None) -> None:
        super().__init__(str(evaluation["evaluation_id"]))
        self.store, self.traces = store, traces
        #: The run id its Prime Traces episodes carry (sync gives them the evaluation's id).
        self.run_id = self.key
        #: The ``seq`` of the last Prime Traces episode read (they are read by position).
        self._after = 0
        self.evaluation: dict[str, Any] = dict(evaluation)
        self._set_manifest()

    def _set_manifest(self) -> None:
        e = self.evaluation
        metadata = e.get("metadata") if isinstance(e.get("metadata"), Mapping) else {}
        self.manifest = {
            "name": e.get("name"), "model": e.get("model_name"),
            # the environments are ids here; sync sends the environment's name as ``dataset``
            "environments": [e["dataset"]] if e.get("dataset") else
            [env.get("id") if isinstance(env, Mapping) else env for env in e.get("environments") or []],
            "created_at": e.get("created_at"), "framework": e.get("framework"), "evaluation_id": e.get("evaluation_id"),
            "local_run_id": metadata.get("local_run_id"), "tags": e.get("tags"),
            "total_samples": e.get("total_samples"), "finalized_at": e.get("finalized_at"),
            "config": _masked_metadata(metadata),
        }

    @property
    def status(self) -> str:
        return str(self.evaluation.get("status") or "unknown").lower()

    @property
    def live(self) -> bool:
        return self.evaluation.get("finalized_at") is None

    @property
    def summary(self) -> dict[str, Any]:
        metrics = self.evaluation.get("metrics")
        return dict(metrics) if isinstance(metrics, Mapping) else {}

    def record(self, row: Row) -> Any:
        """The row's record, masked again on display as a spool's is (docs/masking.md, "What
        the viewer shows"): whatever a producer uploaded, no page shows a credential."""
        if isinstance(row.where, InTraces):
            episode = self.traces.episode_at(row.where.seq)
            if episode is None:
                raise CorruptSpoolError(Path(self.key), row.where.seq, "the episode is gone")
            return remask_episode(episode)
        bodies, _ = self.store.list_samples(self.key, offset=row.where, limit=1)
        if not bodies:
            raise CorruptSpoolError(Path(self.key), row.where, "the sample is gone")
        return _masked_sample(orjson.loads(bodies[0]))

    @property
    def in_traces(self) -> bool:
        """Whether the run's episodes are read from Prime Traces (it has no sample rows)."""
        return self.traces is not None and not self.evaluation.get("total_samples")

    @property
    def store_name(self) -> str:  # type: ignore[override]
        return "Prime Traces" if self.in_traces else "samples table"

    def _read(self, deadline: float) -> None:
        self.evaluation = self.store.get_evaluation(self.key)
        self._set_manifest()
        if self.in_traces:
            self.behind = self._read_episodes(deadline)
        else:
            self.behind = self._read_samples(deadline)

    def _read_episodes(self, deadline: float) -> bool:
        while True:
            found = self.traces.run_episodes(self.run_id, self._after, PLATFORM_PAGE)
            for seq, episode in found:
                row, prompt = row_of_episode(len(self.rows) + 1, InTraces(seq), episode, None)
                self._add(row, prompt)
                self._after = seq
            if len(found) < PLATFORM_PAGE:
                return False
            if time.monotonic() > deadline:
                return True

    def _read_samples(self, deadline: float) -> bool:
        while True:
            bodies, _total = self.store.list_samples(self.key, offset=len(self.rows), limit=PLATFORM_PAGE)
            for body in bodies:
                try:
                    sample = orjson.loads(body)
                except orjson.JSONDecodeError:
                    sample = None
                row, prompt = row_of_sample(len(self.rows) + 1, len(self.rows), sample)
                self._add(row, prompt)
            if len(bodies) < PLATFORM_PAGE:
                return False
            if time.monotonic() > deadline:
                return True
