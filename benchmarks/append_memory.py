"""How much an append of one large episode raises the appender's peak memory, in multiples
of the episode's serialized size (docs/benchmarks.md, "Measured, no goal").

Each case runs in a fresh interpreter (``ru_maxrss`` is a high-water mark) from the tree
given, so an older commit's worktree measures its own code in the same minutes:

    python3 benchmarks/append_memory.py --tree /tmp/old --tree .
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = [(20_000_000, 4), (20_000_000, 20), (8_000_000, 1)]

_CHILD = r'''
import hashlib, resource, sys
sys.path.insert(0, sys.argv[4])
from prime_runs_spool import open_run
size, traces = int(sys.argv[1]), int(sys.argv[2])
def trace(t, per):
    text = (hashlib.sha256(b"%d" % t).hexdigest() * (per // 64 + 1))[:per]
    return {"id": f"t{t}", "task": {"type": "T", "data": {"idx": 0}},
            "agent": {"name": "solver", "trainable": t == 0, "config": {"model": "m"}},
            "nodes": [{"message": {"role": "user", "content": "q"}},
                      {"parent": 0, "message": {"role": "assistant", "content": text}}],
            "rewards": {"correct": {"score": 1.0, "weight": 1.0}}, "metrics": {}, "ok": True}
run = open_run(sys.argv[3], name="large")
run.log_episodes([{"id": "warm", "ok": True, "traces": [trace(99, 3000)]}])
episode = {"id": "large", "ok": True, "traces": [trace(t, size // traces) for t in range(traces)]}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run.log_episodes([episode])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / size)
run.finish()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="a checkout to measure (repeatable)")
    args = parser.parse_args()
    for tree in args.tree or ["."]:
        root = str(Path(tree).resolve())
        for size, traces in CASES:
            with tempfile.TemporaryDirectory() as folder:
                out = subprocess.run([sys.executable, "-c", _CHILD, str(size), str(traces), f"{folder}/run", root],
                                     capture_output=True, text=True, check=True, cwd=folder)
            print(f"{root}: {size // 1_000_000} MB in {traces} trace(s): peak rose {float(out.stdout):.2f}x")


if __name__ == "__main__":
    main()
