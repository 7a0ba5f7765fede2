"""Copies of one spool on this machine: the lock that keeps their passes apart, and a note of
which copy pushed last (docs/sync.md, "Concurrency").

The sync lock (``spool/sync.lock``) belongs to a spool's folder, so it does not see a copy of
the folder (``cp -r``, one CI artifact unpacked by two jobs). What two copies share is on the
platform: the run's one evaluation, found by the run's key (local run id, replay id) on one
destination (sync/evaluation.py). So the part of a pass that may write to the platform (find
or create the evaluation, append, finish) also holds a lock named by destination and run
key, in this user's cache (``$XDG_CACHE_HOME/prime-runs/copies/``, spool/layout.py, folders 0700, files 0600).
It is an ``flock``: the kernel drops it when its holder dies, SIGKILL included, and its file
is never deleted (unlinking a locked file lets a second holder in on a new inode).

A lock alone is not enough: each copy keeps a sync state of its own, and a state this
process wrote is trusted without asking the platform (``SyncState.written_here``). So beside
the lock its holder notes which state file it syncs from (``<key>.holder``). A pass that finds
another state named there, or none, knows another copy may have pushed since its own state
was written: it checks that state against the platform before sending anything, as after a
crash (sync/reconcile.py, ``Reconciler.verify``), and goes on from the platform's count.

What this does not cover: copies synced at once from two machines, or by two users (each has
its own cache), or by syncs whose ``XDG_CACHE_HOME`` differ. The platform's create and append
are not idempotent and take no token that would let the second be refused.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
from pathlib import Path

import orjson

from prime_runs_spool.errors import CopyBusyError, SyncError
from prime_runs_spool.spool.layout import COPY_LOCKS_DIRNAME, FILE_MODE, copy_holder_path, copy_lock_path, printable
from prime_runs_spool.sync.options import COPY_WAIT_ENV
from prime_runs_spool.sync.user_cache import CACHE_ENV, private_folder

#: How often a waiting pass tries the lock again.
POLL = 0.1


def run_key_digest(destination_key: str, local_run_id: str, replay_id: str | None) -> str:
    """The file name stem for one run on one destination (JSON keeps the parts apart)."""
    return hashlib.sha256(orjson.dumps([destination_key, local_run_id, replay_id])).hexdigest()[:32]


class CopyLock:
    """The lock of one run (its key) on one destination, held by the pass syncing from the
    state file ``holder``. Use as ``with CopyLock(...).hold(wait): ...``; :attr:`foreign`
    then says whether another state may have pushed since ``holder`` last did."""

    def __init__(self, destination_key: str, local_run_id: str, replay_id: str | None, holder: Path,
                 run: str) -> None:
        self.stem = run_key_digest(destination_key, local_run_id, replay_id)
        self.local_run_id = local_run_id
        #: The state file this pass syncs from, what tells the copies apart: as a digest of
        #: its absolute path's bytes (a folder name need not be UTF-8, the note is JSON).
        self.holder = hashlib.sha256(os.fsencode(os.path.abspath(holder))).hexdigest()
        #: The run's folder (or URL), named to whoever waits for it.
        self.run = printable(run)
        #: Set by :meth:`hold`: whether the last pass that held the lock synced another state.
        self.foreign = True
        self._fd: int | None = None

    def hold(self, wait: float | None) -> CopyLock:
        """Take the lock, waiting at most ``wait`` seconds (None: until it is free; the wait
        is real time, whatever clock the engine runs on), then note this holder.
        :class:`CopyBusyError` when another pass still holds it, naming its folder;
        :class:`SyncError` when the folder or file cannot be used."""
        try:
            try:
                folder = _folder()
                fd = os.open(copy_lock_path(folder, self.stem), os.O_RDWR | os.O_CREAT | _NO_FOLLOW, FILE_MODE)
            except FileNotFoundError:  # the cache was cleared while this process ran
                folder = _folder(again=True)
                fd = os.open(copy_lock_path(folder, self.stem), os.O_RDWR | os.O_CREAT | _NO_FOLLOW, FILE_MODE)
        except OSError as exc:
            raise SyncError(f"cannot take this run's copy lock in {exc.filename or COPY_LOCKS_DIRNAME}: "
                            f"{exc.strerror or exc}; set {CACHE_ENV} to a writable folder") from None
        try:
            deadline = None if wait is None else time.monotonic() + max(0.0, wait)
            while not _try_lock(fd):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CopyBusyError(self._busy_message(folder, wait))
                time.sleep(POLL if left is None else min(POLL, left))
            self.foreign = self._claim(folder)
        except BaseException:
            os.close(fd)  # drops the lock too, if it was taken
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> CopyLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _claim(self, folder: Path) -> bool:
        """Under the lock: note this holder as the last to push (before any request of this
        pass); True when the note named another state, or none (it may have pushed since)."""
        path = copy_holder_path(folder, self.stem)
        if _read_note(path).get("state") == self.holder:
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NO_FOLLOW, FILE_MODE)
        try:
            os.write(fd, orjson.dumps({"state": self.holder, "run": self.run, "local_run_id": self.local_run_id}))
        finally:
            os.close(fd)
        # Not fsync'd: a note lost to a power cut names an older holder, and every state read
        # by a new process is checked against the platform anyway (SyncState.written_here).
        os.replace(tmp, path)
        return True

    def _busy_message(self, folder: Path, wait: float | None) -> str:
        other = _read_note(copy_holder_path(folder, self.stem)).get("run") or "another folder"
        waited = (f"waited {wait:g} s for it (--copy-wait S or {COPY_WAIT_ENV} waits longer, --wait until it "
                  "is done)") if wait else "not waited for"
        return (f"another prime-runs sync on this machine is pushing a copy of this run (local run id "
                f"{self.local_run_id}) to this destination, from {other}; {waited}")


_NO_FOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

#: The copy locks' folder, made (0700) once per process and cache location: checking it at
#: every pass cost more than the lock itself.
_FOLDERS: dict[tuple[str | None, str | None], Path] = {}


def _folder(*, again: bool = False) -> Path:
    key = (os.environ.get(CACHE_ENV), os.environ.get("HOME"))
    folder = None if again else _FOLDERS.get(key)
    if folder is None:
        folder = _FOLDERS[key] = private_folder(COPY_LOCKS_DIRNAME)
    return folder


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise SyncError(f"cannot take this run's copy lock: {exc.strerror}") from None
    return True


def _read_note(path: Path) -> dict[str, str]:
    """The holder note's fields ({} when there is none, or it is not one)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NO_FOLLOW)
    except OSError:
        return {}
    try:
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    try:
        note = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return {k: v for k, v in note.items() if isinstance(v, str)} if isinstance(note, dict) else {}
