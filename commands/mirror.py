"""``prime-runs mirror PATH... URL``: keep a copy of the spools under PATHS in an object store.

Thin: the work is ``prime_runs_spool.store.mirror``; this module parses options, waits
between passes, stops on SIGINT/SIGTERM, and prints what each pass uploaded.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

from .output import Seconds, fail_usage, require_paths
from .sync_store import PathOrURL, store_urls
from prime_runs_spool.errors import MESSAGE_PREFIX
from prime_runs_spool.files import shown
from prime_runs_spool.plural import plural
from prime_runs_spool.signal_event import SignalEvent
from prime_runs_spool.sync.command_line import output_option


@click.command("mirror")
@click.argument("paths", nargs=-1, required=True, type=PathOrURL(path_type=Path))
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--interval", type=Seconds(0.05), default=None, envvar="PRIME_RUNS_MIRROR_INTERVAL",
              help="Seconds between passes (default 5, env PRIME_RUNS_MIRROR_INTERVAL).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per run uploaded to.")
@output_option
def mirror(paths: tuple[Any, ...], once: bool, interval: float | None, as_json: bool) -> None:
    """Copy the run spools under PATHS into the store URL (the last argument), as they grow.

    Sealed segments go once, whole; a live segment goes up to its writer's durable mark at
    every pass, never past it. A segment written under older masking rules goes up as a
    copy masked again by today's rules (its line says so); the local spool is left as it was. The local spool stays the durable copy. Runs until SIGINT or
    SIGTERM (exit 0), or one pass with --once. Eval outputs without a spool (plain
    vf-eval's) are not copied: each such folder is named on stderr. Exit 1 when a pass
    (with --once) failed to upload something or left such a folder, or the store cannot be
    listed, 2 on bad usage.

    \b
    Examples:
      prime-runs mirror outputs s3://bucket/outputs          # until Ctrl-C
      prime-runs mirror outputs s3://bucket/outputs --once -o json
    """
    from prime_runs_spool.sync.console import json_report

    from prime_runs_spool.errors import StoreError, StoreSetupError
    from prime_runs_spool.store.mirror import DEFAULT_INTERVAL, mirror as run_mirror, refuse_store_inside
    from prime_runs_spool.content.remask import copy_masking
    from prime_runs_spool.store.objects import ObjectStore

    urls = store_urls(paths)
    if len(urls) != 1 or not isinstance(paths[-1], str):
        fail_usage("give local PATHS and then one store URL, e.g. prime-runs mirror outputs s3://bucket/outputs")
    roots = require_paths([p for p in paths if not isinstance(p, str)])
    if not roots:
        fail_usage("give at least one local PATH before the store URL")
    unspooled = _not_spooled(roots)
    stopped = SignalEvent()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    failed = False
    #: Each failing run's error as last printed: a run refused at every pass (its folder
    #: renamed, say) is said once, and again when its error changes, not every --interval.
    said: dict[str, str] = {}

    def show(reports: list[Any]) -> None:
        nonlocal failed
        for report in reports:
            if report.error:
                failed = True
                if said.get(report.path) == report.error and not report.uploaded:
                    continue
                said[report.path] = report.error
            else:
                said.pop(report.path, None)
            if not (report.uploaded or report.error):
                continue
            if as_json:
                click.echo(json_report(report.as_json()))
            elif report.error:
                click.echo(f"error      {shown(report.path)} -> {shown(report.url)}: {shown(report.error)}")
            else:
                click.echo(f"uploaded   {shown(report.path)} -> {shown(report.url)}: {', '.join(report.uploaded)} "
                           f"({report.bytes_sent} bytes){_masked_again(report.masked_again)}")
        sys.stdout.flush()

    try:
        refuse_store_inside(roots, urls[0])
        store = ObjectStore(urls[0])
        run_mirror(roots, store, interval=interval or DEFAULT_INTERVAL, once=once,
                   stop=stopped.wait, on_pass=show, masking=copy_masking)
    except StoreSetupError as exc:  # the URL or the setup, not the store: usage
        fail_usage(str(exc))
    except StoreError as exc:
        click.echo(f"{MESSAGE_PREFIX}{exc}", err=True)
        sys.exit(1)
    sys.exit(1 if once and (failed or unspooled) else 0)


def _masked_again(segments: list[str]) -> str:
    """What the line adds when segments written under older masking rules went up masked again."""
    if not segments:
        return ""
    return (f"; {', '.join(segments)} written under older masking rules: the store holds "
            f"{plural(len(segments), 'it', 'them')} masked again by today's, the local spool is left as it was")


def _not_spooled(roots: list[Path]) -> list[Path]:
    """The eval output folders under ``roots`` with no spool (plain vf-eval's) and an episode
    to lose, named on stderr: the mirror copies spools only, so their episodes would never
    reach the store, and a sync of the store could not see them either."""
    from prime_runs_spool.importer.places import holds_an_episode, import_command, not_spooled

    found = [output_dir for output_dir in not_spooled(roots) if holds_an_episode(output_dir)]
    for output_dir in found:
        click.echo(shown(f"{MESSAGE_PREFIX}{output_dir}: eval outputs without a spool are not mirrored; spool them "
                         f"first ({import_command(output_dir, None)}), or sync them from this machine"), err=True)
    return found
