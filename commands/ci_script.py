"""``prime-runs ci-script``: the CI sync step, written out by the installed command line.

A CI job installs the package (a wheel, or ``pip install`` from a clone's URL) without a
checkout of this repository beside it, so the script docs/ci.md runs must come with the
package: it ships in the command line's docs folder (setup.py, pyproject.toml's
package-data) and this command prints it, byte for byte.
"""

from __future__ import annotations

import click

from .doc_links import docs_folder

#: The script, under the docs folder (installed, or the clone's).
SCRIPT = ("ci", "sync-artifacts.sh")


@click.command("ci-script")
def ci_script() -> None:
    """Print the CI sync step (sync-artifacts.sh, the CI page beside cli.md) on stdout.

    It syncs every run under DIR with --json, keeps the report in $SYNC_REPORT, prints a
    line per run and exits with prime-runs sync's code. Save it, then run it with bash.

    \b
    Examples:
      prime-runs ci-script > sync-artifacts.sh && bash sync-artifacts.sh outputs
      prime-runs ci-script > sync-artifacts.sh && bash sync-artifacts.sh --replay outputs --tag replayed
    """
    # click's echo, as every command writes its output: a full disk under '> sync-artifacts.sh' is
    # then said as that (output.internal_error), where a write of its own ended in exit 120
    click.echo(docs_folder().joinpath(*SCRIPT).read_bytes(), nl=False)
