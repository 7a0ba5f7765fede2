"""What sync remembers beside a spool, one file per destination (docs/sync.md, "State").

The state is a promise about the platform: "exactly ``samples_pushed`` rows of this run's
row stream are on evaluation ``evaluation_id``, and nothing else of ours is in flight, unless
``in_flight`` says so". Everything sync does keeps that promise true at every instant a
process could die, which is why the state is written atomically (temporary file, fsync,
rename, fsync of the directory) *before* each request it announces is sent. What an answer
teaches may wait for the next such write: a file one answer behind is still true
(sync/protocol.py, ``Protocol.note``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from prime_runs_spool.errors import DocumentError, StateFormatError, StateProblem
from prime_runs_spool.files import DISK_FULL_ERRNOS, is_read_only, joined, read_regular_file, shell_line
from prime_runs_spool.sync import state_file
from prime_runs_spool.sync.id_sets import IdSet, named_by, version_1_arrays
from prime_runs_spool.platform_api.v0 import is_evaluation_id
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, spool_dir
from prime_runs_spool.sync.options import AUTO
from prime_runs_spool.sync.sinks.registry import is_sink, known
from prime_runs_spool.sync.typed_json import build, unknown_keys

if TYPE_CHECKING:
    from prime_runs_spool.spool.reader import Position, Record


#: Sync's state files, one per destination (and per replay), inside the spool folder.
SYNC_DIRNAME = "sync"


def sync_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Where sync keeps its state files for the run."""
    return spool_dir(run_dir) / SYNC_DIRNAME


#: What a replay id may be. It is part of a state file's name (and of an object's key), so it holds nothing
#: that could name a file elsewhere: letters, digits, ``_`` and ``-``. The ids sync makes are uuid4 hex (32).
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

#: 2: ``on_platform`` and ``held_there`` name a file of ids (sync/id_sets.py), where 1 held them as arrays;
#: a state of version 1 is read as it is, and written as 2.
STATE_VERSION = 2
#: The key of the state's checksum, the last in the file: the digest of the rest of the document. A damaged
#: byte that still parses (a key's letter flipped, ``in_flight`` read as absent and its request in doubt
#: forgotten; a digit changed in a count) is then damage, reconciled with the platform, not a state trusted.
#: A file without it (written before it was kept) is read as it is, unless it holds a key no state has: no
#: sync wrote that, and it is what a damaged byte in this key's own name leaves.
CHECKSUM_KEY = "checksum"

#: What an announced request is (``InFlight.kind``): the evaluation's creation, its finalize, or a sink's
#: batch, announced under the sink's name (``samples``, ``traces``). Persisted: the values never change.
CREATE = "create"
FINALIZE = "finalize"


@dataclass(frozen=True, slots=True, kw_only=True)
class Cursor:
    """Where the next unacknowledged row starts: a spool :class:`Position` (same fields, same
    meaning), plus how many rows of the episode there were already acknowledged (only an
    episode sent as one row per trace can be split across requests). Its own type because
    it is persisted in the state file; convert with :meth:`at` and :attr:`position`, never
    field by field."""

    segment_index: int
    offset: int
    next_seq: int
    rows_done: int = 0

    @classmethod
    def at(cls, position: Position, rows_done: int = 0) -> Cursor:
        return cls(segment_index=position.segment_index, offset=position.offset,
                   next_seq=position.next_seq, rows_done=rows_done)

    @classmethod
    def past(cls, record: Record) -> Cursor:
        """``at(record.after)``, without building that position: where reading resumes once
        ``record`` is handled (the row stream asks for one per record)."""
        return cls(segment_index=record.segment_index, offset=record.end_offset, next_seq=record.seq + 1)

    @property
    def position(self) -> Position:
        """Where reading resumes (the start of the episode when ``rows_done`` > 0)."""
        # The reader where a run is read: a no-op re-sync loads states' module, not it.
        from prime_runs_spool.spool.reader import Position

        return Position(self.segment_index, self.offset, self.next_seq)


