"""The two tables, streamed into a sink: ``samples`` (a row per episode) and ``runs``.

**Metric columns.** A Parquet file has one schema, written before its first row, yet which
metric names a table has is known only once every episode was read: a run's seal names the
metrics it averaged, but not one that only a non-trainable summary trace reports, and a run
that crashed or is still live has no seal. So the samples table is read in **two passes**:
the first reads every run's episodes for their metric names only (a set of names, nothing
else held) and notes where it stopped in each run; the second reads the same records again,
up to that point, and writes the rows. A live run's later episodes wait for the next export,
and every row has every column. The price is reading the spools twice. The runs table is
small (a row per run, held until the end), so it is read once.

Bounded memory: a pass holds one record and the sink's row group at most, whatever a run's
size; the runs table holds one small row per run.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.errors import ExportError, ExportSetupError, SpoolError
from prime_runs_spool.files import OnLink
from prime_runs_spool.export.columns import (MAX_METRIC_COLUMNS, METRIC_PREFIX, RUN_HEAD, RUN_TAIL, SAMPLE_HEAD,
                                             SAMPLE_TAIL, Column, table_columns)
from prime_runs_spool.export.reading import ExportRun, Extent, Found, RunReading, failure_message, find
from prime_runs_spool.export.rows import RunFacts, metric_names, run_row, sample_row
from prime_runs_spool.export.sinks import (FrameSink, Sink, format_of, open_sink, refuse_run_file, refuse_special_file,
                                          remove_temporaries, require_pyarrow)


@dataclass
class ExportReport:
    """What an export wrote, and the one-line reason for everything it could not."""

    runs: int = 0
    rows: int = 0
    columns: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class _Plan:
    """The first pass over the samples: the metric names, and where each run's read stopped."""

    names: list[str]
    extents: list[Extent | None]


def _with_run(message: str, run: ExportRun) -> str:
    return message if run.where in message else f"{run.where}: {message}"


def _plan_samples(runs: list[ExportRun], problems: list[str]) -> _Plan:
    names: dict[str, None] = {}
    extents: list[Extent | None] = []
    for run in runs:
        reading = RunReading(run)
        own: dict[str, None] = {}
        too_many = False
        for record in reading.episodes():
            for name in metric_names(record.data):
                own[name] = None
            if len(own) > MAX_METRIC_COLUMNS:
                too_many = True
                break
        merged = names | own
        if too_many or len(merged) > MAX_METRIC_COLUMNS:
            problems.append(f"{run.where}: left out: with it the table would have more than {MAX_METRIC_COLUMNS:,} "
                            f"metric columns; export it alone, or without the runs whose metrics differ")
            extents.append(None)
            continue
        names = merged
        extents.append(reading.extent)
    return _Plan(list(names), extents)


def _sample_rows(runs: list[ExportRun], plan: _Plan, report: ExportReport) -> Iterator[dict[str, Any]]:
    for run, extent in zip(runs, plan.extents):
        if extent is None:
            continue
        reading = RunReading(run, upto=extent)
        facts: RunFacts | None = None
        for record in reading.episodes():
            if facts is None:
                facts = RunFacts(reading.manifest, reading.run_id)
            yield sample_row(facts, record.data, (record.meta or {}).get("rollout_number"))
        report.runs += 1
        assert reading.extent is not None
        if reading.extent.error:
            report.problems.append(_with_run(f"{reading.extent.error} (the rows before it were exported)", run))


def _run_rows(runs: list[ExportRun], report: ExportReport) -> tuple[list[str], list[dict[str, Any]]]:
    """Every run's row (held: one small row per run) and the metric names they average."""
    from prime_runs_spool.spool.scan import read_run

    rows, names = [], {}
    for run in runs:
        try:
            status = read_run(run.run_dir).status
        except (SpoolError, OSError) as exc:
            report.problems.append(_with_run(failure_message(exc, run), run))
            continue
        reading = RunReading(run)
        summary = SummaryAccumulator()
        episodes = 0
        for record in reading.episodes():
            summary.add(record.data)
            episodes += 1
        assert reading.extent is not None
        if reading.extent.error:
            report.problems.append(_with_run(f"{reading.extent.error} (its row counts the episodes before it)", run))
        sealed = (reading.seal or {}).get("summary")
        row = run_row(reading.manifest, reading.run_id, status=status, episodes=episodes,
                      summary=sealed if isinstance(sealed, dict) else summary.result(), seal=reading.seal,
                      path=run.where, error_forms=reading.error_forms)
        names.update((key[len(METRIC_PREFIX):], None) for key in row if key.startswith(METRIC_PREFIX))
        rows.append(row)
        report.runs += 1
    return list(names)[:MAX_METRIC_COLUMNS], rows


