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
  Beside it the mirror keeps a **live marker** (``seg-NNNNNN.jsonl.live``, rewritten every
  third of ``store.source.LIVE_MARKER_TTL``), removed once the writer is gone and its last
  bytes are up: so a sync of the store takes the run for live, not crashed, and reads only
  its new lines.

A segment written under older masking rules than this package's (its manifest's
``masking_version``, docs/masking.md) may hold in clear text what today's rules mask: sync
masks it again on its way to the platform, but the mirror copies bytes, so it is not
uploaded at all and the run's report says why.

Before a run's first upload the mirror leaves a **note** in the run's spool folder
(``spool/mirror.json``: the run's URL in the store), fsync'd: a sync of the run's folder
reads it and takes the lease of the store's copy, the one every sync of the store takes, so
the folder and the store are never synced at once (docs/deploy.md). The note names the
first store a run is mirrored into; a copy in any other store is not covered.

Each upload replaces the object whole, so the store holds a segment "re-uploaded as it
grows", which store sync reads from its recorded offset. Only segments are copied: never
locks, durable marks, sync state or logs. One pass costs one listing of the prefix and one
``stat`` per segment; an unchanged spool uploads nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

from prime_runs_spool.errors import StoreError
from prime_runs_spool.files import read_regular_file, replace_private
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, find_runs, list_segments, spool_dir
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.format import MANIFEST, MAX_LINE_BYTES, parse_line
from prime_runs_spool.spool.writer_state import make_durable, writer_alive
from prime_runs_spool.store.object_info import ObjectInfo
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.store.source import LIVE_MARKER_TTL, live_marker_key, marker_fresh

#: Bytes read per step when looking back over a dead writer's padding for its last data byte.
_PADDING_STEP = 64 * 1024
#: The most read of a segment's first line (its header, a few hundred bytes) to tell whose it is.
_HEADER_BYTES = 16 * 1024

#: In a mirrored run's local spool folder: the URL of the run's copy in the store.
MIRROR_NOTE_NAME = "mirror.json"


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
        url = json.loads(data)["run_url"]
        if not isinstance(url, str) or "://" not in url:
            raise ValueError(url)
    except (ValueError, KeyError, TypeError):
        raise StoreError(f"{path}: the mirror's note names no store URL; run prime-runs mirror again "
                         "to write it, or delete it if no mirror copies this run") from None
    return url


def _note_mirror(run_dir: Path, url: str) -> None:
    """Leave the note naming the run's copy (fsync'd, before anything of the run is
    uploaded), unless one names a copy already: the first store a run is mirrored into is
    the one whose lease a sync of its folder takes."""
    if mirrored_to(run_dir) is None:
        replace_private(mirror_note_path(run_dir), json.dumps({"run_url": url}).encode() + b"\n", durable=True)


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
    error: str | None = None

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


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


def _mark_live(store: ObjectStore, key: str, listed: ObjectInfo | None) -> bool:
    """Keep a live segment's marker fresh: written when missing or a third of its lifetime
    old (by the listing). Whether it was written."""
    if listed is not None and marker_fresh(listed, time.time() + 2 * LIVE_MARKER_TTL / 3):
        return False
    store.overwrite(key, json.dumps({"mirrored_at": time.time()}).encode() + b"\n")
    return True


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


#: Says why a segment with this manifest must not be copied (``None``: it may be): given by
#: the caller, from the layer that knows the masking rules (content/remask.py).
ManifestCheck = Callable[[Mapping[str, Any]], "str | None"]


def _check_masked_today(segment: Path, size: int, manifest_check: ManifestCheck) -> bool:
    """Refuse a segment whose manifest (the line after its header) says it was masked under
    other rules than today's: what a newer rule masks is in it in clear text. Whether its
    manifest was read: one not yet within ``size`` (a live writer's first lines) is read
    again at the next upload, and until then no record of the segment travels. A damaged
    manifest is refused too: what masked the records after it cannot be told."""
    with open(segment, "rb") as f:
        header = f.readline(_HEADER_BYTES)
        if len(header) >= size:
            return False
        line = f.readline(min(MAX_LINE_BYTES, size - len(header)) + 1)
    if len(header) + len(line) > size or not line.endswith(b"\n"):
        return False  # not there yet: nothing after the header travels
    record = parse_line(line)
    if record is None or record.type != MANIFEST or not isinstance(record.data, dict):
        # Which rules masked what follows is unknown: its records could hold anything.
        raise StoreError(f"{segment}: the line after its header is no intact manifest, so the masking rules "
                         f"its records were written under are unknown; not mirrored (`prime-runs verify` "
                         f"says what is damaged)")
    refused = manifest_check(record.data)
    if refused is not None:
        raise StoreError(f"{segment} {refused}")
    return True


def mirror_pass(roots: Iterable[Path], store: ObjectStore, checked: set[str] | None = None, *,
                manifest_check: ManifestCheck) -> list[MirrorReport]:
    """Upload what changed in every run under ``roots``; one report per run. ``checked``: the
    objects already known to be this machine's segments, masked under today's rules (kept
    across passes by :func:`mirror`, so each is checked once per process, with one small
    ranged read and a read of its manifest). ``manifest_check``: whether a segment may be
    copied, by its manifest (``content.remask.copy_refused``: not one masked under older rules)."""
    checked = set() if checked is None else checked
    listed = {info.key: info for info in store.list()}
    reports = []
    for root in roots:
        for run_dir in find_runs([root]):
            key = _run_key(Path(root), run_dir)
            report = MirrorReport(path=str(run_dir), url=store.location(key))
            try:
                _check_first_copy(run_dir, store, report.url)
                for _, segment in list_segments(run_dir):
                    object_key = f"{key}/{SPOOL_DIRNAME}/{segment.name}"
                    size, alive = _target_size(segment)
                    there = listed.get(object_key)
                    if size > 0 and (there is None or there.size != size):
                        manifest_read = object_key in checked or _check_masked_today(segment, size, manifest_check)
                        if there is not None and object_key not in checked:
                            _check_same_segment(store, there, segment)
                        _note_mirror(run_dir, report.url)
                        store.upload_prefix(object_key, segment, size)
                        if manifest_read:
                            checked.add(object_key)
                        report.uploaded.append(segment.name)
                        report.bytes_sent += size
                        there = ObjectInfo(object_key, size, None)
                    marker = live_marker_key(object_key)
                    if alive and there is not None:
                        _mark_live(store, marker, listed.get(marker))
                    elif not alive and marker in listed:  # after its last bytes: never live without them
                        store.delete(marker)
            except (StoreError, OSError) as exc:
                report.error = str(exc) if isinstance(exc, StoreError) else f"{exc.filename}: {exc.strerror}"
            reports.append(report)
    return reports


def mirror(roots: list[Path], store: ObjectStore, *, interval: float, once: bool,
           stop: Callable[[float], bool], on_pass: Callable[[list[MirrorReport]], None],
           manifest_check: ManifestCheck) -> None:
    """Mirror until ``stop(interval)`` says so (it waits, and is True once asked to stop)."""
    checked: set[str] = set()
    while True:
        on_pass(mirror_pass(roots, store, checked, manifest_check=manifest_check))
        if once or stop(interval):
            return


#: Seconds between passes unless ``--interval`` (or ``PRIME_RUNS_MIRROR_INTERVAL``, read by
#: the command line, which checks it as it checks the option) says otherwise.
DEFAULT_INTERVAL = 5.0
