"""``python -m prime_runs_spool.sync``: the library's own sync entry point (the one the
online shipper runs) syncs like ``prime-runs sync``, against the real local platform."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.env import child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, evaluations_of, server  # noqa: F401

MODULE = [sys.executable, "-m", "prime_runs_spool.sync"]


@pytest.mark.slow
def test_the_module_syncs_exactly_once_and_reports_like_the_cli(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "run", "module-sync", 7)
    cmd = MODULE + [str(tmp_path), "--base-url", server.base_url, "--json", "--request-lifetime", "1.0",
                    "--backoff-cap", "0.2", "--timeout", "5"]
    env = child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path))
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert [(r["state"], r["pushed_now"]) for r in json.loads(first.stdout)["runs"]] == [("synced", 7)]
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert json.loads(second.stdout)["runs"][0]["state"] == "up_to_date"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_the_module_rejects_bad_usage_in_one_line(tmp_path: Path) -> None:
    missing = subprocess.run(MODULE + [str(tmp_path / "nope")], capture_output=True, text=True,
                             env=child_env(PRIME_API_KEY="k", HOME=str(tmp_path)), timeout=60)
    no_key = subprocess.run(MODULE + [str(tmp_path)], capture_output=True, text=True,
                            env=child_env(HOME=str(tmp_path)), timeout=60)
    for result, what in ((missing, "no such file or directory"), (no_key, "no API key")):
        assert result.returncode == 2
        assert what in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_module_waits_for_a_copy_as_long_as_the_environment_says(tmp_path: Path, server, api) -> None:
    """``PRIME_RUNS_COPY_WAIT`` (and ``--copy-wait``) bound the wait for another sync pushing a
    copy of the run, as for ``prime-runs sync``: the module used to wait its 30 s default."""
    import shutil

    from prime_runs_spool.sync.state import sync_state_path
    from prime_runs_spool.sync.copies import CopyLock
    from prime_runs_spool.sync.state import remote_destination

    builder = build_run(tmp_path / "one" / "r", "module-copy", 3)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    destination = remote_destination(server.base_url, None)
    env = child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path), PRIME_RUNS_COPY_WAIT="0.2")
    cmd = MODULE + [str(tmp_path / "two"), "--base-url", server.base_url, "--json", "--timeout", "5"]
    with CopyLock(destination.key, "module-copy", None, sync_state_path(builder.run_dir, destination.key),
                  str(builder.run_dir)).hold(0):
        by_env = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=20)
        by_flag = subprocess.run(cmd + ["--copy-wait", "0.1"], capture_output=True, text=True,
                                 env=child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path)), timeout=20)
    for result in (by_env, by_flag):
        assert result.returncode == 0, result.stderr
        assert [r["state"] for r in json.loads(result.stdout)["runs"]] == ["skipped"]
    assert evaluations_of(api, builder.run_id) == []  # nothing was sent for the copy


@pytest.mark.slow
def test_the_modules_environment_is_checked_as_prime_runs_syncs_is(tmp_path: Path) -> None:
    """As with ``prime-runs sync`` (click): a flag given wins over a bad environment value, and
    ``--help`` still answers; a bad value the flag does not replace is a one-line usage error,
    ``PRIME_RUNS_SYNC_TO`` too (argparse checks ``choices`` against given values only, so the
    module synced to a destination named ``bogus``)."""
    env = {"PRIME_API_KEY": "k", "HOME": str(tmp_path)}
    given = subprocess.run(MODULE + [str(tmp_path / "nope"), "--copy-wait", "1"], capture_output=True, text=True,
                           env=child_env(PRIME_RUNS_COPY_WAIT="soon", **env), timeout=60)
    assert given.returncode == 2 and "no such file or directory" in given.stderr, given.stderr  # got past the env
    helped = subprocess.run(MODULE + ["--help"], capture_output=True, text=True,
                            env=child_env(PRIME_RUNS_COPY_WAIT="soon", **env), timeout=60)
    assert helped.returncode == 0 and "--copy-wait" in helped.stdout, helped.stderr
    for name, value in (("PRIME_RUNS_COPY_WAIT", "soon"), ("PRIME_RUNS_BACKOFF_CAP", "nan"),
                        ("PRIME_RUNS_SYNC_TO", "bogus")):
        bad = subprocess.run(MODULE + [str(tmp_path)], capture_output=True, text=True,
                             env=child_env(**{name: value}, **env), timeout=60)
        assert bad.returncode == 2 and bad.stdout == "", (name, bad.stdout)
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and "Traceback" not in bad.stderr, (name, bad.stderr)
