"""What a lost state's ``held_there`` ids cost every save of a run's sync state.

Run: ``python3 benchmarks/sync_state_held.py [--held 100000] [--saves 20] [--dir DIR]``
(instructions: ``--instructions``, under valgrind, about a minute).

A state that starts from nothing on an evaluation found again keeps one id per episode the
run's Prime Traces listing showed (``held_there``, docs/sync.md "A lost state"). Until Dec 7
every save rewrote them with the whole state; since, they are a file of their own beside it,
written once (sync/id_sets.py), and the state names it. For a state of a traces run with no
such ids and the same state holding ``--held`` of them (UUID-like ids, as vf-eval's), prints
the state file's bytes (and the ids' file's), the wall time of one ``save_state``
(serialized, written, fsync'd, renamed: the median of ``--saves``, the first, which writes
the ids' file, among them) and of one ``load_state`` (and of reading the ids, which a pass
does once when it cuts batches), and the ratio of the two states'. ``--instructions``
counts, under cachegrind, ``--saves`` saves of each state in a process of its own and gives
the difference an added save costs (the imports and the first save taken out by a run of
one save). Run by an older checkout, the same script measures the inline ids.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prime_runs_spool.sync.state import (  # noqa: E402
    Cursor, SyncState, load_state, local_destination, save_state,
)

try:
    from prime_runs_spool.sync.id_sets import IdSet  # noqa: E402
except ImportError:  # before Dec 7: the ids held in the state
    IdSet = None


def state(held: int) -> SyncState:
    """A traces run's state part way (a cursor, 40 committed batches), holding ``held`` ids."""
    ids = [str(uuid.UUID(int=n + 1, version=4)) for n in range(held)]
    return SyncState(destination=local_destination(Path("/tmp/p.db"), None), local_run_id="bench-run",
                     evaluation_id="0" * 24, cursor=Cursor(segment_index=3, offset=1 << 20, next_seq=5000),
                     store="traces", uploads=[f"{n:064x}" for n in range(40)], episodes_pushed=5000,
                     traces_pushed=5000, held_there=ids if IdSet is None else IdSet.of(ids))


def timed(folder: Path, held: int, saves: int) -> tuple[int, int, float, float, float]:
    """The state file's bytes, the ids' file's, the median save, the median load and the
    median reading of the ids after a load, in seconds."""
    doc = state(held)
    path = folder / f"held-{held}" / "state.json"
    save_times, load_times, read_times = [], [], []
    for _ in range(saves):
        start = time.perf_counter()
        save_state(path, doc)
        save_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        loaded = load_state(path, destination=doc.destination, local_run_id=doc.local_run_id)
        load_times.append(time.perf_counter() - start)
        assert loaded is not None
        start = time.perf_counter()
        ids = loaded.held_there if IdSet is None or loaded.held_there is None else loaded.held_there.ids()
        read_times.append(time.perf_counter() - start)
        assert len(ids or ()) == held
    side = sum(p.stat().st_size for p in path.parent.glob("ids-*"))
    return (path.stat().st_size, side, statistics.median(save_times), statistics.median(load_times),
            statistics.median(read_times))


def saves_only(folder: Path, held: int, saves: int) -> None:
    """The piece cachegrind counts: the state built, then saved ``saves`` times."""
    doc = state(held)
    for _ in range(saves):
        save_state(folder / "sync" / "s.json", doc)


def instructions(folder: Path, held: int, saves: int) -> float:
    """Instructions one more save costs, for a state holding ``held`` ids."""
    from _instructions import instructions as count

    script = str(Path(__file__).resolve())
    many = count(script, ["--piece", str(held), str(saves), "--dir", str(folder)])
    one = count(script, ["--piece", str(held), "1", "--dir", str(folder)])
    return (many - one) / (saves - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--piece", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch)
        if args.piece:
            saves_only(folder, *args.piece)
            return
        base = timed(folder, 0, args.saves)
        held = timed(folder, args.held, args.saves)
        print(f"state without held ids: {base[0]:,} bytes, save {base[2] * 1e3:.2f} ms, load {base[3] * 1e3:.2f} ms")
        print(f"state holding {args.held:,}: {held[0]:,} bytes ({held[0] / max(args.held, 1):.1f} an id) and "
              f"{held[1]:,} in the ids' file, save {held[2] * 1e3:.2f} ms ({held[2] / base[2]:.1f}x), load "
              f"{held[3] * 1e3:.2f} ms ({held[3] / base[3]:.1f}x), the ids read after it {held[4] * 1e3:.2f} ms")
        if args.instructions:
            small = instructions(folder, 0, args.saves)
            large = instructions(folder, args.held, args.saves)
            print(f"instructions a save: {small / 1e6:.2f} M without, {large / 1e6:.2f} M holding {args.held:,} "
                  f"({large / small:.1f}x)")


if __name__ == "__main__":
    main()
