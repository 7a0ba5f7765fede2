"""The verifiers adapter, against config objects shaped like verifiers' EvalConfig."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from prime_runs_spool.spool import durable_file
from support.disk import split_synced_writes
from prime_runs_spool import read_run
from prime_runs_spool.errors import SpoolWriteError
from prime_runs_spool.runner.verifiers import (
    abort_eval_run,
    eval_run_dir,
    finish_eval_run,
    open_eval_run,
)
from prime_runs_spool.content.mask_locations import MASK
from support.episodes import small_episode
from support.files import all_bytes_under


class ClientConfig(pydantic.BaseModel):
    type: str = "eval"
    base_url: str | None = None
    headers: dict[str, str] = {}


class TasksetConfig(pydantic.BaseModel):
    id: str


class EnvConfig(pydantic.BaseModel):
    id: str
    taskset: TasksetConfig | None = None


class RunConfig(pydantic.BaseModel):
    name: str
    dir: str | None = None
    id: str | None = None
    _adopted: str | None = pydantic.PrivateAttr(default=None)

    def adopt_id(self, run_id: str) -> None:
        self._adopted = run_id


class EvalConfig(pydantic.BaseModel):
    """The part of verifiers' v1 EvalConfig the adapter reads."""

    model: str = "default/model"
    num_rollouts: int = 1
    output_dir: str = "outputs"
    run: RunConfig
    client: ClientConfig | None = None
    env: EnvConfig


def eval_config(tmp_path: Path, **run: Any) -> EvalConfig:
    return EvalConfig(
        model="Qwen/Qwen3-8B",
        num_rollouts=3,
        output_dir=str(tmp_path / "outputs"),
        run=RunConfig(name="gsm8k-judge-qwen3-8b", **run),
        client=ClientConfig(headers={"CF-Access-Client-Secret": "cfs_SECRET"}),
        env=EnvConfig(id="agentic-judge", taskset=TasksetConfig(id="gsm8k")),
    )


def test_opens_in_output_dir_slash_run_dir_with_the_manifest(tmp_path: Path) -> None:
    config = eval_config(tmp_path, dir="2026-01-01-gsm8k", id="runner-id")
    at_file = tmp_path / "eval.toml"
    at_file.write_text('model = "Qwen/Qwen3-8B"\n[run]\nname = "gsm8k-judge-qwen3-8b"\n')
    run = open_eval_run(config, num_examples=20, config_file=at_file)
    assert run.dir == tmp_path / "outputs" / "2026-01-01-gsm8k"
    assert run.id == "runner-id" and run.mode == "offline"
    run.log_episodes([small_episode("a", run_id=run.id)])
    assert finish_eval_run(run)["avg_reward"] == 1.0
    spool = read_run(run.dir)
    manifest = spool.manifest
    assert (manifest["name"], manifest["model"], manifest["environments"], manifest["framework"]) == (
        "gsm8k-judge-qwen3-8b", "Qwen/Qwen3-8B", ["gsm8k"], "verifiers")
    assert manifest["config"]["client"]["headers"] == {"CF-Access-Client-Secret": MASK}
    assert (manifest["config"]["num_examples"], manifest["config"]["rollouts_per_example"]) == (20, 3)
    assert manifest["config_source"]["filename"] == "eval.toml"
    assert spool.status == "completed"
    assert b"cfs_SECRET" not in all_bytes_under(run.dir)


def test_run_dir_defaults_to_the_run_name_and_outputs() -> None:
    config = SimpleNamespace(run=SimpleNamespace(name="my-run"))
    assert eval_run_dir(config) == Path("outputs") / "my-run"


def test_environment_falls_back_to_the_env_id(tmp_path: Path) -> None:
    config = eval_config(tmp_path)
    config.env.taskset = None
    run = open_eval_run(config, num_examples=None)
    finish_eval_run(run)
    assert read_run(run.dir).manifest["environments"] == ["agentic-judge"]


