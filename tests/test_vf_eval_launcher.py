"""``prime-runs eval``'s launcher, in process: version detection, hook binding, logging, the CLI shell."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("verifiers.v1.cli.eval.runner")

import verifiers.v1.cli.eval.runner as vf_runner  # noqa: E402

from commands.cli import cli  # noqa: E402
from prime_runs_spool.errors import VerifiersVersionError  # noqa: E402
from prime_runs_spool.runner import verifiers_eval  # noqa: E402
from prime_runs_spool.runner.verifiers_eval import (  # noqa: E402
    EvalSession, SUPPORTED_RANGE, bound_hooks, check_verifiers, launch_file_of,
)
from support.env import CLI, child_env  # noqa: E402


def test_the_installed_release_is_supported() -> None:
    assert check_verifiers() is vf_runner


@pytest.mark.parametrize("version", ["0.3.9", "0.5.0", "1.0.0", "garbage"])
def test_an_unsupported_version_names_itself_and_the_range(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(verifiers_eval, "installed_version", lambda: version)
    with pytest.raises(VerifiersVersionError) as caught:
        check_verifiers()
    assert f"verifiers {version} is installed" in str(caught.value)
    assert SUPPORTED_RANGE in str(caught.value)


def test_verifiers_not_installed_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifiers_eval, "installed_version", lambda: None)
    # verifiers by its own name: the package is on no index, so 'prime-runs-spool[verifiers]' never resolved
    with pytest.raises(VerifiersVersionError, match=r"pip install 'verifiers>=0\.4\.0,<0\.5\.0'"):
        check_verifiers()


def test_a_runner_whose_hooks_differ_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vf_runner, "finish_run", lambda run, episodes: None)
    monkeypatch.delattr(vf_runner, "abort_run")
    with pytest.raises(VerifiersVersionError) as caught:
        check_verifiers()
    message = str(caught.value)
    assert "finish_run(run, episodes) instead of finish_run(run, episodes, state)" in message
    assert "no abort_run" in message and SUPPORTED_RANGE in message


def test_hooks_are_bound_for_the_block_and_restored() -> None:
    originals = {name: getattr(vf_runner, name) for name in verifiers_eval.HOOKS}
    with bound_hooks(EvalSession(argv=[])):
        for name, original in originals.items():
            assert getattr(vf_runner, name) is not original
            assert getattr(vf_runner, name).__self__.__class__.__name__ == "_Hooks"
    assert {name: getattr(vf_runner, name) for name in verifiers_eval.HOOKS} == originals


def test_the_launch_file_is_the_root_at_reference() -> None:
    assert launch_file_of(["@", "eval.toml", "--resume"]) == "eval.toml"
    assert launch_file_of(["tiny", "--env.taskset", "@", "nested.toml"]) is None
    assert launch_file_of(["-n", "3"]) is None


def test_our_warnings_reach_verifiers_own_log(tmp_path: Path) -> None:
    """verifiers' setup_logging sends only its own logger to eval.log; the hook adds ours."""
    from loguru import logger as loguru_logger
    from verifiers.v1.utils.logging import setup_logging

    ours = logging.getLogger("prime_runs_spool")
    saved = (list(ours.handlers), ours.level, ours.propagate)
    log_file = tmp_path / "eval.log"
    setup_logging("INFO", log_file=str(log_file), console=False)
    try:
        verifiers_eval._route_logs_to_verifiers()
        logging.getLogger("prime_runs_spool.runner").warning("spool warning for the eval log")
        loguru_logger.complete()
        line = next(line for line in log_file.read_text().splitlines() if "spool warning" in line)
        assert "WARNING spool warning for the eval log" in line
    finally:
        loguru_logger.remove()
        ours.handlers[:] = saved[0]
        ours.setLevel(saved[1])
        ours.propagate = saved[2]
        logging.getLogger("verifiers.v1").handlers.clear()


