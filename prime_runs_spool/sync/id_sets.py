"""Sets of episode ids a sync state names without holding them: each a file of its own beside
the state, written once, named by the digest of its bytes (docs/sync.md, "State").

Why: ``held_there`` and ``on_platform`` hold one id per episode the platform held when a pass
found the run (a lost state's evaluation, vf-eval's own push). Held in the state itself,
100,000 of them made a 3.9 MB state that every save rewrote (230 M instructions a save
against 0.34 M) and every load parsed (84-155 ms; docs/benchmarks.md). They are fixed once
found, so the state holds only ``{"count", "digest"}`` and a save costs the same for any
number of ids.

- **Crash**: a set's file is written whole and durable (its bytes, then its name: the folder
  fsync'd) before the state that names it is written, so no state on disk names a file that
  a power cut can take back; a cut between leaves a file no state names, which costs only
  its bytes (a pass that finds the ids again names the same file: its name is its content).
- **Copies**: not hidden (an artifact upload keeps it, as ``cp -r`` does), and not ``*.json``
  (no reader takes it for a state); ``adopt_states`` copies those each state names before it.
- **A state whose file is missing** (a copy made without it) is refused when it is read, in
  one line that names the file (:class:`StateProblem`): the pass then reconciles with the
  platform as for any damaged state, and finds the ids again. A file that does not match its
  digest is refused when its ids are first read (a pass about to cut a batch): the run's
  error, in one line that says how to start over from the platform, and nothing sent.
- **Object stores**: an object of its own beside the state object, created before the state
  names it (sync/store_sync.py); the state object stays one object. A machine's copy of it
  is a cache written without an fsync, so a pass checks it against its digest, and fetches
  it again when a power cut tore it, instead of failing every sync of the run; a state
  object of version 1 has its ids written beside this machine's copy, which names them.
- **Removal** (:func:`sweep`, :func:`unnamed`): a file no state names (a lost state's, one
  an older release's reconcile stopped naming, an adopted or copied leftover, a crash's
  between a file and its state) is removed, only by the holder of the lock or lease that
  owns the folder's states, before its pass writes anything: then no writer is between a
  file and the state that will name it (in a store, a holder stopped past its lease is not:
  it renews the lease after making an object, before its state names it, sync/store_sync.py).
  "Named" is read as text, any 32 hex digits in any
  other file there (every state, its twin, a state moved aside, one a newer release wrote
  or a damaged one): a file that may be named is kept; a file that cannot be read keeps them all.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_runs_spool.errors import DocumentError, StateProblem
from prime_runs_spool.files import read_regular_file, replace_private

#: A set's file is ``ids-<digest>.ids`` in the state's folder.
PREFIX, SUFFIX = "ids-", ".ids"
GLOB = f"{PREFIX}*{SUFFIX}"
#: The state's fields that are such sets (sync/state.py, ``SyncState``).
FIELDS = ("on_platform", "held_there")
#: What a digest is: 32 hex digits, so a damaged state cannot name a file elsewhere.
DIGEST = re.compile(r"[0-9a-f]{32}")


@dataclass(kw_only=True)
class IdSet:
    """A set of episode ids, as a state holds it: how many, and the digest of its file (the
    ids sorted, as a JSON array). The ids themselves are read from the file when first asked
    for (:meth:`ids`); a status or a probe, which needs only the count, never reads them."""

    count: int
    digest: str
    #: The ids, once made or read.
    _ids: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)
    #: The file's bytes while only this process holds them (made here, not stored yet).
    _data: bytes | None = field(default=None, init=False, repr=False, compare=False)
    #: The folder whose file holds them (read there, or stored there by this process).
    _folder: str | None = field(default=None, init=False, repr=False, compare=False)
    #: What messages call the file when it is only this machine's copy of an object (its URL).
    _shown: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, ids: Iterable[str]) -> IdSet | None:
        """The set of ``ids``, not stored yet; None for no id (a state then names no file)."""
        unique = sorted(set(ids))
        if not unique:
            return None
        data = orjson.dumps(unique)
        made = cls(count=len(unique), digest=_digest(data))
        made._ids, made._data = frozenset(unique), data
        return made

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.digest}{SUFFIX}"

    def problem(self) -> str | None:
        """What no sync writes (a damaged state's): a digest that names no such file."""
        if DIGEST.fullmatch(self.digest) is None:
            return f"{self.digest[:80]!r} is not the digest of a file of ids"
        return None if self.count > 0 else "a file of ids named with no id in it"

    @property
    def path(self) -> str:
        """Where its file is: in the folder of the state it was read with, or stored by."""
        return os.path.join(self._folder or os.curdir, self.name)

    def missing(self) -> bool:
        """Whether its file is not where the state was read (a copy made without it), nor
        the ids in this process (a state of version 1 holds them itself)."""
        return not self.unstored and not os.path.isfile(self.path)

    def ids(self) -> frozenset[str]:
        """The ids: read from the file, and checked against the digest, the first time."""
        if self._ids is None:
            self._ids = frozenset(self._read()[1])
        return self._ids

    def data(self) -> bytes:
        """The file's bytes (read from where it lies, when this process holds neither them nor the ids)."""
        if self._data is not None:
            return self._data
        return orjson.dumps(sorted(self._ids)) if self._ids is not None else self._read()[0]  # as :meth:`of` made them

    def _read(self) -> tuple[bytes, list[str]]:
        path = self.path
        try:
            data = read_regular_file(path)
        except OSError as exc:
            raise StateProblem(f"{self._shown or path}: cannot read the episode ids the sync state beside it names: "
                               f"{exc.strerror}") from None
        # Its digest matching, these are the bytes a save wrote: a sorted array of strings.
        ids = orjson.loads(data) if _digest(data) == self.digest else None
        if not isinstance(ids, list) or len(ids) != self.count:
            # An object is created once, never replaced (its name is its content): the
            # state moved aside, a pass finding the same ids would name it again.
            todo = "delete that object" if self._shown else "move that state aside"
            raise StateProblem(f"{self._shown or path}: damaged (not the episode ids the sync state beside it "
                               f"names); {todo} and sync again: the platform is asked what it holds")
        return data, ids

    def shown_as(self, location: str) -> None:
        """Its file is this machine's copy of the object at ``location``: messages name that."""
        self._shown = location

    @property
    def unstored(self) -> bool:
        """Whether the ids are this process's alone, in no file yet: made here, or read from
        a state of version 1, which held them itself."""
        return self._data is not None

    def intact_at(self, path: str) -> bool:
        """Whether the file at ``path`` holds this set's bytes (a cache's copy, written without
        an fsync, that a power cut may have left empty or short under its name)."""
        try:
            return _digest(read_regular_file(path)) == self.digest
        except OSError:
            return False

    def found_in(self, folder: str) -> None:
        """The state naming this set was read in ``folder``: the file is there, unless the
        state held the ids itself (version 1), which its next save stores."""
        if self._data is None:
            self._folder = folder

    def store(self, folder: str, *, durable: bool = True, again: bool = False, parents: bool = True) -> bool:
        """The file written in ``folder``, whole, and (``durable``) its bytes and its name made
        durable, before a state there names it; once per folder (``again``: once more, as a
        file another holder may have removed). Whether it was written now. ``parents``: as
        ``replace_private``'s."""
        if self._folder == folder and not again:
            return False
        replace_private(os.path.join(folder, self.name), self.data(), durable=durable,  # type: ignore[arg-type]
                        parents=parents)
        self._folder, self._data = folder, None  # read there again if asked: the pass holds only the ids
        return True


#: A digest a file mentions, as text: 32 hex digits that are not part of a longer run.
MENTIONED = re.compile(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")


def unnamed(names: Iterable[str], documents: Iterable[bytes]) -> list[str]:
    """Of ``names`` (files or objects of ids), those no document mentions (:data:`MENTIONED`)."""
    sets = {name: digest for name in names if (digest := digest_of_name(name)) is not None}
    for document in documents:
        if not sets:
            break
        mentioned = {found.decode() for found in MENTIONED.findall(document)}
        sets = {name: digest for name, digest in sets.items() if digest not in mentioned}
    return sorted(sets)


def digest_of_name(name: str) -> str | None:
    """The digest of a file of ids named ``name``; None for any other name."""
    digest = name[len(PREFIX):-len(SUFFIX)] if name.startswith(PREFIX) and name.endswith(SUFFIX) else ""
    return digest if DIGEST.fullmatch(digest) else None


def sweep(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the files of ids in ``folder`` that no other file there names, and what a write
    of one cut short left (its temporary file); the names removed. Only by the holder of the
    lock or lease that owns the folder's states, before its pass writes: no writer is then
    between a file and its state. One listing when the folder holds no such file."""
    try:
        with os.scandir(folder) as listing:
            entries = [(entry.name, entry.path) for entry in listing]
    except OSError:
        return []
    sets = [name for name, _ in entries if digest_of_name(name) is not None]
    torn = [path for name, path in entries if name.startswith(f".{PREFIX}") and name.endswith(".tmp")]
    if not sets and not torn:
        return []
    documents = []
    for name, path in entries:
        if name in sets or path in torn:
            continue
        try:
            documents.append(read_regular_file(path))
        except OSError:
            if os.path.isdir(path):  # no state: a folder is never read as one
                continue
            return []  # it may name any of them: none removed
    removed = []
    for path in [*torn, *(os.path.join(folder, name) for name in unnamed(sets, documents))]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError:
            break  # a folder that cannot be written: left as it is, named or not
        removed.append(os.path.basename(path))
    return removed


def named_by(state: Any) -> list[IdSet]:
    """The sets of ids a state (sync/state.py, ``SyncState``) names."""
    return [found for name in FIELDS if (found := getattr(state, name)) is not None]


def version_1_arrays(document: Any) -> dict[str, list[str]]:
    """A state of version 1's sets of ids, taken out of its ``document``: arrays of strings
    there, each made an :class:`IdSet` once the state is built (stored by its next save)."""
    if not isinstance(document, dict) or document.get("version", 1) != 1:
        return {}
    arrays = {}
    for name in FIELDS:
        ids = document.pop(name, None)
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            raise DocumentError(f"$.{name}: expected an array of strings")
        if ids is not None:
            arrays[name] = ids
    return arrays


def size_of(found: IdSet | None) -> int:
    return 0 if found is None else found.count


def members_of(found: IdSet | None) -> frozenset[str]:
    return frozenset() if found is None else found.ids()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]
