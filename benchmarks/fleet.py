"""A fleet draining one bucket: episodes per second with 1, 2 and 4 syncers.

Run: ``python3 benchmarks/fleet.py [--machines 4] [--runs 200] [--episodes 50] [--size 2000]
[--syncers 1,2,4] [--jobs 4] [--fault-rate 0.02] [--repeat 2] [--detail] [--quick] [--dir DIR]``

``--machines`` eval machines (each its own processes, HOME and output folder) write
``--runs`` runs between them with fixtures/fleet_writer.py, one machine's writer SIGKILLed
part way (its run under way is left crashed), each machine's spools mirrored into its own
prefix of one bucket by ``prime-runs mirror --once`` (moto's S3 server on loopback). Then,
for each count of syncers, a fresh copy of the bucket and a fresh ``prime-runs platform
serve`` behind the fault proxy (fixtures/fault_proxy.py, ``--fault-rate`` of the requests
failing, half of those after the platform acted), and that many ``prime-runs sync URL
--json`` processes started at once, each its own HOME: the wall time until the last one
exits is the drain. Checked every round: each run has one evaluation holding each of its
spool's episodes once, and the runs were synced once between the syncers (a run another
syncer holds is skipped, never waited for). Prints episodes/s per count of syncers and each
count's time against one syncer's (best of each, and round by round: a repeat runs its
counts back to back, in turns), and each round's CPU seconds (user + system) of the
syncers, the platform, the store (moto) and this process (the fault proxy): on a shared
machine the CPU a drain costs is steadier than its wall time. ``--detail`` adds the
platform's requests, and each syncer's store requests by verb and object (segment, state,
lease), bytes read, and how many runs' segments more than one syncer read (each syncer run
through benchmarks/_counted_sync.py).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import API_KEY, PYTHON, ROOT, arguments, child_env, now, platform, scratch, spread  # noqa: E402
from sync_store import new_bucket, start_moto  # noqa: E402

from fixtures.fault_proxy import FaultProxy  # noqa: E402
from fixtures.fault_proxy import spread as fault_spread  # noqa: E402
from prime_runs_spool.spool.format import EPISODE  # noqa: E402
from prime_runs_spool.spool.reader import iter_records  # noqa: E402
from prime_runs_spool.content.remask import copy_masking  # noqa: E402
from prime_runs_spool.store.mirror import mirror_pass  # noqa: E402
from prime_runs_spool.store.objects import ObjectStore  # noqa: E402

WRITER = ROOT / "fixtures" / "fleet_writer.py"
COUNTED = Path(__file__).resolve().parent / "_counted_sync.py"
SHOW_DETAIL = "--detail" in sys.argv


def write_fleet(work: Path, machines: int, runs: int, episodes: int, size: int) -> dict[str, int]:
    """Every machine's runs, written at once; machine 0's writer SIGKILLed half way through
    its last run. The episodes each run's spool holds, by run id."""
    per = [runs // machines + (1 if n < runs % machines else 0) for n in range(machines)]
    procs = []
    for n in range(machines):
        home = work / f"machine-{n}"
        (home / "outputs").mkdir(parents=True)
        env = {**child_env(), "HOME": str(home)}
        procs.append(subprocess.Popen([PYTHON, str(WRITER), str(home / "outputs"), f"m{n}", str(per[n]),
                                       str(episodes), "--batch", "10", "--size", str(size)],
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    victim = procs[0]
    assert victim.stdout is not None
    last = f"fleet-m0-{per[0] - 1:03d}"
    for line in victim.stdout:
        run_id, count = line.split()
        if run_id == last and int(count) >= episodes // 2:
            victim.send_signal(signal.SIGKILL)
            break
    for proc in procs:
        proc.wait()
    held = {}
    for n in range(machines):
        for run_dir in sorted((work / f"machine-{n}" / "outputs").iterdir()):
            ids = [r for r in iter_records(run_dir) if r.type == EPISODE]
            held[f"fleet-m{n}-{run_dir.name[4:]}"] = len(ids)
    return held


def fill_bucket(endpoint: str, work: Path, machines: int) -> str:
    url = new_bucket(endpoint)
    for n in range(machines):  # what each machine's prime-runs mirror puts there
        reports = mirror_pass([work / f"machine-{n}" / "outputs"], ObjectStore(f"{url}/m{n}"), masking=copy_masking)
        assert not [r.error for r in reports if r.error], reports
    return url


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str, float]:
    """Wait for a syncer: its output and its own CPU (user + system, from ``wait4``)."""
    box: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, s=s: box.__setitem__(n, s.read())) for n, s in
               (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return box["out"], box["err"], usage.ru_utime + usage.ru_stime


def drain(work: Path, url: str, syncers: int, jobs: int, rate: float, round_name: str,
          moto_pid: int) -> tuple[float, list[dict], dict[str, float]]:
    """One round: ``syncers`` syncers at once. The wall time, their reports, and the CPU
    seconds of the syncers, the platform, the store (moto) and this process (the fault proxy)."""
    # The platform commits nothing later than 0.4 s after a request arrived, so a syncer may
    # take a request lost after commit as settled 1 s on (as the tests do): the fence waits
    # of a lost answer cost a second, not the default lifetime of ten minutes.
    with platform(work / f"{round_name}.db", "--request-deadline", "0.4") as server:
        rates = fault_spread(rate) if rate else {}
        with FaultProxy(server.base_url, seed=7, rates=rates, delay=2.0, retry_after=0) as proxy:
            platform_cpu, moto_cpu, own_cpu = _cpu_seconds(server.proc.pid), _cpu_seconds(moto_pid), time.process_time()
            start = now()
            procs = []
            for m in range(syncers):
                home = work / f"{round_name}-syncer-{m}"
                env = {**child_env(), "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache")}
                counted = [str(COUNTED), str(work / f"{round_name}-counts-{m}.json")] if SHOW_DETAIL else ["-m", "commands"]
                procs.append(subprocess.Popen(
                    [PYTHON, *counted, "sync", url, "--json", "--jobs", str(jobs), "--base-url",
                     proxy.base_url, "--timeout", "5", "--request-lifetime", "1.0"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
            ended: list[float] = []
            outs = []
            syncer_cpu = 0.0
            for proc in procs:
                out, err, cpu = _finish(proc)
                outs.append((out, err))
                syncer_cpu += cpu
                ended.append(now() - start)
            elapsed = now() - start
            cpu = {"syncers": syncer_cpu, "platform": _cpu_seconds(server.proc.pid) - platform_cpu,
                   "store": _cpu_seconds(moto_pid) - moto_cpu, "proxy": time.process_time() - own_cpu}
            if SHOW_DETAIL:  # --detail: what reached the platform and the store, and how each syncer ended
                _show_detail(proxy, outs, ended, [work / f"{round_name}-counts-{m}.json" for m in range(syncers)])
        reports = []
        for proc, (out, err) in zip(procs, outs):
            if proc.returncode not in (0, 1):
                raise SystemExit(f"a syncer exited {proc.returncode}: {err[-2000:]}")
            reports += json.loads(out)["runs"]
        return elapsed, reports, cpu


def _show_detail(proxy: FaultProxy, outs: list[tuple[str, str]], ended: list[float], counts: list[Path]) -> None:
    kinds = collections.Counter(f"{d.method} {re.sub(r'[0-9a-f-]{36}', 'ID', d.path)}" for d in proxy.log)
    print("    platform:", dict(kinds.most_common(12)), flush=True)
    read_by: list[set[str]] = []
    for out, at, path in zip(outs, ended, counts):
        states = collections.Counter(r["state"] for r in json.loads(out[0])["runs"])
        found = json.loads(path.read_text())
        read_by.append(set(found["segment_runs"]))
        print(f"    ended at {at:.1f} s: {dict(states)}; store: {dict(sorted(found['counts'].items()))}", flush=True)
    if len(read_by) > 1:
        both = set.intersection(*read_by) if len(read_by) == 2 else {
            run for run in set.union(*read_by) if sum(run in s for s in read_by) > 1}
        print(f"    runs whose segments more than one syncer read: {len(both)}", flush=True)


def check(reports: list[dict], held: dict[str, int]) -> None:
    """Each run synced (or recorded crashed) by exactly one syncer, with all its episodes."""
    done = [r for r in reports if r["state"] in ("synced", "crashed")]
    by_run: dict[str, list[dict]] = {}
    for report in done:
        by_run.setdefault(report["local_run_id"], []).append(report)
    missing = sorted(set(held) - set(by_run))
    again = [run for run, found in by_run.items() if sum(r["pushed_now"] for r in found) != held[run]]
    if missing or again:
        errors = [r["error"] for r in reports if r["state"] == "error"][:3]
        raise SystemExit(f"not drained once: {len(missing)} runs not done ({missing[:3]}), "
                         f"{len(again)} pushed other than their spool ({again[:3]}); errors: {errors}")


def main() -> None:
    parser = arguments(__doc__, repeat=2, quick="40 runs of 20 episodes, syncers 1 and 2, 1 round")
    parser.set_defaults(size=2_000)
    parser.add_argument("--machines", type=int, default=4)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--syncers", default="1,2,4")
    parser.add_argument("--jobs", type=int, default=4, help="each syncer's --jobs")
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--detail", action="store_true", help="each round's platform requests and syncers' ends")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.episodes, args.syncers, args.repeat = 40, 20, "1,2", 1
    counts = [int(c) for c in args.syncers.split(",")]
    os.environ["PRIME_API_KEY"] = API_KEY
    proc, endpoint = start_moto()
    try:
        with scratch(args.dir, "bench-fleet-") as work:
            start = now()
            held = write_fleet(work, args.machines, args.runs, args.episodes, args.size)
            total = sum(held.values())
            print(f"fleet: {args.machines} machines wrote {len(held)} runs, {total:,} episodes of ~{args.size:,} bytes "
                  f"(one writer SIGKILLed) in {now() - start:.1f} s; each syncer --jobs {args.jobs}, "
                  f"faults {args.fault_rate:.0%}", flush=True)
            times: dict[int, list[float]] = {count: [] for count in counts}
            cpus: dict[int, list[dict[str, float]]] = {count: [] for count in counts}
            for n in range(args.repeat):
                for count in (counts if n % 2 == 0 else list(reversed(counts))):
                    url = fill_bucket(endpoint, work, args.machines)
                    elapsed, reports, cpu = drain(work, url, count, args.jobs, args.fault_rate, f"r{n}-m{count}",
                                                  proc.pid)
                    check(reports, held)
                    skipped = sum(1 for r in reports if r["state"] == "skipped")
                    times[count].append(elapsed)
                    cpus[count].append(cpu)
                    print(f"  {count} syncer(s): {elapsed:.2f} s, {total / elapsed:,.0f} episodes/s "
                          f"({skipped} runs skipped as another's); CPU s: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()) + f"; load {os.getloadavg()[0]:.1f}",
                          flush=True)
            one = min(times[counts[0]])
            cpu_one = min(sum(c.values()) for c in cpus[counts[0]])
            for count in counts:
                best = min(times[count])
                cpu = min(sum(c.values()) for c in cpus[count])
                print(f"  {count} syncer(s): best {best:.2f} s ({spread(times[count])} s), "
                      f"{total / best:,.0f} episodes/s, {best / one:.2f}x the time of {counts[0]}; "
                      f"CPU {cpu:.1f} s, {cpu / cpu_one:.2f}x", flush=True)
            for count in counts[1:]:  # each repeat's rounds ran back to back: compared in pairs
                walls = [t / o for t, o in zip(times[count], times[counts[0]])]
                spent = [sum(c.values()) / sum(o.values()) for c, o in zip(cpus[count], cpus[counts[0]])]
                print(f"  {count} against {counts[0]} syncer(s), round by round: time "
                      + " ".join(f"{r:.2f}x" for r in walls) + f" (median {statistics.median(walls):.2f}x), CPU "
                      + " ".join(f"{r:.2f}x" for r in spent) + f" (median {statistics.median(spent):.2f}x)",
                      flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
