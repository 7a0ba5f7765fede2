"""Whether a pushing vf-eval may still be running on an output folder: then it is not
spooled yet (docs/integration.md, "Importing outputs written without a spool").

vf-eval that pushes uploads each episode to its own platform run right after writing its
line of ``traces.jsonl``, from a background queue that retries. Sync adopts that run
(docs/sync.md, "Runs vf-eval pushed") and sends what the platform lacks. While vf-eval
still runs, what the platform lacks includes the episodes its queue is about to send:
both land, and the samples table, which appends without deduplication, holds them twice.
It also closed the live evaluation out as crashed under vf-eval's feet.

So a folder whose episodes name a platform run, whose latest attempt has not torn down
(``importer/outcome.py``: a process still running, or killed), and whose ``traces.jsonl``
or ``eval.log`` changed less than :data:`QUIET_SECONDS` ago, is left for a later sync. A
vf-eval that was killed is spooled once its files have been still that long: by then its
last requests either landed (the platform's count shows them) or never will. A pushing
vf-eval that tore down is spooled at once, as any other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from prime_runs_spool.content.platform_runs import first_run_id_in, is_platform_run_id
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.importer.outcome import latest_log, torn_down
from prime_runs_spool.sync.options import DEFAULT_REQUEST_LIFETIME

#: How long a pushing vf-eval's outputs must be still before its folder is spooled while
#: its log shows no end: the lifetime sync gives a request of its own.
QUIET_SECONDS = DEFAULT_REQUEST_LIFETIME


def still_pushing(output_dir: Path, run_ids: Iterable[str], *, own_run_id: str | None = None,
                  now: float | None = None) -> str | None:
    """Why ``output_dir`` is left for now (see the module docstring), else None.
    ``own_run_id``: a spool's own run id, which names no run vf-eval pushed."""
    pushed = [run_id for run_id in run_ids if is_platform_run_id(run_id) and run_id != own_run_id]
    log = latest_log(output_dir)
    if not pushed or log is None or torn_down(log):
        return None
    changed = []
    for path in (verifiers_traces_path(output_dir), log):
        try:
            changed.append(os.stat(path).st_mtime)
        except OSError:
            continue
    now = time.time() if now is None else now
    # A time ahead of this clock (a copy from a machine whose clock runs ahead) counts as
    # recent, up to the same bound: one far ahead never holds the folder for good.
    ages = [now - mtime for mtime in changed if abs(now - mtime) < QUIET_SECONDS]
    if not ages:
        return None
    return (f"vf-eval may still be running here, pushing to its platform run {pushed[-1]} (its log shows no "
            f"end, and its outputs changed {max(0, round(min(ages)))} s ago): left until it has exited, or its "
            f"files have been still for {QUIET_SECONDS:.0f} s, so that no episode reaches the platform twice")


def may_be_pushing(output_dir: Path) -> bool:
    """Whether :func:`still_pushing` holds for ``output_dir`` by its first episode's run id,
    for a command that only advises (``status``, ``verify``: the import they suggest would
    leave the folder as it is): the log is read first, and ``traces.jsonl`` only to its
    first episode, and only while the log shows no end."""
    log = latest_log(output_dir)
    if log is None or torn_down(log):
        return False
    run_id = first_run_id_in(verifiers_traces_path(output_dir))
    return run_id is not None and still_pushing(output_dir, [run_id]) is not None
