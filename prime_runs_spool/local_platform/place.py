"""Where the local platform keeps its database when no ``--db`` is given:
``$PRIME_RUNS_LOCAL_DB``, else ``$XDG_DATA_HOME/prime-runs/local-platform.db`` (default
``~/.local/share/prime-runs/``).

In the user's data folder, not a cache (it holds the only copy of what was synced locally)
and never inside ``~/.prime/``, which is the platform CLI's configuration. ``prime-runs
platform serve`` and ``prime-runs sync --local`` share this default, so what one writes the
other serves. Imports nothing heavy: the command line reads it to define its options.
"""

from __future__ import annotations

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
