"""The exceptions the library raises, in one place so callers can catch them by kind.

Every one is a :class:`SpoolError`, so ``except SpoolError`` catches everything this
package raises on purpose. Each also keeps the built-in base its callers relied on before
(``ValueError``, ``LookupError``...), so moving it here changed no ``except`` clause.

Every message is one line that says what is wrong and, where there is something to do,
what to do: the command line prints them as they are.

The whole tree, by the layer that raises each class (a built-in base a class also keeps is
in brackets; ``tests/test_architecture.py`` checks that every exception class of the
package is defined here and drawn here):

    SpoolError
    ├── spool
    │   ├── RecordNotSerializableError [TypeError]
    │   ├── RecordTooLargeError [ValueError]
    │   ├── SpoolWriteError [OSError]
    │   │   └── SegmentGoneError
    │   ├── WriterClosedError
    │   ├── UnsupportedFormatError
    │   ├── CorruptSpoolError
    │   │   └── PositionLostError
    │   ├── NoSuchPathError [FileNotFoundError]
    │   ├── NotARunError
    │   ├── NotASegmentFileError [OSError]
    │   ├── SegmentsGoneError [OSError]
    │   └── RunInUseError (the writer, and the runner)
    ├── store
    │   └── StoreError
    │       ├── StoreSetupError
    │       ├── StoreConflict
    │       └── LeaseLost
    ├── content
    │   └── MalformedEpisodeError [TypeError]
    ├── platform_api
    │   ├── PlatformError (its kind a FailureKind)
    │   │   ├── ServiceNotEnabled
    │   │   ├── UnknownEvaluation
    │   │   └── UnexpectedAnswer
    │   ├── InvalidSettingsError [ValueError]
    │   │   └── InvalidBaseUrlError
    │   └── SampleTooLargeError [ValueError]
    ├── sync
    │   ├── SyncError
    │   │   ├── CopyBusyError
    │   │   ├── RequestFailedError
    │   │   └── SampleCountMismatchError
    │   ├── StateProblem
    │   ├── StateFormatError [ValueError]
    │   └── DocumentError [ValueError]
    ├── runner
    │   ├── RunClosedError
    │   ├── RunForkedError
    │   ├── RunNotCopyableError [TypeError]
    │   ├── EpisodeTooLargeError [ValueError]
    │   ├── RunMismatchError [ValueError]
    │   ├── UnsupportedRunConfigError [ValueError]
    │   ├── VerifiersVersionError
    │   └── CleanRefusedError
    ├── importer
    │   └── ImportSourceError
    │       ├── CorruptOutputError
    │       ├── ReadOnlySourceError
    │       ├── RewrittenOutputError
    │       └── MissingMetadataError
    ├── export
    │   └── ExportError
    │       └── ExportSetupError
    ├── viewer
    │   ├── UnsafeListenError [ValueError]
    │   └── UnknownRunError [LookupError]
    └── local_platform
        ├── PlatformDatabaseError
        ├── NotFound [LookupError]
        ├── AlreadyClosed
        ├── DeadlineExceeded
        └── TracesRejected

    Stopped [BaseException], outside the tree on purpose (see its docstring)
    MirroredMeanwhile [Exception], outside the tree on purpose (see its docstring)

Two exception classes live elsewhere, private: ``content/summary.py``'s ``_WrittenOtherwise``
and ``_TwoPass``, each a signal raised and caught inside one function that no caller can ever
see.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

#: What begins every line the command line prints on stderr about a failure or an interrupt,
#: whatever the command (``eval``, ``verify`` and ``platform serve`` included) and the
#: library's own entry points (``python -m prime_runs_spool.sync``, the viewer): one name to
#: look for in a CI log, and the one the online shipper's log is read for.
MESSAGE_PREFIX = "prime-runs: "


class SpoolError(Exception):
    """Base class of every error this package raises on purpose."""


class RecordNotSerializableError(SpoolError, TypeError):
    """A record cannot become JSON. Raised before anything is written for it."""

    def __init__(self, what: str, field_path: str, reason: str) -> None:
        self.what = what
        self.field_path = field_path
        self.reason = reason
        where = f"field {field_path}" if field_path else "the record itself"
        super().__init__(f"cannot serialize {what}: {where}: {reason}")


class NoSuchPathError(SpoolError, FileNotFoundError):
    """A path given to look for runs does not exist."""


class NotASegmentFileError(SpoolError, OSError):
    """Something named like a segment is not a regular file (a FIFO, a directory, a device):
    opening a FIFO would block every reader forever, so it is refused before that, as an
    unreadable file (``errno`` EINVAL, ``filename`` the path)."""


class SegmentsGoneError(SpoolError, OSError):
    """A spool folder whose segments are gone while a segment's durable mark is left (a
    cleanup that deleted ``*.jsonl``): its episodes are gone from this copy, which a walk
    must say, not pass over as a folder holding no run (``errno`` ENOENT, ``filename`` the
    spool folder)."""


class NotARunError(SpoolError):
    """A directory read as a run holds no spool segment."""


class RecordTooLargeError(SpoolError, ValueError):
    """A record's line would exceed the format's line limit."""


class SpoolWriteError(SpoolError, OSError):
    """Writing or syncing a segment failed; the records involved are not durable."""


class SegmentGoneError(SpoolWriteError):
    """The segment file (or its run directory) was deleted or replaced under its live writer:
    what it appends is unreachable. The writer is closed for good."""


class WriterClosedError(SpoolError):
    """An append reached a writer that was closed, sealed or broken by an I/O error."""


class UnsupportedFormatError(SpoolError):
    """A spool was written in a newer format version than this reader knows."""

    def __init__(self, path: Path, found: object, known: int) -> None:
        self.path = path
        self.found = found
        self.known = known
        super().__init__(
            f"{path}: spool format version {found} is newer than this reader's version {known}; "
            "upgrade prime-runs-spool to read it"
        )


class CorruptSpoolError(SpoolError):
    """A spool holds a damaged line that is not a torn tail: data after it cannot be trusted."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(corruption_message(path, offset, reason))


