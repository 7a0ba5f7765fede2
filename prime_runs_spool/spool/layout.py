"""Where a run's spool lives on disk (docs/spool-format.md, section 1).

Only names and directories: nothing here reads or writes a segment's content. Keeping the
naming rules in one module means the writer, the reader, sync and ``find_runs`` can never
disagree about which files form a run's log. The spool's own files under
``<run_dir>/spool/`` are named here:

- ``seg-NNNNNN.jsonl`` a segment, ``seg-NNNNNN.lock`` its writer lock (and, for a moment,
  ``seg-NNNNNN.lock.new``, the replacement of a lock file someone deleted),
  ``seg-NNNNNN.durable`` its live writer's durable mark;
- ``run.lock`` the run lock, held while a writer opens the run.

Readers and sync look only at ``seg-*`` files, so the layers above keep their own files in
the same folder and name them themselves: sync's state (``sync/state.py``), its lock
(``sync/many.py``) and, in an object store, its lease (``sync/store_sync.py``); the online
shipper's log (``runner/online.py``); an import's mark and lock, and the agreement with a
``traces.jsonl`` (``importer/paths.py``).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import NotASegmentFileError, SegmentsGoneError
from prime_runs_spool.files import (Listing, OnLink, OnUnreadable, each_once, joined, make_private_dir, pass_over,
                                   walk_folders)

SPOOL_DIRNAME = "spool"
#: Held (flock) by a writer while it opens the run: opening is atomic against another opener.
RUN_LOCK_NAME = "run.lock"
#: The suffix of a lock file: a segment's writer lock, and sync's copy locks (sync/copies.py).
LOCK_SUFFIX = ".lock"
_SEGMENT_PREFIX = "seg-"
_SEGMENT_RE = re.compile(re.escape(_SEGMENT_PREFIX) + r"(\d{6,})\.jsonl\Z")
_DURABLE_MARK_RE = re.compile(re.escape(_SEGMENT_PREFIX) + r"\d{6,}\.durable\Z")


def spool_dir(run_dir: str | os.PathLike[str]) -> Path:
    try:
        return _spool_dir_of(run_dir)
    except TypeError:  # a path-like that is not hashable
        return Path(run_dir) / SPOOL_DIRNAME


@functools.lru_cache(maxsize=4096)
def _spool_dir_of(run_dir: str | os.PathLike[str]) -> Path:
    """Kept per run folder: a pass asks for it a dozen times, and each ``Path`` made and
    joined anew cost 5 to 12 µs (a tenth of a millisecond a run of a sync of many)."""
    return Path(run_dir) / SPOOL_DIRNAME


def spool_identity(run_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """Which folder ``run_dir``'s spool is (device, inode): a run moved away while read, and
    another spool made at its path since (outputs written again by path, imported), are
    told apart from the spool a reader began with, which the path alone cannot. None when
    there is none there, or it is no local folder (a run in an object store)."""
    try:
        info = os.stat(spool_dir(run_dir))
    except (OSError, TypeError, ValueError):
        return None
    return info.st_dev, info.st_ino


def segment_name(index: int) -> str:
    return f"{_SEGMENT_PREFIX}{index:06d}.jsonl"


def segment_path(run_dir: str | os.PathLike[str], index: int) -> Path:
    return spool_dir(run_dir) / segment_name(index)


def lock_path(run_dir: str | os.PathLike[str], index: int) -> Path:
    """The writer lock of segment ``index``: held (flock) for as long as its writer lives."""
    return lock_path_of(segment_path(run_dir, index))


def durable_mark_path(run_dir: str | os.PathLike[str], index: int) -> Path:
    """Where segment ``index``'s live writer publishes how many of its bytes are fsync'd."""
    return durable_mark_path_of(segment_path(run_dir, index))


def lock_path_of(segment: Path) -> Path:
    """The writer lock beside a segment file (``seg-NNNNNN.lock``)."""
    return segment.with_suffix(LOCK_SUFFIX)


def lock_replacement_path_of(segment: Path) -> Path:
    """Where a writer builds a new lock file before renaming it over a deleted one."""
    return segment.with_suffix(".lock.new")


def run_lock_path(run_dir: str | os.PathLike[str]) -> Path:
    """The run lock: opening a run (scan, then create a segment) holds it (docs/spool-format.md, 1.)."""
    return spool_dir(run_dir) / RUN_LOCK_NAME


def durable_mark_path_of(segment: Path) -> Path:
    """The durable mark beside a segment file (``seg-NNNNNN.durable``)."""
    return segment.with_suffix(".durable")


def segment_version(segment: Any) -> str | None:
    """Which version of a segment file this is, so that one copied or uploaded again can be
    told from the one read before although its size is the same (a writer writes its lines
    into padding: docs/spool-format.md, section 5). A local file: its inode and modification
    time; a store's segment: its etag (None when the store gives none)."""
    own = getattr(segment, "version", None)
    if own is not None:
        return own()
    return _version_of(os.stat(segment))


