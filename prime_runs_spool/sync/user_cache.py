"""This user's cache folder for prime-runs on this machine: ``$XDG_CACHE_HOME/prime-runs``
(default ``~/.cache/prime-runs``).

What sync keeps outside the spools lives under it: the copies of states held in an object
store (sync/store_sync.py), the per-run locks that keep copies of one spool apart
(sync/copies.py) and the runs found up to date (sync/unchanged.py). One place says where,
so all follow ``XDG_CACHE_HOME`` alike.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from prime_runs_spool.files import DIR_MODE, make_private_dir

#: The environment variable that moves the cache (the XDG base directory convention).
CACHE_ENV = "XDG_CACHE_HOME"


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/prime-runs``, else ``~/.cache/prime-runs`` (not created).

    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG base directory specification asks:
    taken as it was, it named a folder under each process's working directory, so two syncs
    of copies of one spool started from two folders took two different copy locks and both
    pushed every row."""
    given = Path(os.environ.get(CACHE_ENV) or "").expanduser()
    return (given if given.is_absolute() else Path.home() / ".cache") / "prime-runs"


def private_folder(name: str) -> Path:
    """``cache_root()/name``, created if needed, both folders 0700 (another user of the
    machine must not read what sync keeps there, nor plant files in it), and every missing
    parent made 0700 too (``Path.mkdir`` made ``XDG_CACHE_HOME`` itself 0755), not fsync'd:
    a cache. OSError when it cannot be created."""
    root = cache_root()
    folder = root / name
    make_private_dir(folder, durable=False)
    if not folder.is_dir():  # a file there (``Path.mkdir(exist_ok=True)`` said so): never chmod'ed
        raise FileExistsError(errno.EEXIST, "is not a folder", str(folder))
    for path in (root, folder):
        if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
            os.chmod(path, DIR_MODE)
    return folder
