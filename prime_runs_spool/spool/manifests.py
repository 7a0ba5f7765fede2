"""What a run's segments open with: each one's manifest, and the run's (docs/spool-format.md,
section 3), read from the first two lines of each segment, never a whole segment.

A resumed segment's manifest says what that process was opened with (and which episodes it
supersedes), which a reader needs before it reads the episodes; a pass needs the run's
manifest before anything else. Kept beside the reader, whose walk answers whenever these
first lines are not plain.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import CorruptSpoolError, UnsupportedFormatError
from prime_runs_spool.spool.crosscheck import RunLedger
from prime_runs_spool.spool.format import EPISODE, HEADER, MANIFEST, MAX_LINE_BYTES, Line, parse_line
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.spool.reader import SegmentState, _check_header, _open_segment, iter_records


def segment_manifests(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Each segment's manifest record (the line after its header), in segment order.

    Reads two lines per segment, never a whole segment: a resumed segment's manifest says
    what that process was opened with (and which episodes it supersedes), which a reader
    needs before it reads the episodes. A segment whose first lines are not intact is
    passed over here; ``iter_records`` reports the damage.
    """
    for _, path in list_segments(run_dir):
        manifest = _segment_manifest(path)
        if manifest is not None:
            yield manifest


def run_manifests(run_dir: str | os.PathLike[str], segments: list[tuple[int, Path]] | None = None
                  ) -> tuple[Any, list[dict[str, Any]]]:
    """The run's manifest as :func:`read_manifest` reads it, and :func:`segment_manifests`,
    from one listing (``segments``, the caller's, which it reads the records by too; else
    listed here) and the first two lines of each segment: what a pass reads before the
    run's records. The first segment's header gets every check a read from the start gives
    it (the format, its run and index); anything else there (damage, a segment still empty,
    a first record that is not the manifest) is read again by :func:`read_manifest`, whose
    walk says what it is, so the answer and the error are the walk's own either way."""
    segments = list_segments(run_dir) if segments is None else segments
    heads = [_segment_head(path) for _, path in segments]
    manifests = [line.data for _, line in heads if _is_manifest(line)]
    if segments and _plain_start(segments[0], *heads[0]):
        return heads[0][1].data, manifests  # type: ignore[union-attr]
    return read_manifest(run_dir), manifests


def read_manifest(run_dir: str | os.PathLike[str]) -> Any:
    """The run's manifest: the first manifest record of its first segment, read by the walk
    (every check of a read from the start; corruption before it raises)."""
    for record in iter_records(run_dir):
        if record.type == MANIFEST:
            return record.data
        if record.type == EPISODE:
            break
    return None


def _plain_start(segment: tuple[int, Path], header: Line | None, manifest: Line | None) -> bool:
    """Whether a run's first segment opens as the walk would read it without a word: an
    intact header it accepts (section 4.1's checks of a first segment included), then the
    manifest as the record after it. Anything else is left to the walk."""
    index, path = segment
    if header is None or header.seq != 0 or not _is_manifest(manifest) or manifest.seq != 1:  # type: ignore[union-attr]
        return False
    ledger = RunLedger()
    try:
        ledger.begin(path, index)
        _check_header(path, index, header, SegmentState(), ledger)
        ledger.prior(path, header.data)
    except (CorruptSpoolError, UnsupportedFormatError):
        return False
    return True


def _segment_head(path: Path) -> tuple[Line | None, Line | None]:
    """A segment's first two lines, each parsed when it is intact (the second only after an
    intact header; both None when the segment is gone)."""
    try:
        handle = _open_segment(path)
    except FileNotFoundError:
        return None, None
    with handle:
        header = parse_line(handle.readline(MAX_LINE_BYTES + 1))
        if header is None or header.type != HEADER:
            return header, None
        return header, parse_line(handle.readline(MAX_LINE_BYTES + 1))


def first_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's manifest as its first segment's first two lines hold it; None when they do
    not (no segment, damage: ``iter_records`` says what). The cheap read of a check that
    only needs the run's id, such as whether a run is already synced."""
    segments = list_segments(run_dir)
    return _segment_manifest(segments[0][1]) if segments else None


def _segment_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest record after the segment's header, if both lines are intact."""
    _, line = _segment_head(path)
    return line.data if _is_manifest(line) else None  # type: ignore[union-attr]


def _is_manifest(line: Line | None) -> bool:
    return line is not None and line.type == MANIFEST and isinstance(line.data, dict)
