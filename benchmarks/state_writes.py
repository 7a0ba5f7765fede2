"""What a new run's sync state writes cost: the four writes of a new run's pass (the create's,
the samples' and the finalize's announcements, then the pass's end), CPU (user and system,
of the writing thread) and wall time a run, against the same four writes each made as every
write was before sync/state_file.py (a temporary file, fsync, rename, and the folder fsync'd
for an announcement), in turns, on the same disk.

Run: ``python3 benchmarks/state_writes.py [--runs 200] [--rounds 5] [--dir DIR]`` (a real
disk, not a tmpfs: on a tmpfs an fsync costs nothing). Printed: each way's median CPU and
wall a run, and their ratio. ``--syscalls`` instead prints the system calls of one run's
writes each way (strace, for docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _synccommon import scratch  # noqa: E402

from prime_runs_spool.files import replace_private  # noqa: E402
from prime_runs_spool.sync import state_file  # noqa: E402
from prime_runs_spool.sync.state import Cursor, Destination, InFlight, SyncState, save_state, sync_state_path  # noqa: E402


def _states() -> list[SyncState]:
    """The four states a new run's pass writes, as the protocol leaves them."""
    state = SyncState(destination=Destination(key="bench", base_url="http://local"), local_run_id="bench-run")
    out = []
    state.in_flight = InFlight(kind="create", sent_at=time.time())
    out.append(dataclasses.replace(state))
    state.evaluation_id, state.viewer_url, state.store = "eval-0123456789", "http://local/evaluations/eval-0123456789", "samples"
    state.in_flight = InFlight(kind="samples", sent_at=time.time(), rows=3, episodes=3,
                               end=Cursor(segment_index=1, offset=6174, next_seq=5), last_sample_id="s-2")
    out.append(dataclasses.replace(state))
    state.cursor, state.samples_pushed, state.episodes_pushed = Cursor(segment_index=1, offset=6174, next_seq=5), 3, 3
    state.in_flight = InFlight(kind="finalize", sent_at=time.time())
    out.append(dataclasses.replace(state))
    state.in_flight, state.finalized, state.terminal = None, True, "completed"
    out.append(dataclasses.replace(state))
    return out


def new_way(path: Path, states: list[SyncState]) -> None:
    """As a pass writes them now (the protocol's begin and end around the writes)."""
    writer = state_file.Writer(str(path))
    for state in states:
        save_state(path, state, writer)
    writer.end()


def old_way(path: Path, states: list[SyncState]) -> None:
    """Each write replaced by a rename, the folder fsync'd for an announcement."""
    for state in states:
        replace_private(path, state.to_json(), durable=True, rename_durable=state.in_flight is not None)


def measure(work: Path, way, runs: int, tag: str) -> tuple[float, float]:
    states = _states()
    paths = [sync_state_path(work / f"{tag}-{n:05d}", "bench") for n in range(runs)]
    for path in paths:  # the run's spool folder is there; its sync/ folder is the first write's to make
        path.parent.parent.mkdir(parents=True)
    cpu, wall = time.thread_time(), time.perf_counter()
    for path in paths:
        way(path, states)
    return (time.thread_time() - cpu) / runs, (time.perf_counter() - wall) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk, not tmpfs)")
    parser.add_argument("--syscalls", action="store_true", help="one run each way, under strace -f -c")
    args = parser.parse_args()
    if args.syscalls:
        import subprocess
        for way in ("old", "new"):
            out = subprocess.run(["strace", "-c", "-e", "trace=%file,%desc", sys.executable, __file__, "--one", way],
                                 capture_output=True, text=True, check=False)
            print(f"{way}:\n{out.stderr}")
        return
    results: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    with scratch(args.dir, "syncbench-state-writes-") as work:
        for round_number in range(args.rounds):
            for name, way in (("old", old_way), ("new", new_way)):
                results[name].append(measure(work, way, args.runs, f"{name}-{round_number}"))
    for name in ("old", "new"):
        cpus, walls = zip(*results[name])
        print(f"{name}: CPU {statistics.median(cpus) * 1e6:7.1f} us a run (rounds {min(cpus) * 1e6:.0f}-{max(cpus) * 1e6:.0f}), "
              f"wall {statistics.median(walls) * 1e3:6.2f} ms a run")
    ratio = statistics.median(c for c, _ in results["new"]) / statistics.median(c for c, _ in results["old"])
    print(f"new / old, CPU: {ratio:.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":  # one run's writes, for --syscalls
        with scratch(None, "syncbench-state-writes-one-") as one:
            (one / "run" / "spool").mkdir(parents=True)
            (new_way if sys.argv[2] == "new" else old_way)(sync_state_path(one / "run", "bench"), _states())
    else:
        main()
