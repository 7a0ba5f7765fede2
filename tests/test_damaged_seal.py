"""A run whose seal is damaged where it lies (the segment its full size, the last line failing
its check) while verifiers' ``traces.jsonl`` beside it shows the eval completed.

``sync --skip-corrupt`` passes the damage, so the run reads ``crashed``: its evaluation is
closed out as crashed and its errored episodes held back. The completion is not taken from
verifiers' files (docs/sync.md, "A damaged seal", says why); the run's report says exactly
what to do instead, and doing it, word for word, ends the run completed: every episode on
the platform once, the held-back ones included, one finalize. Real files, the real command
line, the real local platform."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.local_platform.store import Store

from support.cli import local_sync, run_cli
from support.env import CLI, child_env
from support.eval_outputs import spooled_as_eval, vf040_outputs

pytestmark = pytest.mark.slow  # an eval process, then three syncs

EPISODES = 6
ERRORED = 2


def evaluated(outputs: Path) -> tuple[Path, str]:
    """verifiers' outputs of a completed run (``ERRORED`` of its episodes errored) and the
    spool the eval wrote beside them; the folder and the run's local id."""
    run_dir = outputs / "damaged-seal"
    vf040_outputs(run_dir, EPISODES, errored=ERRORED)
    return run_dir, spooled_as_eval(run_dir)


def damage_the_seal_in_place(segment: Path) -> int:
    """Overwrite ten bytes inside the last line (the seal), the file its size; returns where
    the line starts."""
    data = bytearray(segment.read_bytes())
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    assert b'"type":"seal"' in data[start:]
    data[start + 20:start + 30] = b"*" * 10
    segment.write_bytes(bytes(data))
    return start


def evaluation_of(db: Path, run_id: str) -> tuple[dict, list[str]]:
    store = Store(db)
    try:
        evaluations, _ = store.list_evaluations(skip=0, limit=100)
        [found] = [e for e in evaluations if run_id in json.dumps(e)]
        bodies, _ = store.list_samples(found["evaluation_id"], offset=0, limit=1000)
        return store.get_evaluation(found["evaluation_id"]), [json.loads(body)["sample_id"] for body in bodies]
    finally:
        store.close()


