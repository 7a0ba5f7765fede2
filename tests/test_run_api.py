"""The eval runner's API: open_run, log_episodes, finish, abort, modes, resume, exit hook."""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pydantic
import pytest

from prime_runs_spool.spool import durable_file
from prime_runs_spool import RunClosedError, open_run, read_run
from prime_runs_spool.errors import CorruptSpoolError, RunInUseError, RunMismatchError, SpoolError, SpoolWriteError
from prime_runs_spool.spool.format import FORMAT_VERSION, parse_line
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.runner.ending import EXITED_OPEN_ERROR
from prime_runs_spool.runner.error_line import ERROR_MAX_CHARS, describe_error

from support.disk import split_synced_writes
from support.env import child_env
from support.loop_ticker import Ticker
from support.episodes import small_episode, small_trace
from support.files import all_bytes_under, run_files
from support.cli import local_sync


def lines_of(segment: Path) -> list[Any]:
    return [parse_line(raw) for raw in segment.read_bytes().splitlines(keepends=True)]


def episode_metas(run_dir: Path) -> list[dict[str, Any]]:
    return [r.meta for r in read_run(run_dir).records() if r.type == "episode"]


def seal_of(run_dir: Path, segment: int = -1) -> dict[str, Any]:
    last = lines_of(list_segments(run_dir)[segment][1])[-1]
    assert last.type == "seal"
    return last.data


def basic_run(run_dir: Path, **kwargs: Any):
    args: dict[str, Any] = {"name": "gsm8k-test", "environments": ["gsm8k"], "model": "m", "num_examples": 4,
                            "rollouts_per_example": 2}
    args.update(kwargs)
    return open_run(run_dir, **args)


# -- manifest ------------------------------------------------------------------------------


def test_manifest_is_written_first_with_identity(tmp_path: Path) -> None:
    run = basic_run(tmp_path / "r", config={"model": "m", "client": {"headers": {"X-Key": "s3cret"}}})
    uuid.UUID(run.id)  # a UUID when the caller passes none
    run.log_episodes([small_episode("e1")])
    run.finish()
    lines = lines_of(list_segments(tmp_path / "r")[0][1])
    assert [line.type for line in lines] == ["header", "manifest", "episode", "seal"]
    manifest = lines[1].data
    assert manifest["run_id"] == run.id == lines[0].data["run_id"]
    assert manifest["name"] == "gsm8k-test"
    assert manifest["environments"] == ["gsm8k"]
    assert manifest["framework"] == "verifiers"
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["config"]["client"]["headers"] == {"X-Key": MASK}
    assert run.manifest == manifest
    assert "resumed" not in manifest


def test_given_run_id_and_created_at_are_used(tmp_path: Path) -> None:
    run = basic_run(tmp_path, run_id="fixed-id", created_at="2026-01-02T03:04:05Z")
    run.finish()
    assert read_run(tmp_path).manifest["run_id"] == "fixed-id"
    assert read_run(tmp_path).manifest["created_at"] == "2026-01-02T03:04:05Z"


class ClientConfig(pydantic.BaseModel):
    base_url: str = "https://default.invalid"
    headers: dict[str, str] = {}


class EvalConfig(pydantic.BaseModel):
    model: str = "default-model"
    num_examples: int = 5
    rollouts_per_example: int = 1
    client: ClientConfig = ClientConfig()


def test_pydantic_config_records_set_fields_and_v0_keys(tmp_path: Path) -> None:
    config = EvalConfig(client=ClientConfig(headers={"Authorization": "Bearer tok"}))
    run = open_run(tmp_path, name="n", config=config)
    run.finish()
    recorded = read_run(tmp_path).manifest["config"]
    assert recorded["client"] == {"headers": {"Authorization": MASK}}  # base_url was not set
    # exclude_unset dropped them, the dashboard needs them: v0 defaults fill in.
    assert "model" in recorded and recorded["model"] is None  # no model argument: present, unknown
    assert recorded["num_examples"] == -1
    assert recorded["rollouts_per_example"] == 1


def test_v0_keys_come_from_the_arguments(tmp_path: Path) -> None:
    run = open_run(tmp_path, name="n", model="qwen", config={"num_tasks": 20},
                   num_examples=20, rollouts_per_example=3)
    run.finish()
    recorded = read_run(tmp_path).manifest["config"]
    assert (recorded["model"], recorded["num_examples"], recorded["rollouts_per_example"]) == ("qwen", 20, 3)


def test_config_source_kept_for_a_clean_file(tmp_path: Path) -> None:
    source = tmp_path / "eval.toml"
    source.write_text('model = "m"\n[client.headers]\n')
    run = open_run(tmp_path / "r", name="n", config_file=source)
    run.finish()
    assert read_run(tmp_path / "r").manifest["config_source"] == {
        "format": "toml", "text": source.read_text(), "filename": "eval.toml"}


