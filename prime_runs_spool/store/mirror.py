"""``prime-runs mirror PATH... s3://bucket/prefix``: copy spools into a store as they grow.

So a node's spool reaches the store without a separate copy step, and ``prime-runs sync
s3://...`` can ship it from there. The local spool stays the durable copy; the store's copy
is only ever a prefix of it that is already durable:

- a segment whose writer is gone (sealed, or crashed) is uploaded once, when its size
  differs from the object's, fsync'd first (a killed writer's last lines may be in the page
  cache only, as for a shipping reader), up to its last byte that is not padding: a crashed writer's
  NUL padding (up to 1 MiB, docs/spool-format.md, section 5) is no data, and every sync
  would pay to read it back;
- the live segment is uploaded up to its writer's **durable mark** (docs/spool-format.md,
  section 5), never further: a line written but not yet fsync'd could still be lost by a
  power cut, and a sync reading the store (where no writer lock travels) would ship it.
  Beside it the mirror keeps a **live marker** (``seg-NNNNNN.jsonl.live``, written before the
  segment's bytes, rewritten every third of ``store.source.LIVE_MARKER_TTL``), removed once the writer is gone and its last
  bytes are up: so a sync of the store takes the run for live, not crashed, and reads only
  its new lines.

A segment written under older masking rules than this package's (its manifest's
``masking_version``, docs/masking.md) may hold in clear text what today's rules mask, so its
bytes never travel: the mirror uploads a copy of it instead, each record masked again by
today's rules (the change its caller gives, ``content.remask.copy_masking``) and its line
framed anew (``spool/rewrite.py``), its manifest saying today's version; the local spool is
left as it was. The copy is made again, whole, when the segment grows (an older package's
writer still running), and only ever grows: a sync of the store that read part of it finds
that part unchanged.

Before a run's first upload the mirror leaves a **note** in the run's spool folder
(``spool/mirror.json``: the run's URL in the store), fsync'd: a sync of the run's folder
reads it and takes the lease of the store's copy, the one every sync of the store takes, so
the folder and the store are never synced at once (docs/deploy.md). The note names the
first store a run is mirrored into; a copy in any other store is not covered. A first upload
that failed, leaving nothing there, takes its note back.

Each upload replaces the object whole, so the store holds a segment "re-uploaded as it
grows", which store sync reads from its recorded offset. Only segments are copied: never
locks, durable marks, sync state or logs. One pass costs one listing of the prefix, the
run's mirror lock (a second mirror of the spool waits its turn, then lists that run again)
and one ``stat`` per segment (and, the first time a process sees a segment, a read of its first two
lines; a segment under older rules is read whole and masked again once a process, and again
whenever it grows); an unchanged spool uploads nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from prime_runs_spool.errors import CorruptSpoolError, SpoolError, StoreError, StoreSetupError
from prime_runs_spool.files import (fsync_folder, open_private, printable, read_regular_file, replace_private,
                                    shell_word, shown)
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, find_runs, list_segments, segment_index, spool_dir
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.format import MANIFEST, MAX_LINE_BYTES, parse_line
from prime_runs_spool.spool.reader import Record
from prime_runs_spool.spool.rewrite import RecordChange, rewrite_segment
from prime_runs_spool.spool.writer_state import make_durable, writer_alive
from prime_runs_spool.store.local_files import local_root
from prime_runs_spool.store.object_info import ObjectInfo
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.store.source import LIVE_MARKER_SUFFIX, LIVE_MARKER_TTL, live_marker_key, marker_fresh

#: Bytes read per step when looking back over a dead writer's padding for its last data byte.
_PADDING_STEP = 64 * 1024
#: The most read of a segment's first line (its header, a few hundred bytes) to tell whose it is.
_HEADER_BYTES = 16 * 1024

#: In a mirrored run's local spool folder: the URL of the run's copy in the store.
MIRROR_NOTE_NAME = "mirror.json"
#: In a mirrored run's local spool folder: the lock a mirror's pass over the run holds
#: (``flock``, dropped by the kernel when its holder dies; never deleted).
MIRROR_LOCK_NAME = "mirror.lock"


def mirror_note_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / MIRROR_NOTE_NAME


def mirrored_to(run_dir: str | os.PathLike[str]) -> str | None:
    """The URL of the run's copy in a store, as its mirror noted it; None when no mirror
    copies it. ``StoreError`` for a note that cannot be read or makes no sense: a sync that
    cannot tell where the run's lease is must not push it."""
    path = mirror_note_path(run_dir)
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the mirror's note: {exc.strerror or exc}") from None
    try:
        url = orjson.loads(data)["run_url"]
        if not isinstance(url, str) or "://" not in url:
            raise ValueError(url)
    except (ValueError, KeyError, TypeError):
        raise StoreError(f"{path}: the mirror's note names no store URL; run prime-runs mirror again "
                         "to write it, or delete it if no mirror copies this run") from None
    return url


