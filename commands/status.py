"""``prime-runs status``: what each spool holds and what each destination has, offline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from commands.output import require_paths
from prime_runs_spool.sync.options import SAMPLES, TRACES

if TYPE_CHECKING:
    from prime_runs_spool.sync.status import DestinationStatus


@click.command("status")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable report.")
def status(paths: tuple[Path, ...], as_json: bool) -> None:
    """Show every run spool under PATHS (default: .): name, model, state, episodes, and per
    destination what was pushed, what is pending and the evaluation URL. Makes no request.

    Exit 0, or 2 when a path does not exist.
    """
    from prime_runs_spool.spool.layout import find_runs
    from prime_runs_spool.sync.status import run_status  # the state model: only when run

    runs = [run_status(run_dir) for run_dir in find_runs(require_paths(paths or (Path("."),)))]
    if as_json:
        click.echo(orjson.dumps({"runs": [run.as_json() for run in runs]}, option=orjson.OPT_INDENT_2).decode())
        return
    if not runs:
        click.echo("no runs found")
        return
    for run in runs:
        click.echo(f"{run.status:<10} {run.path}  {run.name or '?'}  model {run.model or '?'}  "
                   f"{run.episodes} episodes in {run.segments} segment(s)"
                   + (f", {run.superseded} superseded by a resume" if run.superseded else ""))
        if run.error:
            click.echo(f"  error: {run.error}")
        for warning in run.warnings:
            click.echo(f"  warning: {warning}")
        if not run.destinations:
            click.echo("  not synced anywhere yet")
        for dest in run.destinations:
            done = "finalized" if dest.finalized else (dest.terminal or "open")
            line = (f"  -> {dest.destination}{' team ' + dest.team_id if dest.team_id else ''}: "
                    f"{_held(dest)}, {dest.pending} episodes pending, {done}")
            if dest.replay_id:
                line += f" (replay {dest.replay_id[:8]})"
            if dest.held_back:
                line += f", {dest.held_back} errored held back until the run completes"
            if dest.superseded_after_push:
                line += (f", {dest.superseded_after_push} superseded after they were pushed "
                         "(the platform keeps their rows; sync --replay for a clean evaluation)")
            if dest.in_flight:
                line += f", a {dest.in_flight} request in doubt"
            if dest.skipped_too_large:
                line += f", {dest.skipped_too_large} episode(s) skipped: too large for any request"
            if dest.url:
                line += f"  {dest.url}"
            click.echo(line)
    sys.exit(0)


def _held(dest: DestinationStatus) -> str:
    """What the destination's store holds of the run, in that store's own terms."""
    if dest.store == TRACES:
        return (f"to traces: {dest.episodes_pushed} episodes ({dest.traces_pushed} traces) "
                f"in {dest.uploads} uploads")
    if dest.store == SAMPLES or dest.samples_pushed:
        return f"to samples: {dest.samples_pushed} samples pushed"
    return "nothing pushed yet"
