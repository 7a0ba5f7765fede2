"""Options that several commands take, each defined here once so that its name, its
environment variable and its help read the same in every command that has it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from prime_runs_spool.importer.options import STATE_DIR_ENV

class StateDirPath(click.Path):
    """``--state-dir``'s value: a folder, made when missing. A file there was taken, and
    every run's import or sync then failed on 'Not a directory' (exit 1); refused at once
    as bad usage, naming the variable when the value came from it. So are a device, a FIFO
    or a socket, and an empty value (``--state-dir "$UNSET"``), which was the current folder;
    a value of blanks only (a folder named so was made), and a path no folder can be made at
    (below a file, through a symbolic link to nothing or a loop of them), where every import
    failed on its own, exit 1."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from prime_runs_spool.files import folder_blocker, special_file_kind

        if isinstance(value, str) and not value:
            self.fail("an empty path names no folder", param, ctx)
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is blanks only and names no folder", param, ctx)
        kind = special_file_kind(value) if isinstance(value, (str, Path)) else None
        if kind is not None:
            self.fail(f"{click.format_filename(value)!r} is {kind}, not a folder", param, ctx)
        blocker = folder_blocker(value) if isinstance(value, (str, Path)) else None
        if blocker is not None:
            self.fail(f"no folder can be made at {click.format_filename(value)!r}: {blocker}", param, ctx)
        return super().convert(value, param, ctx)

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None) -> Any:
        from click.core import ParameterSource

        message = message.rstrip(".")
        if ctx is not None and param is not None and param.name \
                and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT:
            message = f"{message} (from {STATE_DIR_ENV})"
        super().fail(f"{message}; give a folder (made if missing)", param, ctx)


class OutputFolderPath(StateDirPath):
    """A folder a command writes its files into (``view --export``), made when missing: the
    checks ``--state-dir`` gets. An empty value (``--export "$SITE"`` with the variable
    unset) was the current folder, where the pages and ``static/`` were written over what
    was there (an ``index.html`` of its own), 'wrote 35 files to .', exit 0; a file, a device
    or a path below a file is told before anything is read."""


class OutputFilePath(click.Path):
    """A file a command writes (``export -o``): an empty value (``-o "$OUT"`` with the
    variable unset) was the current folder, and the export's rename over it failed as
    'cannot be written (Device or resource busy)', exit 1; one of blanks only made a file
    so named. Both are bad usage; so is ``-`` (standard output in many tools): the export
    replaces its file whole, at once, which a stream cannot be, and a file named ``-`` was
    written where the user looked for rows on the terminal."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("an empty path names no file", param, ctx)
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is blanks only and names no file", param, ctx)
        if value == "-":
            self.fail("'-' is not standard output here: the file is written whole and then put in place; "
                      "give a file name (e.g. -o episodes.jsonl)", param, ctx)
        return super().convert(value, param, ctx)


#: ``--state-dir`` for the commands that read spools: where ``prime-runs import`` kept the
#: spools of sources it could not write to. (``import`` and ``sync``, which write there,
#: say so in their own words.)
read_state_dir_option = click.option(
    "--state-dir", type=StateDirPath(), envvar=STATE_DIR_ENV,
    help=f"Where imported spools are kept, if not in the sources (env {STATE_DIR_ENV}).")

#: ``--allow-empty``: a path with neither a spool nor eval outputs is not a failure.
allow_empty_option = click.option(
    "--allow-empty", is_flag=True, help="Exit 0 even when a path holds neither a spool nor eval outputs.")


def refuse_empty_path(kind: click.ParamType, value: object, param: Any, ctx: Any) -> None:
    """Fail, as ``kind`` fails, for a PATH given empty: ``prime-runs sync "$OUTPUTS"`` with the
    variable unset or empty read ``""`` as ``.``, so every run under the working directory was
    synced (or imported, exported, mirrored), where ``--state-dir ""`` and ``-o ""`` are refused."""
    if isinstance(value, str) and not value.strip():
        kind.fail(f"{value!r} names no folder (an unset variable?); give a folder, or . for this one", param, ctx)


class LocalPath(click.Path):
    """A PATH argument of a command that reads local folders only. A store URL given there
    is told as one, with ``hint`` (what to run instead): as a plain path it was folded
    (``file:/x``) and reported as 'no such file or directory'."""

    def __init__(self, *, hint: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.hint = hint

    def convert(self, value: object, param: object, ctx: object) -> object:
        refuse_empty_path(self, value, param, ctx)
        if isinstance(value, str) and "://" in value:  # a plain path never imports the store's code
            from prime_runs_spool.store.objects import is_store_url

            if is_store_url(value):
                command = ctx.info_name if isinstance(ctx, click.Context) else "this command"
                self.fail(f"{value} is a store URL, and prime-runs {command} reads local folders only; "
                          f"{self.hint}", param, ctx)  # type: ignore[arg-type]
        return super().convert(value, param, ctx)  # type: ignore[arg-type]