def _note_mirror(run_dir: Path, url: str) -> bool:
    """Leave the note naming the run's copy (fsync'd, before anything of the run is
    uploaded), unless one names a copy already: the first store a run is mirrored into is
    the one whose lease a sync of its folder takes. Whether it was left now."""
    if mirrored_to(run_dir) is not None:
        return False
    try:
        replace_private(mirror_note_path(run_dir), orjson.dumps({"run_url": url}) + b"\n", durable=True)
    except OSError as exc:  # a read-only spool folder (an artifact mounted read-only), a full disk
        raise StoreError(f"{shown(str(spool_dir(run_dir)))}: cannot leave the mirror's note there "
                         f"({exc.strerror or exc}), so nothing of the run was uploaded: the note comes first, so "
                         "that a sync of this folder and one of the store never push the run at once; make the "
                         "folder writable, or mirror a writable copy of the run folder") from None
    return True


def _withdraw_note(run_dir: Path, store: ObjectStore, key: str) -> None:
    """Take back the note left for a first upload that failed, once the store answers that
    the object is not there: nothing of the run reached that store, so no sync of it can
    push the run, and a note naming it would bind the folder to a store that never held it
    (a mistyped URL: every sync of the folder failed on its lease, and a mirror into the
    right store kept the wrong note). Left in place when the store cannot say."""
    try:
        if store.exists(key):
            return
    except StoreError:
        return
    note = mirror_note_path(run_dir)
    note.unlink(missing_ok=True)
    fsync_folder(note.parent)


def _check_first_copy(run_dir: Path, store: ObjectStore, url: str) -> None:
    """Refuse (``StoreError``) a run whose note names another copy in this store: its folder
    was renamed or copied after its first upload. Uploaded under its new place too, the store
    would hold the run twice, and a sync of the store could push that copy while a sync of
    the folder pushes it under the noted copy's lease: the one lease the note is there for."""
    noted = mirrored_to(run_dir)
    if noted is None or noted == url or not noted.startswith(store.location("").rstrip("/") + "/"):
        return
    raise StoreError(f"this run was first mirrored to {noted} ({mirror_note_path(run_dir)}), whose lease a sync of "
                     "its folder takes; here it would be a second copy of the run in the store: move the folder "
                     "back, or delete that note and that copy to mirror it here")


@dataclass
class MirrorReport:
    """One pass over one run: what was uploaded."""

    path: str
    url: str
    uploaded: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    #: Of ``uploaded``, the segments written under older masking rules, uploaded masked again.
    masked_again: list[str] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


#: Seconds between two looks at a run's mirror lock another mirror holds, each also a look
#: at whether this mirror was asked to stop.
LOCK_POLL_SECONDS = 0.05