@dataclass(kw_only=True)
class InFlight:
    """A non-idempotent request that was, or may have been, sent and is not yet settled."""

    #: CREATE, FINALIZE, or the name of the sink whose batch it is.
    kind: str
    #: For a ``samples`` request releasing held-back episodes: their ids, recorded as
    #: released once the request is known to have landed.
    released: list[str] = field(default_factory=list)
    #: Wall-clock time (epoch seconds) recorded just before sending; the request cannot land
    #: after ``sent_at + request lifetime``.
    sent_at: float
    #: For ``samples``: how many rows the request carries and where the cursor goes once they are known to have landed.
    rows: int = 0
    episodes: int = 0
    end: Cursor | None = None
    #: The seal at ``end``, when the request's rows reach the end of a sealed log.
    seal: dict[str, Any] | None = None
    #: The sample id of the request's last row.
    last_sample_id: Any = None
    #: For ``traces``: the SHA-256 of the batch's bytes (its idempotency key) and how many
    #: member traces it carries. The batch is the run's episode lines from the cursor to
    #: ``end``: a restarted sync rebuilds exactly these bytes and sends the same key.
    digest: str | None = None
    traces: int = 0


@dataclass(frozen=True, kw_only=True)
class Destination:
    key: str
    base_url: str
    team_id: str | None = None


