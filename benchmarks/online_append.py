"""The eval's append latency with the online shipper on, against offline mode.

Run: ``python3 benchmarks/online_append.py [--rate 50] [--count 300] [--rounds 3] [--size 2000] [--dir DIR]``

One appender calls ``log_episodes([episode])`` ``count`` times at ``rate`` per second (an
eval's pace; ``--rate 0`` appends back to back), in ``offline`` and ``online`` mode
alternately (``rounds`` of each, so disk drift hits both), each in a fresh run directory.
In online mode the shipper child ships to a real local platform process while the run is
live. Reported per mode: the mean, p50 and p99 of every append's latency over all rounds,
and the online/offline ratio of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_platform import platform  # noqa: E402
from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool import open_run  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_round(run_dir: Path, mode: str, rate: float, count: int, size: int) -> list[float]:
    run = open_run(run_dir, name="online-append", environments=["gsm8k"], model="m", mode=mode, ship_timeout=60)
    episodes = [make_episode(n, size=size, run_id=run.id, salt=str(run_dir)) for n in range(count)]
    latencies = []
    start = time.monotonic()
    for n, episode in enumerate(episodes):
        if rate:
            time.sleep(max(0.0, start + n / rate - time.monotonic()))
        began = time.perf_counter()
        run.log_episodes([episode])
        latencies.append(time.perf_counter() - began)
    run.finish()
    if mode == "online" and run.pending:
        print(f"  warning: {run.pending} episodes were not shipped by finish()", file=sys.stderr)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="appends per second (0: back to back)")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=2_000)
    parser.add_argument("--dir", type=Path, default=Path("."), help="scratch folder's parent (a real disk)")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"offline": [], "online": []}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="online-append-") as tmp:
        root = Path(tmp)
        with platform() as base_url:
            os.environ.update(PRIME_API_BASE_URL=base_url, PRIME_API_KEY="local")
            for n in range(args.rounds):
                for mode in ("offline", "online"):
                    results[mode] += one_round(root / f"{mode}-{n}", mode, args.rate, args.count, args.size)
    figures = {mode: (statistics.fmean(v), percentile(v, 0.5), percentile(v, 0.99)) for mode, v in results.items()}
    for mode, (mean, p50, p99) in figures.items():
        print(f"{mode:<8} mean {mean * 1e6:7.0f} us  p50 {p50 * 1e6:7.0f} us  p99 {p99 * 1e6:7.0f} us")
    ratios = [on / off for on, off in zip(figures["online"], figures["offline"])]
    print("online/offline: mean {:.2f}  p50 {:.2f}  p99 {:.2f}".format(*ratios))


if __name__ == "__main__":
    main()
