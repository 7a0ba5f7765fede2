"""One object store, behind the few operations sync needs (docs/sync.md, "Object stores").

Built on obstore (``file://`` aside, below): its ``PutMode`` has exactly the two conditional writes the lease and the
state rely on (create-only, ``If-None-Match: *``; replace-if-unchanged, ``If-Match: <etag>``),
it reads credentials from the usual environment and config of each store, and its reads
take byte ranges. Every failure leaves here as a :class:`StoreError` with one line of text.

A conditional write whose answer is lost is retried by the library, and the retry is then
refused (the first attempt landed): a refusal is therefore checked by reading the object
back, and when it holds exactly the bytes we wrote, the write was ours.

``file://`` is served by :mod:`prime_runs_spool.store.local_files` instead: the library's
local store cannot replace a file only if unchanged, so there the same calls are made on
the folder directly, with a file lock and a compare behind the conditional replace.
"""

from __future__ import annotations

import datetime
import os
import random
import threading
import time
from collections import Counter

from prime_runs_spool.errors import StoreConflict, StoreError, StoreSetupError
from prime_runs_spool.files import MAX_SMALL_FILE_BYTES
from prime_runs_spool.store.local_files import LocalFiles, local_root
from prime_runs_spool.store.object_info import ObjectInfo

#: The URL schemes the library opens (which were tested: docs/cli.md).
SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "file", "memory")
#: The scheme served by local_files.py rather than the library.
LOCAL_SCHEME = "file"
#: How to get the library: the package is on no index, so its extra is named for a clone
#: (the range is the `s3` extra's, pyproject.toml).
OBSTORE_INSTALL = ("pip install 'obstore>=0.12,<0.13' "
                   "(from a clone of prime-runs-spool, pip install -e '.[s3]' does the same)")
#: How often the library retries a failed request (connection errors, 5xx), and for how long.
RETRIES_ENV = "PRIME_RUNS_STORE_RETRIES"
DEFAULT_RETRIES = 10
MAX_RETRIES = 100
RETRY_TIMEOUT = datetime.timedelta(seconds=120)
#: The most :meth:`ObjectStore.read` fetches whole (the local limit, spool/layout.py): a
#: received bucket's state object of gigabytes was read into memory whole.
MAX_SMALL_OBJECT_BYTES = MAX_SMALL_FILE_BYTES
#: Bytes read from a file and sent per part of an upload (the mirror's): what an upload holds.
UPLOAD_PART_BYTES = 8 * 1024 * 1024


def is_store_url(text: object) -> bool:
    """Whether a command-line argument names an object store rather than a local path."""
    if not isinstance(text, str) or "://" not in text:
        return False
    return text.split("://", 1)[0].lower() in SCHEMES


#: The schemes whose URL names a folder after ``://`` (``file:///srv/runs``), not a bucket.
_PATH_SCHEMES = (LOCAL_SCHEME, "memory")