@dataclass(kw_only=True)
class SyncState:
    """The state file's document. Every field is checked against its annotation when the
    file is read (:meth:`from_json`, strictly: sync/typed_json.py); a file that fails is
    damaged, and sync reconciles with the platform instead of trusting it."""

    version: int = STATE_VERSION
    destination: Destination
    local_run_id: str
    #: Set for ``--replay``: which replay this state belongs to (docs/sync.md, "Replay").
    replay_id: str | None = None
    evaluation_id: str | None = None
    viewer_url: str | None = None
    cursor: Cursor | None = None
    #: Per segment index: the acknowledged byte offset and sequence number reached in it.
    segments: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The seal the cursor has passed, when the log ends there: a sync killed after reading
    #: it but before finishing the run must still know, on its next start, how the run ended.
    seal: dict[str, Any] | None = None
    samples_pushed: int = 0
    episodes_pushed: int = 0
    #: The sample id of the last acknowledged row: with ``samples_pushed``, what a sync
    #: checks against the platform before trusting this file (docs/sync.md, "State").
    last_sample_id: Any = None
    #: Set when the platform was found holding samples this state cannot account for:
    #: ``{platform_samples, spool_samples, detail, found_at}``. The run is not finalized
    #: while it is set; every sync checks again and reports it.
    mismatch: dict[str, Any] | None = None
    finalized: bool = False
    #: The terminal state last recorded on the platform: "completed", "failed", "cancelled", "crashed".
    terminal: str | None = None
    #: Size of the last segment when ``terminal`` was recorded. A crashed writer may leave a
    #: torn tail past the cursor; while the file keeps this size there is nothing new.
    terminal_size: int | None = None
    #: Which version of that last segment it was (``segment_version``): a writer writes its
    #: lines into padding, so a copy of a live run re-copied or re-uploaded with more lines
    #: can keep its size. None in a state from before it: the size alone decides.
    terminal_version: str | None = None
    #: Per index, the version of each segment before that last one (sync/pushed_lines.py).
    earlier_versions: dict[str, str] = field(default_factory=dict)
    in_flight: InFlight | None = None
    #: The sink this run's episodes go to on this destination, once decided: "traces" or
    #: "samples" (sync/sinks/choice.py). Recorded so that one run never ends up half in
    #: each. The key keeps its name: the file is a persisted format.
    store: str | None = None
    #: The sink the run's evaluation names in its own metadata (sync/evaluation.py,
    #: ``SINK_KEY``): sent with its create, read when it is found again, and sent anew before
    #: the run's first request to another sink. None: an evaluation that names none (created
    #: before sinks were recorded there, or by vf-eval).
    evaluation_sink: str | None = None
    #: ``store`` was learnt from the platform (an evaluation found again with no state naming
    #: its sink), not chosen here: this state cannot tell that nothing of the run is in that
    #: sink, so the run never leaves it, even for one found unavailable.
    sink_from_platform: bool = False
    #: For traces: the upload id (the content digest) of every committed batch, in order,
    #: and the member traces they carried.
    uploads: list[str] = field(default_factory=list)
    traces_pushed: int = 0
    #: Held-back (errored) episodes pushed when the run completed (docs/sync.md, "Resumed runs").
    released: list[str] = field(default_factory=list)
    #: The episodes the platform run vf-eval pushed this run to held when sync adopted it
    #: (docs/sync.md, "Runs vf-eval pushed"): never sent to Prime Traces again. Fixed at
    #: adoption, before any batch is cut, so every batch is cut and rebuilt without them.
    #: Kept in a file of its own (sync/id_sets.py); None: none.
    on_platform: IdSet | None = None
    #: The episodes the run's Prime Traces held when a pass found its evaluation again with a
    #: state that starts from nothing (the state lost): an earlier sync's, never sent again,
    #: since a re-cut may close a batch elsewhere and store them twice (docs/sync.md, "A lost
    #: state"). Fixed before any batch is cut, as ``on_platform`` is. One id per episode, in
    #: a file of its own as ``on_platform``'s; None: none.
    held_there: IdSet | None = None
    #: Errored episodes held back when the run's end was last recorded (0 once it completed).
    held_back: int = 0
    #: Episodes a later resume superseded after they were pushed: the append-only platform
    #: still holds their rows (said in ``status`` and the evaluation's metadata).
    superseded_pushed: list[str] = field(default_factory=list)
    #: The metrics last sent, with the metadata or the finalize (a later seal that changes
    #: them sends them again).
    metrics_sent: dict[str, Any] | None = None
    #: :func:`metadata_digest` of the metadata document the evaluation last received (with
    #: its create or a PUT): the run's end sends one again only when it differs. None: unknown.
    metadata_sent: str | None = None
    #: Corruption skipped with --skip-corrupt: ``{segment, offset, reason}``.
    skipped: list[dict[str, object]] = field(default_factory=list)
    #: Episodes passed over because no request can carry one of their rows:
    #: ``{segment, offset, episode_id, reason}`` (docs/sync.md, "Rows").
    skipped_too_large: list[dict[str, object]] = field(default_factory=list)
    #: For a run in an object store: the lease generation of the syncer that wrote this
    #: state (fencing, docs/sync.md "Object stores"); None for a local run.
    fence: int | None = None
    #: The mark of the announcement this state was written after (``pass.count``), the same
    #: one the run's copy lock notes first: a pass reading its own state after its holder died
    #: mid-pass trusts it only when the marks agree; else it may be an older copy put back
    #: (sync/copies.py, ``_put_back``). None: written before any pass marked one.
    pass_mark: str | None = None
    updated_at: float = 0.0
    #: Whether this is, byte for byte, the file this process last wrote (and so already
    #: checked against the platform): set by :func:`load_state`, never saved (a leading
    #: underscore keeps it out of the file).
    _written_here: bool = field(default=False, init=False, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: bytes) -> SyncState:
        """The state a file holds; :class:`StateFormatError` when it is not one (not JSON,
        or any field not what its annotation says)."""
        try:
            document = orjson.loads(data)
            if isinstance(document, dict) and CHECKSUM_KEY in document:
                if document.pop(CHECKSUM_KEY) != _checksum(document):
                    raise StateFormatError("its checksum does not match its content: a damaged byte")
            elif unknown := unknown_keys(cls, document):
                raise StateFormatError(f"no checksum, and a key no state has ({unknown[0][:80]}): a damaged byte")
            arrays = version_1_arrays(document)
            state = build(cls, document)
            for name, ids in arrays.items():  # version 1's: a file of their own from the next save on
                setattr(state, name, IdSet.of(ids))
            if state.version < STATE_VERSION:
                state.version = STATE_VERSION  # read as this version holds it, and written so
        except (orjson.JSONDecodeError, DocumentError) as exc:
            raise StateFormatError(str(exc)) from None
        problem = state._value_problem()
        if problem:
            raise StateFormatError(problem)
        return state

    def _value_problem(self) -> str | None:
        """What no sync writes, though its type is right: such a file is damaged too. An id
        that is not one path segment would aim requests at other paths of the API, a
        negative position would be read as a segment no run has (and the spool reported
        corrupt), an unknown sink would be named as the one to sync to."""
        if self.evaluation_id is not None and not is_evaluation_id(self.evaluation_id):
            return f"evaluation_id {self.evaluation_id[:80]!r} is not an evaluation id"
        for key, name in (("store", self.store), ("evaluation_sink", self.evaluation_sink)):
            if name is not None and not is_sink(name):
                return f"{key} {name[:80]!r} is not {' or '.join(known())}"
        if self.in_flight is not None and self.in_flight.kind not in (CREATE, FINALIZE) and not is_sink(
                self.in_flight.kind):
            return f"in_flight.kind {self.in_flight.kind[:80]!r} is not a request sync announces"
        cursors = [self.cursor, self.in_flight.end if self.in_flight else None]
        for cursor in filter(None, cursors):
            if cursor.segment_index < 1 or min(cursor.offset, cursor.next_seq, cursor.rows_done) < 0:
                return f"a cursor is not a spool position: {cursor}"
        if min(self.samples_pushed, self.episodes_pushed, self.traces_pushed) < 0:
            return "a count is negative"
        problems = [problem for found in named_by(self) if (problem := found.problem())]
        return problems[0] if problems else None

    def to_json(self) -> bytes:
        """The file's bytes: every field but the private ones, keys sorted at every level (a
        mapping's non-string keys written as strings, as JSON has them), then the checksum
        (:data:`CHECKSUM_KEY`). One serialization is both the file and the digest's input: it
        is the rest of the document exactly as :func:`_checksum` serializes it on reading."""
        content = orjson.dumps(self, default=_fields_of, option=_CONTENT_OPTIONS)
        return b'%s,"%s":"%s"}' % (content[:-1], _CHECKSUM_KEY_BYTES, _digest_of(content).encode())

    @property
    def written_here(self) -> bool:
        return self._written_here

    def advance(self, end: Cursor, rows: int, episodes: int, seal: dict[str, Any] | None = None,
                last_sample_id: Any = None) -> None:
        """Acknowledge ``rows`` rows (the last one ``last_sample_id``): the cursor moves to
        ``end`` (past ``seal``, if given)."""
        self.cursor = end
        self.seal = seal
        self.samples_pushed += rows
        self.episodes_pushed += episodes
        if rows:
            self.last_sample_id = last_sample_id
        self.segments[str(end.segment_index)] = {"offset": end.offset, "seq": end.next_seq}

    @property
    def ended(self) -> bool:
        """Whether the run's end is recorded (``terminal``): a sync with nothing new says
        ``up_to_date`` of it, not ``live``. Not ``finalized``, a fact of the platform's that a
        resume does not undo: a completed run resumed stays finalized while its new writer
        appends, and was said up to date, so a follow ``--exit-when-idle`` of the store
        ended before the resumed eval did."""
        return self.terminal is not None

    def live_again(self) -> bool:
        """Forget the end last recorded (``terminal``) once the run's writer is live again:
        a crashed run resumed (its new segment), a mirror that came back. Kept, every sync
        with nothing new read the run as ended (``up_to_date``, not ``live``: a follow
        ``--exit-when-idle`` of the store ended while the resumed eval still wrote). Whether
        there was one to forget."""
        if self.terminal is None:
            return False
        self.terminal, self.terminal_size, self.terminal_version, self.earlier_versions = None, None, None, {}
        return True


