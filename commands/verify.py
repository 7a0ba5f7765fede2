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

from prime_runs_spool.plural import count, episodes, plural
from prime_runs_spool.spool.format import CORRUPT
from prime_runs_spool.sync.command_line import output_option

from .options import allow_empty_option, read_state_dir_option
from .import_ import nothing_found_message
from .output import SkippedLinks, require_paths
from .sync_store import PathOrURL, store_urls
from prime_runs_spool.errors import MESSAGE_PREFIX, NoSuchPathError, SpoolError
from prime_runs_spool.files import shown
from prime_runs_spool.importer.options import default_state_dir
from prime_runs_spool.sync.console import json_report


def _damage_line(name: str, damage: dict[str, Any]) -> str:
    """One stretch of damage: where, how long, why, and which records it cost."""
    what = count(damage['length'], 'byte')
    if damage["lost"] is None:
        what += ", records lost: unknown"
    elif damage["lost"]:
        what += f", {count(damage['lost'], 'record')} lost from seq {damage['first_seq']}"
    if damage["episode_ids"]:
        what += f", {plural(len(damage['episode_ids']), 'episode id')} legible: {', '.join(damage['episode_ids'])}"
    return f"  {name}: CORRUPT at byte {damage['offset']} ({what}): {damage['reason']}"


def _segment_lines(segment: dict[str, Any]) -> list[str]:
    name = Path(segment["path"]).name
    if segment["corrupt_offset"] is not None:
        lines = [_damage_line(name, damage) for damage in segment["damage"]] or [
            f"  {name}: CORRUPT at byte {segment['corrupt_offset']}: {segment['corrupt_reason']}"]
        more = segment["damage_count"] - len(segment["damage"])
        if more > 0:
            lines.append(f"  {name}: ... and {more} more {plural(more, 'stretch', 'stretches')} of damage")
        intact = f"{count(segment['records'], 'intact record')}, {count(segment['episodes'], 'intact episode')}"
        return [*lines, f"  {name}: {intact}, " + (f"sealed {segment['sealed']}" if segment["sealed"] else "unsealed")]
    parts = [count(segment["records"], "record"), episodes(segment["episodes"])]
    if segment["format_version"] is None:
        parts = ["empty (no header)"]
    parts.append(f"sealed {segment['sealed']}" if segment["sealed"] else "unsealed")
    if segment["torn_offset"] is not None:
        parts.append(f"torn tail at byte {segment['torn_offset']}")
    if segment["live"]:
        parts.append("writer live (its lock file was deleted)" if segment.get("lock_missing") else "writer live")
    return [f"  {name}: " + ", ".join(parts)]


def _print_human(runs: list[dict[str, Any]], missing: list[tuple[Path, str]]) -> None:
    for path, fix in missing:
        click.echo(shown(f"{path}: not spooled: eval outputs without a spool (run: {fix})"))
    for run in runs:
        if run["status"] is None:
            click.echo(shown(f"{run['run_dir']}: UNREADABLE: {run['error']}"))
            continue
        click.echo(
            f"{shown(run['run_dir'])}: {run['status']}, {count(len(run['segments']), 'segment')}, "
            f"{count(run['records'], 'record')}, {episodes(run['episodes'])}"
        )
        for segment in run["segments"]:
            for line in _segment_lines(segment):
                click.echo(line)
        if run["error"] and run["status"] != CORRUPT:
            click.echo(f"  PROBLEM: {shown(run['error'])}")
        if run.get("traces_disagree"):
            click.echo(f"  DISAGREES: {run['traces_disagree']['describe']}")
        for warning in run.get("warnings") or []:
            click.echo(f"  warning: {warning}")


@click.command()
@click.argument("paths", nargs=-1, type=PathOrURL(path_type=Path, readable=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@output_option
@read_state_dir_option
@allow_empty_option
def verify(paths: tuple[Path, ...], as_json: bool, state_dir: Path | None, allow_empty: bool) -> None:
    """Check the spools of every run under PATHS (default: .): segments, records, seals, torn
    tails, corruption. Eval outputs with no spool are listed as "not spooled", with the
    command that imports them. Reads only. Exit 0 when every run is clean, 1 when one is
    not (or nothing is found), 2 on bad usage.

    \b
    Examples:
      prime-runs verify                     # every run under the current folder
      prime-runs verify outputs --json
      prime-runs verify s3://bucket/outputs
    """
    paths = paths or (Path("."),)
    from prime_runs_spool.importer.places import import_command, not_spooled, paths_with_nothing, spool_roots
    from prime_runs_spool.importer.agreement import disagreement
    from prime_runs_spool.spool.verify import verify_paths  # the reader: only when run

    state = default_state_dir(state_dir)
    try:
        local = require_paths(p for p in paths if not isinstance(p, str))
        links = SkippedLinks()
        verdict = verify_paths(spool_roots(local, state), on_link=links)
        store_empty: list[str] = []
        for url in store_urls(paths):  # s3://bucket/prefix and the like
            from prime_runs_spool.store.verify import verify_store

            found = verify_store(url)
            verdict.runs += found.runs
            store_empty += found.paths_without_runs
        for run in verdict.runs:  # a local spool and the traces.jsonl beside it (importer/agreement.py)
            found = None if "://" in run["run_dir"] else disagreement(Path(run["run_dir"]))
            run["traces_disagree"] = None if found is None else {**found.as_json(), "describe": found.describe()}
        missing = [(p, import_command(p, state)) for p in not_spooled(local, state)]
        empty = [*paths_with_nothing(local), *store_empty]
    except (NoSuchPathError, SpoolError, OSError) as exc:
        click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
        sys.exit(2)
    runs, bad = verdict.runs, verdict.bad
    if as_json:
        document = verdict.as_json()
        document["paths_without_runs"] = [str(p) for p in empty]
        document["not_spooled"] = [{"path": str(p), "fix": fix} for p, fix in missing]
        click.echo(json_report(document, indent=True))
    else:
        _print_human(runs, missing)
    links.say()
    for path in empty:
        click.echo(f"{MESSAGE_PREFIX}{nothing_found_message(path)}", err=True)
    if bad:
        click.echo(f"{MESSAGE_PREFIX}{len(bad)} of {count(len(runs), 'run')} failed verification: {bad[0]['error']}", err=True)
        sys.exit(1)
    if empty and not allow_empty:
        sys.exit(1)
    if not as_json:
        disagree = sum(1 for run in runs if run.get("traces_disagree"))
        click.echo(f"ok: {count(len(runs), 'run')} verified, no corruption"
                   + (f"; {disagree} disagree with their traces.jsonl (the next sync spools the difference)"
                      if disagree else ""))