def test_disabled_mode_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    config = eval_config(tmp_path, id="local-uuid")
    run = open_eval_run(config, num_examples=2, push=True)
    assert run.mode == "disabled" and run.id == "local-uuid"  # a local run keeps its own id
    run.log_episodes([small_episode("a")])
    assert finish_eval_run(run)["avg_error"] == 0.0
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("env_mode", [None, "offline", "online"])
def test_no_push_keeps_the_spool_and_streams_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_mode: str | None
) -> None:
    """--no-push is verifiers' "send nothing while the eval runs": the spool is written
    all the same (offline, even under PRIME_RUNS_MODE=online: no shipper is started)."""
    if env_mode is None:
        monkeypatch.delenv("PRIME_RUNS_MODE", raising=False)
    else:
        monkeypatch.setenv("PRIME_RUNS_MODE", env_mode)
    config = eval_config(tmp_path, id="local-uuid")
    run = open_eval_run(config, num_examples=2, push=False)
    assert run.mode == "offline"
    run.log_episodes([small_episode("a")])
    finish_eval_run(run)
    spool = read_run(run.dir)
    assert (spool.status, spool.episodes_count) == ("completed", 1)
    assert not (run.dir / "spool" / "shipper.log").exists()


def test_finish_logs_the_episodes_it_is_given_once(tmp_path: Path) -> None:
    run = open_eval_run(eval_config(tmp_path), num_examples=2)
    episodes = [small_episode("a"), small_episode("b", ok=False)]
    run.log_episodes(episodes[:1])  # streamed one of them
    summary = finish_eval_run(run, episodes)
    assert summary["avg_error"] == 0.5
    assert read_run(run.dir).episodes_count == 2


def test_resume_continues_the_spools_run_and_the_runner_adopts_its_id(tmp_path: Path) -> None:
    first = open_eval_run(eval_config(tmp_path, id="first-id"), num_examples=2)
    first.log_episodes([small_episode("a")])
    abort_eval_run(first, KeyboardInterrupt())
    config = eval_config(tmp_path, id="fresh-id-after-restart")
    second = open_eval_run(config, num_examples=2)
    assert second.id == "first-id" and second.resumed
    assert config.run._adopted == "first-id"
    second.log_episodes([small_episode("a"), small_episode("b")])
    finish_eval_run(second)
    spool = read_run(second.dir)
    assert (spool.status, spool.episodes_count, len(spool.segments)) == ("completed", 2, 2)


def test_a_config_that_cannot_be_dumped_costs_only_the_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(EvalConfig):
        def model_dump(self, **kwargs: Any) -> dict[str, Any]:
            raise ValueError("cannot serialize secret-bearing field")

    base = eval_config(tmp_path)
    config = Broken(**{name: getattr(base, name) for name in type(base).model_fields})
    with caplog.at_level(logging.WARNING, logger="prime_runs_spool"):
        run = open_eval_run(config, num_examples=4)
    finish_eval_run(run)
    manifest = read_run(run.dir).manifest
    assert manifest["config"] == {"model": "Qwen/Qwen3-8B", "num_examples": 4, "rollouts_per_example": 3}
    assert "config left out" in caplog.text and "secret-bearing" not in caplog.text


def test_duck_typed_config_without_pydantic(tmp_path: Path) -> None:
    config = SimpleNamespace(
        model="m", num_rollouts=2, output_dir=str(tmp_path), run=SimpleNamespace(name="plain"),
        env=SimpleNamespace(id="e", taskset=SimpleNamespace(id="t")),
    )
    run = open_eval_run(config, num_examples=1)
    finish_eval_run(run, [small_episode("a")])
    spool = read_run(tmp_path / "plain")
    assert spool.manifest["environments"] == ["t"] and spool.episodes_count == 1


def test_abort_never_raises_and_tolerates_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    abort_eval_run(None, RuntimeError("open failed"))
    assert finish_eval_run(None) is None
    run = open_eval_run(eval_config(tmp_path), num_examples=1)

    def failing_sync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable_file, "_fdatasync", failing_sync)
    split_synced_writes(monkeypatch)
    with pytest.raises(SpoolWriteError):  # durability is not optional: the eval must hear it
        run.log_episodes([small_episode("a")])
    abort_eval_run(run, RuntimeError("eval failed"))  # the seal fails too, quietly


def test_cancelled_eval_is_sealed_cancelled(tmp_path: Path) -> None:
    run = open_eval_run(eval_config(tmp_path), num_examples=1)

    async def eval_loop() -> None:
        try:
            await run.log_episodes_async([small_episode("a")])
            raise asyncio.CancelledError
        except BaseException as exc:
            abort_eval_run(run, exc)
            raise

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(eval_loop())
    spool = read_run(run.dir)
    assert spool.status == "cancelled"
    seal = [r for r in spool.records() if r.type == "seal"][-1]
    assert seal.data["error"] == "interrupted"


