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
from prime_runs_spool.spool.layout import FILE_MODE, find_runs, spool_dir, sync_lock_path, unreadable_message
from prime_runs_spool.sync.engine import RunSync
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.options import DEFAULT_JOBS, RunReport, SyncOptions
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
    """Sync one run, unless another sync holds it, or a copy of it (then report ``skipped``,
    or wait). ``index``: the environment listings shared with the other runs of this sync."""
    if wait:  # for a copy of the run in another folder too (sync/copies.py)
        options = dataclasses.replace(options, copy_wait=None)
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
    except OSError as exc:  # e.g. its state folder cannot be listed: this run only
        return RunReport(path=str(run_dir), state="error", error=unreadable_message(exc, run_dir))
    except Exception as exc:  # a bug met on this run must not cost the others their sync
        return internal_error_report(str(run_dir), exc)
    finally:
        lock.release()


def internal_error_report(path: str, exc: Exception) -> RunReport:
    """The report of a run whose pass met an error no code path expected: that run's
    ``error``, so the others (local or in a store) still get their sync."""
    return RunReport(path=path, state="error", error=f"internal error: {type(exc).__name__}: {exc}")


def unreadable_report(path: Path, exc: OSError) -> RunReport:
    """The report of a directory under the paths that could not be read: a run may be in it,
    so the sync did not get everything it was asked to (exit 1)."""
    return RunReport(path=str(path), state="error", error=unreadable_message(exc, path))


def discover(paths: Iterable[Path]) -> list[Path | RunReport]:
    """The runs under ``paths`` in walk order, with a ready report in place of each
    directory that could not be read."""
    found: list[Path | RunReport] = []
    for run_dir in find_runs(paths, lambda path, exc: found.append(unreadable_report(path, exc))):
        found.append(run_dir)
    return found


def sync_paths(
    paths: Iterable[Path],
    client: PlatformClient,
    destination: Destination,
    options: SyncOptions,
    *,
    jobs: int = DEFAULT_JOBS,
    wait: bool = False,
    on_progress: Callable[[RunReport], None] | None = None,
) -> list[RunReport]:
    """Sync every run under ``paths``; reports come back in discovery order. A directory
    that cannot be read gets a report of its own (``error``, naming it and why) in its place
    among the others, which are synced all the same. The runs share one
    :class:`EvaluationIndex`, so finding each new run's evaluation costs one small request
    instead of a listing of the whole environment (sync/index.py)."""
    found = discover(paths)
    if not found:
        return []
    index = EvaluationIndex()
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="prime-runs-sync") as pool:
        futures = [item if isinstance(item, RunReport) else
                   up_to_date(item, client, destination, options, on_progress) or
                   pool.submit(sync_run, item, client, destination, options, wait=wait, on_progress=on_progress,
                               index=index)
                   for item in found]
        return [item if isinstance(item, RunReport) else item.result() for item in futures]


def up_to_date(run_dir: Path, client: PlatformClient, destination: Destination, options: SyncOptions,
               on_progress: Callable[[RunReport], None] | None) -> RunReport | None:
    """The report of a run with nothing to send, found in this thread (RunSync.probe), or
    None. A replay is chosen under the run's lock, so it always takes the pool."""
    if options.replay:
        return None
    try:
        return RunSync(run_dir, client, destination, options, on_progress=on_progress).probe()
    except Exception:  # the pass reports whatever this is, under the lock
        return None
