"""Start-up of the command line: what a person waits for before anything happens.

Run: ``python3 benchmarks/startup.py [--repeat N]``

Each figure is the wall time of a whole process, interpreter start included, median (and
range) over N runs taken in turns, so drift on a shared machine hits them all alike:

* floor: importing click, httpx and orjson, the least a click command that talks to the
  platform costs;
* ``prime-runs --help``;
* a no-op ``prime-runs sync`` of one run that was already synced (nothing to send), against
  a local platform running in its own process, as a re-sync in CI meets it.

Goal: both commands under 0.25 s. Beside the wall time, each against the floor,
and the CPU time of the process (user + system), which a busy machine moves far less.

Whether Python may cache bytecode changes the figures: with ``PYTHONDONTWRITEBYTECODE`` set
(as on the shared development machines) and this checkout never compiled, every module of the
package is compiled from source at every start, about 0.09 s of CPU for a no-op sync
(docs/benchmarks.md, "Start-up"). The script says which case it measured.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synccommon import API_KEY, PYTHON, ROOT, arguments, child_env, platform, scratch, spread, write_run  # noqa: E402


FLOOR = "floor (import click, httpx, orjson)"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and any child it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return elapsed, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    args = arguments(__doc__, repeat=9, quick="3 runs of each").parse_args()
    repeat = 3 if args.quick else args.repeat
    with scratch(args.dir, "startup-bench-") as root:
        write_run(root / "runs" / "run-000", "startup-bench-run", 20, 2_000)
        with platform(root / "platform.db") as server:
            env = child_env()
            env.update(PRIME_API_KEY=API_KEY, PRIME_API_BASE_URL=server.base_url)
            sync = [PYTHON, "-m", "commands", "sync", str(root / "runs")]
            timed(sync, env)  # the first sync pushes; every timed one after it has nothing to do
            commands = {
                FLOOR: [PYTHON, "-c", "import click, httpx, orjson"],
                "prime-runs --help": [PYTHON, "-m", "commands", "--help"],
                "no-op prime-runs sync (1 run)": sync,
            }
            times: dict[str, list[float]] = {name: [] for name in commands}
            cpu: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(repeat):
                for name, argv in commands.items():
                    wall, used = timed(argv, env)
                    times[name].append(wall)
                    cpu[name].append(used)
    floor, floor_cpu = statistics.median(times[FLOOR]), statistics.median(cpu[FLOOR])
    cached = "off (PYTHONDONTWRITEBYTECODE)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    print(f"seconds, median (range) of {repeat} runs; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"bytecode caching {cached}")
    print(f"{'':<36} {'wall':<24} {'':>11} {'CPU (user + system)':<24}")
    for name, values in times.items():
        print(f"{name:<36} {spread(values):<24} {statistics.median(values) / floor:>5.2f}x floor {spread(cpu[name]):<24}"
              f" {statistics.median(cpu[name]) / floor_cpu:>5.2f}x floor")


if __name__ == "__main__":
    main()