# -- against the released verifiers (0.4.0): its real EvalConfig ---------------------------

TASKSET_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "verifiers"


def released_config(tmp_path: Path, **fields: Any) -> Any:
    """verifiers' own EvalConfig, resolved the way vf-eval resolves it (the tiny taskset)."""
    pytest.importorskip("verifiers.v1.configs.cli.eval")
    import sys

    if str(TASKSET_DIR) not in sys.path:
        sys.path.insert(0, str(TASKSET_DIR))
    from verifiers.v1.configs.cli.eval import EvalConfig as ReleasedEvalConfig

    data = {"model": "fake/model", "num_rollouts": 2, "output_dir": str(tmp_path / "outputs"),
            "run": {"name": "tiny"}, "env": {"taskset": {"id": "tiny_taskset"}},
            "client": {"type": "eval", "headers": {"X-Secret": "sekrit_HEADER"}}, **fields}
    return ReleasedEvalConfig.model_validate(data)


@pytest.mark.slow
def test_released_config_gets_the_runs_id_through_assign_id(tmp_path: Path) -> None:
    config = released_config(tmp_path)
    with pytest.raises(RuntimeError):  # 0.4.0: no id before open_run assigns one
        config.run.id
    run = open_eval_run(config, num_examples=3)
    assert config.run.id == run.id  # assigned once, the spool's id
    assert run.dir == tmp_path / "outputs" / "tiny"
    finish_eval_run(run)
    spool = read_run(run.dir)
    assert spool.manifest["run_id"] == run.id and spool.manifest["environments"] == ["tiny_taskset"]
    assert b"sekrit_HEADER" not in all_bytes_under(run.dir)


@pytest.mark.slow
def test_released_config_resumed_assigns_the_spools_id(tmp_path: Path) -> None:
    first = open_eval_run(released_config(tmp_path), num_examples=3)
    abort_eval_run(first, KeyboardInterrupt())
    config = released_config(tmp_path)  # a new process: a fresh config, no id
    second = open_eval_run(config, num_examples=3)
    assert second.resumed and config.run.id == first.id == second.id
    finish_eval_run(second)


def test_released_config_no_push_still_writes_the_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIME_RUNS_MODE", raising=False)
    config = released_config(tmp_path, push=False)
    run = open_eval_run(config, num_examples=3)  # push taken from the config
    assert run.mode == "offline" and config.run.id == run.id
    finish_eval_run(run)
    assert read_run(run.dir).status == "completed"


def test_released_config_with_attach_is_refused_clearly(tmp_path: Path) -> None:
    from prime_runs_spool.errors import UnsupportedRunConfigError

    config = released_config(tmp_path, run={"name": "tiny", "attach": "eval-123"})
    with pytest.raises(UnsupportedRunConfigError, match="run.attach='eval-123' is not supported"):
        open_eval_run(config, num_examples=3)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_sigterm_through_verifiers_interrupt_handler_seals_cancelled(tmp_path: Path) -> None:
    """verifiers' eval turns SIGTERM (like Ctrl-C) into KeyboardInterrupt; the run ends cancelled."""
    pytest.importorskip("verifiers.v1.utils.interrupt")
    import signal
    import subprocess
    import sys
    import textwrap

    from support.env import child_env

    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(TASKSET_DIR)!r})
        from verifiers.v1.configs.cli.eval import EvalConfig
        from verifiers.v1.utils.interrupt import install_interrupt
        from prime_runs_spool.runner.verifiers import abort_eval_run, open_eval_run
        config = EvalConfig.model_validate({{"output_dir": {str(tmp_path)!r}, "run": {{"name": "term"}},
                                             "env": {{"taskset": {{"id": "tiny_taskset"}}}}}})
        install_interrupt()
        run = open_eval_run(config, num_examples=1)
        try:
            print("ready", flush=True)
            time.sleep(120)
        except BaseException as exc:
            abort_eval_run(run, exc)
            raise SystemExit(130)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    spool = read_run(tmp_path / "term")
    assert spool.status == "cancelled"
    assert [r for r in spool.records() if r.type == "seal"][-1].data["error"] == "interrupted"
