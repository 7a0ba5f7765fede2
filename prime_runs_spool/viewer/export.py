"""``prime-runs view --export DIR``: the same pages, written as files that open from disk.

The export is the default view of every page: the runs page, each run's table pages in
spool order, its plots, every episode and every example's group, and each run compared with
the one before it on the same environments (``query.neighbour_pairs``) with every example's
transcripts side by side. Sorting, filtering and picking two runs to compare need a server,
so their controls are left out (the templates ask ``links.static_export``). Links
are relative file names and the stylesheet and script are copied beside the pages, so the
folder opens from ``file://`` and can be zipped or served by any static server.

Written 0600 in 0700 folders, like everything the package writes: the pages hold the runs'
prompts and answers. ``index.html`` is written last, so a folder without it is an export
that did not finish. Memory stays bounded: one episode record is held at a time.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from prime_runs_spool.files import make_private_dir, write_private
from prime_runs_spool.viewer.app import wait_indexed
from prime_runs_spool.viewer.pages import Pages
from prime_runs_spool.viewer.query import PAGE_SIZE, RUN_GROUPS, across_metrics, neighbour_pairs
from prime_runs_spool.viewer.render import ASSETS, ExportLinks, asset
from prime_runs_spool.viewer.sources import Source

#: How long the export waits for one run's index (seconds): a spool being written is cut there.
INDEX_WAIT = 600.0


def export(source: Source, out_dir: str | os.PathLike[str]) -> int:
    """Write every page of ``source`` under ``out_dir``; returns how many files were written."""
    out = Path(out_dir)
    make_private_dir(out / "static")  # 0700, and so is every missing parent (os.makedirs: 0755)
    if (out / "static").is_symlink():  # the assets would go wherever it points
        raise OSError(errno.ELOOP, "is a symbolic link; give a folder of your own", str(out / "static"))
    links = ExportLinks()
    pages = Pages(source, links)
    written = 0
    for name in ASSETS:
        write_private(out / "static" / name, asset(name))
        written += 1
    runs = source.runs()
    for run in runs:
        wait_indexed(run, INDEX_WAIT)
    for group in RUN_GROUPS:
        for metric in [None, *across_metrics(runs)]:
            name = links.across(group, metric)
            assert name is not None
            write_private(out / name, pages.across({"group": group, **({"metric": metric} if metric else {})}).encode())
            written += 1
    for run in runs:
        page_count = max(1, -(-len(run.rows) // PAGE_SIZE))
        for page in range(1, page_count + 1):
            name = links.run(run.key, {"page": str(page)})
            assert name is not None
            write_private(out / name, pages.run({"run": run.key, "page": str(page)}, None).encode())
            written += 1
        name = links.plots(run.key)
        assert name is not None
        write_private(out / name, pages.plots({"run": run.key}).encode())
        written += 1
        for row in run.rows:
            name = links.episode(run.key, row.number)
            assert name is not None
            write_private(out / name, pages.episode({"run": run.key, "n": str(row.number)}).encode())
            written += 1
        for example in dict.fromkeys(str(row.example_id) for row in run.rows):
            name = links.group(run.key, example)
            assert name is not None
            write_private(out / name, pages.group({"run": run.key, "example": example}).encode())
            written += 1
    for a, b in neighbour_pairs(runs):
        name = links.compare({"a": a.key, "b": b.key})
        assert name is not None
        write_private(out / name, pages.compare({"a": a.key, "b": b.key}).encode())
        written += 1
        examples = dict.fromkeys(str(row.example_id) for run in (a, b) for row in run.rows)
        for example in examples:
            name = links.pair(a.key, b.key, example)
            assert name is not None
            write_private(out / name, pages.pair({"a": a.key, "b": b.key, "example": example}).encode())
            written += 1
    # The entry page last: an export stopped on the way (Ctrl-C, a full disk) leaves no
    # index.html that opens as if it were whole, with pages missing behind its links.
    write_private(out / links.runs(), pages.runs({}, None).encode())
    return written + 1
