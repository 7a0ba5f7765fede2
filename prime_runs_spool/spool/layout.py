"""Where a run's spool lives on disk (docs/spool-format.md, section 1).

Only names and directories: nothing here reads or writes a segment's content. Keeping the
naming rules in one module means the writer, the reader, sync and ``find_runs`` can never
disagree about which files form a run's log. Every file under ``<run_dir>/spool/`` is
named here:

- ``seg-NNNNNN.jsonl`` a segment, ``seg-NNNNNN.lock`` its writer lock (and, for a moment,
  ``seg-NNNNNN.lock.new``, the replacement of a lock file someone deleted),
  ``seg-NNNNNN.durable`` its live writer's durable mark;
- ``run.lock`` the run lock, held while a writer opens the run;
- ``sync/<dest>.json`` and ``sync/<dest>-replay-<id>.json`` sync's state per destination,
  ``sync.lock`` the run's sync lock, ``shipper.log`` the online shipper's log;
- in an object store only, ``sync.lease.json``, a syncer's lease on the run, and
  ``seg-NNNNNN.jsonl.live``, the mirror's word that the segment's writer lives;
- ``import.json`` and ``import.lock``, in a spool ``prime-runs import`` wrote: its source,
  and the lock an import holds while it writes (an import catching a spool the eval wrote
  up with its ``traces.jsonl`` takes the same lock);
- ``traces-agreed.json``, in a spool the eval wrote: the ``traces.jsonl`` and segments it
  was last found to agree with, by episode id (importer/agreement.py).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import NoSuchPathError, NotASegmentFileError

SPOOL_DIRNAME = "spool"
#: Sync's state files, one per destination (and per replay), inside the spool folder.
SYNC_DIRNAME = "sync"
#: The run's sync lock: at most one sync or follower works on a run at a time.
SYNC_LOCK_NAME = "sync.lock"
#: Held (flock) by a writer while it opens the run: opening is atomic against another opener.
RUN_LOCK_NAME = "run.lock"
#: The online shipper's log (verify and sync only look at ``seg-*`` files).
SHIPPER_LOG_NAME = "shipper.log"
#: verifiers' own results file, beside the spool in the run directory (not ours: read only).
VERIFIERS_TRACES_NAME = "traces.jsonl"
#: In an object store, beside a run's segments: the lease a syncer holds on the run while it
#: works on it (the store's counterpart of ``sync.lock``, docs/sync.md "Object stores").
SYNC_LEASE_NAME = "sync.lease.json"
#: In an object store, beside a segment ``prime-runs mirror`` copies while its writer lives:
#: ``seg-NNNNNN.jsonl.live``, kept fresh by the mirror, removed once the writer is gone
#: (the store's counterpart of a segment's writer lock, docs/sync.md "Object stores").
LIVE_MARKER_SUFFIX = ".live"
#: In this user's cache, outside any spool (sync/user_cache.py): the folder of the copy locks,
#: which keep syncs of copies of one spool folder apart (sync/copies.py, docs/sync.md "Concurrency").
COPY_LOCKS_DIRNAME = "copies"
#: In this user's cache: the viewer's full-text search indexes, one SQLite file per run
#: (viewer/search.py); never in a run's folder, which the viewer only reads.
VIEWER_SEARCH_DIRNAME = "viewer-search"
DIR_MODE = 0o700
FILE_MODE = 0o600

#: The files SQLite keeps beside a database in WAL mode (the local platform's store).
SQLITE_SIDECAR_SUFFIXES = ("-wal", "-shm")

_SEGMENT_PREFIX = "seg-"
_SEGMENT_RE = re.compile(re.escape(_SEGMENT_PREFIX) + r"(\d{6,})\.jsonl\Z")


def spool_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / SPOOL_DIRNAME


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
    return segment.with_suffix(".lock")


def copy_lock_path(folder: Path, stem: str) -> Path:
    """One run's copy lock on one destination (flock'd, never deleted; it holds its last
    holder's note, sync/copies.py): ``stem`` names the run and destination."""
    return folder / f"{stem}.lock"


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
    info = os.stat(segment)
    return f"{info.st_ino}:{info.st_mtime_ns}"


