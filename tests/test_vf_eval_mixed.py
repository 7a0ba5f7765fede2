"""A run folder written in turns by ``prime-runs eval`` and plain ``vf-eval``, with the real
verifiers eval against the fake model server and the local platform.

Plain vf-eval knows nothing of the spool: ``vf-eval @ <run>/configs/resolved/eval.json
--resume`` (what verifiers tells the user after a Ctrl-C) appends to ``traces.jsonl`` only.
The episodes it wrote are spooled before sync reads the run, status and verify name the
difference until then, and the platform ends with every episode of ``traces.jsonl`` once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import FakeChatServer  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from prime_runs_spool.local_platform.store import Store  # noqa: E402
from support.env import CLI, child_env  # noqa: E402
from support.vf_eval import (  # noqa: E402
    TASKS, interrupt_eval, launch_file, resolved_config, run_dir, run_eval, run_plain, traces,
)

ROLLOUTS = 2
SLOW = "Capital of France?"  # task 2: held by the fake server until released


def spool_episodes(path: Path) -> int:
    try:
        return read_run(path).episodes_count
    except Exception:  # not there yet
        return 0


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env=child_env(HOME=str(tmp_path)))


def platform_episodes(db: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every sample on the local platform: (evaluation id, row), all evaluations."""
    store = Store(db)
    try:
        evaluations, _ = store.list_evaluations(skip=0, limit=100)
        rows = []
        for evaluation in evaluations:
            bodies, _ = store.list_samples(evaluation["evaluation_id"], offset=0, limit=10_000)
            rows += [(evaluation["evaluation_id"], json.loads(body)) for body in bodies]
        return rows
    finally:
        store.close()


def evaluation(db: Path) -> dict[str, Any]:
    store = Store(db)
    try:
        evaluations, total = store.list_evaluations(skip=0, limit=100)
        assert total == 1, evaluations
        return store.get_evaluation(evaluations[0]["evaluation_id"])
    finally:
        store.close()


