"""File safety: how the package creates, opens, reads and walks files it did not make itself.

The lowest layer, beside ``errors.py``: the spool, sync, the importer and the viewer all
read folders received from elsewhere (an artifact unpacked from a tarball, a shared disk),
where a FIFO would block a reader forever, a link to ``/dev/zero`` would fill its memory, a
symbolic link could lead a walk out of its tree, and an odd file name could stop a report.
And everything the package writes is ``0600`` in folders ``0700`` (docs/spool-format.md,
section 1): a spool holds what an eval saw.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prime_runs_spool.errors import NoSuchPathError
from prime_runs_spool.plural import count, plural

#: The mode of every folder the package creates.
DIR_MODE = 0o700
#: The mode of every file the package writes.
FILE_MODE = 0o600
#: The permission bits of a mode that let anyone but the owner in.
OTHERS_ACCESS = 0o077
#: The errors that mean the disk (or the user's quota on it) is full: freeing space and
#: trying again is the way on, so they get one line naming the path rather than a traceback.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: The error that means the file system is mounted read-only: no retry and no code change
#: helps, only another place (or a remount), so it too gets one line naming the path.
READ_ONLY_FS_ERRNOS = frozenset({errno.EROFS})
#: The errors that mean the user may not write a path: one line where the path is one the
#: package (or the eval it records) was told to write, a traceback where it is someone's code.
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """Open (creating it ``0600``) a regular file this package writes outside the segment
    writer, and take away any access for others that an older version or another tool left
    (docs/spool-format.md, section 1: everything the package writes is ``0600``). A caller
    writing where others may have put something (an export folder) adds ``os.O_NOFOLLOW``.

    Anything but a regular file at ``path`` is an ``OSError`` (EINVAL, "not a regular
    file"), never waited on: opening a FIFO for writing blocks until someone reads it, so a
    FIFO where a page or an index was to be written hung the export, or the viewer."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads (O_NONBLOCK's answer instead of waiting)
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    try:
        if info.st_mode & OTHERS_ACCESS:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        pass  # not ours to change (another user's file): open it as it is
    return fd


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` as the whole of the file at ``path``, in place: ``0600``, never through
    a symbolic link (an ``OSError``, ELOOP), never into anything but a regular file. For
    files written into a folder the user named, which someone else may have prepared (``view
    --export``'s pages): a link there once had its target, a file of the user's, overwritten."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def make_private(path: str | os.PathLike[str]) -> None:
    """Make an existing file ``0600`` if anyone but its owner may use it, for files another
    program creates beside ours (SQLite's WAL sidecars); ``OSError`` if it cannot be looked
    at or changed."""
    if os.stat(path).st_mode & OTHERS_ACCESS:
        os.chmod(path, FILE_MODE)


def open_to_others(folder: str | os.PathLike[str], *, tighten: bool) -> tuple[list[str], list[str]]:
    """The files and folders at or under ``folder`` (a spool folder) that others may use, as
    ``(tightened, left)``: with ``tighten``, each is made ``0600`` (folders ``0700``) where
    the kernel allows it, else left and named. What the package writes is private whatever
    the umask, but a spool received from elsewhere is not: an artifact unpacked by a tool
    that drops modes (a zip) or applies its own umask (``cp -r``, ``tar`` as another user)
    gives every file ``0644``, and a spool holds what the eval saw. Symbolic links are
    neither followed nor changed; the names are relative to ``folder``."""
    tightened: list[str] = []
    left: list[str] = []
    top = os.fspath(folder)
    pending = [(top, os.path.basename(top.rstrip(os.sep)) + "/")]  # strings: no Path made per file
    while pending:
        path, name = pending.pop()
        try:
            info = os.lstat(path)
        except OSError:
            continue  # gone meanwhile, or unreadable: the reader reports what it cannot read
        if stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(OSError):
                pending += [(entry.path, os.path.join(name, entry.name)) for entry in os.scandir(path)]
        elif not stat.S_ISREG(info.st_mode):
            continue
        if not info.st_mode & OTHERS_ACCESS:
            continue
        shown = f"{name} {stat.S_IMODE(info.st_mode):04o}"
        try:
            if not tighten:
                raise PermissionError
            os.chmod(path, DIR_MODE if stat.S_ISDIR(info.st_mode) else FILE_MODE)
            tightened.append(shown)
        except OSError:
            left.append(shown)
    return sorted(tightened), sorted(left)


def open_to_others_lines(spool: str | os.PathLike[str], *, tighten: bool) -> list[str]:
    """What a report says of a spool folder others may read (:func:`open_to_others`): made
    private when ``tighten`` (sync, which writes beside it anyway), else named with the
    command that does it (``verify``, a dry run, a spool sync may not change)."""
    tightened, left = open_to_others(spool, tighten=tighten)
    lines = []
    if tightened:
        lines.append(f"{count(len(tightened), 'file or folder', 'files or folders')} of the spool "
                     f"{plural(len(tightened), 'was', 'were')} open to other users "
                     f"(e.g. {tightened[0]}): made private (files 0600, folders 0700)")
    if left:
        lines.append(f"{count(len(left), 'file or folder', 'files or folders')} of the spool "
                     f"{plural(len(left), 'is', 'are')} open to other users (e.g. {left[0]}); "
                     f"a spool holds what the eval saw: chmod -R go= {shell_word(spool)} (prime-runs sync does it "
                     "where it may write beside the spool)")
    return lines


#: The most :func:`read_regular_file` reads, and an object store's small reads: far more
#: than any sync state, etag, lease or import JSON file holds. One of gigabytes (a received
#: spool's ``sync/<dest>.json``) was read into memory whole.
MAX_SMALL_FILE_BYTES = 64 * 1024 * 1024


def read_regular_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path`` (a symlink is followed); an ``OSError``
    (EINVAL, "not a regular file") for anything else. For the small files read whole
    beside a spool or an eval's outputs (sync states and their etags, an import's JSON
    files): one that is a FIFO would block its reader at ``open`` forever, a link to
    ``/dev/zero`` would fill its memory, and a folder received from elsewhere (an artifact
    unpacked from a tarball) may hold either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        if info.st_size > MAX_SMALL_FILE_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_SMALL_FILE_BYTES:,} bytes", os.fspath(path))
        return file.read(MAX_SMALL_FILE_BYTES + 1)


def special_file_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (a symlink followed):
    ``"a FIFO"``, ``"a socket"``, ``"a device"``; None for a file, a folder, or nothing
    there. A command given one says so, rather than "nothing found" under it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def folder_blocker(path: str | os.PathLike[str]) -> str | None:
    """Why no folder can be made at ``path`` (``mkdir -p``), said of the entry in the way:
    a file or a device above it, a symbolic link to nothing or a loop of them on the way or
    there; None when it can be (or is one, or a reason lies elsewhere: a permission). The
    last part being a file or special file itself is its caller's own check."""
    path = Path(path)
    for entry in [path, *path.parents]:  # the deepest entry that exists decides
        try:
            os.lstat(entry)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as error:  # a loop above it: found further up
            if error.errno == errno.ELOOP:
                continue
            return None
        try:
            mode = os.stat(entry).st_mode
        except FileNotFoundError:
            return f"{entry} is a symbolic link to {os.readlink(entry)}, which does not exist"
        except OSError as error:
            return f"{entry} is a loop of symbolic links" if error.errno == errno.ELOOP else None
        if entry != path and not stat.S_ISDIR(mode):
            return f"{entry} is {special_file_kind(entry) or 'a file'}, not a folder"
        return None
    return None


def make_private_dir(path: str | os.PathLike[str], *, durable: bool = True, parents: bool = True) -> None:
    """Create a directory ``0700``, and every missing parent ``0700`` too (``os.makedirs``
    gives parents the umask's default mode, often ``0755``), durably: the folder holding each
    new entry is fsync'd before this returns. ``parents`` False: a missing parent is
    ``FileNotFoundError`` (a sync state's folder in a spool folder moved away meanwhile: a
    run folder made again at the old path held nothing but that state).

    A new folder's name lives in its parent, and until that parent is fsync'd a power cut
    may take the name back, and with it every file below, fsync'd or not: the first episode
    a run acknowledges, or the first sync state announced there, would be gone. Not
    ``durable``: for a cache, which a power cut may take back (a store sync's copies of
    the states it read: three fsyncs per run it met, on a disk the platform's database
    shares, where two syncers meet every run)."""
    path = Path(path)
    try:  # the common case, one folder missing under one that is there: no stat asked first
        os.mkdir(path, DIR_MODE)
    except FileNotFoundError:
        if not parents:
            raise
    except OSError:
        pass  # there already, or an error: the walk below finds which
    else:
        if durable:
            fsync_folder(path.parent)
        return
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            pass  # made by a racing process, which may not have fsync'd its parent yet
    for folder in missing if durable else ():
        fsync_folder(folder.parent)


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make the names in ``folder`` (its new entries) durable, not just their content."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: This process's id, asked again in a forked child: ``os.getpid`` is a system call a write.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def replace_private(path: Path, data: bytes, *, durable: bool, rename_durable: bool | None = None,
                    parents: bool = True) -> None:
    """Replace ``path`` with ``data`` in one rename: the file 0600, its folder made 0700 when
    missing, no ``.tmp`` left behind when anything fails (a full disk, a folder where the
    file goes), and an ``OSError`` that names no file (a full disk's write) naming ``path``. ``durable``: the data and the rename are fsync'd (a sync state, an import's
    mark); without it, a cache that can be made again (a copy of a state held in a store).
    ``rename_durable`` False (with ``durable``): the data is fsync'd before the rename, so
    whichever of the two files a power cut leaves under the name is whole, but the folder is
    not, so the cut may leave the old one: for a write its reader may find one write behind.
    The temporary name holds the process and the thread: two writers never share one.
    ``parents``: as :func:`make_private_dir`'s, for the file's folder."""
    folder, name = os.path.split(os.fspath(path))  # strings: a state is written several times a run
    folder = folder or os.curdir
    tmp = os.path.join(folder, f".{name}.{_PID[0]}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    except FileNotFoundError:  # the first file of this folder: the folder first
        make_private_dir(folder, durable=durable, parents=parents)  # a durable file's new folders' names durable too
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a write or fsync: name the file it was for
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
        raise
    if durable and rename_durable is not False:
        fsync_folder(folder)


def unreadable_message(exc: OSError, where: str | os.PathLike[str]) -> str:
    """How every command names what it could not read (the error's file, else ``where``), and why."""
    return f"{exc.filename or where}: cannot be read ({exc.strerror or exc})"


def is_utf8(text: str) -> bool:
    """Whether ``text`` (a path as Python decodes a file name) is valid UTF-8: a name that
    is not decodes to lone surrogates, which orjson refuses to write."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def shell_word(value: str | os.PathLike[str]) -> str:
    """``value`` (a path, an option) as one word of a command a message suggests to paste: quoted
    as POSIX shells read it (``shlex.quote``), or, for a name that is not UTF-8 or holds a
    character that is not printable (a line feed, an escape sequence's ESC), in bash's and
    zsh's ``$'...'`` with each byte outside printable ASCII as ``\\xNN``: quoted as it was, its
    odd bytes went to the terminal raw, and pasted back (a replacement character by then) the
    command named another folder; a line feed split the message's line, and :func:`shown`,
    which keeps it on one, turned it into a backslash and an ``n`` inside quotes. Every
    suggested command quotes its words here."""
    text = os.fspath(value)
    if is_utf8(text) and text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(chr(byte) if 0x20 <= byte < 0x7F and byte not in b"'\\" else f"\\x{byte:02x}"
                          for byte in os.fsencode(text)) + "'"


def shell_line(words: Iterable[str | os.PathLike[str]]) -> str:
    """A command a message suggests, each word :func:`shell_word`."""
    return " ".join(map(shell_word, words))


def printable(text: str) -> str:
    """``text`` (a path as Python decodes a file name) as valid UTF-8: a name that is not
    UTF-8 decodes to lone surrogates, which a JSON encoder, a URL or a web page refuses;
    its undecodable bytes are shown as ``\\xNN`` instead, so one odd folder name never
    stops a report or a page that lists the other runs."""
    if is_utf8(text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def printable_data(value: object) -> object:
    """JSON data with every string (keys too) made :func:`printable`: what a path under a
    folder whose name is not UTF-8 leaves in a report or a config, which orjson refuses."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_data(v) for v in value]
    return value


def shown(text: str) -> str:
    """``text`` (a name from a file system, or a message quoting one) for one line of a
    terminal or a log: :func:`printable`, and each character that is not printable (a line
    feed, a carriage return, an escape sequence's ESC) as its escape (``\\n``, ``\\x1b``),
    so that a folder's name can neither split a report's line nor drive the terminal."""
    text = printable(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


# -- walking a tree received from elsewhere ------------------------------------------------

#: Told of each directory under the paths that could not be read whole (a run may hide in
#: it), with the error (whose ``filename`` is what failed: the directory itself, its
#: ``spool/`` or a file in it); the walk then goes on with the rest of the tree.
OnUnreadable = Callable[[Path, OSError], None]


def joined(folder: str | os.PathLike[str], *names: str) -> str:
    """``os.path.join(folder, *names)`` for plain names (no separator in them, none absolute),
    as a string: the paths a walk and a no-op re-sync ask a ``stat`` of, several a run, where
    ``os.path.join``'s checks cost more than the call they prepare."""
    return os.sep.join((os.fspath(folder), *names))


def pass_over(path: Path, exc: OSError) -> None:
    """For a caller with nobody to tell: an unreadable directory has nothing it can read."""


#: Told of each symbolic link below the paths that names a folder the walk reaches no other
#: way (the link as met, its target's real path): what it holds is not found, and the person
#: who asked is told so (``skipped_link_message``), never left to think it was looked at.
OnLink = Callable[[Path, Path], None]


def skipped_link_message(link: Path, target: Path) -> str:
    """The one line every command prints for a link ``OnLink`` was told of."""
    return (f"skipped symbolic link {shown(str(link))} -> {shown(str(target))}: links are not followed; "
            f"give {shown(str(target))} as a path itself to include what it holds")


def each_once(paths: Iterable[str | os.PathLike[str]],
              found_under: Callable[[Path, Callable[[Path], None] | None], Iterator[Path]],
              report: OnUnreadable = pass_over, on_link: OnLink | None = None) -> Iterator[Path]:
    """What ``found_under`` finds below each path, each folder once (by its real path); a path
    that does not exist raises :class:`NoSuchPathError`, one that cannot be read is reported.
    One walk meets a folder once (it follows no link), so the real paths are only taken when
    there are several paths to walk.

    ``found_under(root, link_met)`` tells ``link_met`` of each link to a folder its walk
    passed over; ``on_link`` hears, once each, of those whose target lies under none of the
    paths (a link into the tree, as verifiers' ``logs/latest``, names what the walk reaches
    anyway, so nothing was missed)."""
    paths = list(paths)
    seen: set[Path] = set()
    link_met = None if on_link is None else _with_target(links_outside(paths, on_link))
    for given in paths:
        root = Path(given)
        try:
            os.stat(root)
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchPathError(f"path does not exist: {given}") from None
        except OSError as exc:
            report(root, exc)
            continue
        for found in found_under(root, link_met):
            if len(paths) == 1:
                yield found
                continue
            key = found.resolve()
            if key not in seen:
                seen.add(key)
                yield found


def _with_target(on_link: OnLink) -> Callable[[Path], None]:
    """``on_link`` for a walk, which knows a link's path; its target's real path added."""
    return lambda link: on_link(link, Path(os.path.realpath(link)))


def links_outside(paths: Iterable[str | os.PathLike[str]], on_link: OnLink) -> OnLink:
    """``on_link``, told once a link, of the links whose target lies under none of ``paths``
    (their real paths, taken at the first link): a link into the tree names what the walk
    reaches anyway."""
    paths = list(paths)
    told: set[Path] = set()
    roots: list[str] = []

    def told_of(link: Path, target: Path) -> None:
        if link in told:
            return
        told.add(link)
        if not roots:
            roots.extend(os.path.realpath(path) for path in paths)
        real = os.fspath(target)
        if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
            on_link(link, target)

    return told_of


#: A folder's entries by name, as one listing gave them (``DirEntry``: its type without a
#: ``stat``); what a walk hands its ``matches`` (None: the folder could not be listed).
Listing = dict[str, os.DirEntry[str]]


def walk_folders(root: Path, matches: Callable[[Path, Listing | None], bool], prune: Callable[[Path, str], bool],
                 report: OnUnreadable = pass_over,
                 folder_seen: Callable[[Path], None] | None = None,
                 link_met: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Folders below ``root`` (itself included) that ``matches``, in name order; symbolic
    links are not followed, and a child folder ``prune(folder, name)`` says no to is not
    entered. A folder that cannot be read is told to ``report`` and not entered; every
    folder entered that does not match is told to ``folder_seen``; every symbolic link to a
    folder passed over (one ``prune`` would not have refused) is told to ``link_met``, so
    that what a link leads to is never left out in silence (docs/cli.md, "Symbolic links below the paths").

    Each folder is listed before ``matches`` is asked, which is given the listing: what it
    looks for among the folder's entries is answered from it, not by a system call a name
    (an eval's outputs, a run's ``spool/``: three a run for a sync's two walks). A folder
    that cannot be listed (searchable, not readable) is still asked, without it.

    Depth first with a stack of its own, not by recursion: a tree a thousand folders deep
    ended every command in a RecursionError traceback. Each folder's children are looked
    at one by one as the walk comes back to it, so folders are found, and unreadable ones
    reported, in the order a recursive walk gives."""
    pending: list[Iterator[Path]] = [iter((root,))]
    while pending:
        folder = next(pending[-1], None)
        if folder is None:
            pending.pop()
            continue
        try:
            if folder is root and not folder.is_dir():  # below it, the listing said so
                continue
        except OSError as exc:
            report(folder, exc)
            continue
        unlisted = None
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except FileNotFoundError:
            continue  # removed while we walked: nothing there any more
        except OSError as exc:
            entries, unlisted = [], exc
        try:
            found = matches(folder, None if unlisted is not None else {entry.name: entry for entry in entries})
        except FileNotFoundError:
            continue
        except OSError as exc:
            report(folder, exc)
            continue
        if found:
            yield folder
        elif folder_seen is not None:
            folder_seen(folder)
        if unlisted is not None:
            report(folder, unlisted)
            continue
        pending.append(_child_folders(folder, entries, prune, report, link_met))


def _child_folders(folder: Path, entries: list[os.DirEntry[str]], prune: Callable[[Path, str], bool],
                   report: OnUnreadable, link_met: Callable[[Path], None] | None) -> Iterator[Path]:
    """The entries of ``folder`` that ``walk_folders`` enters, each judged only when reached."""
    for entry in entries:
        try:
            if entry.is_symlink():
                if link_met is not None and _names_folder(entry) and not prune(folder, entry.name):
                    link_met(folder / entry.name)
                continue
            if not entry.is_dir(follow_symlinks=False):
                continue
            if prune(folder, entry.name):
                continue
        except OSError as exc:
            report(Path(entry.path), exc)
            continue
        yield folder / entry.name  # the folder's parts reused, not the whole path parsed again


def _names_folder(link: os.DirEntry[str]) -> bool:
    """Whether a symbolic link leads to a folder (a dangling one, or one to a file, does not)."""
    try:
        return link.is_dir(follow_symlinks=True)
    except OSError:
        return False


#: Any write permission: the owner's, the group's or others'.
_ANY_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
#: Whether ``os.access(path, os.W_OK)`` is False on a read-only mount (Linux: ``EROFS``).
_ACCESS_SAYS_READ_ONLY_MOUNT = sys.platform.startswith("linux")


def is_read_only(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` must not be written: the kernel says so (``os.access``: a read-only
    mount, an immutable folder), or no one has write permission on it. The second is
    honoured even for root, who may write anyway: a folder its owner made read-only (an
    artifact unpacked 0555) is left as it is. One rule for spools and for plain eval outputs
    (importer/places.py). A read-only mount: Linux's ``access`` says so (``EROFS``, a
    read-only bind mount too), so no ``statvfs`` is asked there, a system call a run a sync
    finds; other kernels answer for permissions only."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True
    if not os.access(path, os.W_OK) or not mode & _ANY_WRITE:
        return True
    if _ACCESS_SAYS_READ_ONLY_MOUNT:
        return False
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
