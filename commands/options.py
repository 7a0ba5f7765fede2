"""Options that several commands take, each defined here once so that its name, its
environment variable and its help read the same in every command that has it."""

from __future__ import annotations

from pathlib import Path

import click

from prime_runs_spool.importer.options import STATE_DIR_ENV

#: ``--state-dir`` for the commands that read spools: where ``prime-runs import`` kept the
#: spools of sources it could not write to. (``import`` and ``sync``, which write there,
#: say so in their own words.)
read_state_dir_option = click.option(
    "--state-dir", type=click.Path(path_type=Path), envvar=STATE_DIR_ENV,
    help=f"Where imported spools are kept, if not in the sources (env {STATE_DIR_ENV}).")

#: ``--allow-empty``: a path with neither a spool nor eval outputs is not a failure.
allow_empty_option = click.option(
    "--allow-empty", is_flag=True, help="Exit 0 even when a path holds neither a spool nor eval outputs.")


class LocalPath(click.Path):
    """A PATH argument of a command that reads local folders only. A store URL given there
    is told as one, with ``hint`` (what to run instead): as a plain path it was folded
    (``file:/x``) and reported as 'no such file or directory'."""

    def __init__(self, *, hint: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.hint = hint

    def convert(self, value: object, param: object, ctx: object) -> object:
        if isinstance(value, str) and "://" in value:  # a plain path never imports the store's code
            from prime_runs_spool.store.objects import is_store_url

            if is_store_url(value):
                command = ctx.info_name if isinstance(ctx, click.Context) else "this command"
                self.fail(f"{value} is a store URL, and prime-runs {command} reads local folders only; "
                          f"{self.hint}", param, ctx)  # type: ignore[arg-type]
        return super().convert(value, param, ctx)  # type: ignore[arg-type]
