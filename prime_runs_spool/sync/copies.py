"""Copies of one spool on this machine: the lock that keeps their passes apart, and what each
holder leaves for the next (docs/sync.md, "Concurrency").

The sync lock (``spool/sync.lock``) belongs to a spool's folder, so it does not see a copy of
the folder (``cp -r``, one CI artifact unpacked by two jobs). What two copies share is on the
platform: the run's one evaluation, found by the run's key (local run id, replay id) on one
destination (sync/evaluation.py). So the part of a pass that may write to the platform (find
or create the evaluation, append, finish) also holds a lock named by destination and run
key, in this user's cache (``$XDG_CACHE_HOME/prime-runs/copies/``, spool/layout.py; folders
0700, files 0600). It is an ``flock``: the kernel drops it when its holder dies, SIGKILL
included, and its file is never deleted (unlinking a locked file lets a second holder in on
a new inode).

A lock alone is not enough, because each copy keeps a sync state of its own. So the lock file
also holds a note, rewritten by each holder: which state file it syncs from, whether its pass
is under way and whether it announced a request yet, and, when the pass ended, the send time
of a request it left in doubt. A pass
that finds another state named there, or none (:attr:`CopyLock.foreign`), knows another copy
may have pushed since its own state was written, even one this process wrote itself: it
checks that state against the platform before sending anything, as after a crash
(sync/reconcile.py, ``Reconciler.verify``). And before it reads the platform at all, it waits
out a request that other copy may still have on its way (:meth:`CopyLock.in_doubt`), as the
protocol waits out its own (sync/protocol.py, ``Protocol.fence``): a holder that ended with
one says when it was sent; one that died mid-pass left its note "under way", and its state
file, which announces every request before it is sent, says whether one was, when it is
the state that pass wrote last: the note carries the mark of the pass's last announcement,
and every state it writes from then on carries it too (``SyncState.pass_mark``). A state
with another mark (an older copy put back over it, even one taken during that pass) cannot
say, and a whole lifetime is waited, unless that holder and this pass are both under the
run's lease in an object store (sync/leased.py), which announced the request first. A holder that
died before its first announcement left a note saying so (``announced: false``, rewritten
just before that announcement): nothing of it can land, so the next pass waits for nothing,
though its state is missing (a first sync stopped at once while it read the platform: no
state was ever written), which otherwise costs a whole request lifetime, since a state
deleted after the pass announced a request (the folder unpacked again) cannot say so.

What this does not cover: copies synced at once from two machines, or by two users (each has
its own cache), or by syncs whose ``XDG_CACHE_HOME`` differ. The platform's create and append
are not idempotent and take no token that would let the second be refused.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from prime_runs_spool.errors import CopyBusyError, StateFormatError, SyncError
from prime_runs_spool.files import FILE_MODE, printable
from prime_runs_spool.spool.layout import LOCK_SUFFIX
from prime_runs_spool.sync.options import COPY_WAIT_ENV, SAMPLES
from prime_runs_spool.sync.sinks.registry import is_sink
from prime_runs_spool.sync.state import CREATE, FINALIZE, InFlight, SyncState, read_state
from prime_runs_spool.sync.user_cache import CACHE_ENV, private_folder

if TYPE_CHECKING:
    from prime_runs_spool.sync.protocol import Protocol


#: In this user's cache, outside any spool (sync/user_cache.py): the folder of the copy locks,
#: which keep syncs of copies of one spool folder apart (docs/sync.md "Concurrency").
COPY_LOCKS_DIRNAME = "copies"


def copy_lock_path(folder: Path, stem: str) -> Path:
    """One run's copy lock on one destination (flock'd, never deleted; it holds its last
    holder's note): ``stem`` names the run and destination."""
    return folder / f"{stem}{LOCK_SUFFIX}"

#: How often a waiting pass tries the lock again.
POLL = 0.1
#: What :meth:`CopyLock.in_doubt` answers when another copy's pass may have left a request in
#: flight at a time it cannot tell: the caller waits a whole request lifetime.
UNKNOWN = math.inf
#: The request kinds a copy's later pass could send a second time (sync/state.py, InFlight).
#: A traces batch is not among them: it is content-addressed, a resend is answered with the
#: receipt (sync/sinks/addressed.py).
_NOT_IDEMPOTENT = frozenset({CREATE, SAMPLES, FINALIZE})


def run_key_digest(destination_key: str, local_run_id: str, replay_id: str | None) -> str:
    """The file name stem for one run on one destination (JSON keeps the parts apart)."""
    return hashlib.sha256(orjson.dumps([destination_key, local_run_id, replay_id])).hexdigest()[:32]