class PositionLostError(CorruptSpoolError):
    """A recorded position (sync's cursor) is no longer the start of a line: the segment
    lost lines a reader had already read, and sync already shipped (docs/spool-format.md,
    section 6). Not damage to skip: what the platform holds is more than the spool has."""


def corruption_message(path: object, offset: object, reason: object) -> str:
    """How every report names a corrupt line: ``<segment>: corrupt at byte N: <reason>``."""
    return f"{path}: corrupt at byte {offset}: {reason}"


class SyncError(SpoolError):
    """A run could not be synced; the message is one line for the user."""


class CopyBusyError(SyncError):
    """Another sync on this machine is pushing a copy of this run (a copy of its spool folder:
    ``cp -r``, one CI artifact unpacked twice) to the same destination, and did not finish
    within the wait allowed (sync/copies.py). The run is reported ``skipped``, not failed:
    the other copy is syncing it."""


class RequestFailedError(SyncError):
    """A platform request failed for this pass (refused, or still failing when the retries
    were spent): the run's state is kept for the next sync to carry on from. It says nothing
    of what the platform holds, so it is never taken for a sample-count mismatch."""


class SampleCountMismatchError(SyncError):
    """The platform holds samples of a run's evaluation that its sync state cannot account
    for (more rows than were acknowledged, or a last row that is not the spool's): a request
    landed after its lifetime, or someone else wrote to the evaluation. Sync reports it and
    never finalizes over it; appends cannot be undone, so a person decides: ``replay``, the
    options that push the run again as a new evaluation (sync/replay.py, ``replay_option``)."""

    def __init__(self, evaluation_id: object, platform_samples: int, spool_samples: int, detail: str,
                 replay: str) -> None:
        self.evaluation_id = evaluation_id
        self.platform_samples = platform_samples
        self.spool_samples = spool_samples
        self.detail = detail
        super().__init__(
            f"evaluation {evaluation_id} holds {platform_samples} samples where this spool's sync accounts for "
            f"{spool_samples} ({detail}): a request landed after its lifetime, or something else wrote to it; "
            f"refusing to guess, not finalized. Check the evaluation, then sync the run with {replay} as a new one")


class RunClosedError(SpoolError):
    """An episode was logged to a run that is already finished or aborted."""


class RunForkedError(SpoolError):
    """A forked child used the run its parent opened: only the process that opened a run
    writes, seals or closes it (docs/integration.md, "Forked processes")."""


class RunNotCopyableError(SpoolError, TypeError):
    """A run was pickled (a pool's task argument, a spawned process's) or copied: a copy
    would share the writer but count apart, so only the process that opened it logs to it."""


class MalformedEpisodeError(SpoolError, TypeError):
    """An episode lacks the shape its summary and its rows are computed from (a trace's
    ``metrics`` that is a list, a ``task.data.idx`` that is a list...). Raised before
    anything of the call is numbered or written."""


class EpisodeTooLargeError(SpoolError, ValueError):
    """No platform request can carry one of the episode's rows: refused at append, so the
    run is never blocked by a row sync could never send (docs/integration.md)."""


class RunMismatchError(SpoolError, ValueError):
    """``open_run`` was asked to continue a run directory as a different run."""