def test_config_source_with_credentials_left_out_and_warned_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "eval.toml"
    source.write_text('model = "m"\n[env.solver.harness.env]\nHF_TOKEN = "hf_SECRETVALUE"\n')
    with caplog.at_level(logging.INFO, logger="prime_runs_spool"):
        run = open_run(tmp_path / "r", name="n", config_file=source)
    run.finish()
    assert "config_source" not in read_run(tmp_path / "r").manifest
    assert "env.solver.harness.env" in caplog.text
    notes = [r for r in caplog.records if "config_source left out" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO]  # one note, not a warning: the run is whole
    assert "hf_SECRETVALUE" not in caplog.text
    assert b"hf_SECRETVALUE" not in all_bytes_under(tmp_path / "r")


# -- episodes ------------------------------------------------------------------------------


def test_rollout_numbers_per_idx_in_arrival_order(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    run.log_episodes([small_episode("a", 0), small_episode("b", 1), small_episode("c", 0)])
    run.log_episodes([small_episode("d", None, traces=[]), small_episode("e", 0), small_episode("f", None)])
    run.finish()
    assert episode_metas(tmp_path) == [
        {"episode_id": "a", "rollout_number": 1},
        {"episode_id": "b", "rollout_number": 1},
        {"episode_id": "c", "rollout_number": 2},
        {"episode_id": "d", "rollout_number": None},  # no traces: no row, no number
        {"episode_id": "e", "rollout_number": 3},
        {"episode_id": "f", "rollout_number": 1},  # None is an idx of its own
    ]


def test_duplicates_within_a_call_and_across_calls_are_skipped(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    assert run.log_episodes([small_episode("a"), small_episode("a"), small_episode(None), small_episode(None)]) == 3
    assert run.log_episodes([small_episode("a")]) == 0
    assert (run.episodes_logged, run.episodes_skipped) == (3, 2)
    run.finish()
    assert [m["episode_id"] for m in episode_metas(tmp_path)] == ["a", None, None]


class Episode(pydantic.BaseModel):
    id: str
    ok: bool
    traces: list[dict[str, Any]]


class RecordEpisode:
    """Like verifiers' episode objects: serializes itself with to_record()."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def to_record(self) -> dict[str, Any]:
        return self.record


def test_pydantic_and_to_record_episodes_are_masked_and_logged(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    model = Episode(id="p", ok=True, traces=[small_trace(0, headers={"H": "pydantic-secret"})])
    run.log_episodes([model, RecordEpisode(small_episode("r", harness_env={"T": "record-secret"}))])
    run.finish()
    assert [m["episode_id"] for m in episode_metas(tmp_path)] == ["p", "r"]
    raw = all_bytes_under(tmp_path)
    assert b"pydantic-secret" not in raw and b"record-secret" not in raw


def test_bad_episodes_are_refused_before_anything_is_numbered(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    with pytest.raises(TypeError, match="list of episodes"):
        run.log_episodes(small_episode("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping or a pydantic model"):
        run.log_episodes([42])
    with pytest.raises(TypeError):
        run.log_episodes([small_episode("x"), {"id": "y", "bad": object()}])
    run.log_episodes([small_episode("x")])  # "x" was not taken by the failed call
    run.finish()
    assert episode_metas(tmp_path) == [{"episode_id": "x", "rollout_number": 1}]


def test_summary_end_to_end_against_hand_computed_values(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    run.log_episodes([
        # trainable reward 0.5*1 + 1*0 = 0.5; the judge's 9.0 must not count
        small_episode("a", traces=[small_trace(0, rewards={"x": (0.5, 1.0), "y": (1.0, 0.0)}, metrics={"m": 1.0}),
                                  small_trace(0, trainable=False, rewards={"j": (9.0, 1.0)}, metrics={"m": 9.0})]),
        small_episode("b", ok=False, rewards={"x": (1.0, 2.0)}, metrics={"m": 3.0, "n": float("nan")}),
        small_episode("c", traces=[]),
    ])
    # avg_metrics: the rewards' own scores (x: 0.5 and 1.0; y: 1.0) and the metrics
    expected = {"avg_reward": (0.5 + 2.0) / 2, "avg_metrics": {"x": 0.75, "y": 1.0, "m": 2.0}, "avg_error": 1 / 3}
    assert run.finish() == expected
    assert seal_of(tmp_path)["summary"] == expected
    assert seal_of(tmp_path)["episodes"] == 3


def test_explicit_summary_is_sealed_as_given(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    run.log_episodes([small_episode("a")])
    assert run.finish({"avg_reward": 7.0}) == {"avg_reward": 7.0}
    assert seal_of(tmp_path)["summary"] == {"avg_reward": 7.0}


def test_concurrent_threads_number_without_gaps(tmp_path: Path) -> None:
    run = basic_run(tmp_path)

    def worker(t: int) -> None:
        for i in range(6):
            run.log_episodes([small_episode(f"{t}-{i}", i % 2)])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.finish()
    metas = episode_metas(tmp_path)
    assert len(metas) == 36 == len({m["episode_id"] for m in metas})
    for idx in (0, 1):
        numbers = sorted(m["rollout_number"] for m in metas if int(m["episode_id"].split("-")[1]) % 2 == idx)
        assert numbers == list(range(1, 19))


# -- finishing and aborting ----------------------------------------------------------------


def test_finish_and_abort_are_idempotent(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    run.log_episodes([small_episode("a")])
    summary = run.finish()
    assert run.finish() == summary
    run.abort(RuntimeError("late"))
    assert run.status == "completed"
    assert len(lines_of(list_segments(tmp_path)[0][1])) == 4  # one seal only
    failed = basic_run(tmp_path / "f")
    failed.abort(RuntimeError("x"))
    failed.abort(RuntimeError("y"))
    assert failed.finish() is None
    assert failed.status == "failed"
    assert seal_of(tmp_path / "f")["error"] == "RuntimeError: x"


def test_log_after_finish_raises_a_clear_error(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    run.finish()
    with pytest.raises(RunClosedError, match="already completed"):
        run.log_episodes([small_episode("a")])
    with pytest.raises(RunClosedError):
        asyncio.run(run.log_episodes_async([small_episode("a")]))


def test_abort_error_is_one_truncated_line() -> None:
    text = describe_error(ValueError("first line\nsecond " + "x" * 2000))
    assert text.startswith("ValueError: first line second ")
    assert "\n" not in text and len(text) == ERROR_MAX_CHARS
    assert describe_error(KeyboardInterrupt()) == "KeyboardInterrupt"


@pytest.mark.parametrize(
    ("exc", "status"),
    [(ValueError("boom"), "failed"), (KeyboardInterrupt(), "cancelled"), (asyncio.CancelledError(), "cancelled"),
     (SystemExit(3), "cancelled")],
)
def test_context_manager_exception_paths(tmp_path: Path, exc: BaseException, status: str) -> None:
    with pytest.raises(type(exc)):
        with basic_run(tmp_path) as run:
            run.log_episodes([small_episode("a")])
            raise exc
    assert run.status == status
    seal = seal_of(tmp_path)
    # an interrupt is recorded as prime-runs 0.1.4 records it: cancelled, "interrupted"
    assert seal["status"] == status
    assert seal["error"] == ("interrupted" if status == "cancelled" else describe_error(exc))
    assert read_run(tmp_path).status == status


def test_context_manager_normal_exit_finishes(tmp_path: Path) -> None:
    with basic_run(tmp_path) as run:
        run.log_episodes([small_episode("a")])
    assert run.status == "completed"
    assert seal_of(tmp_path)["summary"]["avg_reward"] == 1.0


def test_exit_hook_seals_an_open_run_crashed(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        from prime_runs_spool import open_run
        run = open_run({str(tmp_path)!r}, name="left-open")
        run.log_episodes([{{"id": "a", "ok": True, "traces": []}}])
    """)
    subprocess.run([sys.executable, "-c", script], env=child_env(), check=True, timeout=60)
    spool = read_run(tmp_path)
    assert spool.status == "crashed" and spool.episodes_count == 1
    assert seal_of(tmp_path)["error"] == EXITED_OPEN_ERROR


@pytest.mark.slow
@pytest.mark.parametrize(("ending", "status", "error"), [
    ("raise ValueError('judge unreachable with s3cret-value')", "failed", f"ValueError: judge unreachable with {MASK}"),
    ("sys.excepthook = lambda *a: None\nraise ValueError('boom')", "failed", "ValueError: boom"),
    ("async def main():\n    raise RuntimeError('in the loop')\nasyncio.run(main())", "failed",
     "RuntimeError: in the loop"),
    ("raise KeyboardInterrupt", "cancelled", "interrupted"),
    ("sys.exit(0)", "crashed", EXITED_OPEN_ERROR),
    ("sys.exit(0)  # an error on record from before the run is not what ended it", "crashed", EXITED_OPEN_ERROR),
])
def test_a_run_left_open_by_an_uncaught_exception_is_sealed_with_what_happened(
        tmp_path: Path, ending: str, status: str, error: str) -> None:
    """A script whose eval loop raised, its run never finished (no ``with``), was sealed
    ``crashed``, 'the process exited without finishing the run': the run broke, and the
    exception that broke it was lost. Sealed as ``abort`` (and a ``with`` block) seals it,
    whatever sys.excepthook a library set; a plain exit with the run open stays crashed."""
    script = "\n".join([
        "import asyncio, sys",
        "from prime_runs_spool import open_run",
        "sys.last_value = ValueError('shown before the run')" if "before the run" in ending else "",
        f"run = open_run({str(tmp_path)!r}, name='left-open', config={{'client': {{'api_key': 's3cret-value'}}}})",
        "run.log_episodes([{'id': 'a', 'ok': True, 'traces': []}])",
        ending,
    ])
    subprocess.run([sys.executable, "-c", script], env=child_env(), timeout=60, capture_output=True)
    spool = read_run(tmp_path)
    assert spool.status == status and spool.episodes_count == 1
    assert seal_of(tmp_path)["error"] == error
    assert b"s3cret-value" not in all_bytes_under(tmp_path)


def test_api_key_in_the_environment_never_reaches_the_spool(tmp_path: Path) -> None:
    key = "pit_" + uuid.uuid4().hex
    script = textwrap.dedent(f"""
        import logging, os
        logging.basicConfig(level=logging.DEBUG)
        from prime_runs_spool import open_run
        key = os.environ["PRIME_API_KEY"]
        config = {{"client": {{"api_key_var": "PRIME_API_KEY", "headers": {{"Authorization": "Bearer " + key}}}}}}
        trace = {{"agent": {{"trainable": True, "config": {{"client": {{"headers": {{"Authorization": key}}}},
                 "harness": {{"env": {{"PRIME_API_KEY": key}}}}}}}}, "task": {{"data": {{"idx": 0}}}}}}
        with open_run({str(tmp_path)!r}, name="n", config=config) as run:
            run.log_episodes([{{"id": "a", "ok": True, "traces": [trace]}}])
    """)
    done = subprocess.run([sys.executable, "-c", script], env=child_env(PRIME_API_KEY=key),
                          capture_output=True, check=True, timeout=60)
    assert key.encode() not in all_bytes_under(tmp_path)
    assert key.encode() not in done.stdout + done.stderr
    assert read_run(tmp_path).status == "completed"


# -- async ---------------------------------------------------------------------------------


def test_async_logging_never_blocks_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_sync = durable_file._fdatasync

    def slow_sync(fd: int) -> None:
        time.sleep(0.3)
        real_sync(fd)

    run = basic_run(tmp_path)
    monkeypatch.setattr(durable_file, "_fdatasync", slow_sync)
    split_synced_writes(monkeypatch)

    async def main() -> tuple[int, float]:
        async with Ticker(0.01) as ticker:
            await asyncio.gather(*(run.log_episodes_async([small_episode(f"e{i}", i)]) for i in range(4)))
        return ticker.ticks, ticker.elapsed

    ticks, elapsed = asyncio.run(main())
    assert elapsed >= 0.3
    assert ticks >= 10  # the loop kept running while the disk was slow
    monkeypatch.setattr(durable_file, "_fdatasync", real_sync)
    run.finish()
    assert len(episode_metas(tmp_path)) == 4


def test_finish_on_the_loop_with_async_appends_in_flight_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_sync = durable_file._fdatasync

    def held_sync(fd: int) -> None:
        release.wait(10)
        real_sync(fd)

    run = basic_run(tmp_path)
    monkeypatch.setattr(durable_file, "_fdatasync", held_sync)
    split_synced_writes(monkeypatch)

    async def main() -> None:
        task = asyncio.create_task(run.log_episodes_async([small_episode("a")]))
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="to_thread"):
            run.finish()
        release.set()
        await task
        await asyncio.to_thread(run.finish)

    asyncio.run(main())
    assert read_run(tmp_path).status == "completed"