class CopyLock:
    """The lock of one run (its key) on one destination, held by the pass syncing from the
    state file ``holder``: ``with CopyLock(...).hold(wait) as lock: ...``, and
    :meth:`release` says what the pass leaves in doubt."""

    def __init__(self, destination_key: str, local_run_id: str, replay_id: str | None, holder: Path,
                 run: str) -> None:
        self.stem = run_key_digest(destination_key, local_run_id, replay_id)
        self.local_run_id = local_run_id
        #: The state file this pass syncs from, what tells the copies apart (its absolute
        #: path's bytes in hex: a folder name need not be UTF-8, the note is JSON).
        self.holder = os.fsencode(os.path.abspath(holder)).hex()
        #: The run's folder (or URL), named to whoever waits for it.
        self.run = printable(run)
        #: Set by :meth:`hold`: whether the last pass that held the lock synced another state
        #: (or none is known), so this pass's state may be behind the platform.
        self.foreign = True
        #: The note the last holder left, as found by :meth:`hold`.
        self.previous: dict[str, Any] = {}
        self._in_doubt: float | None = None
        #: Set by :meth:`hold`: the sink (TRACES or SAMPLES) a pass of this run last sent its
        #: episodes to, as its note says: a copy whose own state does not know yet must not
        #: put them in the other one too.
        self.sink: str | None = None
        self._fd: int | None = None
        #: The lock file (set by :meth:`hold`) and how long the note in it is.
        self._path: Path | None = None
        self._note_bytes = 0
        #: The note this pass wrote when it took the lock.
        self._note: dict[str, Any] = {}
        #: What marks this pass's announcements (``pass_mark``): a token of its own, and how
        #: many it wrote.
        self._token = secrets.token_hex(8)
        self._marks = 0

    def hold(self, wait: float | None, protocol: Protocol | None = None) -> CopyLock:
        """Take the lock, waiting at most ``wait`` seconds (None: until it is free; the wait
        is real time, whatever clock the engine runs on), and note this pass under way, with
        nothing announced until ``protocol`` (the pass's) is about to write its first
        announcement (:meth:`_announcing`). :class:`CopyBusyError` when another pass still
        holds it, naming its folder; :class:`SyncError` when the folder or file cannot be used."""
        try:
            path = copy_lock_path(_folder(), self.stem)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, FILE_MODE)
            except FileNotFoundError:  # the cache was cleared while this process ran
                path = copy_lock_path(_folder(again=True), self.stem)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | _NO_FOLLOW, FILE_MODE)
        except OSError as exc:
            raise SyncError(f"cannot take this run's copy lock in {printable(str(exc.filename or COPY_LOCKS_DIRNAME))}: "
                            f"{exc.strerror or exc}; set {CACHE_ENV} to a writable folder") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device: no note could be read from it
                raise SyncError(f"this run's copy lock {printable(path.as_posix())} "
                                "is not a regular file; remove it (sync makes it again)")
            deadline = None if wait is None else time.monotonic() + max(0.0, wait)
            while not _try_lock(fd):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CopyBusyError(self._busy_message(_read_note(fd)[0], wait))
                time.sleep(POLL if left is None else min(POLL, left))
            self.previous, found = _read_note(fd)
            self.foreign = self.previous.get("holder") != self.holder
            own = protocol.state.in_flight if protocol is not None and protocol.state is not None else None
            leased = protocol is not None and protocol.LEASED
            self._in_doubt = self._left_in_doubt(own, known=protocol is not None, leased=leased)
            sink = self.previous.get("store")  # the note's key, as notes already written have it
            self.sink = sink if is_sink(sink) else None
            # Until its first announcement, what this pass may leave in flight is what its
            # state announced when it was read: said here, for a pass that finds it dead.
            self._note = {"holder": self.holder, "run": self.run, "under_way": True, "announced": protocol is None,
                          "in_doubt": _not_idempotent(own), **({"leased": True} if leased else {}),
                          **self._handed_on()}
            self._note_bytes = _write_note(fd, self._note, path, found)
        except BaseException:
            os.close(fd)  # drops the lock too, if it was taken
            raise
        self._fd, self._path = fd, path
        if protocol is not None:
            protocol.before_announcement = self._announcing
        return self

    def _announcing(self) -> str:
        """The pass is about to write an announcement: from now on, were it to die mid-pass,
        its state file says what may still land (written before it can be sent), provided it
        is the state written with the mark noted here (returned, for the state to carry until
        the next one). One written before it, put back, is not (:func:`_put_back`). One
        ``pwrite`` an announcement, not fsync'd (:func:`_write_note`)."""
        self._marks += 1
        mark = f"{self._token}.{self._marks}"
        if self._fd is not None:
            self._note_bytes = _write_note(self._fd, {**self._note, "announced": True, "mark": mark},
                                           self._path, self._note_bytes)
        return mark

    def in_doubt(self) -> float | None:
        """The wall-clock send time of a request another copy's pass may still have on its
        way, which this pass must wait out (``Protocol.fence``) before it reads the platform;
        :data:`UNKNOWN` when there may be one sent at a time the note cannot tell; None when
        there is none, or it is this pass's own state's to settle (the last holder synced
        from it). Read by :meth:`hold`."""
        return self._in_doubt

    def _left_in_doubt(self, own: InFlight | None, *, known: bool, leased: bool) -> float | None:
        """What :meth:`in_doubt` answers, from the note :meth:`hold` found: the request the
        last holder left in doubt (its note's ``in_doubt``: when its pass ended, or, for one
        that died before it announced anything, when it began), unless this pass's own
        state announces it (``own``, its ``in_flight``; ``known``: given), which its
        protocol settles; and the one a pass before it left, which the last holder was to
        wait out and handed on (``others``) because it may have been stopped or killed
        before it had (this pass's own last holding too); and, for a last holder that died
        mid-pass after it began to announce (or whose note does not say), the request its
        state file announces. A pass under a run's lease (``leased``) taking over from a
        holder under it too needs no put-back wait (:func:`_put_back`): that holder announced
        every request in the lease before sending it, and the lease's next taker waits it out
        or reads it in the state the store holds (sync/leased.py). That state, written by
        another syncer since, bears that syncer's marks: taken for a copy put back, it cost a
        whole lifetime (tests/test_store_lease_handover.py)."""
        note = self.previous
        if not note:
            return None
        times = [_send_time(note.get("others"))]
        if not note.get("under_way") or note.get("announced") is False:
            left = _send_time(note.get("in_doubt"))
            # This pass's own state that no longer announces it (lost, or put back from an
            # older copy) cannot have it settled: it is waited out as another copy's is.
            if self.foreign or (known and left is not None and _not_idempotent(own) != left):
                times.append(left)
        else:
            # It died mid-pass, once it had begun to announce: its state file announced any
            # request before sending it.
            try:
                state, _ = read_state(os.fsdecode(bytes.fromhex(str(note["holder"]))))
            except (KeyError, OSError, ValueError, StateFormatError):
                # Moved, deleted or damaged since: it cannot say. This pass's own state too
                # (the folder unpacked again after a kill): what it announced is gone with it.
                times.append(UNKNOWN)
            else:
                pending = state.in_flight
                if self.foreign and pending is not None and pending.kind in _NOT_IDEMPOTENT:
                    times.append(pending.sent_at)  # this pass's own is its protocol's to settle
                elif not self.foreign and not (leased and note.get("leased") is True) and _put_back(state, note):
                    times.append(UNKNOWN)
        found = [sent_at for sent_at in times if sent_at is not None]
        return max(found) if found else None

    def _handed_on(self) -> dict[str, float]:
        """The note's ``others``: the request in doubt this pass is to wait out, handed on
        until it can no longer land (a stale one costs the next pass nothing), so that a
        pass stopped while it waits does not let the next one in without waiting. A time
        the note could not tell counts from now."""
        if self._in_doubt is None:
            return {}
        return {"others": time.time() if self._in_doubt == UNKNOWN else self._in_doubt}

    def release(self, pending: InFlight | None = None, sink: str | None = None) -> None:
        """Let the next pass in, noting the send time of ``pending``, the request this pass
        leaves unsettled (its state's ``in_flight``), for another copy to wait out, and
        ``sink``, where its episodes went (else the one the note said)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            _write_note(fd, {"holder": self.holder, "run": self.run, "under_way": False,
                             "in_doubt": _not_idempotent(pending),
                             "store": sink or self.sink, **self._handed_on()}, self._path, self._note_bytes)
        finally:
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> CopyLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _busy_message(self, note: dict[str, Any], wait: float | None) -> str:
        other = note.get("run") if isinstance(note.get("run"), str) else "another folder"
        waited = (f"waited {wait:g} s for it (--copy-wait S or {COPY_WAIT_ENV} waits longer, --wait until it "
                  "is done)") if wait else "not waited for"
        return (f"another prime-runs sync on this machine is pushing a copy of this run (local run id "
                f"{self.local_run_id}) to this destination, from {other}; {waited}")


_NO_FOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

#: The copy locks' folder, made (0700) once per process and cache location: checking it at
#: every pass cost more than the lock itself.
_FOLDERS: dict[tuple[str | None, str | None], Path] = {}


def _folder(*, again: bool = False) -> Path:
    key = (os.environ.get(CACHE_ENV), os.environ.get("HOME"))
    folder = None if again else _FOLDERS.get(key)
    if folder is None:
        folder = _FOLDERS[key] = private_folder(COPY_LOCKS_DIRNAME)
    return folder


def _put_back(state: SyncState, note: dict[str, Any]) -> bool:
    """Whether this pass's own state, read after its last holder died mid-pass once it had
    begun to announce (``note``, the holder's), may be an older copy put back since (a
    backup, an artifact unpacked again) rather than what that holder last wrote: it is not
    written with the mark of that holder's last announcement (``SyncState.pass_mark``; a
    note from before marks: it announces no request sent since the holder began). Such a
    state cannot say what that holder had on its way: its create or samples request, still
    landing, met the count this pass read, and the rows went twice (tests/test_sync_copies.py).
    The mark tells the holder's own last state from a copy of it, with or without a request
    settled since (one killed between a settled request and the next announcement waited a
    lifetime), and from a copy taken earlier in that pass (trusted, it settled its older
    request and sent the rows of the one still on its way). A run in Prime Traces too: its
    batches are content-addressed, but its finalize is not, and a state that does not
    announce it cannot have it settled by the evaluation's status (read RUNNING while the
    holder's finalize was still on its way, the pass finalized again: the statistics job run
    twice)."""
    mark = note.get("mark")
    if isinstance(mark, str):
        if state.pass_mark == mark:
            return False
    elif (announced_at := _send_time(note.get("announced_at"))) is None:
        return False  # a note from before either was kept: as before
    elif (pending := state.in_flight) is not None and pending.sent_at >= announced_at:
        return False
    return True


def _not_idempotent(pending: InFlight | None) -> float | None:
    """The send time of ``pending`` when a copy's later pass could send it a second time."""
    return pending.sent_at if pending is not None and pending.kind in _NOT_IDEMPOTENT else None


