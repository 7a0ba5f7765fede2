"""Lines already pushed, read again when their segment was changed in place (docs/sync.md,
"Lines lost under the cursor").

A pass reads a run from its cursor on, so a finished run whose lines were all pushed is
up to date from its last segment's size and version alone (``RunSync._up_to_date``). A
byte flipped in those lines keeps the size: sync said ``up_to_date`` while ``status`` and
``verify`` said ``corrupt``. Nothing is lost on the platform, which holds every line sent,
but the user was told all was well about a damaged copy.

The version (inode and modification time) is what tells: a write in place moves it. Only
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
from prime_runs_spool.spool.reader import iter_records


def read_again(protocol: Any, run_dir: Path, segments: list[tuple[int, Any]], size: int, version: str | None,
               warnings: list[str]) -> bool:
    """Read the lines the state's cursor passed, their last segment now ``size`` bytes at
    ``version`` (another than the state recorded): a warning in ``warnings`` if they are
    damaged, else the version recorded in the state (``protocol.note``: the pass's end
    writes it). Returns whether the run is up to date: the segment ends at the cursor."""
    state = protocol.state
    cursor = state.cursor
    try:
        for record in iter_records(run_dir, None, segments=segments):
            if (record.segment_index, record.end_offset) >= (cursor.segment_index, cursor.offset):
                break
    except CorruptSpoolError as exc:
        warnings.append(f"{exc}; in lines already pushed, which the platform holds: this copy of the spool is damaged "
                        f"(prime-runs verify {shown(str(run_dir))} shows it)")
        return size == cursor.offset
    if size == cursor.offset:
        state.terminal_size, state.terminal_version = size, version
        protocol.note()
    return size == cursor.offset
