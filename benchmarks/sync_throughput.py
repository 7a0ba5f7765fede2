"""Sync throughput, the command line's process start included, against a bare httpx loop
POSTing the same request bodies and against prime-evals' ``push_samples`` of the same rows.

Run: ``python3 benchmarks/sync_throughput.py [--episodes 10000] [--size 20000] [--repeat 3]
[--quick] [--dir DIR] [--tree CHECKOUT ...] [--compiled]``

One sealed run of ``--episodes`` episodes of about ``--size`` bytes is written to a spool
(outside any timing). Then, ``--repeat`` times, in turn, each against a fresh database behind
a fresh ``prime-runs platform serve`` process (its own GIL):

* **cli**: ``prime-runs sync RUN --json`` as a fresh process, timed from its start to its
  exit: interpreter start and imports, create the evaluation, read + check + project + batch
  + push every row (one state save, with its fsyncs, per request), record metadata, finalize.
  This is what a user waits for.
* **library**: ``sync_paths`` in this process (the same code, without the process start).
* **bare**: an evaluation is created and the request bodies are built with the same projection
  and batching (``RowStream`` + ``batches``) *before* the clock starts; timed: a plain
  ``httpx.Client`` loop POSTing those bodies, nothing else.
* **bare+cpu**: the bare loop while another process burns as much CPU as the cli process
  used in the same round, started with the loop: the floor on two cores, since the work sync
  must do (read, check, project every row) competes with the platform for the cores.
* **prime-evals**: the same rows as Python objects, built before the clock; timed:
  ``EvalsClient.push_samples`` (prime-evals 0.2, its default 4 concurrent uploads), which
  re-serializes and batches them itself.

Goals: cli at most 1.1x bare, and faster than prime-evals. The CPU time and the
minor page faults of the cli process and of the library call are printed too: on a shared
machine they move far less than the wall times.

``--tree CHECKOUT`` (repeatable) times the cli of each checkout (a ``git worktree`` of the
revision to compare) in the same rounds, in turns, each against the same bare loop: before
and after, back to back. ``--compiled`` compiles each checkout's bytecode first, as an
installed package has it; without it, where ``PYTHONDONTWRITEBYTECODE`` is set and the
checkout was never compiled, every cli start also compiles the package (about 0.1 s of
CPU). The script says which case it measured.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import orjson  # noqa: E402
from _synccommon import (  # noqa: E402
    API_KEY, ROOT, arguments, cli_sync, client_for, drop_state, human, now, platform, scratch, spread, write_run,
)

from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES  # noqa: E402
from prime_runs_spool.sync.options import SyncOptions  # noqa: E402
from prime_runs_spool.sync.rows import RowStream, batches  # noqa: E402
from prime_runs_spool.sync.many import sync_paths  # noqa: E402

GOAL = 1.1

#: Per way, per round: (CPU seconds, user + system, and minor page faults) of the sync
#: itself: the command's whole process, or this process during the library call. Less
#: noisy than wall time on a shared machine (docs/benchmarks.md).
CPU: dict[str, list[tuple[float, int]]] = {"library": []}


def _usage(who: int) -> tuple[float, int]:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def _used(way: str, who: int, before: tuple[float, int]) -> None:
    cpu, faults = _usage(who)
    CPU[way].append((cpu - before[0], faults - before[1]))


def time_sync(work: Path, run_dir: Path, label: str, max_request_bytes: int) -> tuple[float, int, int]:
    drop_state(run_dir)
    with platform(work / f"sync-{label}.db") as server:
        client, destination = client_for(server.base_url)
        with client:
            options = SyncOptions(max_request_bytes=max_request_bytes)
            before, start = _usage(resource.RUSAGE_SELF), now()
            reports = sync_paths([run_dir], client, destination, options, jobs=1)
            elapsed = now() - start
            _used("library", resource.RUSAGE_SELF, before)
    (report,) = reports
    if report.state != "synced":
        raise SystemExit(f"sync did not finish: {report.state} {report.error}")
    return elapsed, report.pushed_now, report.bytes_sent


def cli_way(name: str, checkout: Path):  # noqa: ANN201  (a way, as the others)
    """The cli of ``checkout`` as a way of its own, named ``name``."""
    CPU[name] = []

    def time_cli(work: Path, run_dir: Path, label: str, max_request_bytes: int) -> tuple[float, int, int]:
        drop_state(run_dir)
        with platform(work / f"cli-{label}.db") as server:
            before = _usage(resource.RUSAGE_CHILDREN)  # the platform, a child too, is still running
            elapsed, document = cli_sync(run_dir, server.base_url, "--jobs", "1",
                                         "--max-request-bytes", str(max_request_bytes), checkout=checkout)
            _used(name, resource.RUSAGE_CHILDREN, before)
        (report,) = document["runs"]
        return elapsed, report["pushed_now"], report["bytes_sent"]
    return time_cli


def _evaluation(client, name: str) -> str:
    env_id = client.resolve_environment("gsm8k")
    return str(client.create_evaluation({"name": name, "environments": [{"id": env_id}]})["evaluation_id"])


def time_prime_evals(work: Path, run_dir: Path, label: str, max_request_bytes: int) -> tuple[float, int, int]:
    from prime_evals import EvalsClient
    from prime_evals.core import APIClient

    with platform(work / f"evals-{label}.db") as server:
        client, _ = client_for(server.base_url)
        with client:
            evaluation_id = _evaluation(client, "prime-evals")
        stream = RowStream(run_dir, None, evaluation_id, max_request_bytes)
        rows = [row for batch in batches(stream, max_request_bytes) if batch.count
                for row in orjson.loads(bytes(batch.body()))["samples"]]
        os.environ["PRIME_API_BASE_URL"] = server.base_url
        evals = EvalsClient(APIClient(api_key=API_KEY))
        start = now()
        result = evals.push_samples(evaluation_id, rows, max_payload_bytes=max_request_bytes)
        elapsed = now() - start
    sent = sum(len(orjson.dumps(row)) + 1 for row in rows)
    return elapsed, int(result["samples_pushed"]), sent


def time_bare(work: Path, run_dir: Path, label: str, max_request_bytes: int,
              burn: float = 0.0) -> tuple[float, int, int]:
    with platform(work / f"bare-{label}.db") as server:
        client, _ = client_for(server.base_url)
        with client:
            evaluation_id = _evaluation(client, "bare")
        # Built outside the timed region: the same rows, in the same requests, sync sends.
        stream = RowStream(run_dir, None, evaluation_id, max_request_bytes)
        bodies = [bytes(batch.body()) for batch in batches(stream, max_request_bytes) if batch.count]
        rows = sum(b.count(b'"sample_id"') for b in bodies)  # one per row (row keys are fixed)
        headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json",
                   "Accept": "application/json"}
        url = f"{server.base_url}/api/v1/evaluations/{evaluation_id}/samples"
        with httpx.Client(timeout=120.0) as http:
            burner = _burner(burn)
            start = now()
            for body in bodies:
                http.post(url, content=body, headers=headers).raise_for_status()
            elapsed = now() - start
            if burner is not None:
                burner.wait()
        sent = sum(len(b) for b in bodies)
        del bodies
    return elapsed, rows, sent


#: A process that keeps one core busy for argv[1] seconds of its own CPU.
_BURN = ("import sys, time\nend = time.process_time() + float(sys.argv[1])\n"
         "while time.process_time() < end:\n    pass\n")


def time_bare_with_cpu(work: Path, run_dir: Path, label: str, max_request_bytes: int) -> tuple[float, int, int]:
    """The bare loop while another process spends as much CPU as the cli process did this
    round, started with the loop: the floor on this machine's two cores, where the work sync
    cannot skip (reading, checking and projecting every row) competes with the platform for
    the same cores as the cli's does."""
    return time_bare(work, run_dir, label, max_request_bytes, burn=CPU[CLIS[0]][-1][0] if CPU[CLIS[0]] else 0.0)


