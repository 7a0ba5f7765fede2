"""``prime-runs eval`` end to end: the released verifiers eval (vf-eval) writing a spool.

The real verifiers (the ``test`` extra pins it), its ``subprocess`` runtime and ``null``
harness (run by ``uv``), the tiny taskset in fixtures/, and a fake OpenAI-compatible chat
server on loopback. One clean run is shared by the module's checks (a run takes seconds,
not milliseconds: the harness starts a Python program per rollout).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1.cli.eval.runner")

from fixtures.fake_chat_server import ANSWER, FakeChatServer  # noqa: E402
from prime_runs_spool import read_run  # noqa: E402
from prime_runs_spool.local_platform.store import Store  # noqa: E402
from support.env import CLI, child_env  # noqa: E402
from support.files import all_bytes_under  # noqa: E402
from support.vf_eval import (  # noqa: E402
    HEADER_SECRET, KEY_VALUE, TASKS, eval_cmd, eval_env, interrupt_eval, launch_file, resolved_config, run_dir, run_eval, traces,
    wire_episodes,
)

pytestmark = pytest.mark.slow  # one real vf-eval run for the module, then more

ROLLOUTS = 2


@pytest.fixture(scope="module")
def chat_server():
    with FakeChatServer() as server:
        yield server


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory, chat_server: FakeChatServer) -> dict[str, Any]:
    """One clean ``prime-runs eval @ eval.toml --no-rich`` run, then ``sync --local``."""
    tmp_path = tmp_path_factory.mktemp("vf-eval")
    launch = launch_file(tmp_path, chat_server.base_url, rollouts=ROLLOUTS)
    umask = os.umask(0o022)  # the common default, which lets 0644 through: only modes of our own keep files private
    try:
        result = run_eval(tmp_path, "@", launch.name, "--no-rich")
    finally:
        os.umask(umask)
    assert result.returncode == 0, result.stderr[-4000:]
    db = tmp_path / "platform.db"
    synced = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "--json", "outputs"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=child_env(HOME=str(tmp_path)))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    return {"tmp": tmp_path, "eval": result, "db": db, "sync": json.loads(synced.stdout)}


def spool_episodes(path: Path) -> list[dict[str, Any]]:
    return list(read_run(path).episodes())


def local_samples(db: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    store = Store(db)
    try:
        evaluations, total = store.list_evaluations(skip=0, limit=10)
        assert total == 1, evaluations
        evaluation = evaluations[0]
        bodies, _ = store.list_samples(evaluation["evaluation_id"], offset=0, limit=1000)
        return store.get_evaluation(evaluation["evaluation_id"]), [json.loads(body) for body in bodies]
    finally:
        store.close()


def test_every_episode_is_in_the_spool_numbered_per_task_and_verify_is_clean(clean_run: dict[str, Any]) -> None:
    tmp_path = clean_run["tmp"]
    results = traces(tmp_path)
    assert len(results) == TASKS * ROLLOUTS
    assert all(row["ok"] for row in results), [row.get("errors") for row in results]
    spool = read_run(run_dir(tmp_path))
    assert spool.status == "completed"
    records = list(spool.records())
    episodes = [r for r in records if r.type == "episode"]
    assert sorted(r.data["id"] for r in episodes) == sorted(row["id"] for row in results)
    numbers: dict[Any, list[int]] = defaultdict(list)
    for record in episodes:
        numbers[record.data["traces"][0]["task"]["data"]["idx"]].append(record.meta["rollout_number"])
    assert {idx: sorted(n) for idx, n in numbers.items()} == {idx: list(range(1, ROLLOUTS + 1)) for idx in range(TASKS)}
    # the run id verifiers stamped on each episode is the spool's
    assert {row["run"]["id"] for row in results} == {spool.run_id}
    verified = subprocess.run(CLI + ["verify", str(run_dir(tmp_path))], capture_output=True, text=True,
                              env=child_env(), timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # offline: one closing line saying how to sync
    assert f"prime-runs sync {Path('outputs') / 'tiny'}" in clean_run["eval"].stderr


def test_the_launch_files_header_secret_never_reaches_our_files(clean_run: dict[str, Any],
                                                               chat_server: FakeChatServer) -> None:
    tmp_path = clean_run["tmp"]
    # the eval really sent it (so its absence below means something)
    assert any(h.get("CF-Access-Client-Secret") == HEADER_SECRET for h in chat_server.headers_seen)
    ours = all_bytes_under(run_dir(tmp_path) / "spool") + clean_run["db"].read_bytes()
    for extra in clean_run["db"].parent.glob("platform.db*"):
        ours += extra.read_bytes()
    for secret in (HEADER_SECRET, KEY_VALUE):
        assert secret.encode() not in ours


def test_the_launch_files_header_secret_never_reaches_the_terminal(clean_run: dict[str, Any]) -> None:
    """verifiers runs in our process and, with --no-rich, prints every trace as JSON at the
    end: the seat's client headers, the launch file's secret in clear, on the terminal (and in
    any CI log keeping it). Its output now goes through the masking plan the spool is written
    with: the header is printed, its value masked."""
    shown = clean_run["eval"].stdout + clean_run["eval"].stderr
    assert '"CF-Access-Client-Secret": "***"' in shown  # the trace (and its header) was printed
    for secret in (HEADER_SECRET, KEY_VALUE):
        assert secret not in shown


def test_the_dashboard_still_draws_on_a_terminal_through_the_masked_streams(tmp_path: Path,
                                                                          chat_server: FakeChatServer) -> None:
    """The masked streams hand verifiers' dashboard the real terminal's ``isatty`` and
    ``fileno``: under a pseudo-terminal it draws (its escape sequences), exit 0."""
    import pty

    launch = launch_file(tmp_path, chat_server.base_url, rollouts=1)
    leader, follower = pty.openpty()
    child = subprocess.Popen(eval_cmd("@", launch.name), cwd=tmp_path, stdin=follower, stdout=follower,
                             stderr=follower, env=eval_env())
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert child.wait(timeout=180) == 0, shown[-2000:]
    assert shown.count(b"\x1b[") > 100  # the dashboard drew
    assert HEADER_SECRET.encode() not in shown and b"spool written to" in shown


def test_the_files_verifiers_writes_with_the_launch_files_secret_are_private(clean_run: dict[str, Any]) -> None:
    """verifiers writes the launch file, the resolved config and traces.jsonl with the
    umask's mode: the header secret the spool masks was readable by every user (0644)."""
    folder = run_dir(clean_run["tmp"])
    holding = [path for path in folder.rglob("*") if path.is_file() and not path.is_symlink()
               and HEADER_SECRET.encode() in path.read_bytes()]
    assert {path.relative_to(folder).as_posix() for path in holding} >= {
        "configs/eval.toml", "configs/resolved/eval.json", "traces.jsonl"}
    assert [(str(path), oct(path.stat().st_mode & 0o777)) for path in holding
            if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO)] == []


