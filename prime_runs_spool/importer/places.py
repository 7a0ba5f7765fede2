"""Where an imported spool lives, and what a tree of eval outputs holds, for the importer
and the commands that look before they sync (``status``, ``verify``, ``sync --no-import``).

A source's spool is beside it (``<run dir>/spool/``), or with a state directory under
``DIR/imports/<digest of the source's absolute path>/<run id>/``: keyed so that the same
folder synced again from the same place finds its spool and sync state, and a read-only
source is never written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.importer.paths import (
    V0_RESULTS_NAME, find_eval_outputs, import_mark_path, state_dir_run, state_dir_source,
)
from prime_runs_spool.spool.layout import find_runs, is_run_dir
from prime_runs_spool.files import is_read_only, shell_word  # one rule for spools and outputs
from prime_runs_spool.sync.state import folder_key


def source_key(source: Path) -> str:
    """The digest a state directory files a source under (``sync.state.folder_key``)."""
    return folder_key(source)


def imported_run_dir(source: Path, run_id: str, state_dir: Path | None) -> Path:
    """Where the spool of ``source`` lives (see the module docstring)."""
    if state_dir is None:
        return source
    folder = state_dir_source(state_dir, source_key(source))
    if folder.is_dir():  # the run id the state dir already holds wins, as for a resume
        existing = sorted(p for p in folder.iterdir() if p.is_dir())
        if existing:
            return existing[0]
    return state_dir_run(state_dir, source_key(source), _safe(run_id))


def _safe(run_id: str) -> str:
    """``run_id`` as one folder name: the episodes' ``run.id`` is the outputs' text, and one
    of only dots (``..``) would name the folder above, where the spools of every source
    with that id would meet."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:128]
    return name if name.strip(".") else "run"


def is_imported(run_dir: Path) -> bool:
    return import_mark_path(run_dir).is_file()


def spooled_by_eval(output_dir: Path) -> bool:
    """The eval wrote a spool beside its outputs (no import mark): sync ships that one. A
    spool folder that cannot be looked into (another user's) counts as one: the run is
    then the spool's, whose own verdict names the folder among the runs, and an import
    into it could only fail the same way."""
    try:
        return is_run_dir(output_dir) and not is_imported(output_dir)
    except OSError:
        return True


def to_refresh(paths: Iterable[Path], state_dir: Path | None = None) -> list[Path]:
    """The eval output folders under ``paths`` that ``prime-runs sync`` imports (or refreshes)
    before it syncs: all but those whose spool the eval wrote itself, unless that spool and
    its ``traces.jsonl`` may disagree (importer/agreement.py: a few ``stat`` calls decide; the
    module, and the reader under it, are loaded only for such a spool), and those found
    imported and up to date before whose files are still those it found
    (importer/unchanged.py: ``stat`` calls decide)."""
    from prime_runs_spool.importer.unchanged import imports_unchanged

    known = imports_unchanged()
    found = []
    for output_dir in find_eval_outputs(paths):
        if known.holds(output_dir, state_dir):
            continue
        if spooled_by_eval(output_dir):
            from prime_runs_spool.importer.agreement import needs_catching_up

            if not needs_catching_up(output_dir):
                continue
        found.append(output_dir)
    return found


def unspooled(output_dir: Path, state_dir: Path | None) -> bool:
    """An eval output folder with no spool, here or under ``state_dir``; one whose spool
    folder cannot be looked into is not known to have none (the spool's verdict names it)."""
    try:
        if is_run_dir(output_dir):
            return False
    except OSError:
        return False
    if state_dir is not None:
        folder = state_dir_source(state_dir, source_key(output_dir))
        if folder.is_dir() and any(is_run_dir(p) for p in folder.iterdir() if p.is_dir()):
            return False
    return True


def paths_with_nothing(paths: Iterable[Path], state_dir: Path | None = None) -> list[Path]:
    """The given paths under which there is neither a spool nor an eval output folder: a
    CI job that finds nothing must not look like one that shipped everything. One holding a
    folder that cannot be read is not among them: what it hides is unknown, and the
    command names that folder (``nothing found`` beside it said the opposite)."""
    empty = []
    for path in paths:
        unreadable: list[Path] = []
        if (next(iter(find_runs([path], on_unreadable=lambda folder, exc: unreadable.append(folder))), None) is None
                and not unreadable and next(iter(find_eval_outputs([path])), None) is None):
            empty.append(path)
    return empty


def not_spooled(paths: Iterable[Path], state_dir: Path | None = None) -> list[Path]:
    """Eval output folders under ``paths`` with no spool (beside them or in ``state_dir``)."""
    return [p for p in find_eval_outputs(paths) if unspooled(p, state_dir)]


def holds_an_episode(output_dir: Path) -> bool:
    """Whether the folder's episodes file (``traces.jsonl``, else the older ``results.jsonl``)
    holds a complete line: without one the import has nothing to spool (an eval that has
    just begun, or ended before its first rollout: ``empty``), so a command that refuses
    eval outputs without a spool (``export``, ``mirror --once``) has nothing to refuse.
    Read up to its first line feed; a file that cannot be read holds one, for the command
    to report."""
    episodes = verifiers_traces_path(output_dir)
    if not episodes.is_file():
        episodes = output_dir / V0_RESULTS_NAME
    try:
        with open(episodes, "rb") as file:
            while chunk := file.read(1 << 16):
                if b"\n" in chunk:
                    return True
    except OSError:
        return True
    return False


def spool_roots(paths: Iterable[Path], state_dir: Path | None) -> list[Path]:
    """Where the spools of ``paths`` are: the paths, plus (with a state directory) the folder
    it keeps for each eval output found under them."""
    roots = list(paths)
    if state_dir is not None:
        for output_dir in find_eval_outputs(list(roots)):
            folder = state_dir_source(state_dir, source_key(output_dir))
            if folder.is_dir():
                roots.append(folder)
    return roots


def import_command(output_dir: Path, state_dir: Path | None) -> str:
    """The command that imports ``output_dir`` (what ``status``, ``verify``, ``export`` and
    ``sync --no-import`` suggest): on a read-only folder, with the ``--state-dir`` that the
    import would otherwise be refused for."""
    from prime_runs_spool.importer.pushing import may_be_pushing  # reads a log: only when advising

    if state_dir is None and is_read_only(output_dir):
        command = f"prime-runs import {shell_word(output_dir)} --state-dir DIR"
    else:
        command = f"prime-runs import {shell_word(output_dir)}" + (
            f" --state-dir {shell_word(state_dir)}" if state_dir is not None else "")
    if may_be_pushing(output_dir):  # until then the import leaves it as it is (importer/pushing.py)
        command += " once vf-eval has exited: it may still be running here, pushing"
    return command
