"""A partial CI artifact: the eval job died while verifiers was writing its last result, so
the packed ``traces.jsonl`` ends with a torn line (or one line short) while the spool holds
that episode durably. ``prime-runs sync`` of the unpacked artifact (another folder, another
machine's empty cache, output piped) puts every episode the spool holds on the platform,
once, says what ``traces.jsonl`` lacked, and a re-run of the job from a fresh unpacking
adds nothing."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from prime_runs_spool import read_run
from support.env import REPO_ROOT, child_env
from support.sync_e2e import TOKEN, api, sample_ids, server, sync_cmd  # noqa: F401

pytestmark = pytest.mark.slow  # sync processes against the platform process

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"
#: The eval's process: every result logged (durable when log_episodes returns), then killed.
KILLED_EVAL = """
import json, os, signal, sys
from pathlib import Path
from prime_runs_spool import open_run
run_dir = Path(sys.argv[1])
rows = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]
open_run(run_dir, name="ci-partial").log_episodes(rows)
os.kill(os.getpid(), signal.SIGKILL)
"""


def died_while_writing(outputs: Path) -> list[dict]:
    """An eval's run folder as ``prime-runs eval`` leaves it when killed between its spool's
    append and verifiers' own: the spool holds every episode, ``traces.jsonl`` not the
    last, whose line is torn."""
    run_dir = outputs / "vf040-completed"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", run_dir, symlinks=True)
    traces = run_dir / "traces.jsonl"
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    killed = subprocess.run([sys.executable, "-c", KILLED_EVAL, str(run_dir)], env=child_env(), timeout=60)
    assert killed.returncode == -signal.SIGKILL
    traces.write_text("".join(json.dumps(row) + "\n" for row in rows[:-1]) + json.dumps(rows[-1])[:60])
    return rows


def ci_sync(base_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home.mkdir(exist_ok=True)
    return subprocess.run(sync_cmd(base_url, *args), capture_output=True, text=True, timeout=120,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache")),
                          stdin=subprocess.DEVNULL)


def unpack(archive: Path, where: Path) -> Path:
    where.mkdir()
    with tarfile.open(archive) as packed:
        packed.extractall(where, filter="tar")
    return where / "outputs"


def test_a_torn_traces_jsonl_in_an_artifact_loses_no_episode_of_the_spool(tmp_path: Path, server, api) -> None:
    rows = died_while_writing(tmp_path / "eval-job" / "outputs")
    archive = tmp_path / "eval-outputs.tar.gz"
    subprocess.run(["tar", "czf", str(archive), "outputs"], cwd=tmp_path / "eval-job", check=True)

    outputs = unpack(archive, tmp_path / "sync-job-1")
    first = ci_sync(server.base_url, tmp_path / "home-1", str(outputs), "-o", "json")
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(first.stdout)
    [run] = report["runs"]
    assert (run["state"], run["pushed_now"], run["pushed_total"]) == ("crashed", len(rows), len(rows)), run
    [spooled] = report["imports"]
    assert [w for w in spooled["warnings"] if "lacks 1 episode the spool accepted and holds" in w], spooled
    assert read_run(outputs / "vf040-completed").episodes_count == len(rows)
    evaluation = api.get(f"/evaluations/{run['evaluation_id']}").json()
    assert evaluation["total_samples"] == len(rows)
    assert len(set(sample_ids(api, run["evaluation_id"]))) == len(rows)

    rerun = ci_sync(server.base_url, tmp_path / "home-2", str(unpack(archive, tmp_path / "sync-job-2")))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"pushed 0 (total {len(rows)})" in rerun.stdout and "lacks 1 episode the spool accepted" in rerun.stdout
    assert api.get(f"/evaluations/{run['evaluation_id']}").json()["total_samples"] == len(rows)
