"""What ``prime-runs sync --follow`` imports while it follows: eval outputs written without a
spool that appear under the paths, grow there, or were left for later (a pushing vf-eval
still running), spooled before each walk of the follower through the one step a one-shot
sync imports with (``importer.outputs.import_paths``), so the follower then ships them as
any other run. An unchanged folder costs ``stat`` calls (importer/unchanged.py); an import
adds only the episodes its spool lacks, so importing a growing folder again and again
spools, and ships, each episode once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .import_ import import_line

if TYPE_CHECKING:
    from prime_runs_spool.importer.outputs import ImportReport
    from prime_runs_spool.sync.follow import Discovered


class FollowImports:
    """The follower's ``discover``: imports, says what changed, keeps what failed."""

    def __init__(self, paths: Sequence[Path], state_dir: Path | None, *, as_json: bool,
                 echo: Callable[[str], None], flush: Callable[[], None]) -> None:
        self.paths, self.state_dir = list(paths), state_dir
        self.as_json, self.echo, self.flush = as_json, echo, flush
        #: The last thing said of each source that did no import (said again only on a change).
        self.said: dict[str, tuple[str, str | None, tuple[str, ...]]] = {}
        #: The sources whose last import failed: the follower's exit code counts them.
        self.failed: set[str] = set()

    def __call__(self) -> Discovered:
        from prime_runs_spool.errors import SpoolError
        from prime_runs_spool.importer.outputs import FAILED_STATES, import_paths
        from prime_runs_spool.importer.paths import find_eval_outputs
        from prime_runs_spool.importer.places import spool_roots
        from prime_runs_spool.spool.format import LIVE
        from prime_runs_spool.sync.follow import Discovered

        outputs: list[Path] = []
        for path in self.paths:
            try:
                outputs.extend(find_eval_outputs([path]))
            except (SpoolError, OSError):
                continue  # a path that vanished while following holds nothing now
        reports = import_paths(outputs, state_dir=self.state_dir, refresh_only=True) if outputs else []
        for report in reports:
            if report.state in FAILED_STATES:
                self.failed.add(report.source)
            else:
                self.failed.discard(report.source)
            self._say(report)
        roots = spool_roots(self.paths, self.state_dir) if self.state_dir is not None else list(self.paths)
        return Discovered(roots, growing=bool(outputs), waiting=any(r.state == LIVE for r in reports))

    def _say(self, report: ImportReport) -> None:
        from prime_runs_spool.importer.outputs import APPENDED, IMPORTED, SPOOLED
        from prime_runs_spool.sync.console import json_report
        from prime_runs_spool.sync.options import UP_TO_DATE

        if report.state in (IMPORTED, APPENDED):
            self.said.pop(report.source, None)
        else:
            # Once per state: a live folder's reason names its age, which changes every look.
            said = (report.state, report.error, tuple(report.warnings))
            quiet = report.state == UP_TO_DATE or (report.state == SPOOLED and not report.warnings)
            if quiet or self.said.get(report.source) == said:
                self.said[report.source] = said
                return
            self.said[report.source] = said
        if self.as_json:
            self.echo(json_report(report.as_json()))
        else:
            for line in import_line(report):
                self.echo(line)
        self.flush()
