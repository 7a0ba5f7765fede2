"""CPU of laying rows out as request bodies and writing them to a socket: what the sync's
read-ahead and sending threads spend on a body once its rows are encoded.

Run: ``python3 benchmarks/sync_body_writing.py [--tree CHECKOUT ...] [--episodes 1000]
[--rounds 3] [--dir DIR]``

One sealed run of ``--episodes`` episodes of about 20 KB is written (as
``sync_throughput.py`` writes it) and projected once into its encoded rows (about 57 KB
each). Then each checkout (``--tree``, a ``git worktree`` of the revision to compare; by
default this one), in turns for ``--rounds`` rounds, runs in a process of its own with the
sync command's allocator settings (sync/memory.py): its ``Batch`` lays the rows out in
bodies of up to 8 MiB, and its connection's stream (platform_api/deadline.py) writes each
body's pieces to a local socket whose other end a child process reads and drops. Printed:
that process's CPU (user + system) a row, the least of seven passes over the rows, three
times over. The kernel's copy of every byte into the socket is in both; what differs is
the process's own work on the way.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EVALUATION_ID = "0b5e4f7c-6c1a-4a3e-9a4f-3f3b1f0d2c11"
_READER = "import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\nwhile s.recv(1 << 20):\n    pass\n"


def measure(rows_file: Path) -> float:
    """In a process started from a checkout: its CPU a row, least of seven passes."""
    import orjson
    from httpcore._backends.sync import SyncStream

    from prime_runs_spool.platform_api.client import _Chunks
    from prime_runs_spool.platform_api.deadline import _Stream
    from prime_runs_spool.sync.memory import return_large_blocks_promptly
    from prime_runs_spool.sync.rows import Batch, Row

    return_large_blocks_promptly()
    rows = [row.encode() for row in orjson.loads(rows_file.read_bytes())] * 3
    ours, theirs = socket.socketpair()
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()
    stream = _Stream(SyncStream(ours))

    def send(batch: Batch) -> None:
        for piece in _Chunks(batch.parts()):
            stream.write(piece, 30.0)
        batch.release()

    best = float("inf")
    for _ in range(7):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = usage.ru_utime + usage.ru_stime
        batch = Batch()
        for data in rows:
            if not batch.fits(data, 8 << 20):
                send(batch)
                batch = Batch()
            batch.add(Row(data, None, None, True))
        send(batch)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        best = min(best, usage.ru_utime + usage.ru_stime - start)
    ours.close()
    reader.wait()
    return best / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, action="append")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the rows' file: one checkout's turn
    args = parser.parse_args()
    if args.measure:
        print(measure(args.measure))
        return
    sys.path.insert(0, str(HERE))
    import orjson
    from _synccommon import scratch, write_run

    from prime_runs_spool.sync.rows import RowStream

    trees = [tree.resolve() for tree in args.tree or [ROOT]]
    with scratch(args.dir, "syncbench-body-") as work:
        write_run(work / "run", "bench-body", args.episodes, 20_000)
        rows = [row.data.decode() for row in RowStream(work / "run", None, EVALUATION_ID, 26_214_400).rows()]
        rows_file = work / "rows.json"
        rows_file.write_bytes(orjson.dumps(rows))
        print(f"{len(rows)} rows of {sum(map(len, rows)) / len(rows) / 1000:.1f} KB, each pass over them three times")
        figures: dict[Path, list[float]] = {tree: [] for tree in trees}
        for _ in range(args.rounds):
            for tree in trees:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run([sys.executable, str(HERE / "sync_body_writing.py"), "--measure", str(rows_file)],
                                     cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
                figures[tree].append(float(out.split()[-1]))
        for tree, values in figures.items():
            print(f"{tree}: {' '.join(f'{v * 1e6:.1f}' for v in values)} us of CPU a row")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
