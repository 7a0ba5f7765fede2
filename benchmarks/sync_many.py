"""The first sync of many new runs, and the re-sync of them all with nothing to do.

Run: ``python3 benchmarks/sync_many.py [--runs 2000] [--episodes 1] [--repeat 3] [--quick] [--dir DIR]
[--tree CHECKOUT ...] [--jobs N ...]``

Trees of small sealed runs (``--episodes`` episodes of about ``--size`` bytes each, all in
one environment, as an eval sweep writes them) are written outside any timing: one of
``--runs`` runs and one of a quarter as many. Each is synced by ``prime-runs sync`` as a
fresh process (start-up included, ``--jobs`` at its default) to a local platform in its own
process with an empty database, then re-synced ``--repeat`` times with nothing to do.

What is linear shows in the per-run time: if the first sync is linear in the number of runs,
the large tree's seconds per run equal the small one's (the last line's ratio stays near 1;
a quadratic sync makes it about 4). The CPU the sync process and the platform process spent
on the first sync is printed per run too: on a shared machine it moves far less than the
wall time.

The floor: a bare loop on one ``httpx`` connection, against a platform of its own, making
the three requests a run needs at least (create with the run's metadata, one samples
request with its rows, finalize with its metrics), every body built beforehand, on the same
tree. The first sync is printed as a ratio to it, measured in the same run. Goals: the
first sync at most 1.0 x the bare loop, and the no-op re-sync of 2,000 runs under 1 s.

``--tree``: the command and the platform of another checkout (a ``git worktree`` of another
revision); given more than once, each syncs the same tree in turn after the same bare loop,
so the load, which moves the bare loop several times over on a shared machine, moves them
alike (an A/B of two revisions: compare their first syncs, then their ratios). ``--jobs``
likewise: each value's first sync in turn (the command's default when not given).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import orjson  # noqa: E402

from _synccommon import API_KEY, ROOT, arguments, cli_sync, drop_state, now, platform, scratch, spread, write_run  # noqa: E402
from prime_runs_spool.content.summary import SummaryAccumulator  # noqa: E402
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES, create_body, v0_metadata  # noqa: E402
from prime_runs_spool.spool.format import EPISODE, SEAL  # noqa: E402
from prime_runs_spool.spool.reader import iter_records  # noqa: E402
from prime_runs_spool.spool.manifests import read_manifest  # noqa: E402
from prime_runs_spool.sync.rows import RowStream, batches  # noqa: E402

#: Stamped on the bare loop's rows when they are built; replaced by the real id when sent.
PLACEHOLDER = "bare-evaluation-id-placeholder"


def bare_requests(run_dir: Path) -> tuple[bytes, bytes, bytes]:
    """One run's create, samples and finalize bodies, as sync builds them (the samples
    body carries :data:`PLACEHOLDER` for the evaluation id)."""
    manifest = read_manifest(run_dir)
    assert manifest is not None
    metadata = {**v0_metadata(manifest), "local_run_id": str(manifest["run_id"])}
    create = create_body(manifest, name=manifest["name"], environment_ids=["ENV"], tags=[], metadata=metadata)
    stream = RowStream(run_dir, None, PLACEHOLDER, MAX_REQUEST_BYTES)
    bodies = [bytes(batch.body()) for batch in batches(stream, MAX_REQUEST_BYTES) if batch.count]
    assert len(bodies) == 1, "one samples request a run"
    summary = None
    for record in iter_records(run_dir):
        if record.type == SEAL:
            summary = record.data.get("summary")
    if summary is None:
        accumulator = SummaryAccumulator()
        for record in iter_records(run_dir):
            if record.type == EPISODE:
                accumulator.add(record.data)
        summary = accumulator.result()
    return orjson.dumps(create), bodies[0], orjson.dumps({"metrics": summary})


def time_bare(work: Path, tree: Path, runs: int) -> float:
    """The bare three-request loop over every run of ``tree``, on one connection."""
    prepared = [bare_requests(run_dir) for run_dir in sorted(tree.iterdir())]
    assert len(prepared) == runs
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json",
               "Accept": "application/json"}
    with platform(work / f"bare-{runs}.db") as server, httpx.Client(timeout=120.0) as http:
        api = f"{server.base_url}/api/v1"
        env_id = http.post(f"{api}/environmentshub/resolve", json={"name": "gsm8k"},
                           headers=headers).json()["data"]["id"]
        prepared = [(create.replace(b'"ENV"', orjson.dumps(env_id)), rows, finalize)
                    for create, rows, finalize in prepared]
        placeholder = PLACEHOLDER.encode()
        start = now()
        for create, rows, finalize in prepared:
            answer = http.post(f"{api}/evaluations/", content=create, headers=headers)
            answer.raise_for_status()
            evaluation_id = answer.json()["evaluation_id"]
            http.post(f"{api}/evaluations/{evaluation_id}/samples", content=rows.replace(placeholder, evaluation_id.encode()),
                      headers=headers).raise_for_status()
            http.post(f"{api}/evaluations/{evaluation_id}/finalize", content=finalize,
                      headers=headers).raise_for_status()
        return now() - start

BARE_GOAL, NOOP_GOAL = 1.0, 1.0


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children: the syncs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds a running process has used (Linux /proc; 0 elsewhere): the platform."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_and_noop(work: Path, tree: Path, runs: int, repeat: int, checkout: Path,
                   jobs: int | None) -> tuple[float, list[float]]:
    """``checkout``'s first sync of ``tree`` (``--jobs jobs``, None: its default) against its own
    platform on an empty database, then its no-op re-syncs."""
    options = [] if jobs is None else ["--jobs", str(jobs)]
    drop_state(tree)
    label = f"{runs}-{uuid.uuid4().hex[:8]}"
    with platform(work / f"many-{label}.db", checkout=checkout) as server:
        cpu, served = children_cpu(), process_cpu(server.proc.pid)
        first, report = cli_sync(tree, server.base_url, *options, checkout=checkout)
        cpu, served = children_cpu() - cpu, process_cpu(server.proc.pid) - served
        assert len(report["runs"]) == runs and all(r["state"] == "synced" for r in report["runs"]), report
        print(f"  first sync ({checkout}, --jobs {jobs or 'default'}): {first:.1f} s ({1000 * first / runs:.1f} ms a run); CPU a run: the sync's "
              f"{1000 * cpu / runs:.1f} ms, the platform's {1000 * served / runs:.1f} ms", flush=True)
        noop = []
        for _ in range(repeat):
            elapsed, report = cli_sync(tree, server.base_url, *options, checkout=checkout)
            assert all(r["state"] == "up_to_date" and r["pushed_now"] == 0 for r in report["runs"]), report
            noop.append(elapsed)
        print(f"  no-op re-sync: {spread(noop)} s", flush=True)
    return first, noop


def measure(work: Path, runs: int, episodes: int, size: int, repeat: int,
            turns: list[tuple[Path, int | None]]) -> tuple[list[tuple[float, list[float]]], float]:
    """The bare loop, then each turn's (a checkout, its jobs) first sync and no-op re-syncs, of
    one new tree."""
    tree = work / f"tree-{runs}"
    start = now()
    for number in range(runs):
        write_run(tree / f"run-{number:05d}", f"many-{number:05d}-{uuid.uuid4().hex[:8]}", episodes, size)
    print(f"{runs} runs of {episodes} episodes written in {now() - start:.1f} s", flush=True)
    bare = time_bare(work, tree, runs)
    print(f"  bare 3-request loop: {bare:.1f} s ({1000 * bare / runs:.1f} ms a run)", flush=True)
    return [first_and_noop(work, tree, runs, repeat, checkout, jobs) for checkout, jobs in turns], bare


def main() -> None:
    parser = arguments(__doc__, repeat=3, quick="400 runs against 100, one re-sync")
    parser.set_defaults(size=2_000)
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--tree", action="append", type=Path, default=None,
                        help="a checkout whose command and platform sync (again for an A/B in turns)")
    parser.add_argument("--jobs", action="append", type=int, default=None,
                        help="the first sync's --jobs (again for each value in turn)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeat = min(args.runs, 400), 1
    turns = [(path.resolve(), jobs) for path in args.tree or [ROOT] for jobs in args.jobs or [None]]
    small_runs = max(1, args.runs // 4)
    with scratch(args.dir, "syncbench-many-") as work:
        small, small_bare = measure(work, small_runs, args.episodes, args.size, args.repeat, turns)
        large, large_bare = measure(work, args.runs, args.episodes, args.size, args.repeat, turns)
    print()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("| checkout | jobs | runs | first sync, s | ms a run | bare loop, s | sync / bare | no-op re-sync, s, median (min-max) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for place, (checkout, jobs) in enumerate(turns):
        for runs, (first, noop), bare in ((small_runs, small[place], small_bare), (args.runs, large[place], large_bare)):
            print(f"| {checkout.name} | {jobs or 'default'} | {runs} | {first:.1f} | {1000 * first / runs:.1f} | {bare:.1f} | {first / bare:.2f} "
                  f"| {spread(noop)} |")
    for place, (checkout, jobs) in enumerate(turns):
        (small_first, _), (large_first, large_noop) = small[place], large[place]
        per_run_ratio = (large_first / args.runs) / (small_first / small_runs)
        print(f"\n{checkout.name}, --jobs {jobs or 'default'}: per-run time, {args.runs} runs against {small_runs}: {per_run_ratio:.2f}x (1.0 is "
              f"linear, 4 quadratic)")
        print(f"goals at {args.runs} runs: first sync <= {BARE_GOAL:g} x bare: {large_first / large_bare:.2f} x; "
              f"no-op < {NOOP_GOAL:g} s: {statistics.median(large_noop):.2f} s")


if __name__ == "__main__":
    main()
