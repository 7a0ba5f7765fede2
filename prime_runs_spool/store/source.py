"""A run in an object store, readable by the ordinary spool reader (spool/reader.py).

The reader asks a run for its segments (``list_segments``) and a segment for its bytes
(``open_bytes``), its size (``stat``) and whether a writer holds it (``writer_alive``); a
:class:`StoreRun` answers from one listing of the store, so the verdicts (checksums, torn
tails, corruption stops the run) are the reader's own, byte for byte the same as for a local
file. Reads are ranged and bounded: a segment is fetched in windows of at most
``MAX_WINDOW`` bytes as the reader goes, starting small after every seek (a resumed sync
reads the header, then jumps to its recorded offset), and never past the size the listing
gave, under the etag it gave (a segment re-uploaded meanwhile is refused, not mixed).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

from prime_runs_spool.spool.layout import SPOOL_DIRNAME, segment_index
from prime_runs_spool.store.objects import ObjectInfo, ObjectStore

#: The first read after a seek fetches this much (a header, a few records)...
FIRST_WINDOW = 64 * 1024
#: ...and each next one four times more, up to this: what one open segment holds at most
#: (its read buffer). 4 MiB: a GET's latency is paid once per 4 MiB, and ``--jobs 4`` holds
#: 16 MiB of segment reads at most.
MAX_WINDOW = 4 * 1024 * 1024


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

    def __init__(self, store: ObjectStore, info: ObjectInfo, index: int) -> None:
        self.store, self.info, self.index = store, info, index
        self.name = info.key.rsplit("/", 1)[-1]

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
        """No writer lock travels with a copied spool: a store's segment is never live."""
        return False


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


def find_store_runs(store: ObjectStore, listing: Iterable[ObjectInfo], local_root: Path) -> list[StoreRun]:
    """Every run in one listing: a folder whose ``spool/`` holds a ``seg-NNNNNN.jsonl``
    (the same rule as ``layout.find_runs``), in key order, each with its objects."""
    segments: dict[str, list[StoreSegment]] = {}
    objects: dict[str, dict[str, ObjectInfo]] = {}
    infos = sorted(listing, key=lambda info: info.key)
    for info in infos:
        parts = info.key.split("/")
        if len(parts) >= 2 and parts[-2] == SPOOL_DIRNAME:
            index = segment_index(parts[-1])
            if index is not None and index > 0:
                relative = "/".join(parts[:-2])
                segments.setdefault(relative, []).append(StoreSegment(store, info, index))
    for info in infos:
        owner = _owner(info.key, segments)
        if owner is not None:
            objects.setdefault(owner, {})[info.key] = info
    runs = []
    for relative in sorted(segments):
        found = sorted(segments[relative], key=lambda s: s.index)
        runs.append(StoreRun(store, relative, found, objects.get(relative, {}),
                             local_root / (relative or "_run")))
    return runs


def _owner(key: str, runs: dict[str, list[StoreSegment]]) -> str | None:
    """The run whose ``spool/`` folder holds ``key`` (its state, its lease), if any."""
    parts = key.split("/")
    for at in range(len(parts) - 2, -1, -1):
        if parts[at] == SPOOL_DIRNAME and "/".join(parts[:at]) in runs:
            return "/".join(parts[:at])
    return None
