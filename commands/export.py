"""``prime-runs export PATH|URL... -o FILE``: the runs' results as one table file.

Thin: the work is ``prime_runs_spool.export.tables``; this module checks the options and
prints what was written. Exit codes (docs/cli.md): 0 every run exported whole; 1 a run
could not be read whole (its rows before the damage are in the file), eval outputs without
a spool were found (named with the ``prime-runs import`` command), or nothing was found; 2
bad usage.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from .options import OutputFilePath, read_state_dir_option
from .output import SkippedLinks, fail_usage, require_paths
from .sync_store import PathOrURL, store_urls
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.files import shown
from prime_runs_spool.importer.options import default_state_dir
from prime_runs_spool.plural import count
from prime_runs_spool.sync.options import EXIT_OK, EXIT_RUN_FAILED


@click.command("export")
@click.argument("paths", nargs=-1, required=True, type=PathOrURL(path_type=Path, readable=False))
@click.option("-o", "--output", "out", required=True, type=OutputFilePath(),
              help="The file to write (replaced whole once the table is complete).")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "jsonl"]), default=None,
              help="The file's format (default: from its suffix, .parquet, .csv or .jsonl).")
@click.option("--runs", "per_run", is_flag=True, help="One row per run instead of one per episode.")
@click.option("--csv-raw", "csv_raw", is_flag=True,
              help="CSV: write text cells as they are; by default one a spreadsheet would run as a formula "
                   "(beginning =, +, -, @, a tab or a CR) begins with ' (so does one beginning with ').")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON document.")
@read_state_dir_option
def export(paths: tuple[Any, ...], out: Path, fmt: str | None, per_run: bool, csv_raw: bool, as_json: bool,
           state_dir: Path | None) -> None:
    """Write the episodes of every run under PATHS (folders or store URLs) as a table: one
    row per episode (or per run, with --runs), each metric its own column, values as the
    spool stores them (credentials masked). Parquet needs pyarrow (pip install pyarrow;
    from a clone of prime-runs-spool, pip install -e '.[export]').

    \b
    Examples:
      prime-runs export outputs -o episodes.parquet
      prime-runs export s3://bucket/outputs -o episodes.csv
    """
    from prime_runs_spool.errors import ExportSetupError, NoSuchPathError, StoreError, StoreSetupError
    from prime_runs_spool.export.tables import export_file

    targets = [*require_paths(p for p in paths if not isinstance(p, str)), *store_urls(paths)]
    links = SkippedLinks()
    try:
        report = export_file(targets, out, fmt, per_run=per_run, state_dir=default_state_dir(state_dir),
                             on_link=links, csv_raw=csv_raw)
    except (ExportSetupError, StoreSetupError, NoSuchPathError) as exc:
        fail_usage(str(exc))
    except StoreError as exc:
        click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
        sys.exit(EXIT_RUN_FAILED)
    except OSError as exc:  # the output file: its folder read-only, the disk full
        named = exc.filename if exc.filename is not None else out
        if Path(os.fsdecode(named)).parent == Path(out).parent:  # the temporary file beside it: the user's name
            named = out
        click.echo(shown(f"{MESSAGE_PREFIX}{os.fsdecode(named)}: cannot be written ({exc.strerror or exc})"), err=True)
        sys.exit(EXIT_RUN_FAILED)
    written = report.runs > 0
    problems = report.problems or ([] if written else [  # only eval outputs with no episode yet
        "nothing to export: no spool, and no eval output with an episode, under the paths; no file written"])
    if as_json:
        click.echo(json.dumps({"ok": not problems, "output": str(out) if written else None,
                               "runs": report.runs, "rows": report.rows, "columns": report.columns,
                               "problems": problems}))
    elif written:
        click.echo(shown(f"exported {count(report.rows, 'row')} from {count(report.runs, 'run')} to {out}"))  # one line
    for problem in problems:
        click.echo(shown(f"{MESSAGE_PREFIX}{problem}"), err=True)  # a run's folder name: on one line, escaped
    links.say()
    sys.exit(EXIT_RUN_FAILED if problems else EXIT_OK)
