"""How a pass writes its run's sync state file: the pass's first write replaces the file by a
rename, as every write did, and makes its twin beside it; each later write of the pass
overwrites the twin, then the file, in place, each made durable by one ``fdatasync``; the
pass's end removes the twin.

Why: a rename made durable costs two journal commits (the new file's ``fsync`` and its
folder's), 230-250 µs of CPU and about 7 ms on the project VM's disk, four times a new run;
an overwrite of a file's own blocks, its size unchanged, commits no metadata: one
``fdatasync``, 32-51 µs of CPU (docs/benchmarks.md, "A new run's file work").

Why a twin: an overwrite cut short by a power cut can leave the file torn, old bytes and
new. The twin is written and made durable first, so while the file is written the twin
holds the whole new state, and while the twin is written the file holds the whole old one:
whichever a cut interrupts, the other is whole. A reader takes the file, and the twin only
when the file is damaged (sync/state.py, ``load_state``). Both names were made durable by
the first write's folder ``fsync``, and both files are padded (spaces after the JSON) to a
size a pass's later states fit in, so an overwrite never grows them; one that would is a
rename again. Only a write that announces a request makes the names durable, so in-place
writes start after the pass's first announcement.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from prime_runs_spool.files import FILE_MODE, make_private_dir, replace_private

#: Bytes of room a file gets past its state when it is (re)made, so that the states of the
#: rest of a pass (an evaluation id, counts, a cursor, a request announced) fit in place.
ROOM = 1024
#: Files are made a whole number of these long (a page: an overwrite rewrites whole pages).
BLOCK = 4096


def _fdatasync(fd: int) -> None:
    """``os.fdatasync``, asked for when called (a test watches it), or fsync where there is none."""
    getattr(os, "fdatasync", os.fsync)(fd)



def twin_path(path: str) -> str:
    """Where the twin of the state file at ``path`` is: beside it, hidden, matching no
    state file's pattern (``*.json``)."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.twin")


class _Held:
    """A state file a pass writes in place, with its twin: descriptors, and their size."""

    __slots__ = ("file", "last", "size", "twin", "whole")

    def __init__(self) -> None:
        self.file: int | None = None
        self.twin: int | None = None
        self.size = 0
        #: What both files hold after the last write that ended well.
        self.last = b""
        #: False while the file is overwritten, and after a write that failed part way: the
        #: file may be torn then, and the twin must stay.
        self.whole = True


#: The state files passes are writing now (by path): a write elsewhere (a test's, a copy's)
#: replaces the file by a rename as before. One pass at a time per file (the run's locks).
_PASSES: dict[str, _Held] = {}
_PASSES_LOCK = threading.Lock()


def begin(path: str) -> None:
    """A pass starts writing the state at ``path``: its writes may go in place from here."""
    with _PASSES_LOCK:
        _PASSES.setdefault(path, _Held())


def end(path: str) -> None:
    """The pass is over: the twin blanked, unless a write failed part way (the file may be
    torn: the twin is what a reader then takes), and the descriptors closed. Blanked, not
    removed (a removal cost about 100 µs of CPU a run, Dec 7): a file damaged after the pass
    has no twin to be read for it, and the next pass's first write makes the twin again."""
    with _PASSES_LOCK:
        held = _PASSES.pop(path, None)
    if held is None:
        return
    if held.whole and held.twin is not None:
        with contextlib.suppress(OSError):  # not fsync'd: the file is whole and durable, its twin not needed
            _pwrite_all(held.twin, b" " * held.size)
    _close(held)


def _close(held: _Held) -> None:
    for fd in (held.file, held.twin):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    held.file = held.twin = None