def segment_at(run_dir: str | os.PathLike[str], index: int) -> Any:
    """Segment ``index`` of the run, for a question about that one file: a local run's path,
    no listing taken (it may not exist); a run in an object store's own segment, from the
    listing it keeps (None when it has none of that index)."""
    own = getattr(run_dir, "list_segments", None)
    if own is not None:
        return dict(own()).get(index)
    return segment_path(run_dir, index)


def segment_size_and_version(segment: Any) -> tuple[int, str | None]:
    """A segment's size and :func:`segment_version`, a local file's from one ``stat``."""
    own = getattr(segment, "version", None)
    if own is not None:
        return segment.stat().st_size, own()
    info = os.stat(segment)
    return info.st_size, _version_of(info)


def _version_of(info: os.stat_result) -> str:
    return f"{info.st_ino}:{info.st_mtime_ns}"


def segment_index(name: str) -> int | None:
    """The index in a segment file's name, or None if the name is not a segment's."""
    match = _SEGMENT_RE.match(name)
    return int(match.group(1)) if match else None


def is_segment_family(name: str) -> bool:
    """Whether ``name`` is a segment's, its writer lock's or its durable mark's: the files a
    writer changes (a watcher ignores the rest of the spool folder, sync's own files)."""
    return name.startswith(_SEGMENT_PREFIX)


def segment_index_of(path: str | os.PathLike[str]) -> int | None:
    """The index of the segment at ``path`` (any directory), or None if it is not a segment."""
    return segment_index(Path(path).name)


