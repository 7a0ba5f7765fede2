"""The options that say where a sync's episodes go are never passed over in silence:
``--db`` without ``--local`` pushed every run to the remote platform (the key's, from the
environment) while the user named a local database; ``--local`` with ``--base-url`` kept them
on this machine while the user named a platform. Each is bad usage now (exit 2, one line),
refused before anything is written or sent."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from support import platform_process
from support.cli import last_line, run_cli
from support.runs import build_run
from support.sync_e2e import TOKEN
from prime_runs_spool.spool.layout import spool_dir


@pytest.mark.slow
def test_db_without_local_and_base_url_with_local_are_refused_before_anything_moves(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "r", "destination-options", 2)
    with platform_process.running(tmp_path / "remote.db", "--token", TOKEN) as remote, \
            httpx.Client(base_url=remote.api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        cases = [
            (["--db", str(tmp_path / "local.db"), "--base-url", remote.base_url],
             "prime-runs: --db goes with --local (without it, sync pushes to the platform at the base URL, not "
             "into a database)"),
            (["--local", "--db", str(tmp_path / "local.db"), "--base-url", remote.base_url],
             "prime-runs: --base-url does not combine with --local (the local platform runs embedded; for one "
             "served with prime-runs platform serve, give its URL without --local)"),
        ]
        for args, said in cases:
            result = run_cli("sync", str(tmp_path / "runs"), *args, PRIME_API_KEY=TOKEN)
            assert result.returncode == 2, (args, result.stdout, result.stderr)
            assert result.stderr.count("\n") == 1 and last_line(result) == said, result.stderr
            assert not result.stdout
        assert api.get("/evaluations/").json()["total"] == 0, "nothing reached the remote platform"
    assert not (tmp_path / "local.db").exists()
    assert not (spool_dir(builder.run_dir) / "sync").exists(), "no state written"
