"""The exceptions the library raises, in one place so callers can catch them by kind.

Every message is one line that says what is wrong and, where there is something to do,
what to do: the command line prints them as they are.
"""

from __future__ import annotations

from pathlib import Path


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


class NotARunError(SpoolError):
    """A directory read as a run holds no spool segment."""


class RecordTooLargeError(SpoolError, ValueError):
    """A record's line would exceed the format's line limit."""


class SpoolWriteError(SpoolError, OSError):
    """Writing or syncing a segment failed; the records involved are not durable."""


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
        super().__init__(f"{path}: corrupt at byte {offset}: {reason}")


class SyncError(SpoolError):
    """A run could not be synced; the message is one line for the user."""


class RunClosedError(SpoolError):
    """An episode was logged to a run that is already finished or aborted."""


class RunMismatchError(SpoolError, ValueError):
    """``open_run`` was asked to continue a run directory as a different run."""


class RunInUseError(SpoolError):
    """Another live process is writing this run: two writers would record episodes twice."""
