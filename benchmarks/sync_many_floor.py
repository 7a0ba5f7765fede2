"""The floor under the first sync of many new runs: the three requests a run needs and nothing
else, made serially, by threads of one process, and by threads of several processes.

Run: ``python3 benchmarks/sync_many_floor.py [--runs 1000] [--jobs 8] [--processes 2] [--rounds 3] [--dir DIR]``

The runs are written as ``sync_many.py`` writes them and every run's three bodies (create,
samples, finalize) built beforehand, as its bare loop builds them; each way then sends them to
a local platform of its own (a fresh database, its own process), in turns, ``--rounds`` times:

- ``serial``: the bare loop, one connection (``sync_many.py``'s floor);
- ``threads``: ``--jobs`` threads of this process, a connection each, the runs dealt out as
  ``prime-runs sync``'s pool deals them;
- ``processes``: ``--processes`` processes of ``--jobs / --processes`` threads each.

Printed: each way's wall time a run (median of the rounds) and its ratio to the serial loop,
and the CPU a run of the senders and of the platform. Whether the sync's threads sharing one
interpreter lock set its floor shows as threads against processes: the requests are the one
part of a run both ways share, everything else (state writes, reading the spool) only adds
CPU under that lock.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import orjson  # noqa: E402

from _synccommon import API_KEY, platform, scratch, write_run  # noqa: E402
from sync_many import PLACEHOLDER, bare_requests, process_cpu  # noqa: E402

HEADERS = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json", "Accept": "application/json"}


def send(api: str, prepared: list[tuple[bytes, bytes, bytes]]) -> None:
    """The three requests of each run, on one connection of this thread's own."""
    placeholder = PLACEHOLDER.encode()
    with httpx.Client(timeout=120.0) as http:
        for create, rows, finalize in prepared:
            answer = http.post(f"{api}/evaluations/", content=create, headers=HEADERS)
            answer.raise_for_status()
            evaluation_id = answer.json()["evaluation_id"]
            http.post(f"{api}/evaluations/{evaluation_id}/samples",
                      content=rows.replace(placeholder, evaluation_id.encode()), headers=HEADERS).raise_for_status()
            http.post(f"{api}/evaluations/{evaluation_id}/finalize", content=finalize,
                      headers=HEADERS).raise_for_status()


def threaded(api: str, prepared: list[tuple[bytes, bytes, bytes]], jobs: int) -> None:
    """``jobs`` threads, each sending every ``jobs``-th run (the pool's share, near enough)."""
    workers = [threading.Thread(target=send, args=(api, prepared[n::jobs])) for n in range(jobs)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def _process(api: str, prepared: list[tuple[bytes, bytes, bytes]], jobs: int, go: object) -> None:
    go.wait()  # type: ignore[attr-defined]
    threaded(api, prepared, jobs)


def one_round(work: Path, prepared: list[tuple[bytes, bytes, bytes]], way: str, jobs: int,
              processes: int) -> tuple[float, float, float]:
    """Wall seconds, the senders' CPU seconds and the platform's, for one way over every run."""
    with platform(work / f"floor-{uuid.uuid4().hex[:8]}.db") as server:
        api = f"{server.base_url}/api/v1"
        env_id = httpx.post(f"{api}/environmentshub/resolve", json={"name": "gsm8k"},
                            headers=HEADERS).json()["data"]["id"]
        runs = [(create.replace(b'"ENV"', orjson.dumps(env_id)), rows, finalize) for create, rows, finalize in prepared]
        served = process_cpu(server.proc.pid)
        mine = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        if way == "processes":
            context = multiprocessing.get_context("fork")
            go = context.Event()
            procs = [context.Process(target=_process, args=(api, runs[n::processes], max(1, jobs // processes), go))
                     for n in range(processes)]
            for proc in procs:
                proc.start()
            start = time.perf_counter()
            go.set()
            for proc in procs:
                proc.join()
                assert proc.exitcode == 0, proc.exitcode
        else:
            start = time.perf_counter()
            if way == "serial":
                send(api, runs)
            else:
                threaded(api, runs, jobs)
        wall = time.perf_counter() - start
        after, after_children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime - mine.ru_utime - mine.ru_stime
               + after_children.ru_utime + after_children.ru_stime - children.ru_utime - children.ru_stime)
        return wall, cpu, process_cpu(server.proc.pid) - served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=8, help="threads in all (prime-runs sync's default)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk, not tmpfs)")
    args = parser.parse_args()
    ways = ("serial", "threads", "processes")
    with scratch(args.dir, "syncbench-floor-") as work:
        tree = work / "tree"
        for number in range(args.runs):
            write_run(tree / f"run-{number:05d}", f"floor-{number:05d}-{uuid.uuid4().hex[:8]}", 1, 2_000)
        prepared = [bare_requests(run_dir) for run_dir in sorted(tree.iterdir())]
        got: dict[str, list[tuple[float, float, float]]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way in ways:
                got[way].append(one_round(work, prepared, way, args.jobs, args.processes))
    serial = statistics.median(wall for wall, _, _ in got["serial"])
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; {args.runs} runs, {args.jobs} threads, "
          f"{args.processes} processes")
    print("| way | ms a run, median (min-max) | / serial | senders' CPU ms a run | platform's CPU ms a run |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for way in ways:
        walls = [1000 * wall / args.runs for wall, _, _ in got[way]]
        median = statistics.median(wall for wall, _, _ in got[way])
        print(f"| {way} | {statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) | {median / serial:.2f} | "
              f"{1000 * statistics.median(c for _, c, _ in got[way]) / args.runs:.2f} | "
              f"{1000 * statistics.median(p for _, _, p in got[way]) / args.runs:.2f} |")


if __name__ == "__main__":
    main()