def test_cli_refuses_an_unsupported_version_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifiers_eval, "installed_version", lambda: "0.9.1")
    result = CliRunner().invoke(cli, ["eval", "@", "eval.toml"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"prime-runs: verifiers 0.9.1 is installed; prime-runs eval supports verifiers {SUPPORTED_RANGE}. "
        f"Install a supported one: pip install 'verifiers{SUPPORTED_RANGE}'"
    ]


def test_help_says_what_prime_runs_eval_adds_and_where_verifiers_help_is() -> None:
    """Without verifiers' own help: printing it imports verifiers (tests/test_cli_basics.py)."""
    for asked in (["--help"], ["-h"], [], ["@", "eval.toml", "--help"]):
        result = subprocess.run(CLI + ["eval", *asked], capture_output=True, text=True, env=child_env(), timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("prime-runs eval [VF-EVAL ARGUMENTS...]")
        assert "What prime-runs eval adds:" in result.stdout and "--resume" in result.stdout
        assert "verifiers' own arguments (every one passes through): vf-eval --help" in result.stdout
        assert "usage: uv run vf-eval" not in result.stdout


def test_help_names_the_exit_codes_that_are_not_verifiers_own() -> None:
    """The help ended 'The exit code is verifiers' own.', while docs/cli.md's table gives
    prime-runs eval's own 1 (a --clean refused, a folder it cannot write, ...) and 2
    (verifiers missing or unsupported, PRIME_RUNS_MODE not one of its values): a CI job
    reading the help took a 2 for verifiers' usage error."""
    result = subprocess.run(CLI + ["eval", "--help"], capture_output=True, text=True, env=child_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "The exit code is verifiers' own." not in text
    for said in ("--clean is refused", "exit 1", "2 when verifiers is missing", "PRIME_RUNS_MODE is not offline, "
                 "online or disabled", "a folder it cannot write", "the @ file is a folder, a FIFO"):
        assert said in text, (said, text)



@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_launch_file_that_is_a_folder_or_a_fifo_is_one_line_before_verifiers_reads_it(tmp_path: Path,
                                                                                          kind: str) -> None:
    """``prime-runs eval @ configs`` (a completion stopped at the folder) ended in verifiers'
    ``IsADirectoryError`` traceback, exit 1; a FIFO named as the launch file blocked the
    process for good, reading it for the terminal's masking. One line, exit 2, nothing made."""
    import os

    launch = tmp_path / "eval.toml"
    if kind == "folder":
        launch.mkdir()
    else:
        os.mkfifo(launch)
    done = subprocess.run(CLI + ["eval", "@", "eval.toml", "--no-rich"], cwd=tmp_path, capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"prime-runs: @ eval.toml: it is {'a folder' if kind == 'folder' else 'a FIFO'}, not a config file; "
        "give the eval's .toml, .json or .yaml file"], done.stderr[-2000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["eval.toml"]


@pytest.mark.slow
def test_run_attach_is_refused_in_one_line_before_any_rollout(tmp_path: Path) -> None:
    from support.vf_eval import eval_env, launch_file

    launch = launch_file(tmp_path, "http://127.0.0.1:9/v1")
    result = subprocess.run(CLI + ["eval", "@", launch.name, "--no-rich", "--run.attach", "eval-123"], cwd=tmp_path,
                            capture_output=True, text=True, env=eval_env(), timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        "prime-runs: run.attach='eval-123' is not supported: a spool syncs into an evaluation of its own")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs" / "tiny" / "spool").exists()


@pytest.mark.slow
def test_an_unknown_mode_is_a_usage_error_before_verifiers_starts(tmp_path: Path) -> None:
    """PRIME_RUNS_MODE=onlne (a typo) ended the eval as 'internal error: ValueError: ...'
    (exit 1), after verifiers had made the run's folder (configs, an empty traces.jsonl,
    logs): one line naming the variable and its values, exit 2, nothing written."""
    from support.vf_eval import eval_env, launch_file

    launch = launch_file(tmp_path, "http://127.0.0.1:9/v1")
    result = subprocess.run(CLI + ["eval", "@", launch.name, "--no-rich"], cwd=tmp_path, capture_output=True,
                            text=True, env=eval_env(PRIME_RUNS_MODE="onlne"), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "prime-runs: unknown PRIME_RUNS_MODE 'onlne': expected one of offline, online, disabled "
        "(set it to one of them, or unset it for offline)"]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_an_error_escaping_verifiers_is_shown_as_vf_eval_shows_it(tmp_path: Path) -> None:
    """What escapes verifiers' eval (here the environment's own code: the taskset fails to
    load its tasks) is shown as vf-eval shows it, its traceback included (docs/cli.md):
    verifiers rewrites ``sys.argv``, so the command line took it for its own internal error,
    one line with no traceback, which hid where an environment's own code failed."""
    from support.vf_eval import eval_env, launch_file, run_plain

    launch = launch_file(tmp_path, "http://127.0.0.1:9/v1")
    failing = {"TINY_TASKSET_LOAD_FAIL": "1"}
    plain = run_plain(tmp_path, "@", launch.name, "--no-rich", **failing)
    ours = subprocess.run(CLI + ["eval", "@", launch.name, "--no-rich"], cwd=tmp_path, capture_output=True,
                          text=True, env=eval_env(**failing), timeout=120)
    for result in (plain, ours):
        assert result.returncode == 1, result.stderr[-2000:]
        assert "Traceback" in result.stderr and "fails to load on purpose" in result.stderr, result.stderr[-2000:]
    assert "internal error" not in ours.stderr, ours.stderr[-2000:]
