"""``prime-runs status``: what each spool holds and what each destination has, offline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.files import shown
from prime_runs_spool.plural import count, episodes
from prime_runs_spool.sync.command_line import output_option

from .options import allow_empty_option, read_state_dir_option
from .import_ import nothing_found_message
from .output import SkippedLinks, fail_usage, require_paths
from .sync_store import PathOrURL, store_urls
from prime_runs_spool.importer.options import default_state_dir
from prime_runs_spool.sync.console import json_report
from prime_runs_spool.sync.options import SAMPLES, TRACES

if TYPE_CHECKING:
    from prime_runs_spool.importer.agreement import Disagreement
    from prime_runs_spool.sync.status import DestinationStatus


@click.command("status")
@click.argument("paths", nargs=-1, type=PathOrURL(path_type=Path, readable=False))
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable report.")
@output_option
@read_state_dir_option
@allow_empty_option
def status(paths: tuple[Path, ...], as_json: bool, state_dir: Path | None, allow_empty: bool) -> None:
    """Show every run spool under PATHS (default: .): name, model, state, episodes, and per
    destination what was pushed, what is pending and the evaluation URL. Makes no request.
    Eval outputs with no spool are listed as "not spooled", with the command that imports them.

    Exit 0; 1 when a path holds neither a spool nor eval outputs (unless --allow-empty); 2 when
    a path does not exist or a store URL cannot be listed.

    \b
    Examples:
      prime-runs status
      prime-runs status outputs -o json
      prime-runs status s3://bucket/outputs
    """
    from prime_runs_spool.importer.places import import_command, not_spooled, paths_with_nothing, spool_roots
    from prime_runs_spool.importer.agreement import disagreement
    from prime_runs_spool.sync.status import statuses  # the state model: only when run

    local = [p for p in paths if not isinstance(p, str)]
    given = require_paths(local or ((Path("."),) if not paths else ()))
    state = default_state_dir(state_dir)
    links = SkippedLinks()
    runs = statuses(spool_roots(given, state), on_link=links, state_dir=state)
    disagreements = {run.path: found for run in runs if (found := disagreement(Path(run.path))) is not None}
    store_empty: list[str] = []
    for url in store_urls(paths):  # s3://bucket/prefix: the states are objects beside the spools
        from prime_runs_spool.errors import StoreError
        from prime_runs_spool.sync.store_sync import store_status

        try:
            found = store_status(url)
        except StoreError as exc:
            fail_usage(str(exc))
        runs += found
        store_empty += [] if found else [url]
    missing = not_spooled(given, state)
    empty = [*paths_with_nothing(given), *store_empty]
    for path in empty:
        click.echo(f"{MESSAGE_PREFIX}{nothing_found_message(path)}", err=True)
    code = 1 if empty and not allow_empty else 0
    links.say()
    if as_json:
        click.echo(json_report({"runs": [_with_disagreement(run.as_json(), disagreements.get(run.path))
                                          for run in runs],
                                 "not_spooled": [{"path": str(p), "fix": import_command(p, state)} for p in missing],
                                 "paths_without_runs": [str(path) for path in empty]},
                                indent=True))
        sys.exit(code)
    for path in missing:
        click.echo(shown(f"{'not spooled':<10} {path}  eval outputs without a spool (run: {import_command(path, state)})"))
    if not runs and not missing:
        click.echo("no runs found")
        sys.exit(code)
    for run in runs:
        if run.run_id is None and run.error:  # nothing of the spool could be read
            click.echo(f"{run.status:<10} {shown(run.path)}")
            click.echo(f"  error: {shown(run.error)}")
            continue
        # str(): a manifest's name or model is whoever wrote it (a number from another producer)
        click.echo(f"{run.status:<10} {shown(run.path)}  {shown(str(run.name or '?'))}  "
                   f"model {shown(str(run.model or '?'))}  "
                   f"{episodes(run.episodes)} in {count(run.segments, 'segment')}"
                   + (f", {run.superseded} superseded by a resume" if run.superseded else ""))
        if run.error:
            click.echo(f"  error: {run.error}")
        for warning in run.warnings:
            click.echo(f"  warning: {warning}")
        if run.path in disagreements:
            click.echo(f"  DISAGREES: {disagreements[run.path].describe()}")
        if not run.destinations and run.status != "error":
            click.echo("  not synced anywhere yet")
        for dest in run.destinations:
            done = "finalized" if dest.finalized else (dest.terminal or "open")
            line = (f"  -> {dest.destination}{' team ' + dest.team_id if dest.team_id else ''}: "
                    f"{_held(dest)}, {episodes(dest.pending)} pending, {done}")
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
                line += f", {episodes(dest.skipped_too_large)} skipped: too large for any request"
            if dest.lost:
                line += f", LOST: the spool no longer holds what was pushed: {dest.lost}"
            if dest.mismatch:
                line += f", MISMATCH: {dest.mismatch}"
            if dest.url:
                line += f"  {dest.url}"
            click.echo(line)
    sys.exit(code)


def _with_disagreement(document: dict[str, Any], found: Disagreement | None) -> dict[str, Any]:
    """A run's JSON report, with how its spool and ``traces.jsonl`` differ (null: they agree)."""
    document["traces_disagree"] = found.as_json() if found is not None else None
    return document


def _held(dest: DestinationStatus) -> str:
    """What the destination's store holds of the run, in that store's own terms, what
    vf-eval pushed there itself before the run was adopted, and what an earlier sync whose
    state was lost had put there (never sent again: why fewer were pushed than it holds)."""
    theirs = f"{episodes(dest.pushed_by_vf_eval)} vf-eval pushed there itself (adopted)"
    if dest.store == TRACES:
        there = f"{episodes(dest.held_there)} already there (an earlier sync's, its state lost: not sent again)"
        return (f"to traces: {episodes(dest.episodes_pushed)} ({count(dest.traces_pushed, 'trace')}) "
                f"in {count(dest.uploads, 'upload')}" + (f", and {theirs}" if dest.pushed_by_vf_eval else "")
                + (f", and {there}" if dest.held_there else ""))
    if dest.store == SAMPLES or dest.samples_pushed:
        return f"to samples: {count(dest.samples_pushed, 'sample')} pushed"
    if dest.pushed_by_vf_eval:
        return theirs
    return "nothing to push" if dest.finalized else "nothing pushed yet"  # finalized: none was ever to go
