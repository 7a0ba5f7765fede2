"""``prime-runs verify PATH...``: check every spool under the paths, read-only.

Exit codes: 0 clean (a torn tail on an unsealed segment is clean), 1 anything corrupt or
written in a newer format, 2 bad usage (a path that does not exist). Every failure ends
with a one-line reason on stderr, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from prime_runs_spool.errors import NoSuchPathError, SpoolError, UnsupportedFormatError
from prime_runs_spool.spool.layout import find_runs
from prime_runs_spool.spool.reader import read_run


def _check_run(run_dir: Path) -> dict[str, Any]:
    """The verdict on one run, as plain data (the ``--json`` shape)."""
    try:
        spool = read_run(run_dir)
    except UnsupportedFormatError as exc:
        return {"run_dir": str(run_dir), "ok": False, "status": None, "error": str(exc), "segments": []}
    corrupt = spool.corrupt
    return {
        "run_dir": str(run_dir),
        "ok": corrupt is None,
        "run_id": spool.run_id,
        "status": spool.status,
        "records": spool.records_count,
        "episodes": spool.episodes_count,
        "error": f"{corrupt.path}: corrupt at byte {corrupt.corrupt_offset}: {corrupt.corrupt_reason}"
        if corrupt
        else None,
        "segments": [segment.to_dict() for segment in spool.segments],
    }


def _segment_line(segment: dict[str, Any]) -> str:
    name = Path(segment["path"]).name
    if segment["corrupt_offset"] is not None:
        return f"  {name}: CORRUPT at byte {segment['corrupt_offset']}: {segment['corrupt_reason']}"
    parts = [f"{segment['records']} records", f"{segment['episodes']} episodes"]
    if segment["format_version"] is None:
        parts = ["empty (no header)"]
    parts.append(f"sealed {segment['sealed']}" if segment["sealed"] else "unsealed")
    if segment["torn_offset"] is not None:
        parts.append(f"torn tail at byte {segment['torn_offset']}")
    if segment["live"]:
        parts.append("writer live")
    return f"  {name}: " + ", ".join(parts)


def _print_human(runs: list[dict[str, Any]], empty_paths: list[str]) -> None:
    for run in runs:
        if run["status"] is None:
            click.echo(f"{run['run_dir']}: UNREADABLE: {run['error']}")
            continue
        click.echo(
            f"{run['run_dir']}: {run['status']}, {len(run['segments'])} segment(s), "
            f"{run['records']} records, {run['episodes']} episodes"
        )
        for segment in run["segments"]:
            click.echo(_segment_line(segment))
    for path in empty_paths:
        click.echo(f"{path}: no runs found")


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
def verify(paths: tuple[Path, ...], as_json: bool) -> None:
    """Check the spools of every run under PATHS: segments, records, seals, torn tails, corruption."""
    runs: list[dict[str, Any]] = []
    empty_paths: list[str] = []
    try:
        for path in paths:
            found = [_check_run(run_dir) for run_dir in find_runs([path])]
            if not found:
                empty_paths.append(str(path))
            runs.extend(found)
    except (NoSuchPathError, SpoolError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    bad = [run for run in runs if not run["ok"]]
    if as_json:
        document = {"ok": not bad, "runs": runs, "paths_without_runs": empty_paths}
        click.echo(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    else:
        _print_human(runs, empty_paths)
    if bad:
        click.echo(f"error: {len(bad)} of {len(runs)} run(s) failed verification: {bad[0]['error']}", err=True)
        sys.exit(1)
    if not as_json:
        click.echo(f"ok: {len(runs)} run(s) verified, no corruption")