def _fill(sink_for: Any, found: Found, per_run: bool) -> tuple[Any, ExportReport]:
    """Read the runs ``found`` into the sink ``sink_for(columns)`` makes; the sink and report."""
    report = ExportReport(problems=list(found.problems))
    if per_run:
        names, rows = _run_rows(found.runs, report)
        columns = table_columns(RUN_HEAD, names, RUN_TAIL)
        sink = sink_for(columns)
        for row in rows:
            sink.write(row)
            report.rows += 1
    else:
        plan = _plan_samples(found.runs, report.problems)
        columns = table_columns(SAMPLE_HEAD, plan.names, SAMPLE_TAIL)
        sink = sink_for(columns)
        try:
            for row in _sample_rows(found.runs, plan, report):
                sink.write(row)
                report.rows += 1
        except BaseException:
            getattr(sink, "discard", lambda: None)()
            raise
    report.columns = [column.name for column in columns]
    return sink, report


def export_file(targets: list[Path | str], out: Path, fmt: str | None = None, *, per_run: bool = False,
                state_dir: Path | None = None, on_link: OnLink | None = None, csv_raw: bool = False) -> ExportReport:
    """Write the samples table (or, ``per_run``, the runs table) of the runs under ``targets``
    (paths, or store URLs as text) to ``out``. Raises :class:`ExportSetupError` before
    reading anything when the export cannot be made as asked; a run that cannot be read
    whole is in ``problems``, and its rows before the damage are in the file. No file is
    written when no run was found. ``state_dir``: where ``prime-runs import --state-dir``
    keeps the spools of eval outputs under ``targets``; ``on_link``: see ``reading.find``;
    ``csv_raw``: a CSV's text cells as they are, even those a spreadsheet runs as formulas
    (``sinks.spreadsheet_text``)."""
    fmt = format_of(out, fmt)
    if csv_raw and fmt != "csv":
        raise ExportSetupError(f"--csv-raw is for CSV: a {fmt} file holds every value as it is")
    refuse_run_file(out)
    refuse_special_file(out)
    if fmt == "parquet":
        require_pyarrow()
    found = find(targets, state_dir, on_link)
    if not found.runs:
        return ExportReport(problems=found.problems)
    sinks: list[Sink] = []

    def sink_for(columns: list[Column]) -> Sink:
        sinks.append(open_sink(out, fmt, columns, csv_raw=csv_raw))
        return sinks[-1]

    try:
        sink, report = _fill(sink_for, found, per_run)
        sink.close()  # (a Ctrl-C in its last row group's write: the temporary file goes too)
    except BaseException:
        for made in sinks:
            made.discard()
        remove_temporaries(out)  # one a Ctrl-C left before a sink held it
        raise
    return report


def _targets(paths: str | PathLike[str] | Iterable[str | PathLike[str]]) -> list[Path | str]:
    from prime_runs_spool.store.objects import is_store_url

    items = [paths] if isinstance(paths, (str, PathLike)) else list(paths)
    return [item if isinstance(item, str) and is_store_url(item) else Path(item) for item in items]


def _frame(paths: Any, per_run: bool, strict: bool) -> Any:
    found = find(_targets(paths))
    sink, report = _fill(FrameSink, found, per_run)
    if report.problems:
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        if strict:
            raise ExportError(report.problems[0] + more)
        for problem in report.problems:
            warnings.warn(problem, stacklevel=3)
    return sink.frame()


def samples_df(paths: Any, *, strict: bool = True) -> Any:
    """A pandas DataFrame with a row per episode of the runs under ``paths`` (a path, a store
    URL, or a list of them): the columns of ``prime-runs export`` (docs/cli.md). The frame
    holds every row: for tables larger than memory, export to Parquet and query that.
    ``strict``: raise :class:`ExportError` when a run could not be read whole (or eval
    outputs have no spool); with False, warn and return what could be read."""
    return _frame(paths, False, strict)


def runs_df(paths: Any, *, strict: bool = True) -> Any:
    """A pandas DataFrame with a row per run under ``paths`` (see :func:`samples_df`)."""
    return _frame(paths, True, strict)