@contextlib.contextmanager
def _one_mirror_at_a_time(run_dir: Path, stop: Callable[[float], bool] | None = None) -> Iterator[bool | None]:
    """Hold the run's mirror lock for a pass over it: each upload replaces the object whole
    with what its pass measured, so two mirrors of one spool at once (the sidecar still
    running when the job's last ``mirror --once`` runs, docs/deploy.md) let the sidecar's
    upload of the live segment's older, shorter size land after the last mirror's whole
    copy, and its live marker come back: the bucket lost the run's last episodes and seal.
    A pass that waits measures after the other's, so the last word is the latest size; it
    yields True, and lists the run's objects again (the other may have written them since
    its listing). A folder where the lock cannot be made (read-only: nothing writes there)
    is mirrored without it. ``stop`` (it waits, and is True once the mirror is asked to
    stop) is asked between looks at the lock: it yields None when asked while waiting (a
    mirror given SIGINT went on waiting for the other's whole pass, an upload of any size;
    no ``stop``: it waits)."""
    try:
        fd = open_private(spool_dir(run_dir) / MIRROR_LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            waited = _wait_for_lock(fd, stop)
        yield waited
    finally:
        os.close(fd)  # the lock goes with it


def _wait_for_lock(fd: int, stop: Callable[[float], bool] | None) -> bool | None:
    """Take the lock ``fd`` another mirror holds: True once taken, None if ``stop`` said so first."""
    if stop is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    while not stop(LOCK_POLL_SECONDS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    return None


def _listed_again(store: ObjectStore, listed: Mapping[str, ObjectInfo], key: str) -> dict[str, ObjectInfo]:
    """The pass's listing with the run's objects (under ``key``) as the store holds them now."""
    fresh = {k: info for k, info in listed.items() if not k.startswith(f"{key}/")}
    fresh.update((info.key, info) for info in store.list(key))
    return fresh


def _run_key(root: Path, run_dir: Path) -> str:
    """Where a run goes under the prefix: its path below the given root, as ``aws s3 cp -r
    ROOT s3://bucket/prefix`` would put it (a root that is itself a run goes by its name)."""
    try:
        relative = run_dir.resolve().relative_to(root.resolve())
    except ValueError:
        relative = Path(run_dir.name)
    if relative == Path(".") or relative.name == SPOOL_DIRNAME:
        relative = Path(run_dir.resolve().name)
    return relative.as_posix()


def _is_text(key: str) -> bool:
    """Whether ``key`` can name an object: a path from a folder whose name is not UTF-8
    carries surrogates, which no store's key (UTF-8 text) can hold."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _target_size(segment: Path) -> tuple[int, bool]:
    """How much of a segment may travel, and whether its writer lives: what the writer has
    said is durable while it lives, else the file up to its padding.

    The writer first, the size after: a live writer's file holds padding after its lines,
    which it cuts off when it seals or closes (docs/spool-format.md, section 5), so a size
    taken while it lived and used once it is gone could be longer than the file. This way
    round a live writer's answer is at most its mark (its lines stay), and a dead one's
    file no longer changes."""
    if writer_alive(segment):
        return min(segment.stat().st_size, durable_mark(segment)), True
    make_durable(segment)  # a killed writer's last lines may be in the page cache only
    return _data_end(segment), False


def _data_end(segment: Path) -> int:
    """Where a dead writer's segment ends once its trailing NUL padding is left out (a torn
    tail stays: its verdict is the reader's to give)."""
    with open(segment, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        while end > 0:
            start = max(0, end - _PADDING_STEP)
            data = os.pread(f.fileno(), end - start, start)
            kept = data.rstrip(b"\0")
            if kept:
                return start + len(kept)
            end = start
    return 0


def _mark_live(store: ObjectStore, key: str, listed: ObjectInfo | None) -> ObjectInfo:
    """Keep a live segment's marker fresh: written when missing or a third of its lifetime
    old (``listed``: as the listing, or this pass's own write, has it). The marker as it now is."""
    if listed is not None and marker_fresh(listed, time.time() + 2 * LIVE_MARKER_TTL / 3):
        return listed
    data = orjson.dumps({"mirrored_at": time.time()}) + b"\n"
    store.overwrite(key, data)
    return ObjectInfo(key, len(data), None, time.time())  # written by now: as old as that, at most


def _segment_id(first_line: bytes) -> object:
    """The ``segment_id`` a segment's header names (None when the line is not an intact header)."""
    parsed = parse_line(first_line)
    return parsed.data.get("segment_id") if parsed is not None and isinstance(parsed.data, dict) else None


def _check_same_segment(store: ObjectStore, there: ObjectInfo, segment: Path) -> None:
    """Refuse to replace an object that is another segment than ``segment`` (its header names
    another segment): two machines mirroring into one prefix, each with a ``run-000``, would
    otherwise overwrite each other's runs at every pass."""
    with open(segment, "rb") as f:
        ours = _segment_id(f.readline(_HEADER_BYTES))
    theirs = _segment_id(store.read_range(there.key, 0, min(there.size, _HEADER_BYTES), there.etag).split(b"\n", 1)[0] + b"\n")
    if ours is not None and theirs is not None and ours != theirs:
        raise StoreError(f"{store.location(there.key)} holds another run's segment (segment_id {theirs}, not "
                         f"{ours}): another machine mirrors into this prefix? Give each machine its own, e.g. "
                         f"{store.url}/$(hostname); not uploaded")


#: How a segment is copied, given its manifest (the line after its header): ``None`` to copy
#: its bytes as they are, else the change each of its records gets in the copy
#: (``content.remask.copy_masking``: a segment masked under older rules is masked again). Given
#: by the caller, from the layer that knows the masking rules.
CopyMasking = Callable[[Mapping[str, Any]], "RecordChange | None"]


@dataclass
class MirrorMemory:
    """What a mirror process remembers between its passes, so that a pass pays only for the
    segments that changed."""

    #: Segments copied byte for byte whose object is known to be this machine's (its header
    #: checked): up to date when the object is as long as the segment.
    checked: set[str] = field(default_factory=set)
    #: Segments whose manifest says today's masking rules: copied byte for byte, compared by
    #: size alone (their manifest is not read again at every pass).
    masked_today: set[str] = field(default_factory=set)
    #: Segments copied masked again: the source bytes the copy was made of, and the copy's
    #: length; up to date while both still hold.
    masked_again: dict[str, tuple[int, int]] = field(default_factory=dict)


def _segment_manifest(segment: Path, size: int) -> dict[str, Any] | None:
    """The manifest a segment's records were written under (the line after its header), or
    None while it is not within ``size`` yet (a live writer's first lines). A damaged one is
    refused: which rules masked the records after it cannot be told."""
    with open(segment, "rb") as f:
        header = f.readline(_HEADER_BYTES)
        if len(header) >= size:
            return None
        line = f.readline(min(MAX_LINE_BYTES, size - len(header)) + 1)
    if len(header) + len(line) > size or not line.endswith(b"\n"):
        return None
    record = parse_line(line)
    if record is None or record.type != MANIFEST or not isinstance(record.data, dict):
        raise StoreError(f"{segment}: the line after its header is no intact manifest, so the masking rules "
                         f"its records were written under are unknown; not mirrored (`prime-runs verify` "
                         f"says what is damaged)")
    return record.data


def _keep_all(record: Record) -> Any:
    return record.data


class _Copier:
    """One pass's uploads of one run's segments."""

    def __init__(self, store: ObjectStore, listed: Mapping[str, ObjectInfo], run_dir: Path, report: MirrorReport,
                 memory: MirrorMemory, masking: CopyMasking) -> None:
        self.store, self.listed, self.run_dir, self.report = store, listed, run_dir, report
        self.memory, self.masking = memory, masking
        #: Whether the segment being copied has a live writer; and the live markers this
        #: pass made sure of before its segment's bytes (:meth:`_upload`), as they then were.
        self.live = False
        self.marked: dict[str, ObjectInfo] = {}

    def segment(self, index: int, segment: Path, key: str, size: int, there: ObjectInfo | None, *,
                live: bool = False) -> ObjectInfo | None:
        """Bring the object ``key`` up to the segment's first ``size`` bytes (``live``: its
        writer lives); the object as it now is."""
        memory = self.memory
        self.live = live
        if there is not None and ((key in memory.checked or key in memory.masked_today) and there.size == size
                                  or memory.masked_again.get(key) == (size, there.size)):
            return there
        manifest = _segment_manifest(segment, size)
        # Until its manifest is there, only the segment's header is copied (the walk stops
        # before a torn line), so no line written under unknown rules travels.
        change = _keep_all if manifest is None else self.masking(manifest)
        if change is None:
            memory.masked_today.add(key)
            if there is not None and there.size == size:
                return there
            self._check_ours(key, there, segment)
            self._upload(key, segment, size, segment)
            memory.checked.add(key)
            return ObjectInfo(key, size, None)
        return self._masked_again(index, segment, key, size, there, change, manifest is not None)

    def _masked_again(self, index: int, segment: Path, key: str, size: int, there: ObjectInfo | None,
                      change: RecordChange, told: bool) -> ObjectInfo | None:
        """Upload the copy of the segment's first ``size`` bytes with ``change`` made to its
        records, framed anew (spool/rewrite.py), unless the object already is that copy. Made
        in a private temporary file, never in memory; made again whole as the segment grows
        (a live writer of older rules), which only appends to the copy, so what a sync of the
        store read of it stays where it was."""
        fd, temp = tempfile.mkstemp(prefix="prime-runs-mirror-", suffix=".jsonl")  # 0600
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    length = rewrite_segment(segment, index, size, out, change)
                except CorruptSpoolError as exc:
                    raise StoreError(f"{exc}; a damaged line cannot be masked again, so the segment is not "
                                     f"mirrored (`prime-runs verify {shell_word(self.run_dir)}` says more; `prime-runs "
                                     f"sync --skip-corrupt {shell_word(self.run_dir)}` ships the rest from here)") from None
                except SpoolError as exc:  # a newer format, a record that cannot be framed
                    raise StoreError(f"{exc}; not mirrored") from None
            todays = there is not None and self._same_start(there, Path(temp))
            if todays and there is not None and there.size == length:
                self.memory.masked_again[key] = (size, length)
                return there
            self._check_ours(key, there, segment)
            if there is not None and key not in self.memory.masked_again and not (todays and there.size <= length):
                self._check_unread(key)
            if length > 0:
                self._upload(key, Path(temp), length, segment)
                if told:
                    self.report.masked_again.append(segment.name)
            self.memory.masked_again[key] = (size, length)
            return ObjectInfo(key, length, None) if length > 0 else there
        finally:
            os.unlink(temp)

    def _same_start(self, there: ObjectInfo, copy: Path) -> bool:
        """Whether the object starts with the copy's header and manifest, byte for byte: a copy
        of the same length that says today's masking version is the one made from this source
        (the copy is a function of it); an older mirror's byte copy of a segment masked under
        the rules of its day (whose manifest names that day's version) is replaced."""
        with open(copy, "rb") as f:
            start = f.readline(_HEADER_BYTES) + f.readline(MAX_LINE_BYTES + 1)
        return self.store.read_range(there.key, 0, len(start), there.etag) == start

    def _check_unread(self, key: str) -> None:
        """Refuse (``StoreError``) to replace an object that is no copy by today's rules (an
        older mirror copied the segment's bytes, under the rules of its day) once a sync has
        been at the run in the store (it left its lease or state beside the segments): the
        masked copy is not the bytes that sync read up to its recorded place, so it would find
        that place lost. Left as it is, and the line says how to clear it."""
        folder = key.rsplit("/", 1)[0] + "/"
        beside = sorted(k for k in self.listed if k.startswith(folder)
                        and segment_index(k[len(folder):].removesuffix(LIVE_MARKER_SUFFIX)) is None)
        if beside:
            run_url = self.store.location(folder[: -len(SPOOL_DIRNAME) - 2])
            raise StoreError(f"{self.store.location(key)} is a copy an older mirror made under the masking rules of "
                             f"its day, which may hold in clear text what today's rules mask, and a sync has read it "
                             f"there ({beside[0].rsplit('/', 1)[-1]}): a copy masked again is not what it read, so "
                             f"it is left as it is; delete {run_url} from the store and mirror again (a sync of the "
                             f"store then finds what the platform holds of the run and pushes none of it twice)")

    def _check_ours(self, key: str, there: ObjectInfo | None, segment: Path) -> None:
        if there is not None and key not in self.memory.checked and key not in self.memory.masked_again:
            _check_same_segment(self.store, there, segment)

    def _upload(self, key: str, path: Path, size: int, segment: Path) -> None:
        noted_now = _note_mirror(self.run_dir, self.report.url)
        if self.live:
            # The live marker before the bytes it vouches for: a sync listing the store between
            # the two found an unsealed segment with no marker, a run whose mirror had died,
            # and recorded it crashed on the platform. A marker with no segment is read as
            # nothing (store/source.py pairs them by key); it is removed once the writer is gone.
            marker = live_marker_key(key)
            self.marked[marker] = _mark_live(self.store, marker, self.listed.get(marker))
        try:
            self.store.upload_prefix(key, path, size)
        except (StoreError, OSError):
            if noted_now:
                _withdraw_note(self.run_dir, self.store, key)
            raise
        self.report.uploaded.append(segment.name)
        self.report.bytes_sent += size


def refuse_store_inside(roots: Iterable[Path], url: str) -> None:
    """:class:`StoreSetupError` for a ``file://`` store at or below a folder it mirrors: every
    pass would find the copies of the last as runs and copy them again, a level deeper each
    time, until the disk is full."""
    if not url.startswith("file://"):
        return
    folder = local_root(url).resolve()
    for root in roots:
        where = Path(root).resolve()
        if folder == where or where in folder.parents:
            raise StoreSetupError(f"{url} is inside {shown(str(root))}, which it mirrors: every pass would copy its "
                                  "own copies again; give a store outside the paths mirrored")


def mirror_pass(roots: Iterable[Path], store: ObjectStore, memory: MirrorMemory | None = None, *,
                masking: CopyMasking, stop: Callable[[float], bool] | None = None) -> list[MirrorReport]:
    """Upload what changed in every run under ``roots``; one report per run. ``memory``: what
    earlier passes of this process learned (kept across passes by :func:`mirror`, so each
    object is checked to be this machine's once per process, with one small ranged read).
    ``masking``: how a segment is copied, by its manifest (``content.remask.copy_masking``:
    one masked under older rules is masked again by today's). ``stop``: asked while a run's
    mirror lock is another mirror's (:func:`_one_mirror_at_a_time`); True ends the pass there."""
    memory = MirrorMemory() if memory is None else memory
    listed = {info.key: info for info in store.list()}
    reports = []
    for root in roots:
        for run_dir in find_runs([root]):
            key = _run_key(Path(root), run_dir)
            if not _is_text(key):  # one run's name: its error, never the others'
                reports.append(MirrorReport(path=str(run_dir), url=store.location(printable(key)), error=(
                    "its folder's name is not UTF-8, which no object store key can hold; rename the folder "
                    "(its name in UTF-8) and mirror again")))
                continue
            report = MirrorReport(path=str(run_dir), url=store.location(key))
            try:
                with _one_mirror_at_a_time(run_dir, stop) as waited:
                    if waited is None:
                        return reports  # asked to stop while another mirror held the run
                    seen = _listed_again(store, listed, key) if waited else listed
                    copier = _Copier(store, seen, run_dir, report, memory, masking)
                    _check_first_copy(run_dir, store, report.url)
                    for index, segment in list_segments(run_dir):
                        object_key = f"{key}/{SPOOL_DIRNAME}/{segment.name}"
                        size, alive = _target_size(segment)
                        there = seen.get(object_key)
                        if size > 0:
                            there = copier.segment(index, segment, object_key, size, there, live=alive)
                        marker = live_marker_key(object_key)
                        if alive and there is not None:  # again after an upload long enough to age it
                            _mark_live(store, marker, copier.marked.get(marker) or seen.get(marker))
                        elif not alive and marker in seen:  # after its last bytes: never live without them
                            store.delete(marker)
            except (StoreError, OSError) as exc:
                report.error = str(exc) if isinstance(exc, StoreError) else f"{exc.filename}: {exc.strerror}"
            reports.append(report)
    return reports


def mirror(roots: list[Path], store: ObjectStore, *, interval: float, once: bool,
           stop: Callable[[float], bool], on_pass: Callable[[list[MirrorReport]], None],
           masking: CopyMasking) -> None:
    """Mirror until ``stop(interval)`` says so (it waits, and is True once asked to stop)."""
    memory = MirrorMemory()
    while True:
        on_pass(mirror_pass(roots, store, memory, masking=masking, stop=stop))
        if once or stop(interval):
            return


#: Seconds between passes unless ``--interval`` (or ``PRIME_RUNS_MIRROR_INTERVAL``, read by
#: the command line, which checks it as it checks the option) says otherwise.
DEFAULT_INTERVAL = 5.0
