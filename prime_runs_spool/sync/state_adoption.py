"""A read-only spool's first sync from a state directory carries on from the sync states
written beside the spool while it could still be written (a run synced, then archived
read-only): each copied there, after the files of ids it names (sync/id_sets.py), and no
other file of ids (docs/cli.md, "Read-only sources").

Why a state is copied even when a file of ids it names cannot be read (a FIFO or a folder
where the file was, an I/O error): left behind, its run's sync began as if it had never been
synced, silently, and without the wait for a request that state announced, which may still
land (a row twice). Copied without the file, the pass finds it naming a file missing beside
it, which it does not trust: it reconciles with the platform, after waiting out the request
the state announces, if any (sync/engine.py, sync/evaluation.py), and the line says which
file could not be read and why. A state that cannot be read itself (another user's file,
a FIFO, an I/O error) is left behind too, for the same reason: in its place goes a file
that reads as damaged (:data:`UNREADABLE`, naming it), so the pass waits out a request it
may have announced, whenever sent, then reconciles; the line names it and why. Started
from the platform at once, as a run never synced, a pass on another machine or for another
user (whose copy lock knows nothing of that request) sent its rows again, and the request
landed after (tests/test_sync_state_adoption.py)."""

from __future__ import annotations

import os
from pathlib import Path

from prime_runs_spool.files import read_regular_file, replace_private
from prime_runs_spool.sync.id_sets import GLOB as ID_SET_GLOB, unnamed
from prime_runs_spool.sync.state import sync_dir


#: How a state directory's file begins in place of a state beside a read-only spool that could
#: not be read, the path of which follows: no state (it is read as damaged, and waited out).
UNREADABLE = b"not a sync state: it stands in for one that could not be read: "


def unreadable_source(path: Path) -> str | None:
    """The state ``path`` stands in for (:data:`UNREADABLE`), or None: a person ending the
    wait must make that one readable, since removing ``path`` alone only puts it back."""
    try:
        head = read_regular_file(path)
    except OSError:
        return None
    return os.fsdecode(head[len(UNREADABLE):].rstrip(b"\n")) if head.startswith(UNREADABLE) else None


def adopt_states(run_dir: Path, home: Path) -> list[str]:
    """The first time a read-only spool is synced from ``home``: copy the sync states beside
    it there, so this sync carries on from them; the lines its report says of those, or of
    their files of ids, that could not be read (none when all were)."""
    if home == run_dir:
        return []
    source, target = sync_dir(run_dir), sync_dir(home)
    try:
        states = [p.name for p in source.glob("*.json") if not (target / p.name).exists()]
        sets = [p.name for p in source.glob(ID_SET_GLOB)] if states else []
    except OSError:
        return []
    lines = []
    for name in states:
        try:
            state = read_regular_file(source / name)
        except OSError as exc:
            lines.append(f"{source / name}: cannot be read ({exc.strerror}), so this sync waits out a request it may "
                         "have on its way, then reconciles with the platform")
            replace_private(target / name, UNREADABLE + os.fsencode(source / name) + b"\n", durable=True)
            continue
        named = {}
        for found in sorted(set(sets) - set(unnamed(sets, [state]))):
            try:
                if not (target / found).exists():
                    named[found] = read_regular_file(source / found)
            except OSError as exc:
                lines.append(f"{source / found}: cannot be read ({exc.strerror}); {name} is copied without it")
        for found, data in [*named.items(), (name, state)]:
            replace_private(target / found, data, durable=True)
    return lines