def url_problem(url: str) -> str | None:
    """Why a store URL cannot be used as given, or None. The store library takes neither a
    ``user:password@`` nor a ``?query`` or ``#fragment`` from the URL: it drops them without
    a word (credentials and settings come from the environment), so a key pasted into the
    URL was not used, and was printed back in every report line, a CI log's included. A
    prefix cut at a ``?`` or ``#`` would be another prefix than the one named."""
    scheme, _, rest = url.partition("://")
    place = rest.removeprefix("localhost") if scheme.lower() in _PATH_SCHEMES else rest.partition("/")[0]
    if not place.strip("/"):
        # ``file://$UNSET``: the whole file system (a mirror or a sync listed all of it, /proc
        # included, before it failed on a loop there); ``s3://$UNSET``: no bucket at all
        return ("a store URL names a bucket, or for file:// a folder, and this one names none (an unset "
                "variable?); give one, e.g. s3://bucket/outputs or file:///srv/runs")
    if "@" in rest.partition("/")[0]:
        return ("a store URL takes no user:password@ (the store library ignores it; credentials come from "
                "the environment, e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
    if "?" in rest or "#" in rest:
        return ("a store URL takes no ?query or #fragment (the store library ignores it; settings come from "
                "the environment, e.g. AWS_ENDPOINT_URL)")
    return None


def _shown(url: str) -> str:
    """``url`` as a message about it may show it: its scheme and bucket only when it holds
    what :func:`url_problem` refuses (a secret may be in that part)."""
    scheme, _, rest = url.partition("://")
    if "@" not in rest.partition("/")[0] and "?" not in rest and "#" not in rest:
        return url  # nothing of it is refused for what it may hide
    host = rest.partition("/")[0].rpartition("@")[2].partition("?")[0].partition("#")[0]
    return f"{scheme}://{host}/..."


def _retries() -> int:
    text = (os.environ.get(RETRIES_ENV) or "").strip()
    try:
        retries = int(text) if text else DEFAULT_RETRIES
    except ValueError:
        retries = -1
    if not 0 <= retries <= MAX_RETRIES:
        raise StoreSetupError(f"{RETRIES_ENV}={text[:40]!r} is not a whole number from 0 to {MAX_RETRIES}")
    return retries


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


class ObjectStore:
    """The objects under one URL's prefix. Thread-safe (the library's client is)."""

    def __init__(self, url: str) -> None:
        problem = url_problem(url)
        if problem:
            raise StoreSetupError(f"{_shown(url)}: {problem}")
        self.url = url.rstrip("/")
        self._lock = threading.Lock()
        #: Requests made, by kind (``list``, ``get``, ``put``) and bytes read (``bytes_read``):
        #: what the benchmarks and tests count to prove a no-op costs one listing.
        self.stats: Counter[str] = Counter()
        self._local: LocalFiles | None = None
        if self.url.split("://", 1)[0].lower() == LOCAL_SCHEME:
            self._local = LocalFiles(local_root(self.url))
            return
        try:
            from obstore.store import from_url
        except ImportError:
            raise StoreSetupError(f"{url}: store URLs need obstore: {OBSTORE_INSTALL}") from None
        retries = _retries()
        try:
            self._store = from_url(self.url, retry_config={
                "max_retries": retries, "retry_timeout": RETRY_TIMEOUT,
                "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                            "max_backoff": datetime.timedelta(seconds=5), "base": 2.0}})
        except Exception as exc:  # a bad URL, or configuration the library rejects
            raise StoreSetupError(f"{url}: cannot open the store: {_first_line(exc)}") from None
        self._retries = retries

    def location(self, key: str) -> str:
        """The full URL of ``key``, as reports name it."""
        return f"{self.url}/{key}" if key else self.url

    def _count(self, kind: str, amount: int = 1) -> None:
        with self._lock:
            self.stats[kind] += amount

    def list(self, under: str = "") -> list[ObjectInfo]:
        """Every object under the prefix (one listing, paged by the library), or only those
        below its folder ``under`` (keys still from the prefix)."""
        self._count("list")
        if self._local is not None:
            try:
                return self._local.list(under)
            except OSError as exc:
                raise StoreError(f"{self.url}: cannot list: {_os_reason(exc)}") from None
        import obstore

        found = []
        try:
            for page in obstore.list(self._store, under or None, chunk_size=1000):
                found += [ObjectInfo(str(m["path"]), int(m["size"]), _quoted(m.get("e_tag")),
                                     _epoch(m.get("last_modified"))) for m in page]
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise StoreError(f"{self.url}: cannot list: {_first_line(exc)}") from None
        return found

    def read_range(self, key: str, start: int, end: int, etag: str | None) -> bytes:
        """Bytes ``[start, end)`` of ``key``, refused if the object is no longer ``etag``
        (re-uploaded since it was listed: what was listed is what gets read, or nothing)."""
        if end <= start:
            return b""
        self._count("get")
        if self._local is not None:
            try:
                data = self._local.read_range(key, start, end, etag)
            except StoreConflict:
                raise _changed_while_read(self.location(key)) from None
            except OSError as exc:
                raise StoreError(f"{self.location(key)}: cannot read: {_os_reason(exc)}") from None
            self._count("bytes_read", len(data))
            return data
        import obstore

        options: dict[str, object] = {"range": (start, end)}
        if etag:
            options["if_match"] = etag
        try:
            data = bytes(obstore.get(self._store, key, options=options).bytes())
        except Exception as exc:
            raise self._error(exc, key, "read") from None
        self._count("bytes_read", len(data))
        return data

    def read(self, key: str) -> tuple[bytes, str | None] | None:
        """A small object whole, with its etag; None when there is none."""
        self._count("get")
        if self._local is not None:
            return self._read_local(key)
        import obstore

        try:
            result = obstore.get(self._store, key)
            size = result.meta.get("size")
            if isinstance(size, int) and size > MAX_SMALL_OBJECT_BYTES:  # before its body is fetched
                raise self._too_large(key, size)
            data = bytes(result.bytes())
        except FileNotFoundError:
            return None
        except StoreError:
            raise
        except Exception as exc:
            raise self._error(exc, key, "read") from None
        self._count("bytes_read", len(data))
        return data, result.meta.get("e_tag")

    def exists(self, key: str) -> bool:
        """Whether ``key`` is there (one metadata request): the mirror asks it after a run's
        first upload failed, to tell a store that holds nothing of the run."""
        self._count("get")
        if self._local is not None:
            try:
                os.lstat(self._local.path(key))
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise StoreError(f"{self.location(key)}: cannot read: {_os_reason(exc)}") from None
            return True
        import obstore

        try:
            obstore.head(self._store, key)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._error(exc, key, "read") from None
        return True

    def _too_large(self, key: str, size: int) -> StoreError:
        return StoreError(f"{self.location(key)}: {size:,} bytes, more than a sync state or lease ever "
                          f"holds ({MAX_SMALL_OBJECT_BYTES:,}); not read (delete it if it is not yours)")

    def _read_local(self, key: str) -> tuple[bytes, str | None] | None:
        assert self._local is not None
        try:
            found = self._local.read(key, MAX_SMALL_OBJECT_BYTES)
        except OSError as exc:
            raise StoreError(f"{self.location(key)}: cannot read: {_os_reason(exc)}") from None
        if found is None:
            return None
        data, etag, size = found
        if size > MAX_SMALL_OBJECT_BYTES:
            raise self._too_large(key, size)
        self._count("bytes_read", len(data))
        return data, etag

    def create(self, key: str, data: bytes) -> str | None:
        """Write ``key`` only if it does not exist (``If-None-Match: *``); its new etag."""
        return self._put(key, data, "create")

    def replace(self, key: str, data: bytes, etag: str) -> str | None:
        """Write ``key`` only if it still is ``etag`` (``If-Match``); its new etag."""
        return self._put(key, data, {"e_tag": etag})

    def upload_prefix(self, key: str, path: os.PathLike[str] | str, size: int) -> None:
        """Replace ``key`` with the first ``size`` bytes of the file at ``path``, streamed in
        parts (a large segment is never held whole); a failed upload is aborted, leaving the
        object as it was. Unconditional: only the spool's mirror writes segments."""
        self._count("put")
        if self._local is not None:
            try:
                return self._local.upload_prefix(key, path, size)
            except OSError as exc:
                raise StoreError(f"{self.location(key)}: cannot upload: {_os_reason(exc)}") from None
        import obstore

        try:
            with open(path, "rb") as f, obstore.open_writer(self._store, key) as out:
                left = size
                while left > 0:
                    chunk = f.read(min(UPLOAD_PART_BYTES, left))
                    if not chunk:
                        raise StoreError(f"{path}: shorter than the {size} bytes to upload")
                    out.write(chunk)
                    left -= len(chunk)
        except StoreError:
            raise
        except OSError:
            raise
        except Exception as exc:
            raise self._error(exc, key, "upload") from None

    def overwrite(self, key: str, data: bytes) -> None:
        """Write a small ``key`` whatever it holds. Unconditional: only the mirror's own
        objects (a segment's live marker) are written this way."""
        self._count("put")
        if self._local is not None:
            try:
                return self._local.overwrite(key, data)
            except OSError as exc:
                raise StoreError(f"{self.location(key)}: cannot write: {_os_reason(exc)}") from None
        import obstore

        try:
            obstore.put(self._store, key, data)
        except Exception as exc:
            raise self._error(exc, key, "write") from None

    def delete(self, key: str) -> None:
        """Remove ``key``; one already gone is no error."""
        self._count("delete")
        if self._local is not None:
            try:
                return self._local.delete(key)
            except OSError as exc:
                raise StoreError(f"{self.location(key)}: cannot delete: {_os_reason(exc)}") from None
        import obstore

        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._error(exc, key, "delete") from None

    def _put(self, key: str, data: bytes, mode: object) -> str | None:
        """A conditional write, tried again after a failure that is not a refusal (the library
        does not retry a conditional PUT whose connection failed). Safe: if an earlier try
        landed, the next is refused, and the read-back finds our own bytes."""
        if self._local is not None:
            return self._put_local(key, data, mode)
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        attempt = 0
        while True:
            self._count("put")
            try:
                return obstore.put(self._store, key, data, mode=mode)["e_tag"]
            except (AlreadyExistsError, PreconditionError):
                now = self.read(key)  # a lost answer retried: refused, yet the first try landed
                if now is not None and now[0] == data:
                    return now[1]
                raise StoreConflict(f"{self.location(key)} was changed by someone else", now) from None
            except Exception as exc:
                attempt += 1
                if attempt > self._retries:
                    raise self._error(exc, key, "write") from None
                time.sleep(min(5.0, 0.1 * 2 ** (attempt - 1)) * random.random())

    def _put_local(self, key: str, data: bytes, mode: object) -> str:
        """A conditional write on a local folder: no answer is lost there, so a refusal is one."""
        assert self._local is not None
        self._count("put")
        try:
            if mode == "create":
                return self._local.create(key, data)
            assert isinstance(mode, dict)
            return self._local.replace(key, data, mode["e_tag"])
        except StoreConflict:
            raise StoreConflict(f"{self.location(key)} was changed by someone else") from None
        except OSError as exc:
            raise StoreError(f"{self.location(key)}: cannot write: {_os_reason(exc)}") from None

    def _error(self, exc: Exception, key: str, verb: str) -> StoreError:
        from obstore.exceptions import PreconditionError

        if isinstance(exc, PreconditionError):
            return _changed_while_read(self.location(key))
        return StoreError(f"{self.location(key)}: cannot {verb}: {_first_line(exc)}")


def _quoted(etag: str | None) -> str | None:
    """An etag as requests and answers carry it, in quotes: Azure's listing gives it bare
    (``0x8D...``) where its reads and writes give ``"0x8D..."``, and the cached state's etag,
    taken from a write, must compare equal to the listing's."""
    if etag is None or etag.startswith(('"', 'W/"')):
        return etag
    return f'"{etag}"'


def _epoch(when: object) -> float | None:
    """A listing's ``last_modified`` (a datetime) as seconds since the epoch."""
    return when.timestamp() if isinstance(when, datetime.datetime) else None


def _changed_while_read(location: str) -> StoreConflict:
    return StoreConflict(f"{location} changed while it was read (re-uploaded?); "
                         "run the command again to read the new version")


def _os_reason(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"
