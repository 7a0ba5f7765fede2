"""``prime-runs verify s3://bucket/prefix``: the verdict of spool/verify.py on runs in a store.

The same ``check_run`` as for local folders (the reader reads a store's segments through
ranged reads, store/source.py), over the runs of one listing. Read-only: nothing is written
to the store, and this machine's folder for the URL is not even created.
"""

from __future__ import annotations

from pathlib import Path

from prime_runs_spool.spool.verify import Verdict, check_run
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.store.source import find_store_runs


def verify_store(url: str, store: ObjectStore | None = None) -> Verdict:
    """Check every run under ``url``; raises :class:`StoreError` when it cannot be listed."""
    store = store or ObjectStore(url)
    verdict = Verdict()
    runs = find_store_runs(store, store.list(), Path("/nonexistent-local-face"))
    verdict.runs.extend(check_run(run) for run in runs)  # type: ignore[arg-type]
    if not runs:
        verdict.paths_without_runs.append(store.url)
    return verdict
