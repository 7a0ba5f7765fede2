"""Running the real verifiers eval through ``prime-runs eval`` in a test: the launch file,
the child process, and reading back what it wrote.

The eval runs the tiny taskset (``fixtures/verifiers/tiny_taskset``) on verifiers'
``subprocess`` runtime with its ``null`` harness (a chat program run by ``uv``), against
the fake chat server (``fixtures/fake_chat_server.py``) on loopback.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fixtures.vf_launch import TASKSETS as TASKSET_DIR
from fixtures.vf_launch import launch_file_text, write_uv_shim
from support.env import CLI, child_env

#: The secret placed in the launch file's ``[client] headers``; must never reach our files.
HEADER_SECRET = "cfs_LAUNCH_FILE_HEADER_SECRET_0123"
#: The model client's API key variable and value (verifiers reads it from the environment).
KEY_VAR = "TINY_MODEL_KEY"
KEY_VALUE = "sk-model-key-SECRET-4567"
RUN_NAME = "tiny"
TASKS = 3


def launch_file(tmp_path: Path, base_url: str, *, rollouts: int = 2) -> Path:
    path = tmp_path / "eval.toml"
    path.write_text(launch_file_text(run_name=RUN_NAME, base_url=base_url, model="fake/model", rollouts=rollouts,
                                     max_concurrent=8, key_var=KEY_VAR, header_name="CF-Access-Client-Secret",
                                     header_secret=HEADER_SECRET, output_dir="outputs"))
    return path


def uv_shim_dir() -> Path:
    """A folder holding the ``uv`` shim (written once per test process)."""
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"prs-uv-shim-{os.getpid()}"
    if not (folder / "uv").exists():
        write_uv_shim(folder)
        atexit.register(shutil.rmtree, folder, True)
    return folder


def eval_env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(TASKSET_DIR), env["PYTHONPATH"]])
    env["PATH"] = os.pathsep.join([str(uv_shim_dir()), env.get("PATH", "")])
    # Any package index lookup would fail: the run must need nothing beyond loopback.
    env["UV_DEFAULT_INDEX"] = env["UV_INDEX_URL"] = "http://127.0.0.1:9/simple"
    env[KEY_VAR] = KEY_VALUE
    env.setdefault("PRIME_RUNS_MODE", "offline")
    env.pop("PRIME_RUNS_MODE", None) if "PRIME_RUNS_MODE" not in extra else None
    return env


def eval_cmd(*args: str) -> list[str]:
    return CLI + ["eval", *args]


def run_eval(tmp_path: Path, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(eval_cmd(*args), cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=eval_env(**env))


def interrupt_eval(tmp_path: Path, *args: str, when: Any, sig: int = signal.SIGINT,
                   timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    """Start the eval, send ``sig`` once ``when()`` is true, and wait for it to exit."""
    proc = subprocess.Popen(eval_cmd(*args), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=eval_env(**env))
    deadline = time.monotonic() + timeout
    while not when():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            raise AssertionError(f"the eval ended before the interrupt (exit {proc.returncode}): {err[-3000:]}")
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "outputs" / RUN_NAME


def traces(tmp_path: Path) -> list[dict[str, Any]]:
    """verifiers' own results (``traces.jsonl``), in file order."""
    path = run_dir(tmp_path) / "traces.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wire_episodes(rows: list[dict[str, Any]]) -> list[Any]:
    """verifiers' own episode objects for result rows (what the SDK's functions take)."""
    from verifiers.v1.episode import WireEpisode

    return [WireEpisode.model_validate(row) for row in rows]


#: verifiers' own eval command, as ``vf-eval`` runs it (its console script's entry point).
PLAIN_VF_EVAL = [sys.executable, "-c", "import sys; from verifiers.v1.cli.eval.main import main; sys.exit(main())"]


def plain_cmd(*args: str) -> list[str]:
    return PLAIN_VF_EVAL + list(args)


def resolved_config(tmp_path: Path) -> str:
    """What verifiers' own messages tell the user to resume with (relative to ``tmp_path``)."""
    return str(Path("outputs") / RUN_NAME / "configs" / "resolved" / "eval.json")


def run_plain(tmp_path: Path, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    """Plain ``vf-eval`` (no spool hooks). It pushes by default: with no key it logs a
    warning and runs with a disabled platform run (episodes stamped ``disabled-<hex>``),
    unless the environment points it at a platform."""
    return subprocess.run(plain_cmd(*args), cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=eval_env(HOME=str(tmp_path), **env))


def interrupt_plain(tmp_path: Path, *args: str, when: Any, timeout: float = 180,
                    **env: str) -> subprocess.CompletedProcess[str]:
    """Plain ``vf-eval``, sent SIGINT once ``when()`` is true."""
    proc = subprocess.Popen(plain_cmd(*args), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=eval_env(HOME=str(tmp_path), **env))
    deadline = time.monotonic() + timeout
    while not when():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            raise AssertionError(f"vf-eval ended before the interrupt (exit {proc.returncode}): {err[-3000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
