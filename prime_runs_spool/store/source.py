"""A run in an object store, readable by the ordinary spool reader (spool/reader.py).

The reader asks a run for its segments (``list_segments``) and a segment for its bytes
(``open_bytes``), its size (``stat``) and whether a writer holds it (``writer_alive``); a
:class:`StoreRun` answers from one listing of the store, so the verdicts (checksums, torn
tails, corruption stops the run) are the reader's own, byte for byte the same as for a local
file. Reads are ranged and bounded: a segment is fetched in windows of at most
``MAX_WINDOW`` bytes as the reader goes, starting small after every seek (a resumed sync
reads the header, then jumps to its recorded offset), and never past the size the listing
gave, under the etag it gave (a segment re-uploaded meanwhile is refused, not mixed).

A segment is *live* while the listing holds its live marker (``seg-NNNNNN.jsonl.live``,
written by ``prime-runs mirror`` while the writer lives) written less than
:data:`LIVE_MARKER_TTL` ago: so a live run in the store is synced as live (pushed, not
ended as crashed, so nothing is read but its new lines), and a run whose mirror died with
its machine is taken for crashed once the marker has gone stale.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

from prime_runs_spool.spool.layout import SPOOL_DIRNAME, segment_index
from prime_runs_spool.store.object_info import ObjectInfo
from prime_runs_spool.store.objects import ObjectStore


#: In an object store, beside a segment ``prime-runs mirror`` copies while its writer lives:
#: ``seg-NNNNNN.jsonl.live``, kept fresh by the mirror, removed once the writer is gone
#: (the store's counterpart of a segment's writer lock, docs/sync.md "Object stores").
LIVE_MARKER_SUFFIX = ".live"

#: The first read after a seek fetches this much (a header and manifest, a few records: each
#: pass reads a segment's first lines a few times, so this is paid per read of a grown run)...
FIRST_WINDOW = 16 * 1024
#: ...and each next one four times more, up to this: what one open segment holds at most
#: (its read buffer). 4 MiB: a GET's latency is paid once per 4 MiB, and ``--jobs 4`` holds
#: 16 MiB of segment reads at most.
MAX_WINDOW = 4 * 1024 * 1024
#: How long a live marker vouches for its writer after the mirror last wrote it (by the
#: store's clock; the machines' clocks are assumed to agree within the lease's skew). The
#: mirror rewrites it every third of this, so a run whose mirror stopped is taken for
#: crashed at most this long after.
LIVE_MARKER_TTL = 300.0


class _RangedReader(io.RawIOBase):
    """The bytes of one object, ``[0, size)``, fetched by ranged GETs as they are read."""

    def __init__(self, store: ObjectStore, info: ObjectInfo) -> None:
        self._store, self._info = store, info
        self._pos = 0
        self._window = FIRST_WINDOW

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._info.size}[whence]
        self._pos = max(0, base + offset)
        self._window = FIRST_WINDOW
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self._window, self._info.size - self._pos)
        if count <= 0:
            return 0
        data = self._store.read_range(self._info.key, self._pos, self._pos + count, self._info.etag)
        buffer[: len(data)] = data
        self._pos += len(data)
        self._window = min(self._window * 4, MAX_WINDOW)
        return len(data)


class StoreSegment:
    """One segment object, as the reader sees a segment file. Its ``__fspath__`` is its URL,
    so names (``seg-NNNNNN.jsonl``) and messages read as they do for a file."""

    def __init__(self, store: ObjectStore, info: ObjectInfo, index: int,
                 live_marker: ObjectInfo | None = None) -> None:
        self.store, self.info, self.index = store, info, index
        self.name = info.key.rsplit("/", 1)[-1]
        #: The mirror's live marker beside it in the listing, if any (see the module's docstring).
        self.live_marker = live_marker

    def __fspath__(self) -> str:
        return self.store.location(self.info.key)

    def __str__(self) -> str:
        return self.__fspath__()

    def __repr__(self) -> str:
        return f"StoreSegment({self})"

    def stat(self) -> SimpleNamespace:
        return SimpleNamespace(st_size=self.info.size)

    def version(self) -> str | None:
        """Which upload of the segment this is: its etag (``spool.layout.segment_version``)."""
        return None if self.info.etag is None else f"etag:{self.info.etag}"

    def open_bytes(self) -> io.BufferedReader:
        # The buffer is the largest window: the raw reader returns less while its window grows.
        return io.BufferedReader(_RangedReader(self.store, self.info), buffer_size=MAX_WINDOW)

    def writer_alive(self) -> bool:
        """No writer lock travels with a copied spool: its mirror's fresh live marker stands in."""
        return marker_fresh(self.live_marker)

    def durable_bytes(self) -> int:
        """What ``spool.durable_mark`` asks a live segment: all of it here, since the mirror
        uploads only what its writer made durable."""
        return self.info.size


