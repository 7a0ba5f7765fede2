"""Sync every run found under some paths, in parallel, each under its own sync lock.

One run's failure never stops the others: each run gets its own report, and the caller
turns the reports into an exit code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from filelock import FileLock, Timeout

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.spool.layout import FILE_MODE, find_runs, spool_dir, sync_lock_path
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.sync.replay import replay_id_for
from prime_runs_spool.sync.state import Destination

def sync_lock(run_dir: Path, *, wait: bool = False) -> FileLock:
    """The run's sync lock (``spool/sync.lock``), not yet taken: at most one sync or follower
    works on a run at a time; the kernel drops it when its holder dies."""
    return FileLock(sync_lock_path(run_dir), timeout=-1 if wait else 0, mode=FILE_MODE)


def for_run(run_dir: Path, destination: Destination, options: SyncOptions) -> SyncOptions:
    """The options for one run: with ``replay`` and no explicit id, the run's own replay id
    (its latest unfinished replay to this destination, else a new one). Call under the lock."""
    if options.replay and options.replay_id is None:
        return dataclasses.replace(options, replay_id=replay_id_for(run_dir, destination.key))
    return options


def sync_run(
    run_dir: Path,
    client: PlatformClient,
    destination: Destination,
    options: SyncOptions,
    *,
    wait: bool = False,
    on_progress: Callable[[RunReport], None] | None = None,
    index: EvaluationIndex | None = None,
) -> RunReport:
    """Sync one run, unless another sync holds it (then report ``skipped``, or wait).
    ``index``: the environment listings shared with the other runs of this sync."""
    lock = sync_lock(run_dir, wait=wait)
    try:
        lock.acquire()
    except Timeout:
        return RunReport(path=str(run_dir), state="skipped",
                         error="another prime-runs sync is working on this run (use --wait to wait for it)")
    except OSError as exc:
        return RunReport(path=str(run_dir), state="error",
                         error=f"cannot take the sync lock in {spool_dir(run_dir)}: {exc.strerror}")
    try:
        return RunSync(run_dir, client, destination, for_run(run_dir, destination, options),
                       on_progress=on_progress, index=index).run()
    finally:
        lock.release()


def sync_paths(
    paths: Iterable[Path],
    client: PlatformClient,
    destination: Destination,
    options: SyncOptions,
    *,
    jobs: int = 4,
    wait: bool = False,
    on_progress: Callable[[RunReport], None] | None = None,
) -> list[RunReport]:
    """Sync every run under ``paths``; reports come back in discovery order. The runs share
    one :class:`EvaluationIndex`, so finding each new run's evaluation costs one small
    request instead of a listing of the whole environment (sync/index.py)."""
    runs = list(find_runs(paths))
    if not runs:
        return []
    index = EvaluationIndex()
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="prime-runs-sync") as pool:
        futures = [pool.submit(sync_run, run_dir, client, destination, options, wait=wait,
                               on_progress=on_progress, index=index) for run_dir in runs]
        return [future.result() for future in futures]
