"""Where the viewer's runs come from: spools under some paths, or the local platform's store.

Both give the pages the same thing, a list of :class:`~.index.RunIndex` by key, so one set
of pages serves ``prime-runs view`` and the platform's dashboard.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import NoSuchPathError, SegmentsGoneError, SpoolError, UnknownRunError
from prime_runs_spool.importer.places import import_command, spool_roots, unspooled
from prime_runs_spool.files import OnLink, printable
from prime_runs_spool.importer.paths import find_eval_outputs
from prime_runs_spool.spool.layout import find_runs
from prime_runs_spool.viewer.index import PlatformIndex, RunIndex, SpoolIndex
from prime_runs_spool.viewer.plain import PlainIndex
from prime_runs_spool.viewer.traces_runs import KEY_PREFIX, TracesRunIndex

#: New runs under the paths are looked for at most this often (seconds).
RESCAN_INTERVAL = 0.5
#: At most this many evaluations are listed from a platform store.
MAX_EVALUATIONS = 1000


class Source:
    """A set of runs by key; ``runs()`` refreshes the list, ``get(key)`` finds one."""

    def __init__(self) -> None:
        self._runs: dict[str, RunIndex] = {}
        self._lock = threading.Lock()

    def runs(self) -> list[RunIndex]:
        raise NotImplementedError

    def get(self, key: str) -> RunIndex:
        run = self._runs.get(key)
        if run is None:
            self.runs()
            run = self._runs.get(key)
        if run is None:
            raise UnknownRunError(f"no run {key!r} here")
        return run


class SpoolSource(Source):
    """Every run directory under ``paths``, found again as new ones appear, and every eval
    output folder there with no spool (shown read-only, :class:`~.plain.PlainIndex`).

    ``state_dir``: where ``prime-runs import --state-dir`` keeps the spools of outputs it
    imported; those spools are shown, and their outputs are not "not spooled". ``on_link``:
    told, at every scan, of each link to a folder outside the paths the walk passed over
    (``layout.find_runs``), so that the command names runs kept elsewhere.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]], state_dir: Path | None = None,
                 on_link: OnLink | None = None) -> None:
        super().__init__()
        self.paths = [Path(p) for p in paths]
        self.state_dir = state_dir
        self.on_link = on_link
        for path in self.paths:
            if not path.exists():
                raise NoSuchPathError(f"path does not exist: {path}")
        self._scanned_at = -1.0
        self._order: list[str] = []

    def _key_of(self, run_dir: Path) -> str:
        """The run's key in the viewer's URLs: its path below the root it was found under,
        made printable (a folder name that is not UTF-8 cannot go into a URL or a page)."""
        return printable(self._relative_name(run_dir))

    def _relative_name(self, run_dir: Path) -> str:
        for root in [*self.paths, *([self.state_dir] if self.state_dir is not None else [])]:
            try:
                relative = run_dir.resolve().relative_to(root.resolve())
            except ValueError:
                continue
            return relative.as_posix() if str(relative) != "." else run_dir.resolve().name
        return run_dir.name

    def runs(self) -> list[RunIndex]:
        with self._lock:
            now = time.monotonic()
            if now - self._scanned_at >= RESCAN_INTERVAL:
                self._scanned_at = now
                self._scan()
            return [self._runs[key] for key in self._order]

    def _unspooled(self, folder: Path) -> bool:
        """An eval output folder with no spool; one whose spool folder cannot be looked into
        is left out (it is not known to have none), never the end of the scan."""
        try:
            return unspooled(folder, self.state_dir)
        except OSError:
            return False

    def _scan(self) -> None:
        found: list[Path] = []

        def gone(folder: Path, exc: OSError) -> None:
            """A run whose segments were deleted is listed, as one that cannot be read (its
            index says why, as ``status`` does); other folders that cannot be read are
            passed over, as before (they may hold no run)."""
            if isinstance(exc, SegmentsGoneError):
                found.append(folder)

        try:
            found.extend(find_runs(spool_roots(self.paths, self.state_dir), gone, on_link=self.on_link))
            plain = [folder for folder in find_eval_outputs(self.paths) if self._unspooled(folder)]
        except (SpoolError, OSError):
            return  # a path removed since: the runs already known stay shown
        # Outputs spooled since they were listed are shown by their spool from now on; a
        # run deleted (or moved) since is listed no more, or where it is now; a run deleted
        # and written again at its path is read afresh, under its key.
        still, spooled = {path.resolve() for path in plain}, {path.resolve() for path in found}
        for key in [k for k, run in self._runs.items() if (run.output_dir.resolve() not in still
                    if isinstance(run, PlainIndex) else run.run_dir.resolve() not in spooled
                    or run.is_another_spool())]:
            del self._runs[key]
            self._order.remove(key)
        known = {run.run_dir.resolve() for run in self._runs.values() if isinstance(run, SpoolIndex)}
        known |= {run.output_dir.resolve() for run in self._runs.values() if isinstance(run, PlainIndex)}
        for folder in [*found, *plain]:
            if folder.resolve() in known:
                continue
            key = self._key_of(folder)
            while key in self._runs:
                key += "+"
            if folder in plain:
                self._runs[key] = PlainIndex(key, folder, import_command(folder, self.state_dir))
            else:
                self._runs[key] = SpoolIndex(key, folder, self.state_dir)
            self._order.append(key)


class PlatformSource(Source):
    """The evaluations of a local platform's store, newest first; ``traces`` (its Prime
    Traces store) gives the episodes of the evaluations whose runs went there."""

    def __init__(self, store: Any, traces: Any = None) -> None:
        super().__init__()
        self.store, self.traces = store, traces

    def runs(self) -> list[RunIndex]:
        """The evaluations, then the Prime Traces runs no evaluation names (``traces_runs``)."""
        evaluations, _ = self.store.list_evaluations(skip=0, limit=MAX_EVALUATIONS)
        elsewhere = self.traces.episode_runs() if self.traces is not None else []
        with self._lock:
            out: list[RunIndex] = []
            for evaluation in evaluations:
                key = str(evaluation["evaluation_id"])
                run = self._runs.get(key)
                if run is None:
                    run = self._runs[key] = PlatformIndex(self.store, evaluation, self.traces)
                out.append(run)
            named = {str(e["evaluation_id"]) for e in evaluations}
            for run_id in elsewhere[:MAX_EVALUATIONS]:
                key = KEY_PREFIX + run_id
                run = self._runs.get(key)
                if run is None:
                    if run_id in named or self.store_has(run_id):
                        continue
                    run = self._runs[key] = TracesRunIndex(self.store, self.traces, run_id,
                                                           self.traces.run_started(run_id))
                out.append(run)
            return out

    def store_has(self, evaluation_id: str) -> bool:
        """Whether an evaluation of that id exists (beyond the newest MAX_EVALUATIONS listed)."""
        from prime_runs_spool.errors import NotFound

        try:
            self.store.get_evaluation(evaluation_id)
        except NotFound:
            return False
        return True

    def get(self, key: str) -> RunIndex:
        run = self._runs.get(key)
        if run is None and key.startswith(KEY_PREFIX):
            self.runs()
            run = self._runs.get(key)
            if run is None:
                raise UnknownRunError(f"no Prime Traces run {key[len(KEY_PREFIX):]!r} here")
        if run is None:
            from prime_runs_spool.errors import NotFound

            try:
                evaluation = self.store.get_evaluation(key)
            except NotFound:
                raise UnknownRunError(f"no evaluation {key!r} here") from None
            with self._lock:
                run = self._runs.setdefault(key, PlatformIndex(self.store, evaluation, self.traces))
        return run
