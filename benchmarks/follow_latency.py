"""Latency from a durable append to the sample being visible on the platform, while
``prime-runs sync --follow`` tails the spool.

Run: ``python3 benchmarks/follow_latency.py [--rate 20] [--seconds 5] [--size 2000] [--dir DIR]``

A writer (``open_run``, offline, in this process) logs ``rate`` episodes per second for
``seconds``; a real ``prime-runs sync --follow`` process ships them to a real local platform
process; a poller reads the evaluation's ``total_samples`` every 10 ms. Episode *i*'s delay
is from ``log_episodes`` returning (durable) to the first poll that counts it, so each figure
carries up to 10 ms of polling error. Reported: p50, p99, max.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_platform import child_env, find_evaluation, platform  # noqa: E402
from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool import open_run  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(base_url: str, root: Path, rate: float, seconds: float, size: int) -> list[float]:
    run = open_run(root / "run", name="latency", environments=["gsm8k"], model="m", mode="offline")
    follower = subprocess.Popen(
        [sys.executable, "-m", "commands", "sync", "--follow", "--exit-when-idle", "--base-url", base_url, str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(PRIME_API_KEY="local"))
    appended: list[float] = []
    visible: dict[int, float] = {}
    done = threading.Event()
    with httpx.Client(base_url=base_url, timeout=30) as api:
        evaluation = None
        while evaluation is None:  # created as soon as the manifest is durable
            evaluation = find_evaluation(api, run.id, "gsm8k")
            time.sleep(0.01)

        def poll() -> None:
            seen = 0
            while not done.is_set() or seen < len(appended):
                total = api.get(f"/api/v1/evaluations/{evaluation}").json()["total_samples"]
                now = time.monotonic()
                for index in range(seen, total):
                    visible[index] = now
                seen = max(seen, total)
                time.sleep(0.01)

        poller = threading.Thread(target=poll)
        poller.start()
        count = int(rate * seconds)
        start = time.monotonic()
        for n in range(count):
            time.sleep(max(0.0, start + n / rate - time.monotonic()))
            run.log_episodes([make_episode(n, size=size, run_id=run.id, salt="latency")])
            appended.append(time.monotonic())
        done.set()
        poller.join(60)
    run.finish()
    follower.wait(60)
    return [visible[i] - appended[i] for i in range(len(appended))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="episodes appended per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=2_000, help="bytes per episode")
    parser.add_argument("--dir", type=Path, default=Path("."), help="scratch folder's parent (a real disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="follow-latency-") as tmp:
        root = Path(tmp)
        with platform() as base_url:
            delays = measure(base_url, root / "outputs", args.rate, args.seconds, args.size)
    ms = [d * 1000 for d in delays]
    print(f"{len(ms)} episodes at {args.rate:g}/s, {args.size} B: append -> visible on the platform: "
          f"p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, max {max(ms):.0f} ms, "
          f"mean {statistics.fmean(ms):.0f} ms")


if __name__ == "__main__":
    main()
