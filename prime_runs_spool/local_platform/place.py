"""Where the local platform keeps its database when no ``--db`` is given:
``$PRIME_RUNS_LOCAL_DB``, else ``$XDG_DATA_HOME/prime-runs/local-platform.db`` (default
``~/.local/share/prime-runs/``).

In the user's data folder, not a cache (it holds the only copy of what was synced locally)
and never inside ``~/.prime/``, which is the platform CLI's configuration. ``prime-runs
platform serve`` and ``prime-runs sync --local`` share this default, so what one writes the
other serves. Imports nothing heavy: the command line reads it to define its options.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: The environment variable that names the database outright.
DATABASE_ENV = "PRIME_RUNS_LOCAL_DB"
#: The environment variable that moves the user's data folder (the XDG base directories).
DATA_ENV = "XDG_DATA_HOME"
DATABASE_NAME = "local-platform.db"


def default_database() -> Path:
    """The database path (not created). A relative ``XDG_DATA_HOME`` is ignored, as the XDG
    base directory specification asks."""
    named = os.environ.get(DATABASE_ENV)
    if named:
        return Path(named).expanduser()
    given = Path(os.environ.get(DATA_ENV) or "").expanduser()
    return (given if given.is_absolute() else Path.home() / ".local" / "share") / "prime-runs" / DATABASE_NAME


def database_source(given: Path | None) -> str:
    """Where the database path came from, as a message names it for the user to fix:
    ``--db``, the environment variable, or the default."""
    if given is not None:
        return "--db"
    return DATABASE_ENV if os.environ.get(DATABASE_ENV) else "the default database"


def folder_refused(folder: Path, given: Path | None, reason: str) -> str:
    """The line for a database folder that cannot be made (a HOME that is not writable,
    another user's data folder), with what to give instead: ``sync --local`` and ``platform
    serve`` share it."""
    return (f"cannot create {folder} for {database_source(given)}: {reason}; give --db FILE in a folder "
            f"you can write (or set {DATABASE_ENV}=FILE)")


def database_blocker(path: Path) -> str | None:
    """Why ``path`` cannot be taken as the database, before anything is made for it: a name
    of blanks only (a file so named was made in the current folder); a loop of symbolic
    links (``resolve`` raised, an internal error); a symbolic link to nothing on the way (a
    disk not mounted: its folders were made through the link, on the disk below the mount
    point). None otherwise; a link as the file itself, to a file not yet there in a folder
    that is, is a database SQLite creates."""
    if not str(path).strip():
        return f"{str(path)!r} is blanks only and names no file"
    full = Path(os.path.abspath(path))
    for entry in [*reversed(full.parents), full]:
        if not os.path.islink(entry):
            continue
        try:
            os.stat(entry)
        except FileNotFoundError:
            if entry == full and os.path.isdir(os.path.dirname(os.path.realpath(entry))):
                continue
            return f"{entry} is a symbolic link to {os.readlink(entry)}, which does not exist"
        except OSError as error:
            if error.errno == errno.ELOOP:
                return f"{entry} is a loop of symbolic links"
    return None