def sync_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Where sync keeps its state files for the run."""
    return spool_dir(run_dir) / SYNC_DIRNAME


#: What a replay id may be. It is part of a state file's name (and of an object's key), so
#: it holds nothing that could name a file elsewhere: letters, digits, ``_`` and ``-``. The
#: ids sync makes are uuid4 hex (32 of these).
REPLAY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def valid_replay_id(replay_id: object) -> bool:
    return isinstance(replay_id, str) and REPLAY_ID.fullmatch(replay_id) is not None


def sync_state_path(run_dir: str | os.PathLike[str], dest_key: str, replay_id: str | None = None) -> Path:
    """Sync's state for one destination (and, for ``--replay``, one replay of it). A replay
    id that is not :data:`REPLAY_ID` is refused, so no id can name a file elsewhere."""
    if replay_id is not None and not valid_replay_id(replay_id):
        raise ValueError(f"not a replay id: {replay_id!r} (1 to 64 letters, digits, '_' or '-')")
    name = dest_key if replay_id is None else f"{dest_key}-replay-{replay_id}"
    return sync_dir(run_dir) / f"{name}.json"


def replay_state_glob(dest_key: str) -> str:
    """The pattern matching every replay state file of one destination (see sync_state_path)."""
    return f"{dest_key}-replay-*.json"


def sync_lease_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where a run in an object store keeps its syncer's lease (relative to the run)."""
    return spool_dir(run_dir) / SYNC_LEASE_NAME


def state_etag_path(state_path: Path) -> Path:
    """Beside a locally cached copy of a state kept in an object store: the etag it had."""
    return state_path.with_name(f"{state_path.name}.etag")


def sync_lock_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / SYNC_LOCK_NAME


def shipper_log_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / SHIPPER_LOG_NAME


def verifiers_traces_path(run_dir: str | os.PathLike[str]) -> Path:
    """verifiers' ``traces.jsonl`` of a run (its results; ``--resume`` rewrites it)."""
    return Path(run_dir) / VERIFIERS_TRACES_NAME


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
            found.append((index, folder / entry.name))
    found.sort()
    return found


