"""What an append holds in memory: a bounded multiple of the episode, whatever its size.

An append serializes the episode once (the line it writes), and an episode large enough to
reach the platform's request limit has its rows measured before it is numbered
(platform_api/v0.py ``check_sendable``). Each is measured in a fresh interpreter by the
rise of its peak resident set (``ru_maxrss``) over the appender's own memory, the episode
built: a size, never a time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.env import child_env

#: The most an append may hold beyond the episode itself, in multiples of its serialized
#: size: the line (1x) and the largest part of a row measured at once, with the allocator's
#: slack. It was 4.3x (four traces) and 10x (one trace) when each row was encoded whole,
#: with upstream's measure made as one text and its bytes.
MAX_PEAK_OVER_EPISODE = 2.0

_APPEND = textwrap.dedent('''
    import hashlib, resource, sys
    from prime_runs_spool import open_run

    size, traces = int(sys.argv[1]), int(sys.argv[2])

    def trace(t, per):
        text = (hashlib.sha256(b"%d" % t).hexdigest() * (per // 64 + 1))[:per]  # its own, not shared
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
''')


@pytest.mark.slow
@pytest.mark.parametrize(("size", "traces"), [(20_000_000, 4), (20_000_000, 20), (8_000_000, 1)])
def test_a_large_episode_is_appended_in_a_bounded_multiple_of_its_size(tmp_path: Path, size: int,
                                                                       traces: int) -> None:
    """A 20 MB episode of four (or twenty) traces raised the appender's peak by 4.3x its size,
    an 8 MB one of one trace by 10x (80 MB): its rows were each encoded whole to be measured, the
    episode's own three times over (its message, its branch, its wrapper), and upstream's
    measure held its text in pieces, joined and encoded at once."""
    result = subprocess.run([sys.executable, "-c", _APPEND, str(size), str(traces), str(tmp_path / "run")],
                            capture_output=True, text=True, env=child_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    peak = float(result.stdout.split()[0])
    assert peak <= MAX_PEAK_OVER_EPISODE, f"the append's peak rose {peak:.2f}x the episode's {size} bytes"