def test_a_damaged_seal_says_how_to_end_the_run_as_traces_jsonl_does_and_that_way_works(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    run_dir, run_id = evaluated(outputs)
    segment = run_dir / "spool" / "seg-000001.jsonl"
    offset = damage_the_seal_in_place(segment)
    db = tmp_path / "platform.db"

    crashed = local_sync(outputs, db, "--skip-corrupt")
    assert crashed.returncode == 0, crashed.stdout + crashed.stderr
    [run] = json.loads(crashed.stdout)["runs"]
    assert (run["state"], run["held_back"], run["pushed_total"]) == ("crashed", ERRORED, EPISODES - ERRORED), run
    [advice] = [w for w in run["warnings"] if "where its seal would be" in w]
    assert f"damage at byte {offset} of {segment}" in advice and "traces.jsonl" in advice
    cut = re.search(r"truncate -s (\d+) (\S+);", advice)
    assert cut is not None and int(cut.group(1)) == offset and Path(shlex.split(cut.group(2))[0]) == segment
    sync_again = re.search(r"then (prime-runs sync .+? --skip-corrupt) ", advice)
    assert sync_again is not None

    status = run_cli("status", str(outputs), "--json")  # where the user looks next: the same advice
    assert status.returncode == 0, status.stderr
    [shown] = json.loads(status.stdout)["runs"]
    assert advice in shown["warnings"], shown

    os.truncate(shlex.split(cut.group(2))[0], int(cut.group(1)))  # the advice, word for word
    given = shlex.split(sync_again.group(1))[2:]  # the sync's own destination and sink, not the default platform
    assert [Path(given[0]), given[1:]] == [run_dir, ["--local", "--db", str(db), "--to", "samples", "--skip-corrupt"]]
    ended = subprocess.run(["sh", "-c", shlex.join(CLI) + sync_again.group(1).removeprefix("prime-runs") + " --json"],
                           capture_output=True, text=True, timeout=120, env=child_env())
    assert ended.returncode == 0, ended.stdout + ended.stderr
    [run] = json.loads(ended.stdout)["runs"]
    assert (run["state"], run["held_back"], run["pushed_total"]) == ("synced", 0, EPISODES), run
    evaluation, samples = evaluation_of(db, run_id)
    assert evaluation["status"] == "COMPLETED" and evaluation["finalize_count"] == 1
    traces_ids = [json.loads(line)["id"] for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    assert sorted(samples) == sorted(traces_ids)  # every episode once, the errored ones released

    again = local_sync(outputs, db, "--skip-corrupt")
    assert again.returncode == 0 and json.loads(again.stdout)["runs"][0]["pushed_now"] == 0, again.stdout


def test_damage_that_leaves_an_intact_line_after_it_gets_no_such_advice(tmp_path: Path) -> None:
    """Damage before the seal (an episode line): the seal still ends the run; nothing to cut."""
    outputs = tmp_path / "outputs"
    run_dir, _ = evaluated(outputs)
    segment = run_dir / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    seal_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    episode_start = data.rindex(b"\n", 0, seal_start - 1) + 1
    data[episode_start + 20:episode_start + 30] = b"*" * 10
    segment.write_bytes(bytes(data))
    synced = local_sync(outputs, tmp_path / "platform.db", "--skip-corrupt")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    [run] = json.loads(synced.stdout)["runs"]
    assert run["state"] == "synced" and not [w for w in run["warnings"] if "where its seal would be" in w], run


def test_the_advice_for_a_read_only_spool_names_the_state_dir_and_works_pasted(tmp_path: Path) -> None:
    """A spool folder read-only (an artifact unpacked 0555), synced with ``--state-dir``:
    the sync the advice hands on must keep its state where this one did. Without
    ``--state-dir`` it was refused, pasted (the spool folder is read-only)."""
    outputs = tmp_path / "outputs"
    run_dir, run_id = evaluated(outputs)
    segment = run_dir / "spool" / "seg-000001.jsonl"
    damage_the_seal_in_place(segment)
    (run_dir / "spool").chmod(0o555)
    db, state_dir = tmp_path / "platform.db", tmp_path / "state dir"
    crashed = local_sync(outputs, db, "--skip-corrupt", "--state-dir", str(state_dir))
    assert crashed.returncode == 0, crashed.stdout + crashed.stderr
    [run] = json.loads(crashed.stdout)["runs"]
    assert run["state"] == "crashed", run
    [advice] = [w for w in run["warnings"] if "where its seal would be" in w]
    status = run_cli("status", str(outputs), "--json", "--state-dir", str(state_dir))
    assert advice in json.loads(status.stdout)["runs"][0]["warnings"], status.stdout
    cut = re.search(r"truncate -s (\d+) (\S+);", advice)
    sync_again = re.search(r"then (prime-runs sync .+? --skip-corrupt.*?) seals", advice)
    assert cut is not None and sync_again is not None, advice
    os.truncate(shlex.split(cut.group(2))[0], int(cut.group(1)))
    ended = subprocess.run(["sh", "-c", shlex.join(CLI) + sync_again.group(1).removeprefix("prime-runs") + " --json"],
                           capture_output=True, text=True, timeout=120, env=child_env())
    assert ended.returncode == 0, (sync_again.group(1), ended.stdout + ended.stderr)
    [run] = json.loads(ended.stdout)["runs"]
    assert (run["state"], run["held_back"], run["pushed_total"]) == ("synced", 0, EPISODES), run
    evaluation, samples = evaluation_of(db, run_id)
    assert evaluation["status"] == "COMPLETED" and evaluation["finalize_count"] == 1
    assert not list((run_dir / "spool").glob("sync/*.json")), "the state stays under --state-dir"