def _send_time(value: Any) -> float | None:
    """A send time as a note holds it: None when there is none; :data:`UNKNOWN` for one no
    clock can be compared with (a note edited or torn: NaN, infinite, or too large a number)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return UNKNOWN
    return seconds if math.isfinite(seconds) else UNKNOWN


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise SyncError(f"cannot take this run's copy lock: {exc.strerror}") from None
    return True


def _write_note(fd: int, note: dict[str, Any], path: Path | None, before: int) -> int:
    """Replace the note in the lock file, whose bytes were ``before`` long: one write at its
    start, a note shorter than the one before padded with spaces to its length (JSON's
    whitespace), not cut off: one system call, where the note's ``"announced": true`` after
    ``false`` made it two for every new run. Were a holder killed mid-write, :func:`_read_note`
    reads the note and ignores what follows it. Not fsync'd: after a power cut every state is
    read by a new process, which checks it against the platform anyway
    (SyncState.written_here). ``path``: the lock file's, for the error a failed write raises.
    Returns how long the file's note (padding included) now is."""
    data = orjson.dumps(note)
    if before > len(data) and before < 1 << 16:  # a longer file (one read's worth) is cut, as before
        data += b" " * (before - len(data))
    try:
        os.pwrite(fd, data, 0)
        if before > len(data):
            os.ftruncate(fd, len(data))
    except OSError as exc:  # a full disk: the error names the lock file, not the run it is for
        raise OSError(exc.errno, exc.strerror, os.fspath(path or COPY_LOCKS_DIRNAME)) from None
    return len(data)


def _read_note(fd: int) -> tuple[dict[str, Any], int]:
    """The note at the start of the lock file: {} for a new lock; for bytes that are no note
    (torn by a power cut), one that says a pass was under way, from a state it cannot name;
    and how many bytes the file holds (at most what one read takes: a longer file is cut)."""
    data = os.pread(fd, 1 << 16, 0)
    if not data:
        return {}, 0
    size = len(data) if len(data) < 1 << 16 else 1 << 62
    try:
        note, _ = json.JSONDecoder().raw_decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        note = None
    return (note if isinstance(note, dict) else {"under_way": True}), size
