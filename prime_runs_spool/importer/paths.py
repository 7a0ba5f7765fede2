"""The names of what an eval writes without a spool, and of the import's own files
(docs/integration.md, "Importing").

``prime-runs import`` reads an eval's outputs; nothing here ever writes them. verifiers
0.4.0 writes, per run directory: ``traces.jsonl`` (named in content/supersede.py, which
reads it on ``--resume`` too), ``configs/<cli>.toml`` (the launch file, verbatim),
``configs/resolved/<cli>.json`` (the resolved config) and ``logs/attempt_N/eval.log``
(``logs/latest`` links the newest). The older layout is ``metadata.json`` + ``results.jsonl``.
The import's own files sit beside a spool's segments (readers and sync look only at
``seg-*`` files) or under ``--state-dir``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prime_runs_spool.content.supersede import VERIFIERS_TRACES_NAME
from prime_runs_spool.files import Listing, OnLink, OnUnreadable, each_once, joined, pass_over, walk_folders
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, spool_dir

CONFIGS_DIRNAME = "configs"
RESOLVED_DIRNAME = "resolved"
LOGS_DIRNAME = "logs"
LATEST_LOG_LINK = "latest"
ATTEMPT_PREFIX = "attempt_"
EVAL_LOG_NAME = "eval.log"
V0_METADATA_NAME = "metadata.json"
V0_RESULTS_NAME = "results.jsonl"
#: Beside an imported spool's segments: where it was imported from and how far (the
#: importer's own bookkeeping; readers and sync look only at ``seg-*`` files).
IMPORT_MARK_NAME = "import.json"
#: Held while an import writes a spool: two imports of one source never both write it.
IMPORT_LOCK_NAME = "import.lock"
#: Beside the segments of a spool the eval wrote: the versions of ``traces.jsonl`` and of
#: the segments last found to agree by episode id, so an unchanged run is not read again.
AGREED_MARK_NAME = "traces-agreed.json"
#: Under ``--state-dir``: one folder per imported source run.
STATE_IMPORTS_DIRNAME = "imports"


def resolved_config_paths(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``configs/resolved/*.json``, sorted (verifiers reads the first one back too)."""
    folder = Path(output_dir) / CONFIGS_DIRNAME / RESOLVED_DIRNAME
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def launch_file_paths(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``configs/*.toml``: the launch files copied verbatim. Never a symbolic link: verifiers
    copies the file, and a link's target (anywhere on the machine that imports, say a CI
    runner unpacking an artifact) would be uploaded as the run's launch file, word for word."""
    folder = Path(output_dir) / CONFIGS_DIRNAME
    return sorted(p for p in folder.glob("*.toml") if p.is_file() and not p.is_symlink()) if folder.is_dir() else []


def attempt_log_paths(output_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``logs/attempt_N/eval.log`` that exists, oldest attempt first."""
    folder = Path(output_dir) / LOGS_DIRNAME
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            number = entry.name[len(ATTEMPT_PREFIX):]
            if entry.name.startswith(ATTEMPT_PREFIX) and number.isdigit() and not entry.is_symlink():
                log = entry / EVAL_LOG_NAME
                if log.is_file():
                    found.append((int(number), log))
    return [log for _, log in sorted(found)]


def v0_paths(output_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    return Path(output_dir) / V0_METADATA_NAME, Path(output_dir) / V0_RESULTS_NAME


def import_mark_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / IMPORT_MARK_NAME


def import_lock_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / IMPORT_LOCK_NAME


def agreed_mark_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / AGREED_MARK_NAME


def state_dir_run(state_dir: str | os.PathLike[str], source_key: str, run_id: str) -> Path:
    """Where ``--state-dir`` keeps the spool imported from one source run: keyed by the
    source's absolute path (``source_key``, a digest of it) and the run id."""
    return Path(state_dir) / STATE_IMPORTS_DIRNAME / source_key / run_id


def state_dir_source(state_dir: str | os.PathLike[str], source_key: str) -> Path:
    return Path(state_dir) / STATE_IMPORTS_DIRNAME / source_key


def is_eval_output_dir(path: Path, listing: Listing | None = None) -> bool:
    """A folder verifiers wrote a run to: ``traces.jsonl``, or ``results.jsonl`` with
    ``metadata.json``, or without it when its rows are the older layout's (``_holds_v0_rows``):
    that run cannot be imported (its id is derived from ``metadata.json``), and found, the
    import says so in one line; not found, a walk passed its episodes over without a word.
    Asked of every folder a walk meets, so by plain strings: a path object per name cost more
    than the ``stat`` calls. ``listing``: the folder's, as the walk took it (``files.walk_folders``):
    the names are looked up there, no system call a name (a link still followed to its file)."""
    folder = os.fspath(path)
    if listing is not None:
        if _listed_file(listing, VERIFIERS_TRACES_NAME):
            return True
        if not _listed_file(listing, V0_RESULTS_NAME):
            return False
        return _listed_file(listing, V0_METADATA_NAME) or _holds_v0_rows(joined(folder, V0_RESULTS_NAME))
    if _is_file(joined(folder, VERIFIERS_TRACES_NAME)):
        return True
    if not _is_file(joined(folder, V0_RESULTS_NAME)):
        return False
    return _is_file(joined(folder, V0_METADATA_NAME)) or _holds_v0_rows(joined(folder, V0_RESULTS_NAME))


#: How much of a ``results.jsonl`` with no ``metadata.json`` beside it is read to tell the
#: older layout's rows from any other file of that name (a table ``prime-runs export`` wrote).
V0_SNIFF_BYTES = 64 * 1024


def _holds_v0_rows(path: str) -> bool:
    """Whether a ``results.jsonl`` begins with a row of the older layout: its first line
    names both ``prompt`` and ``completion``, as every v0 row does and an export's row
    (``final_answer``, never ``completion``) does not. Only a folder holding that file
    without ``metadata.json`` is asked, so a walk reads nothing more for any other folder;
    a file it cannot read is no run it can tell (as before)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(V0_SNIFF_BYTES)
    except OSError:
        return False
    first = head.split(b"\n", 1)[0]
    return b'"prompt"' in first and b'"completion"' in first


def _is_file(path: str) -> bool:
    """``os.path.isfile``, asked first whether the name exists: most folders have none of
    these files, and a ``stat`` that fails costs an exception, about twice the call."""
    return os.access(path, os.F_OK) and os.path.isfile(path)


def _listed_file(listing: Listing, name: str) -> bool:
    """``os.path.isfile`` of a name in a folder's listing: its type from the listing, a link followed."""
    entry = listing.get(name)
    try:
        return entry is not None and entry.is_file()
    except OSError:
        return False


def find_eval_outputs(paths: Iterable[str | os.PathLike[str]], on_link: OnLink | None = None,
                      on_unreadable: OnUnreadable = pass_over) -> Iterator[Path]:
    """Every eval output folder under ``paths``, each once, deterministic order; symbolic
    links are not followed (``on_link`` is told of each to a folder outside the paths, as
    for :func:`find_runs`) and a spool folder is never entered. A missing path raises
    :class:`NoSuchPathError`, as for :func:`find_runs`; a folder that cannot be read is told
    to ``on_unreadable`` (eval outputs may hide in it) and not entered."""
    skipped = (SPOOL_DIRNAME, LOGS_DIRNAME, CONFIGS_DIRNAME)

    def outputs_under(root: Path, link_met: Callable[[Path], None] | None) -> Iterator[Path]:
        return walk_folders(root, is_eval_output_dir, lambda folder, name: name in skipped, on_unreadable,
                            link_met=link_met)

    return each_once(paths, outputs_under, on_unreadable, on_link=on_link)
