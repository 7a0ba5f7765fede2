"""The verdict of ``prime-runs verify`` on spools, as plain data (the ``--json`` shape).

In the library rather than the command so that anything (a CI step, a test, the command
line) reaches the same verdict; ``commands/verify.py`` only prints it. Read-only: a torn
tail on an unsealed segment is clean, corruption or a newer format is not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import NotARunError, UnsupportedFormatError, corruption_message
from prime_runs_spool.files import OnLink, links_outside, open_to_others_lines, special_file_kind, unreadable_message
from prime_runs_spool.spool.layout import find_runs, is_segment_file, spool_dir
from prime_runs_spool.spool.scan import read_run


def check_run(run_dir: Path) -> dict[str, Any]:
    """The verdict on one run: ``ok``, its status, counts, the first corruption, its segments."""
    try:
        spool = read_run(run_dir)
    except UnsupportedFormatError as exc:
        return _unverifiable(run_dir, str(exc))
    except OSError as exc:  # a segment or the spool folder that cannot be read
        return _unverifiable(run_dir, unreadable_message(exc, run_dir))
    corrupt = spool.corrupt
    problem = spool.problem
    return {
        "run_dir": str(run_dir),
        "ok": corrupt is None and problem is None,
        "run_id": spool.run_id,
        "status": spool.status,
        "records": spool.records_count,
        "episodes": spool.episodes_count,
        "error": corruption_message(corrupt.path, corrupt.corrupt_offset, corrupt.corrupt_reason)
        if corrupt
        else problem,
        "warnings": spool.warnings + _privacy(run_dir),
        "segments": [segment.to_dict() for segment in spool.segments],
    }


def _privacy(run_dir: Path) -> list[str]:
    """A local spool folder others may read, said (verify changes nothing; sync makes it
    private); a run in an object store has no modes."""
    if not isinstance(run_dir, Path):
        return []
    return open_to_others_lines(spool_dir(run_dir), tighten=False)


def _unverifiable(run_dir: str | os.PathLike[str], error: str) -> dict[str, Any]:
    """The verdict on a run (or a directory that may hold one) that could not be read whole."""
    return {"run_dir": str(run_dir), "ok": False, "status": None, "error": error, "segments": []}


@dataclass
class Verdict:
    """Every run found under some paths, and the paths under which none was found."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    paths_without_runs: list[str] = field(default_factory=list)

    @property
    def bad(self) -> list[dict[str, Any]]:
        return [run for run in self.runs if not run["ok"]]

    def as_json(self) -> dict[str, Any]:
        return {"ok": not self.bad, "runs": self.runs, "paths_without_runs": self.paths_without_runs}


def verify_paths(paths: Iterable[str | os.PathLike[str]], on_link: OnLink | None = None) -> Verdict:
    """Check every run under ``paths`` (a segment file stands for its run). Raises
    ``NoSuchPathError`` for a missing path, ``NotARunError`` for a file that is no segment. A
    directory that cannot be read is a failed verdict of its own, between the others: one
    unreadable run never hides the rest. ``on_link`` is told of each link to a folder
    outside the paths, not followed (``layout.find_runs``)."""
    verdict = Verdict()
    paths = list(paths)
    if on_link is not None:  # each path is walked alone: a link into another is quiet too
        on_link = links_outside(paths, on_link)
    seen: set[Path] = set()  # a run two of the paths reach (a folder and a run in it) is checked once
    for path in paths:
        kind = special_file_kind(path)
        if kind is not None or (Path(path).is_file() and not is_segment_file(Path(path))):
            what = f"{kind}, not a regular file or folder" if kind else "a file, not a run"
            raise NotARunError(
                f"{path} is {what}: give a run directory, its spool/ folder, one of its "
                "segment files (spool/seg-NNNNNN.jsonl), or a folder above runs")
        found: list[dict[str, Any]] = []

        def unreadable(directory: Path, exc: OSError) -> None:
            found.append(_unverifiable(directory, unreadable_message(exc, directory)))

        reached = False
        for run_dir in find_runs([path], unreadable, on_link=on_link):
            reached = True
            if (key := run_dir.resolve()) not in seen:
                seen.add(key)
                found.append(check_run(run_dir))
        if not found and not reached:
            verdict.paths_without_runs.append(str(path))
        verdict.runs.extend(found)
    return verdict