def metadata_digest(metadata: Any) -> str:
    """A short digest of an evaluation's metadata document, keys in any order."""
    return hashlib.sha256(orjson.dumps(metadata, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()[:32]


def destination_key(identity: str) -> str:
    """A short, stable file name for a destination; ``identity`` is e.g. ``base_url|team``."""
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]


def remote_destination(base_url: str, team_id: str | None) -> Destination:
    """The destination identity of a platform reached over HTTP: ``base_url|team``. The
    command line and the online shipper both name destinations this way, so a run's online
    state and a later ``prime-runs sync`` share one state file."""
    return Destination(key=destination_key(f"{_same_platform(base_url)}|{team_id or ''}"), base_url=base_url,
                       team_id=team_id)


#: The port a scheme's URL means when it names none.
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _same_platform(base_url: str) -> str:
    """``base_url`` spelled one way for every spelling of one platform: the scheme and host
    in lower case, the scheme's own port left out. Two spellings made two destinations, so
    copies of one spool synced at once through each (``https://API.example.com:443`` in one CI
    job, ``https://api.example.com`` in another) took two copy locks (sync/copies.py) and
    both appended every row. A URL already spelled so is its own identity: no state file
    changes name."""
    try:
        parts = urlsplit(base_url)
        scheme, host, port = parts.scheme.lower(), parts.hostname or "", parts.port
    except ValueError:  # not a URL the settings let through: it names itself
        return base_url
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address keeps its brackets
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path, parts.query, parts.fragment))


