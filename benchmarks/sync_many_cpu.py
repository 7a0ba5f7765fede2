"""Where the first sync of many new small runs spends its CPU: per run, in-process.

Run: ``python3 benchmarks/sync_many_cpu.py [--runs 400] [--rounds 3] [--jobs N] [--profile] [--dir DIR]``

A tree of ``--runs`` small sealed runs (3 episodes of about 2 KB, one environment, as in
``sync_many.py``) is written once; each round forgets every sync state, starts a local
platform on a fresh database in its own process, and runs ``prime-runs sync TREE`` in this
process (the click command, so start-up is not counted). Printed per run: the sync's CPU
(user and system, ``getrusage``), its wall time, the platform's CPU, the requests made
and their thread CPU. The first round also pays for importing the HTTP stack and the
platform client's first connections: read the later ones. ``--profile`` wraps each run's ``sync.many.sync_run`` in a
``cProfile.Profile(time.thread_time)`` (one per run, merged; the profiler's own overhead
inflates the Python-heavy code several times) and prints the top functions (by cumulative time, or
what ``PROFILE_SORT`` names: ``PROFILE_SORT=tottime`` for each function's own time; ``PROFILE_OUT=FILE``
keeps the merged profile for ``pstats``). The probe of each run in the command's thread, and the
discovery, are profiled too.

CPU time moves with the load on a shared machine (other processes' cache and the GIL's
hand-offs); for an A/B figure the load cannot move, count instructions instead, e.g.
``valgrind --tool=cachegrind --cache-sim=no python3 benchmarks/sync_many_cpu.py --runs 30
--tree T30`` against ``--runs 90 --tree T90``, each tree written by a run outside valgrind
first (the difference over 60 runs is the per-run figure).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import resource
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import API_KEY, drop_state, platform, scratch, write_run  # noqa: E402
from sync_many import process_cpu  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=None, help="default: the command's")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk, not tmpfs)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="the runs' tree: written there if missing, and kept (for cachegrind, so that "
                             "writing it is not counted)")
    args = parser.parse_args()
    os.environ["PRIME_API_KEY"] = API_KEY
    os.environ.pop("PRIME_TEAM_ID", None)

    import prime_runs_spool.sync.many as many
    from commands.cli import cli
    from prime_runs_spool.platform_api.client import PlatformClient

    requests = {"count": 0, "cpu": 0.0}
    send = PlatformClient._request

    def counted(self: PlatformClient, *a: object, **k: object) -> object:
        start = time.thread_time()
        try:
            return send(self, *a, **k)
        finally:
            requests["count"] += 1  # GIL-atomic enough for a benchmark's tally
            requests["cpu"] += time.thread_time() - start

    PlatformClient._request = counted  # type: ignore[method-assign]
    profiles: list[cProfile.Profile] = []
    sync_run = many.sync_run

    def profiled(*a: object, **k: object) -> object:
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        try:
            return sync_run(*a, **k)
        finally:
            profile.disable()
            profiles.append(profile)

    def profiling(function):  # each call its own profile, in whichever thread makes it
        def wrapped(*a: object, **k: object) -> object:
            profile = cProfile.Profile(time.thread_time)
            profile.enable()
            try:
                return function(*a, **k)
            finally:
                profile.disable()
                profiles.append(profile)
        return wrapped

    if args.profile:
        many.sync_run = profiled
        many.up_to_date = profiling(many.up_to_date)  # the probe, in the command's thread
        many.discover = profiling(many.discover)
    with scratch(args.dir, "syncbench-many-cpu-") as work:
        tree = args.tree or work / "tree"
        if not tree.exists():
            for number in range(args.runs):
                write_run(tree / f"run-{number:05d}", f"cpu-{number:05d}-{uuid.uuid4().hex[:8]}", 3, 2_000)
        for round_number in range(args.rounds):
            drop_state(tree)
            requests.update(count=0, cpu=0.0)
            with platform(work / f"platform-{round_number}.db") as server:
                argv = ["sync", str(tree), "--base-url", server.base_url, "--json"]
                argv += ["--jobs", str(args.jobs)] if args.jobs else []
                served = process_cpu(server.proc.pid)
                before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
                    cli(argv, standalone_mode=False)
                wall = time.perf_counter() - wall
                after = resource.getrusage(resource.RUSAGE_SELF)
                served = process_cpu(server.proc.pid) - served
            assert out.getvalue().count('"synced"') == args.runs, out.getvalue()[-2000:]
            per = 1000 / args.runs
            print(f"round {round_number}: wall {per * wall:.1f} ms a run; the sync's CPU "
                  f"{per * (after.ru_utime - before.ru_utime):.2f} user + {per * (after.ru_stime - before.ru_stime):.2f} "
                  f"system ms a run; the platform's {per * served:.2f} ms; {requests['count'] / args.runs:.2f} requests "
                  f"a run, {1000 * requests['cpu'] / max(1, requests['count']):.3f} ms of thread CPU each", flush=True)
    if profiles:
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        stats.sort_stats(os.environ.get("PROFILE_SORT", "cumulative")).print_stats(args.top)
        if os.environ.get("PROFILE_OUT"):
            stats.dump_stats(os.environ["PROFILE_OUT"])


if __name__ == "__main__":
    main()
