"""What ``prime-runs sync --follow`` costs while the runs it follows are idle, and how soon it
still sees an episode appended to one of them.

Run: ``python3 benchmarks/follow_idle.py [--runs 500] [--seconds 10] [--wakes 5] [--dir DIR]``

This process opens ``runs`` live runs (``SegmentWriter``: a manifest each, writer lock
held, then nothing) and a real ``prime-runs sync --follow`` process follows them into a real
local platform process. Once every run has been reported ``live`` and two seconds have
passed, the follower's CPU time (``utime + stime`` from ``/proc/<pid>/stat``) is read over
``seconds``: that is the idle cost, as a percentage of one core. The baseline, in the same
invocation and measured the same way, is a follower of one idle run; the same ``runs`` are
then followed by polling alone (``PRIME_RUNS_NO_INOTIFY=1``, as where inotify is missing).
Then, ``wakes`` times,
one episode is appended to a randomly chosen idle run (idle for at least a few seconds),
and the time until the platform counts it is measured (polled every 10 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_platform import child_env, platform  # noqa: E402
from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402
from prime_runs_spool.sync.watch import NO_INOTIFY_ENV  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def open_idle_runs(root: Path, count: int, tag: str) -> list[tuple[str, SegmentWriter]]:
    runs = []
    for n in range(count):
        run_id = f"idle-{tag}-{n}"
        writer = SegmentWriter.create(root / f"run-{n:04d}", run_id)
        writer.append("manifest", {"run_id": run_id, "name": "idle", "environments": ["gsm8k"], "model": "m"})
        runs.append((run_id, writer))
    return runs


def follow(base_url: str, root: Path, expect: int, poll_only: bool) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A follower of ``root``, returned once it has reported every run live, with each
    run's evaluation id (by local run id)."""
    env = child_env(PRIME_API_KEY="local", **({NO_INOTIFY_ENV: "1"} if poll_only else {}))
    proc = subprocess.Popen([sys.executable, "-m", "commands", "sync", "--follow", "--json", "--base-url", base_url,
                             str(root)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    live: dict[str, str] = {}
    while len(live) < expect:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the follower exited before reporting {expect} runs live")
        report = json.loads(line)
        if report["state"] == "live" and report["evaluation_id"]:
            live[report["local_run_id"]] = report["evaluation_id"]
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
    return proc, live


def idle_cpu(proc: subprocess.Popen[str], seconds: float) -> float:
    """The follower's CPU use over ``seconds``, in percent of one core."""
    time.sleep(2.0)  # let the passes that reported "live" settle
    before, start = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(proc.pid) - before) / (time.monotonic() - start)


def wake_latency(api: httpx.Client, runs: list[tuple[str, SegmentWriter]], evaluations: dict[str, str],
                 wakes: int) -> list[float]:
    """Seconds from a durable append to an idle run until the platform counts it."""
    delays = []
    for run_id, writer in random.Random(7).sample(runs, min(wakes, len(runs))):
        time.sleep(3.0)  # idle long enough for any backoff to have grown
        evaluation = evaluations[run_id]
        writer.append("episode", make_episode(0, size=2_000, run_id=run_id, salt=run_id),
                      {"episode_id": f"{run_id}-0", "rollout_number": 0})
        appended = time.monotonic()
        while api.get(f"/api/v1/evaluations/{evaluation}").json()["total_samples"] < 1:
            time.sleep(0.01)
        delays.append(time.monotonic() - appended)
    return delays


def measure(base_url: str, root: Path, count: int, seconds: float, wakes: int, *,
            poll_only: bool = False) -> tuple[float, list[float]]:
    runs = open_idle_runs(root, count, f"{root.name}-{os.getpid()}")
    proc, evaluations = follow(base_url, root, count, poll_only)
    try:
        cpu = idle_cpu(proc, seconds)
        with httpx.Client(base_url=base_url, timeout=30) as api:
            delays = wake_latency(api, runs, evaluations, wakes)
    finally:
        proc.terminate()
        proc.wait(30)
        for _, writer in runs:
            writer.close()
    return cpu, delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the idle CPU is measured")
    parser.add_argument("--wakes", type=int, default=5, help="appends to idle runs whose latency is measured")
    parser.add_argument("--dir", type=Path, default=Path("."), help="scratch folder's parent (a real disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="follow-idle-") as tmp, platform() as base_url:
        figures = {
            "1 run": measure(base_url, Path(tmp) / "one", 1, args.seconds, 1),
            f"{args.runs} runs": measure(base_url, Path(tmp) / "many", args.runs, args.seconds, args.wakes),
            f"{args.runs} runs, polling only ({NO_INOTIFY_ENV}=1)": measure(
                base_url, Path(tmp) / "polled", args.runs, args.seconds, args.wakes, poll_only=True),
        }
    base = max(figures["1 run"][0], 0.01)
    print(f"idle follower, % of one core over {args.seconds:g} s, and append -> counted on the platform:")
    for what, (cpu, delays) in figures.items():
        print(f"  {what}: {cpu:.2f}% (x{cpu / base:.1f} the 1-run baseline); latency max {max(delays) * 1000:.0f} ms "
              f"({', '.join(f'{d * 1000:.0f}' for d in delays)} ms)")


if __name__ == "__main__":
    main()
