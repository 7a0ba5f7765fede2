"""How a pass writes its run's sync state file, through a :class:`Writer` the pass owns: its
writes replace the file by a rename, as every write did, until its first write that
announces a request, which makes the file's twin beside it too; each later write of the pass
overwrites in place, each file made durable by one ``fdatasync``: the twin, then the file,
for a write that announces a request, the file alone for one that announces nothing; the
pass's end blanks the twin (spaces: no state), unless a write failed part way.

Why: a rename made durable costs two journal commits (the new file's ``fsync`` and its
folder's), 230-250 µs of CPU and about 7 ms on the project VM's disk, four times a new run;
an overwrite of a file's own blocks, its size unchanged, commits no metadata: one
``fdatasync``, 32-51 µs of CPU (docs/benchmarks.md, "A new run's file work").

Why a twin: an overwrite cut short by a power cut can leave the file torn, old bytes and
new. The twin is written and made durable first, so while the file is written the twin
holds the whole new state, and while the twin is written the file holds the whole old one:
whichever a cut interrupts, the other is whole. Every reader reads through sync/state.py's
``read_state``: the file, and the twin only when the file is damaged. Both names were made
durable by the first write's folder ``fsync``, and both files are padded (spaces after the
JSON) to a size a pass's later states fit in, so an overwrite never grows them; one that
would is a rename again. Only a write that announces a request makes the names durable, so in-place
writes start after the pass's first announcement.
"""

from __future__ import annotations

import contextlib
import errno
import os

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


class Writer:
    """One pass's writes of its state file: the descriptors of the file and its twin, and
    their size. The pass owns it, made with the pass and :meth:`end`-ed with it, so a write
    elsewhere (a test's, a copy's, a leased pass's) replaces the file by a rename as before,
    with no registry of the passes under way to consult. One pass at a time per file (the
    run's locks); one write at a time (the pass waits for each)."""

    __slots__ = ("file", "last", "path", "size", "twin", "whole")

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: int | None = None
        self.twin: int | None = None
        self.size = 0
        #: What both files hold after the last write that ended well.
        self.last = b""
        #: False while the file is overwritten, and after a write that failed part way: the
        #: file may be torn then, and the twin must stay.
        self.whole = True

    def write(self, data: bytes, *, announces: bool) -> bytes:
        """Write ``data`` as the state file, durably (its bytes, and for a write that
        ``announces`` a request its name too); returns the bytes the file now holds."""
        if self.file is not None and len(data) <= self.size:
            return _in_place(self, data.ljust(self.size), announces=announces)
        return _remade(self, data, announces=announces)

    def end(self) -> None:
        """The pass is over: the twin blanked, unless a write failed part way (the file may
        be torn: the twin is what a reader then takes), and the descriptors closed; a write
        after it starts again from a rename. Blanked, not removed (a removal cost about 100
        µs of CPU a run, Dec 7): a file damaged after the pass has no twin to be read for it,
        and the next pass's first write makes the twin again."""
        if self.whole and self.twin is not None:
            with contextlib.suppress(OSError):  # not fsync'd: the file is whole and durable, its twin not needed
                _pwrite_all(self.twin, b" " * self.size)
        _close(self)
        self.whole = True


def _close(writer: Writer) -> None:
    for fd in (writer.file, writer.twin):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    writer.file = writer.twin = None


def write(path: str, data: bytes, *, announces: bool, writer: Writer | None = None, parents: bool = True) -> bytes:
    """Write ``data`` as the state file at ``path``, durably (its bytes, and for a write that
    ``announces`` a request its name too), by ``writer`` when a pass writes it (its path
    ``path``), else by a rename (``parents``: as ``replace_private``'s); returns the bytes
    the file now holds."""
    if writer is None:
        replace_private(path, data, durable=True, rename_durable=announces, parents=parents)
        return data
    assert writer.path == path, (writer.path, path)
    return writer.write(data, announces=announces)


def _remade(writer: Writer, data: bytes, *, announces: bool) -> bytes:
    """The file replaced by a rename, padded; for a write that announces a request, its twin
    made first (a write that fails there leaves the old file as it was), and both names made
    durable by the folder's fsync after the rename, so that the writes after it go in place."""
    path = writer.path
    _close(writer)
    padded = data.ljust(-(-(len(data) + ROOM) // BLOCK) * BLOCK)
    if not announces:  # a twin a failed write left stays: true still, no request went since
        replace_private(path, padded, durable=True, rename_durable=False, parents=False)
        writer.whole = True
        return padded
    twin = _made_twin(path, padded)
    try:
        replace_private(path, padded, durable=True, rename_durable=True, parents=False)  # and the twin's name
        file = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(twin)
        raise
    writer.twin, writer.file, writer.whole = twin, file, True
    writer.size, writer.last = len(padded), padded
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
            make_private_dir(os.path.dirname(twin) or os.curdir, durable=True, parents=False)
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


def _in_place(writer: Writer, padded: bytes, *, announces: bool) -> bytes:
    """The twin, then the file, overwritten. A write that announces nothing leaves the twin
    as it is: a cut that tears the file leaves the twin one write behind, true still, as a
    rename a cut takes back leaves the file (save_state)."""
    assert writer.file is not None and writer.twin is not None
    path = writer.path
    try:
        if announces:
            _pwrite_all(writer.twin, padded)
            _fdatasync(writer.twin)
    except OSError as exc:
        # The file is whole, the twin may not be: the next write makes both again.
        _close(writer)
        raise _named(exc, path) from None
    writer.whole = False  # until the file's bytes are durable: whatever stops this, the twin stays
    try:
        _pwrite_all(writer.file, padded)
        _fdatasync(writer.file)
    except OSError as exc:
        # The file may be torn and the twin holds a request that will not be sent: both
        # given back the last state, if they can be, or the twin (whole) is what is read.
        writer.whole = _put_back(writer)
        _close(writer)
        raise _named(exc, path) from None
    writer.last, writer.whole = padded, True
    return padded


def _put_back(writer: Writer) -> bool:
    """Both files given the last state that was written whole again; whether they were."""
    try:
        for fd in (writer.twin, writer.file):
            assert fd is not None
            _pwrite_all(fd, writer.last)
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
