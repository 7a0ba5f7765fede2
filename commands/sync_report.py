"""What ``prime-runs sync`` prints at the end, for local paths and store URLs alike, so a
script reads one format (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prime_runs_spool.files import shell_word, shown

from .sync_setup import LOCAL_BROWSE_PORT

if TYPE_CHECKING:
    from prime_runs_spool.importer.outputs import ImportReport
    from prime_runs_spool.sync.options import RunReport


def print_reports(reports: list[RunReport], imports: list[ImportReport], left_out: list[Path], state: Path | None,
                  *, as_json: bool, local_db: str | None, ok: bool, empty: list[Path] | None = None,
                  dry_run: bool = False) -> None:
    """Each run's report (and each import's), as lines or one JSON document. ``empty``: the
    paths that held nothing (said on stderr; in the JSON document as ``verify`` and
    ``import`` name them, so a CI step reading only stdout learns why ``ok`` is false)."""
    from prime_runs_spool.importer.places import import_command
    from prime_runs_spool.sync.console import json_report, report_lines

    from .import_ import import_line

    if as_json:
        document: dict[str, Any] = {
            "runs": [report.as_json() for report in reports],
            "imports": [report.as_json() for report in imports],
            "not_imported": [str(path) for path in left_out],
            "paths_without_runs": [str(path) for path in empty or []],
            "ok": ok,
        }
        if local_db:
            document["local_db"] = local_db
        click.echo(json_report(document, indent=True))
        return
    if imports:  # the importer (and the runner, the writer under it) only when it ran
        from prime_runs_spool.importer.outputs import SPOOLED
        from prime_runs_spool.sync.options import UP_TO_DATE
    told = False  # whether a line above already said what was found
    for imported in imports:
        if imported.state in (SPOOLED, UP_TO_DATE) and not imported.warnings:
            # Nothing imported (the eval's own spool, agreeing; or an import with nothing new,
            # which a later re-sync answers from its stat cache without a line): the run's
            # own sync line follows.
            continue
        for line in import_line(imported):
            click.echo(line)
            told = True
    for path in left_out:
        click.echo(shown(f"not spooled {path}: not imported (run: {import_command(path, state)})"))
        told = True
    if not reports:
        # Eval outputs that failed to import (or hold no episode yet) were found: their lines
        # said so, and "no runs found" beside them would say the paths were empty.
        if not told:
            click.echo("no runs found")
        return
    told: set[str] = set()  # the destination's notices, said once
    for report in reports:
        for line in report_lines(report, told, dry_run):
            click.echo(line)
    if local_db:
        click.echo(browse_line(local_db))


def browse_line(local_db: str) -> str:
    """How to open the links a ``--local`` sync prints: the platform it wrote, served on the
    port the links name (the embedded one is gone, or on another port, by then)."""
    return f"browse with: prime-runs platform serve --db {shell_word(local_db)} --port {LOCAL_BROWSE_PORT}"


def waiting_imports(imports: list[ImportReport]) -> list[ImportReport]:
    """The eval output folders an eval may still be writing (their line says so): left for a
    later sync, neither a failure nor "no runs found"."""
    if not imports:
        return []
    from prime_runs_spool.spool.format import LIVE

    return [imported for imported in imports if imported.state == LIVE]