class UnsupportedRunConfigError(SpoolError, ValueError):
    """An eval config asks for something the spool cannot do (``run.attach``)."""


class VerifiersVersionError(SpoolError):
    """The installed verifiers' eval runner is not one ``prime-runs eval`` knows how to bind."""


class CleanRefusedError(SpoolError):
    """``prime-runs eval --clean`` would delete a spool whose episodes no sync shipped."""


class RunInUseError(SpoolError):
    """Another live process is writing this run: two writers would record episodes twice."""


class ImportSourceError(SpoolError):
    """An eval output folder cannot be imported as it is; nothing of that run was imported."""


class CorruptOutputError(ImportSourceError):
    """A line of an eval output file is damaged and is not its torn last line."""

    def __init__(self, path: Path, line: int, reason: str, *, whole: bool = False) -> None:
        """``whole``: the line ends in a line feed (the last line, maybe), rather than having
        lines after it: either way not a torn tail, and the message says which."""
        self.path = path
        self.line = line
        self.reason = reason
        why = "it ends in a line feed, so it is no torn tail" if whole else "lines follow it"
        super().__init__(f"{path}: line {line} is damaged ({reason}) and {why}; "
                         "nothing of this run was imported (repair or remove that line, or re-run the eval)")


class ReadOnlySourceError(ImportSourceError):
    """The eval output folder cannot be written, and no state directory was given."""


class RewrittenOutputError(ImportSourceError):
    """An older-layout ``results.jsonl`` no longer holds rows an earlier import recorded (that
    layout has no resume whose supersede rule would explain it)."""


class MissingMetadataError(ImportSourceError):
    """An older-layout ``results.jsonl`` has no ``metadata.json`` beside it: the run's id is
    derived from that file, so the run cannot be told (or imported) without it."""

    def __init__(self, metadata_path: Path, results_name: str) -> None:
        self.metadata_path = metadata_path
        self.results_name = results_name
        super().__init__(f"{metadata_path} is missing beside {results_name}: the older layout's run is named by it "
                         "(its run id is derived from it; the eval writes it when it ends); nothing of this run "
                         "was imported (import it once the eval has ended, or once metadata.json is put back "
                         "from where these outputs came from)")
        #: Said instead when an earlier import spooled the run: nothing was lost.
        self.kept = (f"{metadata_path} is missing beside {results_name}: the spool keeps what an earlier import "
                     "took from these outputs (sync ships it); nothing more is read from them until it is back")


class FailureKind(enum.Enum):
    """What a failed platform request means for a retry (docs/sync.md, "The protocol, per run")."""

    NOT_SENT = "not_sent"
    ANSWERED = "answered"
    IN_DOUBT = "in_doubt"
    FATAL = "fatal"


class PlatformError(SpoolError):
    """A request failed; ``kind`` says what may be done about it."""

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.kind = kind
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


class InvalidSettingsError(SpoolError, ValueError):
    """A destination setting no request can carry (a base URL that names no server, an API
    key an HTTP header cannot hold): a usage error, reported at once, never retried."""


class InvalidBaseUrlError(InvalidSettingsError):
    """The platform's base URL (``--base-url``, the environment or the config file) cannot
    name any server: a usage error, reported at once, never retried."""