def list_segments(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The run's segments as ``(index, path)``, in index order: the order of the run's log.

    A run read from an object store (``prime_runs_spool.store.source.StoreRun``) lists its
    own segments, from the store's listing; every reader of a run goes through here."""
    own = getattr(run_dir, "list_segments", None)
    if own is not None:
        return own()
    folder = spool_dir(run_dir)
    return [(index, folder / name) for index, name in _segment_names(folder)]


def segment_follows(run_dir: str | os.PathLike[str], index: int | None) -> bool:
    """Whether a segment follows segment ``index`` (None: whether the run has any). A local
    run answers by one ``lstat`` of the next segment's name (a resumed writer makes the
    segment after the last; anything by that name keeps the run open), not a listing of its
    folder, which a sync of every new run asked at its pass's end; a run in an object store
    from its listing, as :func:`list_segments` dispatches."""
    if index is not None and getattr(run_dir, "list_segments", None) is None:
        return os.path.lexists(segment_path(run_dir, index + 1))
    segments = list_segments(run_dir)
    return bool(segments) and segments[-1][0] != index


def _segment_names(folder: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """The segment files in a spool folder as ``(index, name)``, in index order (none when
    the folder is gone); :class:`NotASegmentFileError` for one that is not a regular file."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        index = segment_index(entry.name)
        if index is not None and index > 0:
            if not entry.is_file():  # d_type, no extra system call; a symlink is followed
                raise NotASegmentFileError(errno.EINVAL, "not a regular file", entry.path)
            found.append((index, entry.name))
    found.sort()
    return found


def ensure_spool_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Create the run directory and its spool folder (``0700`` when we create them)."""
    folder = spool_dir(run_dir)
    make_private_dir(folder)
    return folder


def is_run_dir(path: Path, listing: Listing | None = None) -> bool:
    """A run directory is one whose (real, not symlinked) ``spool/`` holds a segment.

    Raises :class:`OSError` (its ``filename`` the directory that could not be read) when
    ``path`` or its ``spool/`` cannot be looked into: "cannot tell" is not "no".
    ``listing``: ``path``'s, as a walk took it (``files.walk_folders``), which says whether
    ``spool/`` is a folder without an ``lstat``.
    """
    folder = joined(path, SPOOL_DIRNAME)  # a string: asked of every folder a walk meets
    if listing is not None:
        entry = listing.get(SPOOL_DIRNAME)
        try:
            if entry is None or not entry.is_dir(follow_symlinks=False):
                return False
        except OSError as exc:
            raise _unreadable(exc, path) from None
        return _holds_a_segment(folder)
    try:
        mode = os.lstat(folder).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise _unreadable(exc, path) from None
    if not stat.S_ISDIR(mode):
        return False
    return _holds_a_segment(folder)  # its OSError names the spool folder or the file


def _holds_a_segment(folder: str) -> bool:
    """Whether the spool folder holds a segment; :class:`SegmentsGoneError` when it holds
    none but a segment's durable mark is left: a run was written there and its segments
    were deleted (``find -name '*.jsonl' -delete``). Passed over, the run left every
    command's walk without a word while its episodes were gone."""
    if _segment_names(folder):
        return True
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return False
    marks = sorted(name for name in names if _DURABLE_MARK_RE.match(name))
    if marks:
        raise SegmentsGoneError(errno.ENOENT, f"no segment left beside the durable mark {marks[0]}: the run's "
                                "episodes are gone from this copy (what a sync shipped is on its destination)",
                                folder)
    return False


def is_segment_file(path: Path) -> bool:
    """Whether ``path`` is a file named like a segment inside a run's ``spool/`` folder."""
    return (segment_index(path.name) is not None and path.parent.name == SPOOL_DIRNAME
            and path.is_file())


def find_runs(paths: Iterable[str | os.PathLike[str]], on_unreadable: OnUnreadable | None = None,
              on_folder: Callable[[Path], None] | None = None, on_link: OnLink | None = None) -> Iterator[Path]:
    """Every run directory under ``paths``, each once, in a deterministic order.

    A path may be a run directory, its ``spool/`` folder, one of its segment files (which
    stands for its whole run: a segment is only meaningful in its run's log), or any folder
    above runs. Symbolic
    links below a given path are not followed, so a walk never leaves the tree it was given
    (nor loops). A path that does not exist raises :class:`NoSuchPathError`: a typo must not
    look like "nothing to do".

    A directory that cannot be read (permissions, an I/O error, a stale mount) never stops
    the walk: ``on_unreadable`` is told of it (in walk order, between the runs) and the walk
    goes on. Every command passes one, so what it could not read is named to the person
    who asked; without one (a caller with nobody to tell) it is passed over.

    ``on_folder`` is told of every folder the walk looked into that is not a run (where a
    new run could appear: a follower watches them).

    ``on_link`` is told of each symbolic link to a folder outside the paths that the walk
    passed over (once each; ``files.each_once``): a command names it, so runs kept elsewhere
    and linked in are never taken for synced.
    """
    report = on_unreadable or pass_over

    def runs_under(root: Path, link_met: Callable[[Path], None] | None) -> Iterator[Path]:
        if is_segment_file(root):
            return iter([root.parent.parent])
        try:
            spool_of_run = root.name == SPOOL_DIRNAME and is_run_dir(root.parent)
        except OSError as exc:
            report(root.parent, exc)
            return iter(())
        if spool_of_run:
            return iter([root.parent])
        last_run: list[Path] = []  # the folder last found a run: its spool/ is not entered

        def is_run(folder: Path, listing: Listing | None) -> bool:
            if is_run_dir(folder, listing):
                last_run[:] = [folder]
                return True
            return False

        def spool_of_a_run(folder: Path, name: str) -> bool:
            return name == SPOOL_DIRNAME and ((bool(last_run) and folder is last_run[0]) or is_run_dir(folder))

        return walk_folders(root, is_run, spool_of_a_run, report, on_folder, link_met)

    return each_once(paths, runs_under, report, on_link)


def _unreadable(exc: OSError, directory: Path) -> OSError:
    """``exc`` naming the directory whose contents could not be read."""
    return type(exc)(exc.errno, exc.strerror, str(directory))
