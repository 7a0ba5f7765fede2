"""fixtures/eval_outputs is real verifiers 0.4.0 output, small, with the fake credential where
a real one would sit; fixtures/make_eval_outputs.py regenerates it (slow: it runs vf-eval)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.make_eval_outputs import FAKE_CREDENTIAL
from prime_runs_spool.importer.outputs import read_source
from support.env import REPO_ROOT, child_env

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"
RUNS = ("vf040-completed", "vf040-cancelled", "vf040-killed", "vf040-torn", "vf040-corrupt", "v0-completed")
#: Stopped by a signal once the first episode landed: how many landed by then depends on timing.
SIGNALLED = ("vf040-cancelled", "vf040-killed")


def verdicts(root: Path) -> dict[str, tuple[str, str, int]]:
    out = {}
    for name in RUNS:
        if name == "vf040-corrupt":
            continue
        source = read_source(root / name)
        out[name] = (source.outcome.status, source.outcome.kind, len(source.ids))
    return out


def test_the_committed_outputs_are_small_and_real() -> None:
    files = [p for p in EVAL_OUTPUTS.rglob("*") if p.is_file() and not p.is_symlink()]
    assert files and max(p.stat().st_size for p in files) < 16 * 1024
    assert sorted(p.name for p in EVAL_OUTPUTS.iterdir()) == sorted(RUNS)
    first = json.loads((EVAL_OUTPUTS / "vf040-completed" / "traces.jsonl").read_text().splitlines()[0])
    assert first["traces"][0]["verifiers"]["version"] == "0.4.0"
    assert f'X-Fake-Gateway-Token = "{FAKE_CREDENTIAL}"' in (
        EVAL_OUTPUTS / "vf040-completed" / "configs" / "eval.toml").read_text()
    assert (EVAL_OUTPUTS / "vf040-completed" / "logs" / "latest").is_symlink()
    assert verdicts(EVAL_OUTPUTS) == {
        "vf040-completed": ("completed", "completed", 4),
        "vf040-cancelled": ("cancelled", "cancelled", 1),
        "vf040-killed": ("crashed", "crashed", 1),
        "vf040-torn": ("crashed", "crashed", 3),
        "v0-completed": ("completed", "completed", 4),
    }


@pytest.mark.slow
def test_regenerating_with_the_real_vf_eval_gives_the_same_shapes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fixtures.make_eval_outputs", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    fresh, committed = verdicts(tmp_path), verdicts(EVAL_OUTPUTS)
    for name in SIGNALLED:  # how many rollouts land before the signal takes effect is timing
        assert fresh[name][:2] == committed[name][:2]
        assert 1 <= fresh.pop(name)[2] < 4
        committed.pop(name)
    assert fresh == committed