@pytest.mark.slow
def test_a_run_resumed_by_plain_vf_eval_reaches_the_platform_whole(tmp_path: Path) -> None:
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        interrupted = interrupt_eval(tmp_path, "@", launch.name, "--no-rich",
                                     when=lambda: spool_episodes(run_dir(tmp_path)) >= 2 * ROLLOUTS)
        assert interrupted.returncode == 130, interrupted.stderr[-3000:]
        server.release()
        resumed = run_plain(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    assert spool_episodes(run_dir(tmp_path)) == 2 * ROLLOUTS  # plain vf-eval wrote no spool

    status = cli(tmp_path, "status", "outputs")
    assert status.returncode == 0, status.stderr
    assert f"traces.jsonl holds {ROLLOUTS} episodes the spool lacks" in status.stdout, status.stdout
    verify = cli(tmp_path, "verify", "--json", "outputs")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    [checked] = json.loads(verify.stdout)["runs"]
    assert checked["traces_disagree"]["only_in_traces"] == ROLLOUTS

    db = tmp_path / "platform.db"
    synced = cli(tmp_path, "sync", "--local", "--db", str(db), "outputs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    rows = platform_episodes(db)
    assert sorted(row["sample_id"] for _, row in rows) == sorted(row["id"] for row in final)
    found = evaluation(db)
    assert found["status"] == "COMPLETED" and found["finalize_count"] == 1

    spool = read_run(run_dir(tmp_path))
    assert (spool.status, len(spool.segments), spool.episodes_count) == ("completed", 2, TASKS * ROLLOUTS)
    again = cli(tmp_path, "sync", "--local", "--db", str(db), "outputs")
    assert again.returncode == 0 and len(platform_episodes(db)) == TASKS * ROLLOUTS
    after = cli(tmp_path, "status", "outputs")
    assert "lacks" not in after.stdout, after.stdout


@pytest.mark.slow
def test_plain_then_prime_runs_eval_then_plain_again_with_a_sync_between(tmp_path: Path) -> None:
    """Plain vf-eval (pushing off) Ctrl-C'd, synced (imported: a spool of its own), resumed by
    ``prime-runs eval --resume`` and Ctrl-C'd again, synced, then finished by plain vf-eval
    and synced: one evaluation, each episode of traces.jsonl once, finalized once."""
    from support.vf_eval import interrupt_plain

    db = tmp_path / "platform.db"
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        first = interrupt_plain(tmp_path, "@", launch.name, "--no-rich",
                                when=lambda: len(_rows(tmp_path)) >= ROLLOUTS)
        assert first.returncode == 130, first.stderr[-3000:]
        assert cli(tmp_path, "sync", "--local", "--db", str(db), "outputs").returncode == 0
        # The first Ctrl-C can land after task 3 finished too (a loaded machine), so the rows
        # alone may be there before the resumed eval has started: it is interrupted once it
        # has asked the model something, not during its interpreter's start.
        asked_before = server.requests
        second = interrupt_eval(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich",
                                when=lambda: server.requests > asked_before
                                and len(_rows(tmp_path)) >= 2 * ROLLOUTS)
        assert second.returncode == 130, second.stderr[-3000:]
        assert cli(tmp_path, "sync", "--local", "--db", str(db), "outputs").returncode == 0
        server.release()
        third = run_plain(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich")
        assert third.returncode == 0, third.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    synced = cli(tmp_path, "sync", "--local", "--db", str(db), "outputs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    rows = platform_episodes(db)
    assert sorted(row["sample_id"] for _, row in rows) == sorted(row["id"] for row in final)
    found = evaluation(db)
    assert found["status"] == "COMPLETED" and found["finalize_count"] == 1


def _rows(tmp_path: Path) -> list[dict[str, Any]]:
    try:
        return traces(tmp_path)
    except (FileNotFoundError, json.JSONDecodeError):  # not there yet, or a line being written
        return []


@pytest.mark.slow
def test_outputs_imported_under_a_state_dir_then_resumed_by_prime_runs_eval_are_one_evaluation(
        tmp_path: Path) -> None:
    """Plain vf-eval (pushing off) Ctrl-C'd and synced with ``--state-dir`` (its spool kept
    there, none in the folder), then ``prime-runs eval --resume``, which writes a spool in
    the folder. Both spools are one run (the id of the outputs' episodes), synced into one
    evaluation: the 4 kept episodes reached the platform twice, in two evaluations, when
    the resumed spool took an id of its own. One rollout at a time, so the resumed spool
    logs the kept episodes in the order traces.jsonl held them."""
    from support.vf_eval import interrupt_plain

    db, state = tmp_path / "platform.db", tmp_path / "state"
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        launch.write_text(launch.read_text().replace("max_concurrent = 8", "max_concurrent = 1"))
        first = interrupt_plain(tmp_path, "@", launch.name, "--no-rich",
                                when=lambda: len(_rows(tmp_path)) >= 2 * ROLLOUTS)
        assert first.returncode == 130, first.stderr[-3000:]
        imported = cli(tmp_path, "sync", "--local", "--db", str(db), "--state-dir", str(state), "outputs")
        assert imported.returncode == 0, imported.stdout + imported.stderr
        server.release()
        resumed = run_eval(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS
    synced = cli(tmp_path, "sync", "--local", "--db", str(db), "--state-dir", str(state), "outputs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    rows = platform_episodes(db)
    assert sorted(row["sample_id"] for _, row in rows) == sorted(row["id"] for row in final), synced.stdout
    assert read_run(run_dir(tmp_path)).run_id == final[0]["run"]["id"]
    found = evaluation(db)
    assert found["status"] == "COMPLETED" and found["finalize_count"] == 1


def _task_of(row: dict[str, Any]) -> int:
    return int(row["task"]["data"]["idx"])


@pytest.mark.slow
def test_outputs_finished_interleaved_imported_then_resumed_by_prime_runs_eval_reach_the_platform_once(
        tmp_path: Path) -> None:
    """As above, with the kept episodes of different tasks finished interleaved (the default
    with concurrency): verifiers' resume rewrites traces.jsonl grouped by task, so the resumed
    spool logs them in another order than the import read them. The evaluation holds every
    episode of the final traces.jsonl once (their ids, and their count), exit 0.

    Which rollout finishes first is the machine's to decide, so the interleaving is made
    deterministic: the real vf-eval's output, Ctrl-C'd with two fast tasks A < B done, is put
    in the order ``A, B, B, A`` (each task's own rollouts kept in their order, as a concurrent
    run can finish them) before it is imported; the real ``prime-runs eval --resume`` then
    rewrites it grouped, ``A, A, B, B``, whose last row is not the platform's."""
    from support.vf_eval import interrupt_plain

    db, state = tmp_path / "platform.db", tmp_path / "state"
    with FakeChatServer(delay=120, slow_prompts=(SLOW,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        first = interrupt_plain(tmp_path, "@", launch.name, "--no-rich",
                                when=lambda: len(_rows(tmp_path)) >= 2 * ROLLOUTS)
        assert first.returncode == 130, first.stderr[-3000:]
        lines = (run_dir(tmp_path) / "traces.jsonl").read_bytes().splitlines(keepends=True)
        by_task: dict[int, list[bytes]] = {}
        for line in lines:
            by_task.setdefault(_task_of(json.loads(line)), []).append(line)
        done = sorted(by_task)  # the two fast tasks
        assert len(done) == 2 and all(len(kept) == ROLLOUTS for kept in by_task.values()), by_task
        interleaved = [by_task[done[0]][0], by_task[done[1]][0], by_task[done[1]][1], by_task[done[0]][1]]
        (run_dir(tmp_path) / "traces.jsonl").write_bytes(b"".join(interleaved))
        imported = cli(tmp_path, "sync", "--local", "--db", str(db), "--state-dir", str(state), "outputs")
        assert imported.returncode == 0, imported.stdout + imported.stderr
        assert [row["sample_id"] for _, row in platform_episodes(db)] == [
            json.loads(line)["id"] for line in interleaved]
        server.release()
        resumed = run_eval(tmp_path, "@", resolved_config(tmp_path), "--resume", "--no-rich")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = traces(tmp_path)
    [slow] = set(range(TASKS)) - set(done)
    assert [_task_of(row) for row in final] == [done[0]] * 2 + [done[1]] * 2 + [slow] * 2  # grouped by the resume
    synced = cli(tmp_path, "sync", "--local", "--db", str(db), "--state-dir", str(state), "outputs")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    rows = platform_episodes(db)
    assert len(rows) == len(final) == TASKS * ROLLOUTS
    assert sorted(row["sample_id"] for _, row in rows) == sorted(row["id"] for row in final), synced.stdout
    found = evaluation(db)
    assert found["status"] == "COMPLETED" and found["finalize_count"] == 1 and found["total_samples"] == len(final)
    again = cli(tmp_path, "sync", "--local", "--db", str(db), "--state-dir", str(state), "outputs")
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(platform_episodes(db)) == len(final)
