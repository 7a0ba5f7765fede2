"""``prime-runs import PATHS...``: turn eval output folders written without a spool into spools.

The importer is the library's (``prime_runs_spool.importer.outputs``); this module
prints its reports. Exit codes (docs/cli.md): 0 every run imported or up to date; 1 a run
could not be imported (the others still were), or a path holds neither a spool nor eval
outputs (unless ``--allow-empty``); 2 bad usage.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.files import shown, unreadable_message
from prime_runs_spool.plural import count, episodes
from prime_runs_spool.sync.command_line import output_option

from .options import LocalPath, StateDirPath
from .output import SkippedLinks, require_paths
from prime_runs_spool.importer.options import STATE_DIR_ENV, default_state_dir
from prime_runs_spool.sync.options import EXIT_RUN_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    from prime_runs_spool.importer.outputs import ImportReport
    from prime_runs_spool.sync.interrupt import Interrupt

# The importer (and the writer behind it) is imported where it runs, not here:
# ``prime-runs --help`` must not pay for it (tests/test_cli_basics.py).


def import_line(report: ImportReport) -> list[str]:
    """One line per run (plus its warnings and error): shared with ``prime-runs sync``."""
    from prime_runs_spool.importer.outputs import APPENDED, FAILED_STATES, IMPORTED
    from prime_runs_spool.sync.options import UP_TO_DATE

    if report.state in FAILED_STATES:
        return [f"{report.state:<11} {shown(report.source)}", f"  error: {shown(report.error or '')}"]
    where = f" -> {shown(report.run_dir)}" if report.run_dir and report.run_dir != report.source else ""
    if report.state in (IMPORTED, APPENDED, UP_TO_DATE):
        line = (f"{report.state:<11} {shown(report.source)}{where}: {episodes(report.episodes_added)} added, "
                f"{report.episodes_total} in the spool, {report.status}")
        if report.outcome and report.outcome != report.status:
            line += f" ({report.outcome})"
    else:
        line = f"{report.state:<11} {shown(report.source)}: {shown(str(report.reason))}"
    return [line] + [f"  {_label(warning)}: {shown(warning)}" for warning in report.warnings]


def _label(warning: str) -> str:
    """A launch file left out of the manifest because it sets credentials is the masking
    doing its job, not a problem: a note, as the eval logs it (info), not a warning."""
    from prime_runs_spool.content.manifest import is_config_source_note  # only when a run has warnings

    return "note" if is_config_source_note(warning) else "warning"


def nothing_found_message(path: Path) -> str:
    from prime_runs_spool.files import special_file_kind

    kind = special_file_kind(path)
    if kind is not None:  # a FIFO has nothing "under it": say what it is instead
        return f"{path}: nothing found: it is {kind}, not a regular file or folder"
    return (f"{path}: nothing found: neither a spool nor eval outputs (traces.jsonl, or metadata.json + "
            "results.jsonl) under it")


def _stop_on_signals() -> Interrupt:
    """SIGINT and SIGTERM: the first stops the import at its next batch (the spool sealed
    there, as a Ctrl-C seals a live run), a second at once."""
    from prime_runs_spool.sync.interrupt import Interrupt

    interrupt = Interrupt()
    interrupt.install(on_second=lambda: os.write(2, f"\n{MESSAGE_PREFIX}stopped at once (second signal); run "
                                                    "prime-runs import again to carry on\n".encode()))
    return interrupt


def _exit_interrupted(reports: list[ImportReport]) -> None:
    """After the first signal: each run's line, then one saying what is left; exit 130."""
    from prime_runs_spool.sync.options import EXIT_INTERRUPTED, INTERRUPTED

    for report in reports:
        for line in import_line(report):
            click.echo(line)
    done = sum(1 for report in reports if report.state != INTERRUPTED)
    click.echo(f"{MESSAGE_PREFIX}interrupted: {count(done, 'run')} done, the rest left; run the same prime-runs "
               "import again to carry on", err=True)
    sys.exit(EXIT_INTERRUPTED)


