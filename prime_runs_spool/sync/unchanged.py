"""Runs found up to date before, answered again without opening a file (docs/sync.md, "The
protocol, per run", step 1).

A no-op re-sync of thousands of runs spent most of its time reading what it had read the
last time: each run's state file, parsed and checked, and the first lines of its spool. So
for every run a probe found up to date (``RunSync.probe``: finished, nothing in flight),
this machine keeps the files that answer rested on, each by device, inode, size,
modification and change time: the spool folder, the state file, and the run's first
segment (its manifest), every segment after it to the last (the cursor's: a segment
before it changed in place is read again, sync/pushed_lines.py), with their indices; and the
report it gave. A run whose files all still match is up to date again at the cost of a
``stat`` for each (three for a run never resumed): no file opened, no folder listed, no
lock, no request.

Why matching files hold what they held: a state is only ever replaced whole, by a rename,
and any write to a file, or a ``touch``, moves its change time, which no process can set
back. A segment added, removed or renamed in (or a state file put) in the spool folder
moves the folder's own times, so while the folder matches, its listing is the one the
answer was kept with: the same first and last segment, none missing between them. The one
blind spot is a change in the same tick of the file system's clock as the last change
before the files were looked at; so files and folders changed less than :data:`SETTLED`
seconds before that are not kept (the next sync reads them once more and keeps them then).
A live run (its writer's lock decides, not a file) and a replay always take the probe.

A cache and nothing more: lost, stale, damaged or written by another version, it costs the
probe that reads, never a wrong answer. One file per destination in this user's cache
(``unchanged/<destination key>-v<version>.json``), written at the end of a sync that learned
something, whole by a rename, not fsync'd, merged with what another sync wrote meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.files import is_utf8, joined, replace_private
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, list_segments, segment_name
from prime_runs_spool.sync.options import AUTO, UP_TO_DATE, RunReport
from prime_runs_spool.sync.state import SYNC_DIRNAME, Destination
from prime_runs_spool.sync.user_cache import private_folder

#: The folder in this user's cache (sync/user_cache.py) that holds one file per destination.
UNCHANGED_DIRNAME = "unchanged"
#: Changes when what an entry means does (its fields, or the rule of an up-to-date run): an
#: entry of another number is not used, and its file is another.
ENTRY_VERSION = 3
#: Seconds a file must have been left alone before an answer resting on it is kept.
SETTLED = 2.0
#: At most this many runs per destination are kept (about 450 bytes each, read whole at
#: every sync); those this sync did not see go first.
MAX_ENTRIES = 50_000
#: The report's fields an entry keeps: what ``RunSync.probe`` fills in.
_REPORT_FIELDS = ("local_run_id", "name", "evaluation_id", "url", "pushed_total", "store", "held_back")

Fingerprint = list[int]


def fingerprint(info: os.stat_result) -> Fingerprint:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


class Look:
    """The run's files as they were before a probe read them: kept with its answer."""

    def __init__(self, state_path: str, state: Fingerprint, folder: Fingerprint,
                 segments: list[list[int]]) -> None:
        self.state_path = state_path
        self.state = state
        #: The spool folder's: its times move when a segment is added, removed or renamed.
        self.folder = folder
        #: Every segment: ``[index, *fingerprint]`` each.
        self.segments = segments

    def settled(self, now: float) -> bool:
        """Whether every file was last changed long enough ago (see the module docstring)."""
        newest = max([self.state[4], self.folder[4], *(segment[5] for segment in self.segments)])
        return newest / 1e9 < now - SETTLED


def state_path_of(home: str | os.PathLike[str], destination: Destination) -> str:
    """The run's state file for ``destination`` (``sync_state_path``'s, as a string: asked of
    every run of a no-op re-sync, where path objects cost more than the ``stat`` calls)."""
    return joined(home, SPOOL_DIRNAME, SYNC_DIRNAME, f"{destination.key}.json")


def look(run_dir: Path, home: Path, destination: Destination) -> Look | None:
    """The run's files now (its state file under ``home``), listed: what a probe's answer is
    kept with. None when there is no state file or no segment."""
    path = state_path_of(home, destination)
    try:
        folder = os.stat(joined(run_dir, SPOOL_DIRNAME))  # before the listing: a later change moves it
        state = os.stat(path)
        segments = list_segments(run_dir)
        if not segments or segments[-1][0] != len(segments):
            return None  # none, or one missing before the last: the probe reads, and reports it
        return Look(path, fingerprint(state), fingerprint(folder),
                    [[index, *fingerprint(os.stat(p))] for index, p in segments])
    except OSError:
        return None


