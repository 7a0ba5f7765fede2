"""Which runs a table is made of, and each run's episodes, read as sync reads them.

Runs are found under local paths (``layout.find_runs``) or a store URL (one listing,
store/source.py); either way every record comes through the spool reader, one at a time
and checked, up to the durable mark of a live writer. A run's episodes are its effective
set: those a resumed segment supersedes are left out (content/supersede.py), as sync leaves
them out. Eval outputs written without a spool are not read here: they are named, with the
``prime-runs import`` command that spools them.

A table of samples is read in two passes (export/tables.py); :class:`Extent` is where the
first one stopped, so the second reads exactly the same records, however much a live run
appended meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prime_runs_spool.content.episodes import episode_id_of
from prime_runs_spool.content.remask import error_forms_of, needs_remask, remask_episode, remask_manifest
from prime_runs_spool.content.supersede import supersedes_of
from prime_runs_spool.errors import SpoolError
from prime_runs_spool.spool.format import EPISODE, MANIFEST, SEAL
from prime_runs_spool.files import OnLink, unreadable_message
from prime_runs_spool.spool.layout import find_runs
from prime_runs_spool.spool.manifests import segment_manifests
from prime_runs_spool.spool.reader import Position, Record, iter_records


@dataclass
class ExportRun:
    """One run to export: ``where`` names it in reports (a path or a URL); ``run_dir`` is
    what the reader reads (a folder, or a run in a store)."""

    where: str
    run_dir: Any


@dataclass
class Found:
    """What a set of paths and URLs holds: the runs, and what could not be exported, each a
    one-line reason (eval outputs with no spool, a folder that cannot be read, a path with
    nothing in it)."""

    runs: list[ExportRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def find(targets: list[Path | str], state_dir: Path | None = None, on_link: OnLink | None = None) -> Found:
    """The runs under ``targets`` (local paths, or store URLs given as text), and those
    imported from eval outputs under them into ``state_dir`` (``prime-runs import
    --state-dir``). ``on_link``: told of each link to a folder outside the paths that the
    walk passed over (``layout.find_runs``)."""
    from prime_runs_spool.importer.places import (
        holds_an_episode, import_command, not_spooled, paths_with_nothing, spool_roots,
    )

    found = Found()
    local = [Path(t) for t in targets if not isinstance(t, str)]
    for url in (t for t in targets if isinstance(t, str)):
        found.runs += _store_runs(url, found)
    if local:
        runs = find_runs(spool_roots(local, state_dir),
                         on_unreadable=lambda path, exc: found.problems.append(unreadable_message(exc, path)),
                         on_link=on_link)
        found.runs += [ExportRun(str(run_dir), run_dir) for run_dir in runs]
        for output_dir in filter(holds_an_episode, not_spooled(local, state_dir)):  # no episode: no row lost
            found.problems.append(f"{output_dir}: eval outputs without a spool; spool them first: "
                                  f"{import_command(output_dir, state_dir)}")
        for path in paths_with_nothing(local):
            found.problems.append(f"{path}: nothing found: no spool and no eval outputs under it")
    return found


def _store_runs(url: str, found: Found) -> list[ExportRun]:
    from prime_runs_spool.store.objects import ObjectStore
    from prime_runs_spool.store.source import find_store_runs

    store = ObjectStore(url)  # StoreSetupError: the caller's usage error
    runs = find_store_runs(store, store.list(), Path("/nonexistent-local-face"))
    if not runs:
        found.problems.append(f"{store.url}: nothing found: no spool under it")
    return [ExportRun(str(run), run) for run in runs]


def failure_message(exc: BaseException, run: ExportRun) -> str:
    """One line for a run that could not be read whole."""
    if isinstance(exc, OSError) and not isinstance(exc, SpoolError):
        return unreadable_message(exc, run.where)
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Extent:
    """Where a first read of a run stopped: after its last record read (None: nothing read),
    and the error that stopped it, if one did."""

    end: Position | None
    error: str | None


class RunReading:
    """One pass over a run's records. Iterate :meth:`episodes`; meanwhile ``manifest`` (its
    first manifest record), ``seal`` (the last seal read), ``run_id`` and, once the pass is
    over, ``extent`` fill in."""

    def __init__(self, run: ExportRun, upto: Extent | None = None) -> None:
        self.run = run
        self.upto = upto
        self.manifest: dict[str, Any] = {}
        self.seal: dict[str, Any] | None = None
        self.run_id: str | None = None
        self.extent: Extent | None = None
        #: Written under older masking rules: what the run's error line is cleared of
        #: (content/remask.py), and each episode is masked again before it gives a row.
        self.error_forms: list[str] = []
        self.remask = False

    def episodes(self) -> Iterator[Record]:
        """The effective set's episode records, in spool order; never raises for the run's
        own damage (it ends the pass, and ``extent.error`` says why)."""
        last: Position | None = None
        error: str | None = None
        end = self.upto.end if self.upto is not None else None
        try:
            superseded = supersedes_of(segment_manifests(self.run.run_dir))
            if self.upto is None or end is not None:
                for record in iter_records(self.run.run_dir, durable_only=True):
                    if self.upto is not None and _at_or_after(record.position, end):
                        break
                    last = record.after
                    if record.type == EPISODE:
                        if episode_id_of(record.data) not in superseded:
                            yield replace(record, data=remask_episode(record.data)) if self.remask else record
                    elif record.type == MANIFEST and not self.manifest and isinstance(record.data, dict):
                        # A table is a file meant to be shared: a spool written under older
                        # masking rules has its config masked by today's first, as sync does.
                        self.remask = needs_remask(record.data)
                        self.manifest = remask_manifest(record.data) if self.remask else record.data
                        self.error_forms = error_forms_of(record.data) if self.remask else []
                        run_id = record.data.get("run_id")
                        self.run_id = run_id if isinstance(run_id, str) else None
                    elif record.type == SEAL and isinstance(record.data, dict):
                        self.seal = record.data
            if self.upto is not None:
                error = self.upto.error
        except (SpoolError, OSError) as exc:
            error = failure_message(exc, self.run)
        self.extent = Extent(last, error)


def _at_or_after(position: Position, end: Position | None) -> bool:
    if end is None:
        return True
    return (position.segment_index, position.offset) >= (end.segment_index, end.offset)