def write(path: str, data: bytes, *, announces: bool) -> bytes:
    """Write ``data`` as the state file at ``path``, durably (its bytes, and for a write that
    ``announces`` a request its name too); returns the bytes the file now holds."""
    held = _PASSES.get(path)
    if held is None:
        replace_private(path, data, durable=True, rename_durable=announces)
        return data
    if held.file is not None and len(data) <= held.size:
        return _in_place(path, held, data.ljust(held.size), announces=announces)
    return _remade(path, held, data, announces=announces)


def _remade(path: str, held: _Held, data: bytes, *, announces: bool) -> bytes:
    """The file replaced by a rename, padded; for a write that announces a request, its twin
    made first (a write that fails there leaves the old file as it was), and both names made
    durable by the folder's fsync after the rename, so that the writes after it go in place."""
    _close(held)
    padded = data.ljust(-(-(len(data) + ROOM) // BLOCK) * BLOCK)
    if not announces:  # a twin a failed write left stays: true still, no request went since
        replace_private(path, padded, durable=True, rename_durable=False)
        held.whole = True
        return padded
    twin = _made_twin(path, padded)
    try:
        replace_private(path, padded, durable=True, rename_durable=True)  # ... and the twin's name
        file = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(twin)
        raise
    held.twin, held.file, held.whole = twin, file, True
    held.size, held.last = len(padded), padded
    return padded


def _made_twin(path: str, padded: bytes) -> int:
    """The twin of the file at ``path`` made, holding ``padded``, its bytes fsync'd (its
    blocks allocated: an overwrite then commits no metadata); its open descriptor."""
    twin = twin_path(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        try:
            fd = os.open(twin, flags, FILE_MODE)
        except FileNotFoundError:  # the first state of this folder: the folder first, its name durable
            make_private_dir(os.path.dirname(twin) or os.curdir, durable=True)
            fd = os.open(twin, flags, FILE_MODE)
        try:
            _write_all(fd, padded)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
    except OSError as exc:
        raise _named(exc, twin) from None
    return fd


def _in_place(path: str, held: _Held, padded: bytes, *, announces: bool) -> bytes:
    """The twin, then the file, overwritten. A write that announces nothing leaves the twin
    as it is: a cut that tears the file leaves the twin one write behind, true still, as a
    rename a cut takes back leaves the file (save_state)."""
    assert held.file is not None and held.twin is not None
    try:
        if announces:
            _pwrite_all(held.twin, padded)
            _fdatasync(held.twin)
    except OSError as exc:
        # The file is whole, the twin may not be: the next write makes both again.
        _close(held)
        raise _named(exc, path) from None
    held.whole = False  # until the file's bytes are durable: whatever stops this, the twin stays
    try:
        _pwrite_all(held.file, padded)
        _fdatasync(held.file)
    except OSError as exc:
        # The file may be torn and the twin holds a request that will not be sent: both
        # given back the last state, if they can be, or the twin (whole) is what is read.
        held.whole = _put_back(held)
        _close(held)
        raise _named(exc, path) from None
    held.last, held.whole = padded, True
    return padded


def _put_back(held: _Held) -> bool:
    """Both files given the last state that was written whole again; whether they were."""
    try:
        for fd in (held.twin, held.file):
            assert fd is not None
            _pwrite_all(fd, held.last)
            _fdatasync(fd)
    except OSError:
        return False
    return True


def _pwrite_all(fd: int, data: bytes) -> None:
    """``data`` written over the file from its start, whole or an ``OSError``: a short
    ``pwrite`` taken for a whole one (at a file size limit, or ENOSPC or a quota met part
    way on a copy-on-write file system, with no error) left the file torn while the pass
    blanked its twin. Asked again, the rest meets the error that cut it short."""
    done = os.pwrite(fd, data, 0)
    while done < len(data):  # rare: the rest copied
        if (n := os.pwrite(fd, data[done:], done)) == 0:
            raise OSError(errno.EIO, "the state file took none of the bytes written to it")
        done += n


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _named(exc: OSError, path: str) -> OSError:
    return OSError(exc.errno, exc.strerror, exc.filename or path)
