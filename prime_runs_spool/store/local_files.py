"""A ``file://`` store: the few calls of :class:`~prime_runs_spool.store.objects.ObjectStore`
over a local folder, with conditional writes that are real.

The store library's local file store creates only-if-absent, but cannot replace only if
unchanged, and the lease and the sync state rely on both. Here every write lands whole by
``rename`` from a temporary file in the same folder (a reader sees the old object or the new
one, never half), and:

- **create-only** is ``link(2)`` of that temporary file to the key's path, which the kernel
  refuses when the path exists;
- **replace-if-unchanged** takes an exclusive ``flock`` on the current file, checks that the
  path still names the file it locked (a replace that renamed over it meanwhile means: look
  again), compares the etag, and only then renames over it, lock held. Every replacer of a
  key goes through the same lock, so two cannot both succeed from one version.

An etag is ``<inode>-<mtime ns>-<size>`` in hex. A file written here gets a modification
time of our own clock in nanoseconds (the kernel's file times are coarse, a few ms), so a
freed inode number reused within one tick of the clock for an object of the same size
cannot bring an old etag back. Locks need a file system that honours ``flock`` between the
processes using the folder (a local one; not every network mount does).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
import time
from pathlib import Path
from urllib.parse import unquote

from prime_runs_spool.errors import StoreConflict, StoreSetupError
from prime_runs_spool.files import fsync_folder, make_private_dir, open_private
from prime_runs_spool.store.object_info import ObjectInfo

#: Where a write is prepared before it lands, beside its object; never listed as an object.
TEMP_PREFIX = ".prime-runs-tmp-"
#: Bytes copied at a time by :meth:`LocalFiles.upload_prefix`.
COPY_BYTES = 8 * 1024 * 1024


def local_root(url: str) -> Path:
    """The folder a ``file://`` URL names: ``file:///abs/path`` (or ``file://localhost/...``)."""
    rest = url.partition("://")[2]
    host, slash, path = rest.partition("/")
    if host not in ("", "localhost"):
        raise StoreSetupError(f"{url}: a file:// URL names a folder on this machine: file:///absolute/path")
    return Path(unquote(slash + path) or "/")


def etag_of(info: os.stat_result) -> str:
    return f"{info.st_ino:x}-{info.st_mtime_ns:x}-{info.st_size:x}"


class LocalFiles:
    """The objects under one folder; keys are ``/``-separated paths below it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(part in ("", ".", "..") for part in parts) or parts[-1].startswith(TEMP_PREFIX):
            raise StoreSetupError(f"{key!r} is not a key this store can hold")
        return self.root.joinpath(*parts)

    def list(self, under: str = "") -> list[ObjectInfo]:
        """Every regular file below the root, or below its folder ``under`` (symbolic links
        are not followed)."""
        found = []
        for folder, dirs, files in os.walk(self.path(under) if under else self.root, onerror=_raise):
            dirs.sort()
            for name in sorted(files):
                if name.startswith(TEMP_PREFIX):
                    continue
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue  # replaced or removed between the listing and its stat
                if stat.S_ISREG(info.st_mode):
                    key = Path(path).relative_to(self.root).as_posix()
                    found.append(ObjectInfo(key, info.st_size, etag_of(info), info.st_mtime))
        return found

    def read(self, key: str, max_bytes: int) -> tuple[bytes, str, int] | None:
        """``key``'s bytes (up to ``max_bytes + 1``), its etag and its size; None if absent."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise OSError(0, "not a regular file", str(self.path(key)))
            if info.st_size > max_bytes:
                return b"", etag_of(info), info.st_size
            return f.read(max_bytes + 1), etag_of(info), info.st_size

    def read_range(self, key: str, start: int, end: int, etag: str | None) -> bytes:
        """Bytes ``[start, end)``; :class:`StoreConflict` if the file is no longer ``etag``."""
        fd = os.open(self.path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO put there never blocks
        try:
            if etag is not None and etag_of(os.fstat(fd)) != etag:
                raise StoreConflict("changed")
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)

    def create(self, key: str, data: bytes) -> str:
        """Write ``key`` only if there is no file there; its etag."""
        target = self.path(key)
        temp, etag = self._prepare(target, data)
        try:
            os.link(temp, target)
        except FileExistsError:
            raise StoreConflict("exists") from None
        finally:
            os.unlink(temp)
        fsync_folder(target.parent)
        return etag

    def replace(self, key: str, data: bytes, etag: str) -> str:
        """Write ``key`` only if it still is ``etag``; its new etag."""
        target = self.path(key)
        while True:
            try:
                fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                raise StoreConflict("gone") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    now = os.lstat(target)
                except FileNotFoundError:
                    raise StoreConflict("gone") from None
                if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
                    continue  # renamed over while we waited: lock the file that is there now
                if etag_of(held) != etag:
                    raise StoreConflict("changed")
                temp, new_etag = self._prepare(target, data)
                os.rename(temp, target)
                fsync_folder(target.parent)
                return new_etag
            finally:
                os.close(fd)  # the lock goes with it

    def overwrite(self, key: str, data: bytes) -> None:
        """Replace ``key`` with ``data`` whatever it holds (by a rename: never half written)."""
        target = self.path(key)
        temp, _ = self._prepare(target, data)
        try:
            os.rename(temp, target)
        except BaseException:
            _unlink_quietly(temp)
            raise
        fsync_folder(target.parent)

    def delete(self, key: str) -> None:
        """Remove ``key``; one already gone is no error."""
        target = self.path(key)
        try:
            os.unlink(target)
        except FileNotFoundError:
            return
        fsync_folder(target.parent)

    def upload_prefix(self, key: str, source: os.PathLike[str] | str, size: int) -> None:
        """Replace ``key`` with the first ``size`` bytes of ``source``, copied in parts."""
        target = self.path(key)
        temp = self._temp(target)
        try:
            with open(source, "rb") as f, os.fdopen(self._open_temp(temp), "wb") as out:
                left = size
                while left > 0:
                    chunk = f.read(min(COPY_BYTES, left))
                    if not chunk:
                        raise OSError(0, f"shorter than the {size} bytes to upload", os.fspath(source))
                    out.write(chunk)
                    left -= len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.rename(temp, target)
        except BaseException:
            _unlink_quietly(temp)
            raise
        fsync_folder(target.parent)

    def _temp(self, target: Path) -> Path:
        if not target.parent.is_dir():
            make_private_dir(target.parent)  # durably: a new folder's name is fsync'd in its parent
        return target.with_name(f"{TEMP_PREFIX}{target.name}-{os.getpid()}-{secrets.token_hex(6)}")

    @staticmethod
    def _open_temp(temp: Path) -> int:
        return open_private(temp, os.O_WRONLY | os.O_EXCL | os.O_NOFOLLOW)

    def _prepare(self, target: Path, data: bytes) -> tuple[Path, str]:
        """``data`` in a durable temporary file beside ``target``, stamped with a fine-grained
        modification time (see the module's docstring); the file and its etag."""
        temp = self._temp(target)
        try:
            fd = self._open_temp(temp)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.utime(fd, ns=(time.time_ns(), time.time_ns()))
                os.fsync(fd)
                return temp, etag_of(os.fstat(fd))
            finally:
                os.close(fd)
        except BaseException:
            _unlink_quietly(temp)
            raise


def _raise(exc: OSError) -> None:
    """A folder that cannot be listed fails the listing; one gone meanwhile (or a root not
    made yet) holds nothing."""
    if not isinstance(exc, FileNotFoundError):
        raise exc


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
