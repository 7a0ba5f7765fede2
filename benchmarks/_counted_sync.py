"""``prime-runs`` with every object-store request counted: what benchmarks/fleet.py's
``--detail`` runs as each syncer, to show where a syncer's requests go.

Run: ``python3 benchmarks/_counted_sync.py OUT.json sync URL ...``. At exit OUT.json holds
the store requests by verb and object kind (segment, state, lease, other), bytes read, and
the runs whose segments this process read. Counting wraps the store's methods; the sync is
the command's own.
"""

from __future__ import annotations

import atexit
import collections
import json
import re
import sys
import threading

from prime_runs_spool.store.objects import ObjectStore

OUT = sys.argv.pop(1)
_counts: collections.Counter[str] = collections.Counter()
_segment_runs: set[str] = set()
_lock = threading.Lock()
_KINDS = ((re.compile(r"/spool/seg-\d+\.jsonl$"), "segment"), (re.compile(r"/spool/sync\.lease\.json$"), "lease"),
          (re.compile(r"/spool/sync/[^/]+\.json$"), "state"))


def _kind(key: str) -> str:
    return next((name for pattern, name in _KINDS if pattern.search(key)), "other")


def _counted(name: str, verb: str):
    original = getattr(ObjectStore, name)

    def wrapper(self, *args, **kwargs):
        key = args[0] if args else ""
        kind = _kind(key) if key else "bucket"
        try:
            result = original(self, *args, **kwargs)
        except Exception as exc:
            with _lock:
                _counts[f"{verb} {kind} {type(exc).__name__}"] += 1
            raise
        with _lock:
            _counts[f"{verb} {kind}"] += 1
            if name == "read_range":
                _counts["bytes_read segment"] += len(result)
                _segment_runs.add(key.split("/spool/")[0])
            elif name == "read" and result is not None:
                _counts[f"bytes_read {kind}"] += len(result[0])
        return result
    setattr(ObjectStore, name, wrapper)


for _name, _verb in (("list", "list"), ("read_range", "get-range"), ("read", "get"), ("create", "create"),
                     ("replace", "replace")):
    _counted(_name, _verb)


@atexit.register
def _dump() -> None:
    with open(OUT, "w") as f:
        json.dump({"counts": dict(_counts), "segment_runs": sorted(_segment_runs)}, f)


from commands.cli import main  # noqa: E402

main()