class StoreRun:
    """A run directory in the store: ``<prefix>/<relative>/spool/seg-*.jsonl``, as listed.

    ``local`` is the run's folder on this machine (its cached sync state lives there), and
    is what ``os.fspath`` gives, so the local layout's paths (``sync_state_path``) apply.
    """

    def __init__(self, store: ObjectStore, relative: str, segments: list[StoreSegment],
                 objects: dict[str, ObjectInfo], local: Path) -> None:
        self.store = store
        self.relative = relative
        self.segments = segments
        #: Every object of the listing under the run, by key: the state's etag comes from here.
        self.objects = objects
        self.local = local

    def key(self, *parts: str) -> str:
        """The key of ``<run>/<parts...>``."""
        return "/".join(p for p in (self.relative, *parts) if p)

    def list_segments(self) -> list[tuple[int, StoreSegment]]:
        return [(segment.index, segment) for segment in self.segments]

    def __fspath__(self) -> str:
        return os.fspath(self.local)

    def __str__(self) -> str:
        return self.store.location(self.relative)

    def __repr__(self) -> str:
        return f"StoreRun({self})"


def live_marker_key(segment_key: str) -> str:
    """The key of the live marker beside the segment object ``segment_key``."""
    return segment_key + LIVE_MARKER_SUFFIX


def marker_fresh(marker: ObjectInfo | None, now: float | None = None) -> bool:
    """Whether a live marker still vouches for its writer (a store that gives no time
    for it: it does, as long as it is there)."""
    if marker is None:
        return False
    if marker.modified is None:
        return True
    return (time.time() if now is None else now) - marker.modified < LIVE_MARKER_TTL


def find_store_runs(store: ObjectStore, listing: Iterable[ObjectInfo], local_root: Path) -> list[StoreRun]:
    """Every run in one listing: a folder whose ``spool/`` holds a ``seg-NNNNNN.jsonl``
    (the same rule as ``layout.find_runs``), in key order, each with its objects."""
    infos = sorted(listing, key=lambda info: info.key)
    segments = _segments(store, infos)
    objects: dict[str, dict[str, ObjectInfo]] = {}
    for info in infos:
        owner = _owner(info.key, segments)
        if owner is not None:
            objects.setdefault(owner, {})[info.key] = info
    return [StoreRun(store, relative, segments[relative], objects.get(relative, {}), local_root / (relative or "_run"))
            for relative in sorted(segments)]


def relist_segments(run: StoreRun) -> None:
    """List the run's ``spool/`` folder again and take its segments from there: a sync
    state read after the listing the run was found in may describe segments that listing
    is too old to show (another syncer read them, uploaded since), which would read as
    lines lost. Its other objects (states, files of ids) stay as first listed."""
    found = _segments(run.store, sorted(run.store.list(run.key(SPOOL_DIRNAME)), key=lambda info: info.key))
    run.segments = found.get(run.relative, [])


def _segments(store: ObjectStore, infos: list[ObjectInfo]) -> dict[str, list[StoreSegment]]:
    """Each run's segments in a listing sorted by key, in order, by the run's folder."""
    segments: dict[str, list[StoreSegment]] = {}
    markers = {info.key: info for info in infos if info.key.endswith(LIVE_MARKER_SUFFIX)}
    for info in infos:
        parts = info.key.split("/")
        if len(parts) >= 2 and parts[-2] == SPOOL_DIRNAME:
            index = segment_index(parts[-1])
            if index is not None and index > 0:
                relative = "/".join(parts[:-2])
                segments.setdefault(relative, []).append(
                    StoreSegment(store, info, index, markers.get(live_marker_key(info.key))))
    return {relative: sorted(found, key=lambda s: s.index) for relative, found in segments.items()}


def _owner(key: str, runs: dict[str, list[StoreSegment]]) -> str | None:
    """The run whose ``spool/`` folder holds ``key`` (its state, its lease), if any."""
    parts = key.split("/")
    for at in range(len(parts) - 2, -1, -1):
        if parts[at] == SPOOL_DIRNAME and "/".join(parts[:at]) in runs:
            return "/".join(parts[:at])
    return None
