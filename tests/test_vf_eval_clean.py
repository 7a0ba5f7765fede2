"""``prime-runs eval --clean`` over a run whose spool holds episodes no sync shipped.

verifiers' ``--clean`` (its own message suggests it for a run folder that already holds
results) deleted the folder, the spool with it: durable episodes, never shipped anywhere,
gone without a word. It is refused now, in one line naming the sync that ships them, before
anything is deleted; once they are shipped the clean goes ahead as verifiers does it. The
real verifiers eval, through the command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from support.cli import run_cli  # noqa: E402
from support.files import all_bytes_under  # noqa: E402
from support.vf_eval import RUN_NAME, TASKS, launch_file, run_dir, run_eval  # noqa: E402


@pytest.mark.slow  # three real vf-eval starts
def test_clean_is_refused_while_the_spool_holds_episodes_no_sync_shipped(tmp_path: Path) -> None:
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=1)
        first = run_eval(tmp_path, "@", launch.name, "--no-rich")
        assert first.returncode == 0, first.stderr[-3000:]
        before = all_bytes_under(run_dir(tmp_path))

        refused = run_eval(tmp_path, "@", launch.name, "--no-rich", "--clean")
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr
        assert refused.stderr.strip().splitlines()[-1] == (
            f"prime-runs: --clean would delete outputs/{RUN_NAME} with its spool, whose {TASKS} episodes no sync "
            f"has shipped whole anywhere (prime-runs status outputs/{RUN_NAME}); ship them first with: prime-runs sync "
            f"outputs/{RUN_NAME}, or move the folder away, then run the eval again")
        assert all_bytes_under(run_dir(tmp_path)) == before  # nothing deleted, nothing written

        synced = run_cli("sync", str(run_dir(tmp_path)), "--local", "--db", str(tmp_path / "local.db"))
        assert synced.returncode == 0, synced.stderr
        old_id = read_run(run_dir(tmp_path)).run_id
        cleaned = run_eval(tmp_path, "@", launch.name, "--no-rich", "--clean")
        assert cleaned.returncode == 0, cleaned.stderr[-3000:]
    run = read_run(run_dir(tmp_path))
    assert run.run_id != old_id and run.status == "completed" and run.episodes_count == TASKS


@pytest.mark.slow  # two real vf-eval starts
def test_clean_goes_ahead_over_a_spool_whose_segments_were_deleted(tmp_path: Path) -> None:
    """A spool whose segments a cleanup deleted (its durable mark left) holds no episode to
    keep: ``--clean`` goes ahead as verifiers does it, without a traceback (the walks name
    such a run as one that cannot be read, docs/cli.md; the guard asks the same question)."""
    with FakeChatServer() as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=1)
        first = run_eval(tmp_path, "@", launch.name, "--no-rich")
        assert first.returncode == 0, first.stderr[-3000:]
        old_id = read_run(run_dir(tmp_path)).run_id
        for segment in (run_dir(tmp_path) / "spool").glob("seg-*.jsonl"):
            segment.unlink()
        cleaned = run_eval(tmp_path, "@", launch.name, "--no-rich", "--clean")
        assert cleaned.returncode == 0 and "Traceback" not in cleaned.stderr, cleaned.stderr[-3000:]
    run = read_run(run_dir(tmp_path))
    assert run.run_id != old_id and run.status == "completed" and run.episodes_count == TASKS
