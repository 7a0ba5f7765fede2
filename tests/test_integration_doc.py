"""docs/integration.md's recipes run as written against the released verifiers (0.4.0)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from prime_runs_spool import read_run
from support.env import REPO_ROOT
from support.episodes import small_episode

DOC = REPO_ROOT / "docs" / "integration.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_name_the_doc_imports_from_this_package_exists() -> None:
    imports = [m for block in BLOCKS for m in re.findall(r"^from (prime_runs_spool[\w.]*) import ([\w, ]+)$", block, re.M)]
    assert imports, "the doc imports nothing from prime_runs_spool?"
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(loaded, name), f"docs/integration.md: {module} has no {name}"


@pytest.mark.slow
def test_the_adapter_recipe_runs_against_verifiers_0_4_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("verifiers.v1.configs.cli.eval")
    monkeypatch.syspath_prepend(str(REPO_ROOT / "fixtures" / "verifiers"))
    monkeypatch.delenv("PRIME_RUNS_MODE", raising=False)
    (recipe,) = [block for block in BLOCKS if "EvalConfig.model_validate" in block]
    output_dir = tmp_path / "outputs"
    episodes = [small_episode("a"), small_episode("b")]
    exec(compile(recipe, str(DOC), "exec"), {"output_dir": output_dir, "episodes": episodes})
    spool = read_run(output_dir / "my-run")
    assert (spool.status, spool.episodes_count) == ("completed", 2)