#: How a destination's ``base_url`` names the local platform's database (``--local --db``).
LOCAL_PREFIX = "local:"


def local_destination(db_path: Path, team_id: str | None) -> Destination:
    """The destination identity of the local platform's database at ``db_path``: named by
    the database, not by the embedded server's port, which changes with every start."""
    return Destination(key=destination_key(f"local|{db_path}|{team_id or ''}"), base_url=f"{LOCAL_PREFIX}{db_path}",
                       team_id=team_id)


def sync_command(path: str | Sequence[str], destination: Destination | None, sink: str | None, *more: str) -> str:
    """The ``prime-runs sync`` of ``path`` (or of several) a message suggests, shell-quoted,
    with ``more`` options: it carries the options that send the run to ``destination`` and
    ``sink`` (None or ``auto``: none), so that, pasted, it goes where the sync that printed it
    went, not to the default platform. ``destination`` None: a run never synced, for the user's own."""
    where = [] if destination is None else destination_options(destination, sink)
    paths = [path] if isinstance(path, str) else list(path)
    return shell_line(["prime-runs", "sync", *paths, *where, *more])


def destination_options(destination: Destination, sink: str | None) -> list[str]:
    """The options of ``prime-runs sync`` that send a run to ``destination`` and ``sink``."""
    if destination.base_url.startswith(LOCAL_PREFIX):
        words = ["--local", "--db", destination.base_url.removeprefix(LOCAL_PREFIX)]
    else:
        words = ["--base-url", destination.base_url]
    if destination.team_id:
        words += ["--team", destination.team_id]
    if sink is not None and sink != AUTO:
        words += ["--to", sink]
    return words