# -- failures of the disk -------------------------------------------------------------------


def test_a_disk_error_on_append_surfaces_and_abort_stays_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = basic_run(tmp_path)

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(durable_file, "_fdatasync", failing_sync)
    split_synced_writes(monkeypatch)
    with pytest.raises(SpoolWriteError):
        run.log_episodes([small_episode("a")])
    # Retrying the episode that failed must fail too, never pass as an already-logged duplicate.
    with pytest.raises(SpoolError):
        run.log_episodes([small_episode("a")])
    run.abort(SpoolWriteError("disk"))  # must not raise on the way out
    assert run.status == "crashed"
    assert run.episodes_logged == 0


def test_durable_listeners_hear_each_append_and_the_seal(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    heard: list[tuple[str, int]] = []
    run.add_durable_listener(lambda r: heard.append((r.status, r.episodes_logged)))
    run.add_durable_listener(lambda r: 1 / 0)  # a failing listener never reaches the eval
    run.log_episodes([small_episode("a")])
    run.log_episodes([small_episode("b")])
    run.finish()
    assert heard == [("open", 1), ("open", 2), ("completed", 2)]


def test_a_durable_listener_that_cannot_be_called_is_refused_where_it_is_given(tmp_path: Path) -> None:
    """It was taken, then logged as failing ('str' object is not callable) after every append
    and the seal, never raised: the mistake was told far from where it was made."""
    run = basic_run(tmp_path)
    with pytest.raises(TypeError, match="add_durable_listener takes a callable"):
        run.add_durable_listener("progress")  # type: ignore[arg-type]
    run.log_episodes([small_episode("a")])
    run.finish()


# -- modes ---------------------------------------------------------------------------------


def test_disabled_mode_writes_nothing_but_behaves_the_same(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run = basic_run(run_dir, mode="disabled", config={"client": {"headers": {"A": "b"}}})
    assert run.mode == "disabled" and uuid.UUID(run.id)
    assert run.log_episodes([small_episode("a"), small_episode("a")]) == 1
    with pytest.raises(TypeError):
        run.log_episodes([42])
    assert run.finish() == {"avg_reward": 1.0, "avg_metrics": {"r": 1.0}, "avg_error": 0.0}
    with pytest.raises(RunClosedError):
        run.log_episodes([small_episode("b")])
    assert not run_dir.exists()
    assert list(tmp_path.iterdir()) == []


def test_mode_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    assert basic_run(tmp_path / "d").mode == "disabled"
    assert basic_run(tmp_path / "o", mode="offline").mode == "offline"  # the argument wins
    assert not (tmp_path / "d").exists()
    monkeypatch.setenv("PRIME_RUNS_MODE", "offlnie")
    with pytest.raises(ValueError, match="PRIME_RUNS_MODE.*offline, online, disabled"):
        basic_run(tmp_path / "x")


def test_unknown_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown mode 'shipping': expected one of offline, online, disabled"):
        basic_run(tmp_path, mode="shipping")
    assert list(tmp_path.iterdir()) == []


def test_online_mode_spools_like_offline(tmp_path: Path) -> None:
    with basic_run(tmp_path, mode="online") as run:
        run.log_episodes([small_episode("a")])
    assert run.mode == "online"
    assert read_run(tmp_path).status == "completed"


# -- resume --------------------------------------------------------------------------------


def test_resume_continues_the_same_run(tmp_path: Path) -> None:
    first = basic_run(tmp_path, config={"model": "m", "x": 1})
    first.log_episodes([small_episode("a", 0), small_episode("b", 0), small_episode("c", 1, ok=False)])
    first.abort(KeyboardInterrupt())

    second = basic_run(tmp_path, config={"model": "m", "x": 2})
    assert second.id == first.id and second.resumed
    assert second.manifest["config"]["x"] == 1  # the original manifest is the run's
    # The runner re-logs what it kept, then new rollouts.
    assert second.log_episodes([small_episode("a", 0), small_episode("b", 0)]) == 0
    assert second.log_episodes([small_episode("d", 0), small_episode("e", 1)]) == 2
    assert (second.episodes_logged, second.episodes_skipped) == (2, 2)
    summary = second.finish()
    assert summary["avg_error"] == pytest.approx(1 / 5)  # the whole run, not just this segment

    segments = list_segments(tmp_path)
    assert [index for index, _ in segments] == [1, 2]
    new_manifest = lines_of(segments[1][1])[1]
    assert new_manifest.type == "manifest"
    assert new_manifest.data["resumed"] is True and new_manifest.data["config"]["x"] == 2
    assert new_manifest.data["run_id"] == first.id
    spool = read_run(tmp_path)
    assert spool.status == "completed" and spool.episodes_count == 5
    assert spool.manifest["config"]["x"] == 1
    assert [(m["episode_id"], m["rollout_number"]) for m in episode_metas(tmp_path)] == [
        ("a", 1), ("b", 2), ("c", 1), ("d", 3), ("e", 2)]


def test_resume_after_a_crash_without_a_seal(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os
        from prime_runs_spool import open_run
        run = open_run({str(tmp_path)!r}, name="n", run_id="crashing")
        run.log_episodes([{{"id": "a", "ok": True, "traces": []}}])
        os._exit(1)
    """)
    subprocess.run([sys.executable, "-c", script], env=child_env(), timeout=60)
    assert read_run(tmp_path).status == "crashed"
    with open_run(tmp_path, name="n") as run:
        assert run.id == "crashing"
        assert run.log_episodes([{"id": "a", "ok": True, "traces": []}, {"id": "b", "ok": True}]) == 1
    assert read_run(tmp_path).episodes_count == 2


def test_resume_with_a_different_run_id_is_an_error(tmp_path: Path) -> None:
    basic_run(tmp_path, run_id="one").finish()
    with pytest.raises(RunMismatchError, match="holds run one, not two"):
        basic_run(tmp_path, run_id="two")
    assert len(list_segments(tmp_path)) == 1
    basic_run(tmp_path, run_id="one").finish()  # the same id is fine
    assert len(list_segments(tmp_path)) == 2


def test_a_run_still_being_written_is_not_resumed(tmp_path: Path) -> None:
    """By this very process (a notebook's cell run twice): the refusal said to wait for
    "another process" to exit, which never happens; it names the Run to finish instead."""
    run = basic_run(tmp_path)
    with pytest.raises(RunInUseError, match=r"this process already has this run open .*finish\(\) or abort\(\)"):
        basic_run(tmp_path)
    run.log_episodes([small_episode("after")])
    run.finish()
    assert read_run(tmp_path).episodes_count == 1


@pytest.mark.slow
def test_a_run_another_process_writes_is_not_resumed(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from prime_runs_spool import open_run
        run = open_run({str(tmp_path)!r}, name="r")
        print("open", flush=True)
        sys.stdin.readline()
        run.finish()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert child.stdout is not None and child.stdout.readline() == "open\n"
        with pytest.raises(RunInUseError, match="another process is still writing this run"):
            basic_run(tmp_path)
    finally:
        child.communicate("\n", timeout=60)
    basic_run(tmp_path).finish()


def test_resumed_disabled_run_reads_and_writes_nothing(tmp_path: Path) -> None:
    basic_run(tmp_path, run_id="one").finish()
    before = {p: p.read_bytes() for p in run_files(tmp_path)}
    run = basic_run(tmp_path, mode="disabled", run_id="other")
    run.log_episodes([small_episode("a")])
    run.finish()
    assert {p: p.read_bytes() for p in run_files(tmp_path)} == before


def test_known_episodes_are_skipped_without_being_serialized(tmp_path: Path) -> None:
    class Kept:
        """A kept episode object: serializing it again would be wasted work on resume."""

        id = "a"

        def to_record(self) -> dict[str, Any]:
            raise AssertionError("a known episode must not be serialized again")

    run = basic_run(tmp_path)
    run.log_episodes([small_episode("a")])
    assert run.log_episodes([Kept(), {"id": "a", "unserializable": object()}]) == 0
    assert run.episodes_skipped == 2
    run.finish()


def test_a_corrupt_spool_is_not_resumed(tmp_path: Path) -> None:
    first = basic_run(tmp_path)
    first.log_episodes([small_episode("a"), small_episode("b")])
    first.finish()
    segment = list_segments(tmp_path)[0][1]
    data = bytearray(segment.read_bytes())
    second_line = data.index(b"\n") + 1
    data[second_line + 20] ^= 0x01  # damage the manifest line; intact lines follow it
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptSpoolError):
        basic_run(tmp_path)
    assert len(list_segments(tmp_path)) == 1


def test_a_resume_that_supersedes_gives_the_retry_its_slot_number_and_summary(tmp_path: Path) -> None:
    """content/supersede.py: the retry takes the superseded attempt's number (lowest free),
    never one a remaining episode holds, and the summary covers the effective set only."""
    first = basic_run(tmp_path)
    first.log_episodes([small_episode("a"), small_episode("b", ok=False), small_episode("x", idx=1, ok=False)])
    first.abort(KeyboardInterrupt())
    second = open_run(tmp_path, name="n", supersedes=["b", "x"])
    second.log_episodes([small_episode("c")])  # task 0's retry
    assert second.finish()["avg_error"] == 0.0  # a and c; b and x replaced
    third = open_run(tmp_path, name="n", supersedes=["b", "x"])  # b stays out of traces.jsonl
    third.log_episodes([small_episode("d"), small_episode("y", idx=1)])
    third.finish()
    numbers = {meta["episode_id"]: meta["rollout_number"] for meta in episode_metas(tmp_path)}
    assert numbers == {"a": 1, "b": 2, "x": 1, "c": 2, "d": 3, "y": 1}
    manifests = [r.data for r in read_run(tmp_path).records() if r.type == "manifest"]
    assert [m.get("supersedes") for m in manifests] == [None, ["b", "x"], ["b", "x"]]


@pytest.mark.slow
def test_environments_given_as_one_string_are_one_environment(tmp_path: Path) -> None:
    """A str is a Sequence[str]: open_run(environments="gsm8k") recorded five environments,
    g, s, m, 8 and k, and sync created each on the platform and attached the evaluation to
    all of them. A foreign manifest holding the bare string was split the same way by sync."""
    import sqlite3

    from prime_runs_spool import open_run
    from prime_runs_spool.spool.writer import SegmentWriter
    from support.runs import manifest_for

    with open_run(tmp_path / "runs" / "api", name="one-string", environments="gsm8k", model="m") as run:
        pass
    foreign = SegmentWriter.create(tmp_path / "runs" / "foreign", "foreign-env-string")
    foreign.append("manifest", {**manifest_for("foreign-env-string"), "environments": "math500"})
    foreign.seal("completed")
    from prime_runs_spool.spool.manifests import read_manifest

    assert read_manifest(tmp_path / "runs" / "api")["environments"] == ["gsm8k"], run.id
    db = tmp_path / "local.db"
    result = local_sync(tmp_path / "runs", db)
    assert result.returncode == 0, result.stdout + result.stderr
    with sqlite3.connect(db) as connection:
        names = sorted(row[0] for row in connection.execute("SELECT name FROM environments"))
    assert names == ["gsm8k", "math500"], names


def test_tags_given_as_one_string_are_one_tag() -> None:
    """As one environment given as a string is one environment: "nightly" was seven tags."""
    from prime_runs_spool.sync.evaluation import _tags

    assert _tags("nightly") == ["nightly"]
    assert _tags(["a", "b"]) == ["a", "b"]
    assert _tags(None) == []


def test_a_run_whose_episodes_hold_no_trace_says_so_at_its_end(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Mappings without ``traces`` are recorded (an episode's shape is the producer's), but
    they have no row for the platform: 1,500 such episodes synced as "pushed 0 (total 0)",
    finalized, exit 0, and nothing anywhere said why."""
    from fixtures.episodes import make_episode

    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        with open_run(tmp_path / "plain", name="plain-dicts") as run:
            run.log_episodes([{"id": f"e{n}", "prompt": "q", "completion": "a", "reward": 1.0} for n in range(3)])
        with open_run(tmp_path / "traced", name="traced") as run:
            run.log_episodes([make_episode(n) for n in range(3)])
    (line,) = [r.getMessage() for r in caplog.records if "holds a trace" in r.getMessage()]
    assert "none of its 3 episodes holds a trace" in line and read_run(tmp_path / "plain").episodes_count == 3, line


def test_a_launch_file_that_cannot_be_read_is_a_warning_not_a_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``config_file="eval.toml"`` (as README's example passes it) naming no file is the caller's
    mistake: kept out like a file holding credentials, but said as a warning, which a runner
    with no log setup still prints (Python's last-resort handler), not a note nobody sees."""
    with caplog.at_level(logging.INFO, logger="prime_runs_spool"):
        run = open_run(tmp_path / "r", name="n", config_file=tmp_path / "no-such" / "eval.toml")
    run.finish()
    assert "config_source" not in read_run(tmp_path / "r").manifest
    said = [r for r in caplog.records if "config_source left out" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING], caplog.text
    assert "eval.toml cannot be read (No such file or directory)" in said[0].getMessage()


@pytest.mark.parametrize("field, value", [("model", 3), ("model", ["a", "b"]), ("name", 7), ("framework", 5),
                                          ("environments", [1, 2])])
def test_an_identity_the_platform_cannot_take_is_refused_at_open(tmp_path: Path, field: str, value: Any) -> None:
    """open_run(model=3) wrote a run that every sync then failed on ('model_name: Input should
    be a valid string', answered 422), each episode acknowledged into it waiting forever:
    refused before anything is written, naming the argument."""
    from prime_runs_spool import open_run

    kwargs: dict[str, Any] = {"name": "r", field: value}
    with pytest.raises(TypeError, match=f"open_run: .*{'environment name' if field == 'environments' else field} "
                                        f"is .*not a string.*could never be synced"):
        open_run(tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs, error, said", [
    ({"created_at": "yesterday"}, ValueError, "created_at is 'yesterday', not an ISO 8601 time"),
    ({"created_at": "2026-01-15T12:00:00"}, ValueError, "names no timezone"),
    ({"created_at": 1765000000}, TypeError, "created_at is int '1765000000', not a time"),
    ({"num_examples": "10"}, TypeError, "num_examples is str '10', not a whole number; pass num_examples=int"),
    ({"num_examples": 2.5}, TypeError, "num_examples is float '2.5', not a whole number"),
    ({"num_examples": True}, TypeError, "num_examples is bool 'True', not a whole number"),
    ({"num_examples": -3}, ValueError, "num_examples is -3, less than -1"),
    ({"rollouts_per_example": "3"}, TypeError, "rollouts_per_example is str '3', not a whole number"),
    ({"rollouts_per_example": 0}, ValueError, "rollouts_per_example is 0, less than 1"),
])
def test_counts_and_a_creation_time_that_are_not_what_they_say_are_refused_at_open(
        tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], said: str) -> None:
    """created_at="yesterday" was recorded as given (a run no listing could place in time) and
    num_examples="10" as text the dashboard's count reads as none: refused before anything is
    written, one line saying what is wrong and what to pass."""
    with pytest.raises(error) as raised:
        open_run(tmp_path / "run", name="r", **kwargs)
    message = str(raised.value)
    assert message.startswith("open_run: ") and said in message and "\n" not in message, message
    assert "; pass " in message, message
    assert not (tmp_path / "run").exists()


def test_counts_and_creation_times_that_are_what_they_say_are_recorded(tmp_path: Path) -> None:
    """What is refused above is not what a runner passes: -1 for an unknown count, a time
    with an offset (recorded in UTC), an aware datetime."""
    import datetime as dt

    run = open_run(tmp_path / "a", name="r", num_examples=-1, rollouts_per_example=3,
                   created_at="2026-01-15T14:00:00+02:00")
    assert run.manifest["created_at"] == "2026-01-15T12:00:00Z"
    assert (run.manifest["config"]["num_examples"], run.manifest["config"]["rollouts_per_example"]) == (-1, 3)
    run.finish()
    when = dt.datetime(2026, 1, 15, 12, tzinfo=dt.timezone.utc)
    run = open_run(tmp_path / "b", name="r", num_examples=0, created_at=when)
    assert run.manifest["created_at"] == "2026-01-15T12:00:00Z"
    run.finish()


@pytest.mark.slow
def test_status_shows_a_manifest_whose_name_or_model_is_not_a_string(tmp_path: Path) -> None:
    """Another producer's manifest (or an older open_run's) may hold a number there: status
    ended in 'internal error: AttributeError: 'int' object has no attribute 'encode''."""
    from prime_runs_spool.spool.writer import SegmentWriter
    from support.cli import run_cli
    from support.runs import manifest_for

    foreign = SegmentWriter.create(tmp_path / "runs" / "foreign", "foreign-numbers")
    foreign.append("manifest", {**manifest_for("foreign-numbers"), "name": 7, "model": 3})
    foreign.seal("completed")
    result = run_cli("status", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  7  model 3  0 episodes" in result.stdout, result.stdout


@pytest.mark.parametrize("summary, error", [({"avg_reward": object()}, "field summary.avg_reward"),
                                            ([1, 2], "takes a mapping"), ("text", "takes a mapping")])
def test_a_summary_the_seal_cannot_hold_is_refused_and_the_run_stays_open(
        tmp_path: Path, summary: Any, error: str) -> None:
    """Refused at the seal, finish(summary={"avg_reward": object()}) left the run crashed in
    this process, its segment still locked ("live" to status) and finish, abort and a new
    open_run all unable to seal it until the process exited."""
    from prime_runs_spool.spool.writer_state import run_writer_alive

    run = basic_run(tmp_path)
    run.log_episodes([small_episode("e1")])
    with pytest.raises(TypeError, match=f"{re.escape(error)}.*the run is still open"):
        run.finish(summary=summary)
    assert run.status == "open"
    run.log_episodes([small_episode("e2")])
    assert run.finish() == run.summary()
    assert not run_writer_alive(tmp_path)
    spool = read_run(tmp_path)
    assert (spool.status, spool.episodes_count) == ("completed", 2)


def test_a_launch_file_whose_name_is_not_utf8_is_recorded_and_a_manifest_refused_writes_nothing(
        tmp_path: Path) -> None:
    """open_run(config_file=<a name that is not UTF-8>) failed writing the manifest after the
    segment was made: a traceback, and a spool without a manifest that sync refused for good
    ('the spool has no manifest record'). The name is recorded printable; a manifest that
    still cannot be written (a run name of lone surrogates) is refused before any file is made."""
    import os

    from prime_runs_spool.errors import RecordNotSerializableError
    from prime_runs_spool.spool.manifests import read_manifest

    launch = tmp_path / os.fsdecode(b"ev\xe9.toml")
    launch.write_text('model = "m"\n')
    with open_run(tmp_path / "run", name="r", config_file=launch) as run:
        run.log_episodes([small_episode("e1")])
    assert read_manifest(tmp_path / "run")["config_source"]["filename"] == "ev\\xe9.toml"
    assert read_run(tmp_path / "run").status == "completed"

    with pytest.raises(RecordNotSerializableError, match="field name"):
        open_run(tmp_path / "other", name=os.fsdecode(b"caf\xe9"))
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_a_process_out_of_descriptors_is_told_the_runs_it_holds_open(tmp_path: Path) -> None:
    """A long-lived process that opens runs and never finishes them runs out of file
    descriptors (each open run keeps its segment's files): open_run ended in the bare
    'Too many open files: '.../seg-000001.durable''. Said with how many runs it holds open
    and what to do; finishing them is the cure (a hundred finished runs hold nothing)."""
    script = textwrap.dedent(f"""
        import logging, resource
        logging.disable(logging.CRITICAL)
        from prime_runs_spool import open_run
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        for i in range(100):  # finished: nothing held, past the limit
            with open_run({str(tmp_path / "done")!r} + f"/r{{i}}", name="x"):
                pass
        held = []
        try:
            for i in range(100):
                held.append(open_run({str(tmp_path / "left")!r} + f"/r{{i}}", name="x"))
        except OSError as exc:
            print(len(held), exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], env=child_env(), timeout=120, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    held, said = result.stdout.split(" ", 1)
    assert f"holds {held} runs open" in said and "finish or abort each run when its eval is done" in said, said
    assert "\n" not in said.strip()
