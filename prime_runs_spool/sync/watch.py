"""Being told that a followed spool changed, instead of looking at every spool every poll.

``prime-runs sync --follow`` over hundreds of idle runs used to take each run's signature
ten times a second (docs/sync.md, "Following"): a cost of runs x polls for nothing. Here the
kernel says what changed. On Linux, one inotify descriptor (through ``ctypes``: no new
dependency) watches

- each followed run's ``spool/`` folder, for the events a writer causes: an append
  (``IN_MODIFY`` of a segment or its durable mark), a new segment (``IN_CREATE``), a writer
  that exits or dies (the kernel closes its descriptors: ``IN_CLOSE_WRITE`` of its segment
  and lock), a rename or removal. Only the names of a segment's family (``seg-*``) count:
  the follower's own sync lock and state files never wake it;
- every other folder the walk for runs went through, for something created, moved or
  removed in it: how a new run appears.

The events only say *when* to look; what changed is still read from the spool (the
signature), so a spurious event costs one look and a lost one costs latency, never
correctness. Events are not trusted where they cannot be complete: a folder on a network or
FUSE filesystem (a writer on another host changes it without a local event), a kernel
without inotify, a watch refused (the per-user limit). Such a run is polled, the interval
doubling while it stays idle, up to about a second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import sys
from pathlib import Path

from prime_runs_spool.spool.layout import is_segment_family

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

#: What a writer does to its spool folder: append, mark durable, start a segment, exit.
SPOOL_EVENTS = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
                | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
#: How a run appears in (or leaves) a folder of the tree.
TREE_EVENTS = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
#: Events about the watched folder itself, or the queue: whatever the name, they count.
_ALWAYS = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_Q_OVERFLOW

#: Set (to anything) to follow by polling alone, as where inotify is missing.
NO_INOTIFY_ENV = "PRIME_RUNS_NO_INOTIFY"

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

#: statfs f_type of filesystems whose changes may come from another host or a user-space
#: server, so that a local inotify watch cannot see them all.
_REMOTE_FILESYSTEMS = frozenset({
    0x6969,  # NFS
    0x517B,  # SMB
    0xFF534D42,  # CIFS
    0xFE534D42,  # SMB2
    0x65735546,  # FUSE
    0x00C36400,  # Ceph
    0x01161970,  # GFS2
    0x7461636F,  # OCFS2
    0x01021997,  # 9P
    0x5346414F,  # AFS
    0x6B414653,  # kAFS
    0x0BD00BD0,  # Lustre
    0x47504653,  # GPFS
    0x013111A8,  # IBRIX
})


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch, libc.statfs  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    return libc


_LIBC = _libc()


def events_complete(path: Path) -> bool:
    """Whether local inotify events see every change under ``path``: a local filesystem."""
    if _LIBC is None:
        return False
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _LIBC.statfs(os.fsencode(path), buffer) != 0:
        return False
    f_type = ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    return f_type not in _REMOTE_FILESYSTEMS


class ChangeWatch:
    """Which followed runs may have changed, and whether the tree of folders did.

    Without inotify every method still works: nothing is ever watched (``watch_run``
    returns False, so the follower polls that run), and :meth:`wait` only sleeps.
    """

    def __init__(self) -> None:
        self._fd = -1
        if _LIBC is not None and not os.environ.get(NO_INOTIFY_ENV):
            fd = _LIBC.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            self._fd = fd if fd >= 0 else -1
        self._runs: dict[int, object] = {}  # wd -> the run's key
        self._run_wd: dict[object, int] = {}
        self._tree: dict[int, Path] = {}  # wd -> folder
        self._tree_wd: dict[Path, int] = {}
        self._changed: set[object] = set()
        self._tree_changed = False
        self._overflow = False
        #: Whether every folder of the tree is watched on a local filesystem: new runs are
        #: then found by events, and the walk can be rare.
        self.tree_complete = False

    @property
    def available(self) -> bool:
        return self._fd >= 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _add(self, path: Path, mask: int) -> int | None:
        if self._fd < 0 or not events_complete(path):
            return None
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(path), mask)
        return wd if wd >= 0 else None

    def _rm(self, wd: int) -> None:
        if self._fd >= 0 and wd not in self._runs and wd not in self._tree:
            _LIBC.inotify_rm_watch(self._fd, wd)

    # -- what is watched ----------------------------------------------------------------

    def watch_run(self, key: object, spool_dir: Path) -> bool:
        """Watch one run's spool folder; True when its events can be relied on."""
        if key in self._run_wd:
            return True
        wd = self._add(spool_dir, SPOOL_EVENTS)
        if wd is None:
            return False
        self._runs[wd] = key
        self._run_wd[key] = wd
        return True

    def watching(self, key: object) -> bool:
        """Whether the run's folder is (still) watched: a watch ends when its folder goes."""
        return key in self._run_wd

    def forget_run(self, key: object) -> None:
        wd = self._run_wd.pop(key, None)
        if wd is not None:
            self._runs.pop(wd, None)
            self._rm(wd)

    def watch_tree(self, folders: set[Path]) -> bool:
        """Watch exactly ``folders`` (the walk's non-run folders) for runs appearing. True
        when a folder got a new watch: whatever was created in it between the walk's look
        and the watch made no event, so the caller walks once more."""
        for folder in set(self._tree_wd) - folders:
            wd = self._tree_wd.pop(folder)
            self._tree.pop(wd, None)
            self._rm(wd)
        complete, added = self.available, False
        for folder in folders - set(self._tree_wd):
            wd = self._add(folder, TREE_EVENTS)
            if wd is None:
                complete = False
                continue
            self._tree[wd] = folder
            self._tree_wd[folder] = wd
            added = True
        self.tree_complete = complete and len(self._tree_wd) == len(folders)
        return added

    # -- events -------------------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Block until an event arrives or ``timeout`` seconds pass, then read the events;
        True when some were read."""
        timeout = max(0.0, timeout)
        if self._fd < 0:
            if timeout:
                select.select([], [], [], timeout)
            return False
        readable, _, _ = select.select([self._fd], [], [], timeout)
        if readable:
            self._read()
        return bool(readable)

    def pending(self) -> tuple[set[object], bool]:
        """The runs told of and whether the tree changed, since the last :meth:`take`."""
        return self._changed, self._tree_changed or self._overflow

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset:offset + length].rstrip(b"\0").decode("utf-8", "surrogateescape")
                offset += length
                self._note(wd, mask, name)

    def _note(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self._overflow = True  # events were lost: everything may have changed
            return
        if wd in self._runs:
            if mask & _ALWAYS or is_segment_family(name):
                self._changed.add(self._runs[wd])
            if mask & IN_IGNORED:  # the folder is gone: watch it again once it is found again
                key = self._runs.pop(wd)
                self._run_wd.pop(key, None)
        elif wd in self._tree:
            self._tree_changed = True
            if mask & IN_IGNORED:
                self._tree_wd.pop(self._tree.pop(wd), None)
                self.tree_complete = False

    def take(self) -> tuple[set[object], bool, bool]:
        """The runs changed since the last call, whether the tree changed, and whether events
        were lost (then everything must be looked at)."""
        changed, tree, overflow = self._changed, self._tree_changed, self._overflow
        self._changed, self._tree_changed, self._overflow = set(), False, False
        return changed, tree, overflow
