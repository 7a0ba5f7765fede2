"""Where the documentation is, named in help texts as a link a user can open.

The repository's docs/ folder: read in place from a clone (an editable install, or
``python -m commands``), else the copy a built wheel installs with the command line
(setup.py ships it as ``prime_runs_spool_cli/docs``). A bare ``docs/sync.md`` would name a
path inside a checkout the user may not have, relative to a folder they may not be in.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
#: The page that has every command, option and exit code.
CLI_PAGE = "cli.md"


def docs_folder() -> Path:
    """The installed copy if there is one, else the clone's docs/ beside this folder."""
    installed = _HERE / "docs"
    return installed if (installed / CLI_PAGE).is_file() else _HERE.parent / "docs"


def doc_link(page: str = CLI_PAGE) -> str:
    """A ``file://`` URL of one page (terminals open it with a click)."""
    return (docs_folder() / page).as_uri()


def docs_epilog() -> str:
    """The end of every command's help: the link on a line of its own, never wrapped (a
    wrapped URL no longer opens with a click); option help names a page beside it."""
    return f"\b\nDocumentation (every command, option and exit code; the other pages beside it):\n  {doc_link()}"