def quiet_library_warnings() -> None:
    """The reports carry the library's warnings; don't print them twice through logging."""
    logging.getLogger("prime_runs_spool").addHandler(logging.NullHandler())


@click.command("import")
@click.argument("paths", nargs=-1, required=True, type=LocalPath(path_type=Path, hint=(
    "a store holds spools only, with nothing to import: sync, status, verify and export read it as it is")))
@click.option("--state-dir", type=StateDirPath(), envvar=STATE_DIR_ENV,
              help=f"Keep the imported spools here instead of in the sources (env {STATE_DIR_ENV}); "
                   "for read-only sources.")
@click.option("--allow-empty", is_flag=True, help="Exit 0 even when a path holds neither a spool nor eval outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable report.")
@output_option
def import_(paths: tuple[Path, ...], state_dir: Path | None, allow_empty: bool, as_json: bool) -> None:
    """Import every eval output folder under PATHS (verifiers 0.4.0's traces.jsonl + configs/,
    or the older metadata.json + results.jsonl) into a spool, as the eval would have written it.

    Run it again any time: nothing is added twice; episodes appended since go into a new segment.

    \b
    Examples:
      prime-runs import outputs
      prime-runs import /mnt/artifact --state-dir ~/.cache/prime-runs   # a read-only source
      prime-runs import outputs -o json
    """
    from prime_runs_spool.errors import NoSuchPathError
    from prime_runs_spool.importer.outputs import FAILED_STATES, import_paths
    from prime_runs_spool.sync.console import json_report
    from prime_runs_spool.importer.places import paths_with_nothing

    quiet_library_warnings()
    roots = require_paths(paths)
    state = default_state_dir(state_dir)
    interrupt = _stop_on_signals()
    try:
        links = SkippedLinks()
        unreadable: list[str] = []  # folders eval outputs may hide in: named, never passed over in silence
        reports = import_paths(roots, state_dir=state, stop=interrupt.is_set, on_link=links,
                               on_unreadable=lambda folder, exc: unreadable.append(unreadable_message(exc, folder)))
        empty = paths_with_nothing(roots)
    except NoSuchPathError as exc:
        click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
        sys.exit(EXIT_USAGE)
    if interrupt.is_set():
        _exit_interrupted(reports)
    failed = [r for r in reports if r.state in FAILED_STATES]
    if as_json:
        click.echo(json_report({"ok": not failed and not unreadable and (allow_empty or not empty),
                                 "imports": [r.as_json() for r in reports], "unreadable": unreadable,
                                 "paths_without_runs": [str(p) for p in empty]},
                                indent=True))
    else:
        for report in reports:
            for line in import_line(report):
                click.echo(line)
        if not reports and not empty and not unreadable:  # spools only: said, so that it shows the import looked
            from prime_runs_spool.spool.layout import find_runs

            spooled = sum(1 for _ in find_runs(roots, on_unreadable=lambda *_: None))
            click.echo(f"nothing to import under {', '.join(map(str, roots))}: no eval output without a spool "
                       f"({count(spooled, 'spooled run')}; prime-runs sync ships them)")
    links.say()
    for path in empty:
        click.echo(f"{MESSAGE_PREFIX}{nothing_found_message(path)}", err=True)
    for line in unreadable:
        click.echo(shown(f"{MESSAGE_PREFIX}{line}: eval outputs in it, if any, were not imported"), err=True)
    if unreadable and not failed:
        sys.exit(EXIT_RUN_FAILED)
    if failed:
        click.echo(f"{MESSAGE_PREFIX}{len(failed)} of {count(len(reports), 'run')} could not be imported: {failed[0].error}",
                   err=True)
        sys.exit(EXIT_RUN_FAILED)
    if empty and not allow_empty:
        sys.exit(EXIT_RUN_FAILED)