def _still(entry: dict[str, Any], run_dir: Path, state_path: str) -> bool:
    """Whether the run's files are the ones ``entry`` was kept for: its spool folder first
    (unchanged, it lists the same segments), then the state file and the segments."""
    spool = joined(run_dir, SPOOL_DIRNAME)
    if not entry["segments"]:
        return False  # never kept so: a damaged record
    if fingerprint(os.stat(spool)) != entry["folder"] or fingerprint(os.stat(state_path)) != entry["state_file"]:
        return False
    for index, *kept in entry["segments"]:
        if fingerprint(os.stat(joined(spool, segment_name(index)))) != kept:
            return False
    return True


class Unchanged:
    """The runs of one destination this machine found up to date, loaded once per sync."""

    def __init__(self, destination: Destination, folder: Path | None = None) -> None:
        self.destination = destination
        self._folder = folder
        self._entries: dict[str, dict[str, Any]] = {}
        self._seen: set[str] = set()
        self._learned = False
        self._path: Path | None = None
        try:
            # Named by version too: two versions installed side by side keep their own.
            self._path = (folder or private_folder(UNCHANGED_DIRNAME)) / f"{destination.key}-v{ENTRY_VERSION}.json"
            self._entries = self._read(self._path)
        except OSError:
            pass  # no cache folder: every run takes the probe

    def _read(self, path: Path) -> dict[str, dict[str, Any]]:
        try:
            document = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if (not isinstance(document, dict) or document.get("version") != ENTRY_VERSION
                or document.get("destination") != [self.destination.key, self.destination.base_url,
                                                   self.destination.team_id]
                or not isinstance(document.get("runs"), dict)):
            return {}
        return document["runs"]

    def answer(self, run_dir: Path, home: Path, to: str) -> RunReport | None:
        """The run's report when its files are the ones an up-to-date answer was kept for,
        else None (the probe decides). ``to``: ``--to``, which must not name another sink
        than the run's (the probe's error to report)."""
        state_path = state_path_of(home, self.destination)
        entry = self._entries.get(state_path)
        if entry is None:
            return None
        try:
            if (not _still(entry, run_dir, state_path)
                    or (entry["sink"] is not None and to != AUTO and to != entry["sink"])):
                return None
            report = RunReport(path=str(run_dir), state=UP_TO_DATE,
                               **{name: entry["report"][name] for name in _REPORT_FIELDS})
        except (OSError, KeyError, TypeError, ValueError):
            return None
        self._seen.add(state_path)
        return report

    def learn(self, before: Look | None, report: RunReport, sink: str | None) -> None:
        """Keep an up-to-date answer the probe gave from the files as ``before`` found them."""
        if (before is None or report.state != UP_TO_DATE or not before.settled(time.time())
                or not is_utf8(before.state_path)):  # a name orjson cannot write: probed each time
            return
        self._entries[before.state_path] = {
            "state_file": before.state, "folder": before.folder, "segments": before.segments, "sink": sink,
            "report": {name: getattr(report, name) for name in _REPORT_FIELDS},
        }
        self._seen.add(before.state_path)
        self._learned = True

    def save(self) -> None:
        """Write what this sync learned, over what another sync may have written meanwhile."""
        if not self._learned or self._path is None:
            return
        runs = {**self._read(self._path), **{key: self._entries[key] for key in self._seen if key in self._entries}}
        if len(runs) > MAX_ENTRIES:
            ours = [key for key in runs if key in self._seen]
            others = [key for key in runs if key not in self._seen]
            runs = {key: runs[key] for key in [*others[len(runs) - MAX_ENTRIES:], *ours][-MAX_ENTRIES:]}
        document = {"version": ENTRY_VERSION,
                    "destination": [self.destination.key, self.destination.base_url, self.destination.team_id],
                    "runs": runs}
        with contextlib.suppress(OSError):  # a cache: a sync that cannot keep it only reads again
            replace_private(self._path, orjson.dumps(document), durable=False)