#: The cli ways, one per checkout (``--tree``); bare+cpu burns the first one's CPU.
CLIS: list[str] = []


def compile_checkout(checkout: Path) -> None:
    """Bytecode for the package and the command line, as an installed package has it."""
    import subprocess

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "prime_runs_spool"),
                    str(checkout / "commands")], check=True)


def _burner(seconds: float):  # noqa: ANN202  (a Popen or None)
    import subprocess

    return subprocess.Popen([sys.executable, "-c", _BURN, f"{seconds:.3f}"]) if seconds > 0 else None


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="2,000 episodes, 2 repeats")
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--max-request-bytes", type=int, default=MAX_REQUEST_BYTES)
    parser.add_argument("--tree", type=Path, action="append",
                        help="a checkout whose cli is timed (repeatable: each in turn, in the same rounds)")
    parser.add_argument("--compiled", action="store_true", help="compile each checkout's bytecode first")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeat = min(args.episodes, 2_000), min(args.repeat, 2)
    checkouts = [tree.resolve() for tree in args.tree or [ROOT]]
    for checkout in checkouts:
        if args.compiled:
            compile_checkout(checkout)
        CLIS.append("cli" if len(checkouts) == 1 else f"cli {checkout.name}")
    for checkout in checkouts:
        compiled = (checkout / "prime_runs_spool" / "__pycache__").is_dir()
        cached = "compiled first" if args.compiled else "compiled before" if compiled else (
            "never compiled, PYTHONDONTWRITEBYTECODE: compiled at every start"
            if os.environ.get("PYTHONDONTWRITEBYTECODE") else "cached by Python")
        print(f"bytecode of {checkout}: {cached}", flush=True)

    with scratch(args.dir, "syncbench-tp-") as work:
        run_dir = work / "run"
        spool_bytes = write_run(run_dir, "bench-throughput", args.episodes, args.size)
        print(f"spool: {args.episodes} episodes of ~{args.size} B, {human(spool_bytes)} on disk", flush=True)
        ways = {**{name: cli_way(name, checkout) for name, checkout in zip(CLIS, checkouts)},
                "library": time_sync, "bare": time_bare, "prime-evals": time_prime_evals}
        if importlib.util.find_spec("prime_evals") is None:
            print("prime-evals is not installed: its figure is left out", flush=True)
            del ways["prime-evals"]
        ways["bare+cpu"] = time_bare_with_cpu  # after the cli in each round: it burns the cli's CPU
        times: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(args.repeat):
            turns = [name for name in ways if name != "bare+cpu"]
            order = turns[i % len(turns):] + turns[:i % len(turns)] + ["bare+cpu"]
            sent: dict[str, tuple[int, int]] = {}
            for name in order:
                elapsed, rows, nbytes = ways[name](work, run_dir, f"{name}-{i}", args.max_request_bytes)
                times[name].append(elapsed)
                sent[name] = (rows, nbytes)
            if len({rows for rows, _ in sent.values()}) != 1:
                print(f"  warning: rows sent differ: {sent}")
            print("  round " + str(i + 1) + ": " + ", ".join(f"{name} {times[name][-1]:.3f} s" for name in ways)
                  + f"  ({sent['bare'][0]} rows, {human(sent['bare'][1])})", flush=True)

    mb = sent["bare"][1] / 1e6
    print()
    print("| figure | seconds, median (min-max) | MB/s (median) | / bare (median of rounds) |")
    print("| --- | ---: | ---: | ---: |")
    for name in ways:
        ratios = [t / b for t, b in zip(times[name], times["bare"])]
        print(f"| {name} | {spread(times[name])} | {mb / statistics.median(times[name]):.0f} | "
              f"{statistics.median(ratios):.2f} |")
    print("\n| CPU of the sync (user + system) | seconds, median (min-max) | minor page faults, median |")
    print("| --- | ---: | ---: |")
    for name, used in CPU.items():
        print(f"| {name} | {spread([cpu for cpu, _ in used])} | {statistics.median(f for _, f in used):,.0f} |")
    floor_ratio = statistics.median(t / b for t, b in zip(times["bare+cpu"], times["bare"]))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[1]:.1f} (5 min); "
          f"the floor on this machine now, bare+cpu / bare: {floor_ratio:.2f}")
    for name in CLIS[1:]:
        cpu = statistics.median(a[0] / b[0] for a, b in zip(CPU[name], CPU[CLIS[0]]))
        wall = statistics.median(a / b for a, b in zip(times[name], times[CLIS[0]]))
        print(f"{name} / {CLIS[0]}, median of rounds: wall {wall:.2f}, CPU {cpu:.2f}")
    cli = CLIS[-1]
    cli_ratio = statistics.median(t / b for t, b in zip(times[cli], times["bare"]))
    print(f"goals: {cli} <= {GOAL}x bare: {cli_ratio:.2f} ({'met' if cli_ratio <= GOAL else 'MISSED'})", end="")
    if "prime-evals" in times:
        evals_ratio = statistics.median(c / e for c, e in zip(times[cli], times["prime-evals"]))
        print(f"; cli faster than prime-evals: cli/prime-evals {evals_ratio:.2f} "
              f"({'met' if evals_ratio < 1 else 'MISSED'})", end="")
    print()


if __name__ == "__main__":
    main()
