"""Lines already pushed, read again when their segment was changed in place (docs/sync.md,
"Lines lost under the cursor").

A pass reads a run from its cursor on, so a finished run whose lines were all pushed is
up to date from its segments' sizes and versions alone (``RunSync._up_to_date``). A byte
flipped in those lines keeps the size: sync said ``up_to_date`` while ``status`` and
``verify`` said ``corrupt``. Nothing is lost on the platform, which holds every line sent,
but the user was told all was well about a damaged copy.

The version (inode and modification time; a store's etag) is what tells: a write in place
moves it. Each segment's is kept when the run's end is recorded (the last one's with its
size; those before it, a resumed run's, one ``stat`` each when the answer is asked: a run
never resumed has none), so damage in any of them is told. Only
then, and only in the pass (a probe writes nothing and leaves such a run to the pass), is
the run read again from its start, once: intact (a ``touch``, a copy, an artifact unpacked
again), the new version is recorded and the next sync is a ``stat`` again; damaged, the run
stays up to date with one warning that names the damage, and the version is not recorded,
so every sync says it again while the damage is there. A no-op re-sync of unchanged runs
reads nothing more than before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prime_runs_spool.errors import CorruptSpoolError
from prime_runs_spool.files import shown
from prime_runs_spool.spool.layout import segment_at, segment_size_and_version, segment_version
from prime_runs_spool.spool.reader import iter_records


def record_versions(state: Any, run_dir: Any) -> None:
    """Record the run's files as its end is recorded: the cursor's segment's size and
    version (the bytes past the cursor, a torn tail or padding, are not read again) and the
    version of each segment before it, the ones :func:`same_versions` compares: one
    ``stat`` a segment, no listing, once a run."""
    cursor = state.cursor
    state.terminal_size = state.terminal_version = None
    state.earlier_versions = {}
    segment = segment_at(run_dir, cursor.segment_index) if cursor is not None else None
    if segment is None:
        return
    try:
        state.terminal_size, state.terminal_version = segment_size_and_version(segment)
        state.earlier_versions = _versions([(index, segment_at(run_dir, index))
                                            for index in range(1, cursor.segment_index)])
    except FileNotFoundError:  # gone since it was read: the next pass reads, and reports it
        state.terminal_size = state.terminal_version = None
        state.earlier_versions = {}


def same_versions(state: Any, segments: list[tuple[int, Any]], version: str | None) -> bool:
    """Whether the run's segments are the versions recorded with its end: the last one
    ``version``, each before it as :func:`record_versions` kept it (a ``stat`` each: a
    run that was never resumed has none). A state from before versions were kept: the
    size alone decided, and still does."""
    if state.terminal_version not in (None, version):
        return False
    kept = state.earlier_versions
    try:
        return not kept or all(kept.get(str(index)) in (None, segment_version(segment))
                               for index, segment in segments[:-1])
    except OSError:  # gone since it was listed: the pass reads, and reports it
        return False


def _versions(segments: list[tuple[int, Any]]) -> dict[str, str]:
    """The version of each segment (by index, as a state keeps it; a store's segment
    without an etag, or a segment gone, is left out: its version cannot tell)."""
    found = {}
    for index, segment in segments:
        try:
            version = segment_version(segment) if segment is not None else None
        except FileNotFoundError:
            continue
        if version is not None:
            found[str(index)] = version
    return found


def read_again(protocol: Any, run_dir: Path, segments: list[tuple[int, Any]], size: int, version: str | None,
               warnings: list[str]) -> bool:
    """Read the lines the state's cursor passed, their last segment now ``size`` bytes at
    ``version`` (another than the state recorded): a warning in ``warnings`` if they are
    damaged, else the version recorded in the state (``protocol.note``: the pass's end
    writes it). Returns whether the run is up to date: the segment ends at the cursor."""
    state = protocol.state
    cursor = state.cursor
    earlier = _versions(segments[:-1])  # as they are before they are read, as ``version`` is
    try:
        for record in iter_records(run_dir, None, segments=segments):
            if (record.segment_index, record.end_offset) >= (cursor.segment_index, cursor.offset):
                break
    except CorruptSpoolError as exc:
        warnings.append(f"{exc}; in lines already pushed, which the platform holds: this copy of the spool is damaged "
                        f"(prime-runs verify {shown(str(run_dir))} shows it)")
        return size == cursor.offset
    if size == cursor.offset:
        state.terminal_size, state.terminal_version, state.earlier_versions = size, version, earlier
        protocol.note()
    return size == cursor.offset
