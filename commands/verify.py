"""``prime-runs verify PATH...``: check every spool under the paths, read-only.

The verdict is the library's (``prime_runs_spool.spool.verify``); this module prints it.

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

from prime_runs_spool.errors import NoSuchPathError, SpoolError


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
        parts.append("writer live (its lock file was deleted)" if segment.get("lock_missing") else "writer live")
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
        if run["error"] and run["status"] != "corrupt":
            click.echo(f"  PROBLEM: {run['error']}")
    for path in empty_paths:
        click.echo(f"{path}: no runs found")


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
def verify(paths: tuple[Path, ...], as_json: bool) -> None:
    """Check the spools of every run under PATHS: segments, records, seals, torn tails, corruption."""
    from prime_runs_spool.spool.verify import verify_paths  # the reader: only when run

    try:
        verdict = verify_paths(paths)
    except (NoSuchPathError, SpoolError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    runs, bad = verdict.runs, verdict.bad
    if as_json:
        click.echo(orjson.dumps(verdict.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        _print_human(runs, verdict.paths_without_runs)
    if bad:
        click.echo(f"error: {len(bad)} of {len(runs)} run(s) failed verification: {bad[0]['error']}", err=True)
        sys.exit(1)
    if not as_json:
        click.echo(f"ok: {len(runs)} run(s) verified, no corruption")