class ServiceNotEnabled(PlatformError):
    """Prime Traces answered ``service_not_enabled``: the account has it turned off, so
    ``sync --to auto`` sends the run to legacy samples (when no batch was committed yet)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(FailureKind.FATAL, message, status=status)


class UnknownEvaluation(PlatformError):
    """A request about one evaluation answered 404: the platform does not know it (deleted,
    or another platform's). Resending cannot help; pushing the run again as a new evaluation
    can, with the options sync/replay.py gives for the state that named it (a replay's own
    state needs a new replay id), which the sync adds to the message."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.FATAL, message, status=404)


class UnexpectedAnswer(PlatformError):
    """A success answer that is not one the platform gives: no JSON, or without a field sync
    reads (platform_api/answers.py). Its kind says what it means for the request, as any
    failure's; the key check takes one to its evaluations listing for a base URL whose server
    is not the platform (another JSON API, a web page), which no retry changes."""


class SampleTooLargeError(SpoolError, ValueError):
    """Even a single trace's row cannot fit in one request: the episode cannot be sent.

    Raised rather than dropping the episode, so a run never silently loses a sample.
    """

    def __init__(self, episode_id: Any, trace_id: Any, size: int, limit: int) -> None:
        self.episode_id = episode_id
        self.trace_id = trace_id
        self.size = size
        self.limit = limit
        super().__init__(
            f"episode {episode_id}: the row of trace {trace_id} needs {size} bytes with the "
            f"request envelope, over the {limit}-byte request limit; it cannot be sent"
        )


class StateProblem(SpoolError):
    """A sync state file exists but cannot be trusted (unreadable, corrupt, or someone
    else's): sync then reconciles with the platform instead of trusting it, once a request
    the state may have left in flight can no longer land. ``sent_at``: that request's send
    time; ``inf`` (the default) when the state cannot tell (the wait lasts a whole request
    lifetime), None when it is whole and announces none (it lost only a file of ids)."""

    def __init__(self, message: str, *, sent_at: float | None = float("inf")) -> None:
        super().__init__(message)
        self.sent_at = sent_at


class StateFormatError(SpoolError, ValueError):
    """Bytes that are not a sync state document (the message says what is wrong). Caught
    where a state is read, and turned into a :class:`StateProblem` or a state set aside."""


class DocumentError(SpoolError, ValueError):
    """A JSON document does not have the shape of the dataclass it is read as
    (sync/typed_json.py); the message says where."""


class UnsafeListenError(SpoolError, ValueError):
    """A server was asked to listen beyond loopback without a token to keep strangers out."""

    def __init__(self, host: str, token_problem: str | None = None) -> None:
        """``token_problem``: the token given is no token at all (white space only, a line
        break or another control character), said instead; the token itself never is."""
        self.host = host
        if token_problem is not None:
            super().__init__(
                f"refusing the token: it {token_problem}, which no login form or Authorization header carries as "
                "typed; give another with --token TOKEN (or its environment variable)")
            return
        super().__init__(
            f"refusing to listen on {host} without a token: anyone who can reach it would see the runs; "
            "pass --token TOKEN, or listen on 127.0.0.1"
        )


class UnknownRunError(SpoolError, LookupError):
    """A viewer page names a run, episode or example that the viewer does not have."""


class PlatformDatabaseError(SpoolError):
    """The local platform's database cannot be opened or initialised (a usage error, not a bug)."""


class NotFound(SpoolError, LookupError):
    """An id (evaluation or environment) the local platform's store does not hold."""


class AlreadyClosed(SpoolError):
    """A status update reached a local platform evaluation that is already closed (409)."""


class DeadlineExceeded(SpoolError):
    """A local platform write was refused, uncommitted, because its request outlived its deadline."""


class TracesRejected(SpoolError):
    """An upload or read the local Prime Traces service refuses; it answers
    ``{"error": {"code", "message"}}`` with ``status`` and ``code`` (a ``prime_traces.ErrorCode``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class Stopped(BaseException):
    """Raised out of a follower's wait once a stop was asked for (a second SIGINT/SIGTERM).

    Deliberately a ``BaseException`` and outside the :class:`SpoolError` tree, like
    ``KeyboardInterrupt``: it is control flow, not an error, and it must pass through every
    ``except Exception`` / ``except SpoolError`` in the engine so the follower stops at once.
    """


class MirroredMeanwhile(Exception):
    """Raised out of a sync's pass over a local run when ``prime-runs mirror`` left its note
    in the run's folder while the pass, begun without the store copy's lease, was under way:
    before the pass announces its next request (none is out), so that it goes on under the
    lease (sync/mirrored.py). Outside the :class:`SpoolError` tree: control flow, caught by
    the pass's caller, never an error a user sees.
    """


class StoreError(SpoolError):
    """An object store (``s3://``, ``gs://``...) failed or refused a request; one line for the user."""


class StoreSetupError(StoreError):
    """The store cannot be used at all as given (a URL the library does not recognise,
    configuration it rejects, obstore not installed): a usage or configuration error, exit 2,
    where a store that answers with a failure is exit 1."""


class StoreConflict(StoreError):
    """A conditional write was refused: the object was created or replaced by someone else
    since we read it (docs/sync.md, "Object stores"). ``current``: the object as read right
    after the refusal (its bytes and etag), when that read was made, so a caller deciding
    what to do next (a lease taker judging the holder) needs no second GET."""

    def __init__(self, message: str, current: tuple[bytes, str | None] | None = None) -> None:
        super().__init__(message)
        self.current = current


class LeaseLost(StoreError):
    """This syncer's lease on a run was taken over by another after it expired: the syncer
    must stop before its next request (fencing by generation, docs/sync.md)."""


class ExportError(SpoolError):
    """A table could not be exported whole (``prime-runs export``, ``samples_df``): the runs
    it could not read, each named with its reason."""


class ExportSetupError(ExportError):
    """An export cannot start as asked (a format not named, pyarrow missing for Parquet, an
    output folder that does not exist): a usage error, exit 2."""
