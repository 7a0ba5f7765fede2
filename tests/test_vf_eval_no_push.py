"""``prime-runs eval ... --no-push`` with the real verifiers eval: the spool is still written.

vf-eval users pass ``--no-push`` by habit; it means "send nothing while the eval runs",
never "no crash safety". So the spool is written, the closing line says how to ship it,
and nothing is streamed, even under ``PRIME_RUNS_MODE=online``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from support.env import CLI, child_env  # noqa: E402
from support.vf_eval import TASKS, launch_file, run_dir, run_eval, traces  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["offline", "online"])
def test_no_push_writes_the_spool_and_streams_nothing(tmp_path: Path, mode: str) -> None:
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=1)
        # online with no platform at all: were anything streamed, a shipper would start.
        result = run_eval(tmp_path, "@", launch.name, "--no-rich", "--no-push", PRIME_RUNS_MODE=mode,
                          PRIME_API_BASE_URL="http://127.0.0.1:9")
    assert result.returncode == 0, result.stderr[-3000:]
    spool = read_run(run_dir(tmp_path))
    assert (spool.status, spool.episodes_count) == ("completed", TASKS)
    assert sorted(e["id"] for e in spool.episodes()) == sorted(row["id"] for row in traces(tmp_path))
    assert f"ship it with: prime-runs sync {Path('outputs') / 'tiny'}" in result.stderr
    assert not (run_dir(tmp_path) / "spool" / "shipper.log").exists()


def test_eval_help_says_no_push_keeps_the_spool(tmp_path: Path) -> None:
    result = subprocess.run(CLI + ["eval", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env=child_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--no-push keeps the spool" in result.stdout