def test_rows_equal_the_sdks_build_samples_of_the_same_episodes(clean_run: dict[str, Any]) -> None:
    from prime_runs.projection import build_samples

    evaluation, rows = local_samples(clean_run["db"])
    records = spool_episodes(run_dir(clean_run["tmp"]))
    for record in records:  # upstream's runner stamps the platform's evaluation id on each episode
        record["run"]["id"] = evaluation["evaluation_id"]
    episodes = wire_episodes(records)
    expected = json.loads(json.dumps(build_samples(episodes)))
    assert len(rows) == len(expected) == TASKS * ROLLOUTS
    assert rows == expected


def test_the_fake_server_answers_streaming_and_not(chat_server: FakeChatServer) -> None:
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    plain = httpx.post(chat_server.base_url + "/chat/completions", json=body, timeout=10).json()
    assert plain["choices"][0]["message"]["content"] == ANSWER
    with httpx.stream("POST", chat_server.base_url + "/chat/completions", timeout=10,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == ANSWER
    assert chunks[-1]["usage"]["total_tokens"] == 8


def test_online_mode_streams_the_run_into_the_platform(tmp_path: Path, chat_server: FakeChatServer) -> None:
    """PRIME_RUNS_MODE=online: the shipper follows the spool into the (local) platform."""
    from support import platform_process

    token = "vf-eval-online-token"
    launch = launch_file(tmp_path, chat_server.base_url, rollouts=1)
    with platform_process.running(tmp_path / "online.db", "--token", token) as platform:
        result = run_eval(tmp_path, "@", launch.name, "--no-rich", PRIME_RUNS_MODE="online",
                          PRIME_API_KEY=token, PRIME_API_BASE_URL=platform.base_url)
        assert result.returncode == 0, result.stderr[-4000:]
        assert "ship it with" not in result.stderr  # nothing left to sync by hand
    evaluation, rows = local_samples(tmp_path / "online.db")
    spool = read_run(run_dir(tmp_path))
    assert sorted(row["sample_id"] for row in rows) == sorted(e["id"] for e in spool.episodes())
    assert len(rows) == TASKS and evaluation["finalize_count"] == 1
    assert token.encode() not in all_bytes_under(run_dir(tmp_path) / "spool")


def test_the_runs_summary_equals_the_sdks_from_episodes(clean_run: dict[str, Any]) -> None:
    """The seal's summary and the evaluation's metrics are what verifiers' SDK computes."""
    from prime_runs.metrics import from_episodes

    tmp_path = clean_run["tmp"]
    expected = from_episodes(wire_episodes(traces(tmp_path)))
    assert expected["avg_metrics"]  # the reward and the metric: not {}
    seal = [r for r in read_run(run_dir(tmp_path)).records() if r.type == "seal"][-1]
    assert_summary(seal.data["summary"], expected)
    evaluation, _ = local_samples(clean_run["db"])
    assert_summary(evaluation["metrics"], expected)


def assert_summary(found: dict[str, Any], expected: dict[str, Any]) -> None:
    assert found["avg_reward"] == pytest.approx(expected["avg_reward"])
    assert found["avg_error"] == pytest.approx(expected["avg_error"])
    assert found["avg_metrics"] == pytest.approx(expected["avg_metrics"])


def episodes_in_spool(path: Path) -> int:
    try:
        return read_run(path).episodes_count
    except Exception:  # not there yet
        return 0


def slots_of(rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return sorted((row["example_id"], row["rollout_number"]) for row in rows)


def test_sigint_then_a_resume_that_retries_errored_rollouts_ends_equal_to_verifiers_results(
    tmp_path: Path,
) -> None:
    """Task 1's rollouts error and task 2's hang; SIGINT once tasks 0 and 1 are in the spool
    seals it cancelled. --resume continues the same spool: verifiers re-runs task 2 and the
    errored task 1 (rewriting traces.jsonl without the errored attempts), and sync --local
    leaves one evaluation with each (example, rollout) slot once, the latest attempt, equal
    to verifiers' final traces.jsonl, its metrics the SDK's over them."""
    from prime_runs.metrics import from_episodes

    slow = "Capital of France?"  # task 2
    with FakeChatServer(delay=120, slow_prompts=(slow,)) as server:
        launch = launch_file(tmp_path, server.base_url, rollouts=ROLLOUTS)
        interrupted = interrupt_eval(tmp_path, "@", launch.name, "--no-rich", TINY_TASKSET_FAIL="1",
                                     when=lambda: episodes_in_spool(run_dir(tmp_path)) >= 2 * ROLLOUTS)
        assert interrupted.returncode == 130, interrupted.stderr[-3000:]
        resume_lines = [line for line in interrupted.stderr.splitlines() if line.startswith("interrupted; ")]
        assert resume_lines == [f"interrupted; resume with: prime-runs eval @ {resolved_config(tmp_path)} --resume"]
        resume_args = shlex.split(resume_lines[0].split("resume with: ", 1)[1])[2:]  # after "prime-runs eval"
        spool = read_run(run_dir(tmp_path))
        assert spool.status == "cancelled"
        assert [r for r in spool.records() if r.type == "seal"][-1].data["error"] == "interrupted"
        errored = {e["id"] for e in spool.episodes() if not e["ok"]}
        assert len(errored) == ROLLOUTS  # task 1, both rollouts
        first_run_id = spool.run_id

        server.release()
        resumed = run_eval(tmp_path, *resume_args)  # the command the interrupt printed, as printed
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        for shown in (interrupted.stdout + interrupted.stderr, resumed.stdout + resumed.stderr):
            assert HEADER_SECRET not in shown  # launched from verifiers' resolved JSON config too
    final = traces(tmp_path)
    assert len(final) == TASKS * ROLLOUTS and all(row["ok"] for row in final)

    spool = read_run(run_dir(tmp_path))
    assert (spool.run_id, spool.status, len(spool.segments)) == (first_run_id, "completed", 2)
    assert spool.episodes_count == TASKS * ROLLOUTS + ROLLOUTS  # append-only: 8 for 6 slots
    manifest = [r for r in spool.records() if r.type == "manifest"][-1].data
    assert set(manifest["supersedes"]) == errored

    db = tmp_path / "platform.db"
    synced = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "outputs"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=child_env(HOME=str(tmp_path)))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    evaluation, rows = local_samples(db)  # one evaluation
    assert sorted(row["sample_id"] for row in rows) == sorted(row["id"] for row in final)
    assert slots_of(rows) == [(idx, n) for idx in range(TASKS) for n in range(1, ROLLOUTS + 1)]
    assert evaluation["status"] == "COMPLETED" and evaluation["finalize_count"] == 1
    assert_summary(evaluation["metrics"], from_episodes(wire_episodes(final)))


def test_a_header_value_a_failed_model_call_quotes_never_reaches_our_files(tmp_path: Path,
                                                                           chat_server: FakeChatServer) -> None:
    """The launch file's header secret pasted with its newline: httpx refuses it and quotes it
    (``Illegal header value b'...\\n'``), verifiers records that in every failed call's error
    and the episodes' errors, and the spool held it there in clear text, 9 times a run."""
    launch = launch_file(tmp_path, chat_server.base_url, rollouts=1)
    launch.write_text(launch.read_text().replace(f'{HEADER_SECRET}"', f'{HEADER_SECRET}\\n"'))
    result = run_eval(tmp_path, "@", launch.name, "--no-rich")
    assert result.returncode == 0, result.stderr[-4000:]
    quoted = [row for row in traces(tmp_path) if HEADER_SECRET in json.dumps(row["traces"][0]["errors"])]
    assert len(quoted) == TASKS  # verifiers' own file quotes it: the failure is the one meant
    assert HEADER_SECRET.encode() not in all_bytes_under(run_dir(tmp_path) / "spool")
    episodes = list(read_run(run_dir(tmp_path)).episodes())
    assert [episode["traces"][0]["errors"][0]["message"] for episode in episodes] == [
        "Illegal header value b'***'"] * TASKS


def test_an_output_dir_whose_name_is_not_utf8_gets_its_spool_and_syncs(tmp_path: Path,
                                                                       chat_server: FakeChatServer) -> None:
    """The run's config (its output_dir) went into the manifest as it was, and orjson
    refused the surrogates such a name decodes to: the eval ended in a traceback from
    content/manifest.py, where plain vf-eval runs; the manifest now holds the name with its
    odd bytes as \\xNN, as reports show it."""
    launch = launch_file(tmp_path, chat_server.base_url, rollouts=1)
    odd = os.fsdecode(b"out-\xff")
    result = subprocess.run(eval_cmd("@", launch.name, "--output-dir", odd, "--no-rich"), cwd=tmp_path,
                            capture_output=True, text=True, errors="backslashreplace", timeout=180, env=eval_env())
    assert result.returncode == 0 and "prime_runs_spool" not in result.stderr, result.stderr[-3000:]
    run = read_run(tmp_path / odd / "tiny")
    assert run.status == "completed" and len(list(run.episodes())) == TASKS
    assert run.manifest["config"]["output_dir"] == "out-\\xff"
    synced = subprocess.run(CLI + ["sync", "--local", "--db", str(tmp_path / "platform.db"), "--json", odd],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=child_env(HOME=str(tmp_path)))
    assert synced.returncode == 0, synced.stderr
    assert [run["state"] for run in json.loads(synced.stdout)["runs"]] == ["synced"]