def ensure_spool_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Create the run directory and its spool folder (``0700`` when we create them)."""
    folder = spool_dir(run_dir)
    make_private_dir(folder)
    return folder


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """Open (creating it ``0600``) a file this package writes outside the segment writer,
    and take away any access for others that an older version or another tool left
    (docs/spool-format.md, section 1: everything the package writes is ``0600``)."""
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        pass  # not ours to change (another user's file): open it as it is
    return fd


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


def make_private_dir(path: str | os.PathLike[str]) -> None:
    """Create a directory ``0700``, and every missing parent ``0700`` too (``os.makedirs``
    gives parents the umask's default mode, often ``0755``), durably: the folder holding each
    new entry is fsync'd before this returns.

    A new folder's name lives in its parent, and until that parent is fsync'd a power cut
    may take the name back, and with it every file below, fsync'd or not: the first episode
    a run acknowledges, or the first sync state announced there, would be gone."""
    path = Path(path)
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
    for folder in missing:
        fsync_folder(folder.parent)


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make the names in ``folder`` (its new entries) durable, not just their content."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_database(path: str | os.PathLike[str]) -> None:
    """Make sure an SQLite database and its WAL sidecars are ``0600`` before SQLite opens
    them: SQLite creates the sidecars with the database file's mode, so creating the
    database ``0600`` first is enough for new files; existing ones are tightened."""
    os.close(open_private(path, os.O_RDWR))
    for suffix in SQLITE_SIDECAR_SUFFIXES:
        sidecar = f"{os.fspath(path)}{suffix}"
        try:
            if os.stat(sidecar).st_mode & 0o077:
                os.chmod(sidecar, FILE_MODE)
        except OSError:
            pass


def is_run_dir(path: Path) -> bool:
    """A run directory is one whose (real, not symlinked) ``spool/`` holds a segment.

    Raises :class:`OSError` (its ``filename`` the directory that could not be read) when
    ``path`` or its ``spool/`` cannot be looked into: "cannot tell" is not "no".
    """
    folder = path / SPOOL_DIRNAME
    try:
        mode = os.lstat(folder).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise _unreadable(exc, path) from None
    if not stat.S_ISDIR(mode):
        return False
    return bool(list_segments(path))  # its OSError names the spool folder or the file


def is_segment_file(path: Path) -> bool:
    """Whether ``path`` is a file named like a segment inside a run's ``spool/`` folder."""
    return (segment_index(path.name) is not None and path.parent.name == SPOOL_DIRNAME
            and path.is_file())


def _unreadable(exc: OSError, directory: Path) -> OSError:
    """``exc`` naming the directory whose contents could not be read."""
    return type(exc)(exc.errno, exc.strerror, str(directory))


def unreadable_message(exc: OSError, where: str | os.PathLike[str]) -> str:
    """How every command names what it could not read (the error's file, else ``where``), and why."""
    return f"{exc.filename or where}: cannot be read ({exc.strerror or exc})"


#: Told of each directory under the paths that could not be read whole (a run may hide in
#: it), with the error (whose ``filename`` is what failed: the directory itself, its
#: ``spool/`` or a file in it); the walk then goes on with the rest of the tree.
OnUnreadable = Callable[[Path, OSError], None]


def _pass_over(path: Path, exc: OSError) -> None:
    """For a caller with nobody to tell: an unreadable directory has no runs it can read."""


def _no_folder(folder: Path) -> None:
    """For a caller that does not watch the folders a walk went through."""


def printable(text: str) -> str:
    """``text`` (a path as Python decodes a file name) as valid UTF-8: a name that is not
    UTF-8 decodes to lone surrogates, which a JSON encoder, a URL or a web page refuses;
    its undecodable bytes are shown as ``\\xNN`` instead, so one odd folder name never
    stops a report or a page that lists the other runs."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def find_runs(paths: Iterable[str | os.PathLike[str]], on_unreadable: OnUnreadable | None = None,
              on_folder: Callable[[Path], None] | None = None) -> Iterator[Path]:
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
    """
    report = on_unreadable or _pass_over
    folder_seen = on_folder or _no_folder

    def runs_under(root: Path) -> Iterator[Path]:
        if is_segment_file(root):
            return iter([root.parent.parent])
        try:
            spool_of_run = root.name == SPOOL_DIRNAME and is_run_dir(root.parent)
        except OSError as exc:
            report(root.parent, exc)
            return iter(())
        if spool_of_run:
            return iter([root.parent])
        return _walk(root, is_run_dir, lambda folder, name: name == SPOOL_DIRNAME and is_run_dir(folder),
                     report, folder_seen)

    return _each_once(paths, runs_under, report)


def _each_once(paths: Iterable[str | os.PathLike[str]], found_under: Callable[[Path], Iterator[Path]],
               report: OnUnreadable = _pass_over) -> Iterator[Path]:
    """What ``found_under`` finds below each path, each folder once (by its real path); a path
    that does not exist raises :class:`NoSuchPathError`, one that cannot be read is reported."""
    seen: set[Path] = set()
    for given in paths:
        root = Path(given)
        try:
            os.stat(root)
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchPathError(f"path does not exist: {given}") from None
        except OSError as exc:
            report(root, exc)
            continue
        for found in found_under(root):
            key = found.resolve()
            if key not in seen:
                seen.add(key)
                yield found


def _walk(root: Path, matches: Callable[[Path], bool], prune: Callable[[Path, str], bool],
          report: OnUnreadable = _pass_over, folder_seen: Callable[[Path], None] = _no_folder) -> Iterator[Path]:
    """Folders below ``root`` (itself included) that ``matches``, in name order; symbolic
    links are not followed, and a child folder ``prune(folder, name)`` says no to is not
    entered. A folder that cannot be read is told to ``report`` and not entered; every
    folder entered that does not match is told to ``folder_seen``.

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
            if not folder.is_dir():
                continue
            found = matches(folder)
        except FileNotFoundError:
            continue  # removed while we walked: nothing there any more
        except OSError as exc:
            report(folder, exc)
            continue
        if found:
            yield folder
        else:
            folder_seen(folder)
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            report(folder, exc)
            continue
        pending.append(_child_folders(folder, entries, prune, report))


def _child_folders(folder: Path, entries: list[os.DirEntry[str]], prune: Callable[[Path, str], bool],
                   report: OnUnreadable) -> Iterator[Path]:
    """The entries of ``folder`` that ``_walk`` enters, each judged only when reached."""
    for entry in entries:
        try:
            if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                continue
            if prune(folder, entry.name):
                continue
        except OSError as exc:
            report(Path(entry.path), exc)
            continue
        yield Path(entry.path)


# -- what an eval runner writes without a spool (docs/integration.md, "Importing") --------
#
# ``prime-runs import`` reads these; nothing here ever writes them. verifiers 0.4.0 writes,
# per run directory: ``traces.jsonl``, ``configs/<cli>.toml`` (the launch file, verbatim),
# ``configs/resolved/<cli>.json`` (the resolved config) and ``logs/attempt_N/eval.log``
# (``logs/latest`` links the newest). The older layout is ``metadata.json`` + ``results.jsonl``.

CONFIGS_DIRNAME = "configs"
RESOLVED_DIRNAME = "resolved"
LOGS_DIRNAME = "logs"
LATEST_LOG_LINK = "latest"
ATTEMPT_PREFIX = "attempt_"
EVAL_LOG_NAME = "eval.log"
V0_METADATA_NAME = "metadata.json"
V0_RESULTS_NAME = "results.jsonl"
#: Beside an imported spool's segments: where it was imported from and how far (the
#: importer's own bookkeeping; readers and sync look only at ``seg-*`` files).
IMPORT_MARK_NAME = "import.json"
#: Held while an import writes a spool: two imports of one source never both write it.
IMPORT_LOCK_NAME = "import.lock"
#: Beside the segments of a spool the eval wrote: the versions of ``traces.jsonl`` and of
#: the segments last found to agree by episode id, so an unchanged run is not read again.
AGREED_MARK_NAME = "traces-agreed.json"
#: Under ``--state-dir``: one folder per imported source run.
STATE_IMPORTS_DIRNAME = "imports"


def resolved_config_paths(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``configs/resolved/*.json``, sorted (verifiers reads the first one back too)."""
    folder = Path(output_dir) / CONFIGS_DIRNAME / RESOLVED_DIRNAME
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def launch_file_paths(output_dir: str | os.PathLike[str]) -> list[Path]:
    """``configs/*.toml``: the launch file(s) copied verbatim."""
    folder = Path(output_dir) / CONFIGS_DIRNAME
    return sorted(p for p in folder.glob("*.toml") if p.is_file()) if folder.is_dir() else []


def attempt_log_paths(output_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``logs/attempt_N/eval.log`` that exists, oldest attempt first."""
    folder = Path(output_dir) / LOGS_DIRNAME
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            number = entry.name[len(ATTEMPT_PREFIX):]
            if entry.name.startswith(ATTEMPT_PREFIX) and number.isdigit() and not entry.is_symlink():
                log = entry / EVAL_LOG_NAME
                if log.is_file():
                    found.append((int(number), log))
    return [log for _, log in sorted(found)]


def v0_paths(output_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    return Path(output_dir) / V0_METADATA_NAME, Path(output_dir) / V0_RESULTS_NAME


def import_mark_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / IMPORT_MARK_NAME


def import_lock_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / IMPORT_LOCK_NAME


def agreed_mark_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / AGREED_MARK_NAME


def state_dir_run(state_dir: str | os.PathLike[str], source_key: str, run_id: str) -> Path:
    """Where ``--state-dir`` keeps the spool imported from one source run: keyed by the
    source's absolute path (``source_key``, a digest of it) and the run id."""
    return Path(state_dir) / STATE_IMPORTS_DIRNAME / source_key / run_id


def state_dir_source(state_dir: str | os.PathLike[str], source_key: str) -> Path:
    return Path(state_dir) / STATE_IMPORTS_DIRNAME / source_key


def is_eval_output_dir(path: Path) -> bool:
    """A folder verifiers wrote a run to: ``traces.jsonl``, or ``metadata.json`` + ``results.jsonl``."""
    if verifiers_traces_path(path).is_file():
        return True
    metadata, results = v0_paths(path)
    return metadata.is_file() and results.is_file()


def find_eval_outputs(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Every eval output folder under ``paths``, each once, deterministic order; symbolic
    links are not followed and a spool folder is never entered. A missing path raises
    :class:`NoSuchPathError`, as for :func:`find_runs`."""
    skipped = (SPOOL_DIRNAME, LOGS_DIRNAME, CONFIGS_DIRNAME)
    return _each_once(paths, lambda root: _walk(root, is_eval_output_dir, lambda folder, name: name in skipped))