def load_state(path: Path, *, destination: Destination, local_run_id: str,
               shown: str | None = None) -> SyncState | None:
    """The state at ``path``; None when there is none; :class:`StateProblem` when there is
    one that must not be trusted (sync then reconciles with the platform instead).
    ``shown``: what the messages call the state, when ``path`` is only this machine's copy
    of it (a run in an object store: the object's URL, which the user knows, not the cache)."""
    name = shown or path
    try:
        state, raw = read_state(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateProblem(f"cannot read {name}: {exc.strerror}") from None
    except StateFormatError:
        raise StateProblem(f"{name} is damaged") from None
    if state.version > STATE_VERSION:
        raise StateProblem(f"{name} was written by a newer prime-runs-spool (state v{state.version})")
    if state.local_run_id != local_run_id or state.destination.key != destination.key:
        raise StateProblem(f"{name} belongs to another run or destination")
    for found in named_by(state):
        if shown:  # this machine's copy of an object beside the state object
            found.shown_as(f"{shown.rsplit('/', 1)[0]}/{found.name}")
        if found.missing():  # whole but for it: what it announces is known (errors.py, StateProblem)
            raise StateProblem(f"{name} names {found.name} beside it, which is missing ("
                               f"{'the store does not hold it' if shown else 'a copy made without it?'})",
                               sent_at=state.in_flight.sent_at if state.in_flight else None)
    state._written_here = _OWN_WRITES.get(str(path)) == raw.rstrip(b" ")[_MARK]  # its padding aside
    return state


def state_before_damage(path: Path, destination: Destination) -> SyncState | None:
    """The state a pass finds beside a run whose manifest it cannot read (the damage is in
    a segment's first two lines, e.g. a segment cut to nothing): what this destination was
    sent before, for the run's report to count (not "pushed 0 (total 0)"). Only read, never
    trusted for a push: the run id it would be checked against is in the lost manifest.
    None when there is none, or none to read."""
    try:
        state, _ = read_state(path)
    except (OSError, StateFormatError):
        return None
    return state if state.version <= STATE_VERSION and state.destination.key == destination.key else None


def read_state(path: str | os.PathLike[str]) -> tuple[SyncState, bytes]:
    """The state file at ``path`` and the bytes it was read from: the file's, or, where a
    power cut tore the file as a pass overwrote it, its twin's (sync/state_file.py), which
    holds the whole state then. ``OSError`` when the file cannot be read,
    ``StateFormatError`` when neither holds a state. Every reader of a local state reads by it."""
    raw = read_regular_file(path)
    try:
        state = SyncState.from_json(raw)
    except StateFormatError as damaged:
        try:
            raw = read_regular_file(state_file.twin_path(os.fspath(path)))
            state = SyncState.from_json(raw)
        except (OSError, StateFormatError):
            raise damaged from None
    for found in named_by(state):  # their files lie beside it (sync/id_sets.py)
        found.found_in(os.path.dirname(os.fspath(path)) or os.curdir)
    return state, raw


#: Per state file, the checksum ending this process's last write there: a file that holds it was checked already.
_OWN_WRITES: dict[str, bytes] = {}


def _checksum(document: dict[str, Any]) -> Any:
    """A state document's checksum: of its content, not of its bytes, so a file parsed and
    written again unchanged (its keys in another order, its spaces) keeps it."""
    return _digest_of(orjson.dumps(document, option=orjson.OPT_SORT_KEYS))


def _digest_of(content: bytes) -> str:
    """The checksum of a document's content serialized with its keys sorted, no spaces."""
    return hashlib.sha256(content).hexdigest()[:32]


#: A state's content as the file holds it: every dataclass handed to :func:`_fields_of`, its fields sorted as keys.
_CONTENT_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
_CHECKSUM_KEY_BYTES = CHECKSUM_KEY.encode()
_FIELD_NAMES: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # per dataclass: fields a file holds, private ones
_MARK = slice(-34, -2)  # where the checksum lies in a state file's bytes: the mark of this process's own write


def _fields_of(value: Any) -> dict[str, Any]:
    """A state dataclass (the state, its destination, cursors, request) as its fields (orjson's ``default``): its
    ``__dict__`` copied less the private ones when it holds every field and no more; else each read (30 k instructions)."""
    cls = type(value)
    if (known := _FIELD_NAMES.get(cls)) is None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not part of a sync state")
        every = [f.name for f in dataclasses.fields(cls)]
        known = _FIELD_NAMES[cls] = (tuple(n for n in every if n[0] != "_"), tuple(n for n in every if n[0] == "_"))
    names, private = known
    if (fields := getattr(value, "__dict__", None)) is not None:
        document = fields.copy()
        for name in private:
            document.pop(name, None)
        if len(document) == len(names):  # every field is there (``__init__`` sets each): nothing else is
            return document
    return {name: getattr(value, name) for name in names}


def save_state(path: Path, state: SyncState, writer: state_file.Writer | None = None, *, parents: bool = True) -> None:
    """Write the state file durably: its bytes fsync'd before it replaces the old (whichever
    file a power cut leaves under the name is whole, or its twin is: sync/state_file.py),
    and its name made durable (its folder fsync'd) when the state announces a request
    (``in_flight``): that one must outlive a power cut, since its request may land. A state
    that announces nothing records what the platform, or the spool, tells again (docs/sync.md,
    "State"): a cut that takes its rename back leaves the file of an earlier write, which is
    true still (every request sent since it was announced by a write whose rename was
    fsync'd, and that fsync made every earlier rename in the folder durable too), and the
    next sync settles from it as after any crash. ``writer``: the pass's, which writes in
    place after its first announcement (sync/state_file.py); without one, a rename. The
    pass's state folder is made in its spool folder, never that folder itself: a run moved
    away under the pass is not made again at its old path to hold a state. ``parents``
    False: likewise for a save by a rename (a mirrored run's pass, sync/leased.py); a
    store's syncer keeps its states in a cache whose folders it makes."""
    name = str(path)
    parents = parents and writer is None
    for found in named_by(state):  # durable before the state names them (sync/id_sets.py)
        found.store(os.path.dirname(name) or os.curdir, parents=parents)
    state.updated_at = time.time()
    data = state.to_json()
    _OWN_WRITES.pop(name, None)  # until it is written, the file is not (yet) this write
    state_file.write(name, data, announces=state.in_flight is not None, writer=writer, parents=parents)
    _OWN_WRITES[name] = data[_MARK]  # its checksum, the digest of its content: not digested again


def distrust(path: Path) -> None:
    """Forget that this process wrote the state at ``path``: a failed pass's, checked at its next read ("State")."""
    _OWN_WRITES.pop(str(path), None)


def disk_full_line(exc: OSError, where: Path) -> str | None:
    """The one line for a sync that could not write its state (or lock) because the disk is
    full: which file, and what to do; None for any other error. Nothing is lost by it: a
    state not written is a pass cut short, which the next sync carries on from, exactly once
    (docs/sync.md)."""
    if exc.errno not in DISK_FULL_ERRNOS:
        return None
    return (f"{exc.filename or where}: cannot be written, the disk is full ({exc.strerror}); "
            "free space on it, then sync again: it carries on, pushing nothing twice")


# -- where a run's sync state lives ------------------------------------------------------

#: Under a state directory (``--state-dir``), the folder that keeps the sync lock and state of each spool
#: that lies on a read-only source, one folder per spool, keyed by a digest of the run folder's absolute
#: path; each holds ``spool/sync.lock`` and ``spool/sync/``, laid out as beside a spool.
STATE_DIR_SPOOLS = "spools"


def state_home(run_dir: Path, state_dir: Path | None) -> Path | None:
    """The folder whose ``spool/`` keeps ``run_dir``'s sync lock and state: the run folder
    itself, or, when its spool folder is read-only, its folder under ``state_dir``; None when
    the spool folder is read-only and there is no state directory (the caller names
    ``--state-dir``)."""
    if not is_read_only(joined(run_dir, SPOOL_DIRNAME)):  # a string: asked of every run a sync finds
        return run_dir
    if state_dir is None:
        return None
    return state_dir / STATE_DIR_SPOOLS / folder_key(run_dir)


def state_dir_kept(state_path: Path, run_dir: Path) -> Path | None:
    """The ``--state-dir`` that a state file of ``run_dir`` at ``state_path`` is kept under
    (:func:`state_home`'s folder, read back), so that a command a message suggests keeps the
    state where it is; None for a state beside the spool."""
    home = state_path.parent.parent.parent  # HOME/spool/sync/KEY.json
    if home == run_dir:
        return None
    return home.parent.parent  # STATE_DIR/spools/KEY


def folder_key(folder: Path) -> str:
    """The name a state directory files a folder's state under: a digest of its absolute
    path, as the file system's bytes (the UTF-8 of a name that is UTF-8, so every key stays
    what it was; a name that is not has no UTF-8, and its encoding was an internal error)."""
    return hashlib.sha256(os.fsencode(folder.resolve())).hexdigest()[:16]
