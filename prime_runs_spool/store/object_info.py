"""One object of a store's listing, in a module of its own: both the library-backed store
(store/objects.py) and the ``file://`` one (store/local_files.py) list objects, and the first
opens the second, so what they both return lives below them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing: its key below the store's prefix, its size, its etag, and
    when it was last written (seconds since the epoch, by the store's clock; None if unknown)."""

    key: str
    size: int
    etag: str | None
    modified: float | None = None
