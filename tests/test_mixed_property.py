"""Property: however ``prime-runs eval``, plain ``vf-eval --resume``, interrupts and syncs
interleave on one run folder, the platform ends with each episode of ``traces.jsonl`` once.

A model of the two eval programs' effect on the folder (fast, so hypothesis can try many
interleavings); tests/test_vf_eval_mixed.py runs the real vf-eval for one of them:

- both, on a resume, first do what verifiers' ``--resume`` does: rewrite ``traces.jsonl``
  keeping only the ok episodes (through a temporary file and a rename), and owe every other
  slot again;
- each completed rollout is appended to ``traces.jsonl`` (verifiers' ``append_episode``);
- ``prime-runs eval`` also writes the spool, exactly as its hooks do: ``open_run`` with the
  episodes the rewritten file dropped superseded, every kept episode logged (verifiers
  re-logs them), then each new episode right after its ``traces.jsonl`` line; Ctrl-C seals
  it ``cancelled``;
- plain vf-eval (pushing off: no key) stamps ``disabled-<hex>`` and writes no spool;
- each attempt writes verifiers' ``logs/attempt_N/eval.log`` lines the importer reads (the
  plan, the interrupt warning, the teardown).

Syncs are the real ``prime-runs sync --local`` into the local platform. The last step
completes the run (every owed slot, no error) and syncs it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.episodes import make_episode
from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.supersede import kept_episode_ids, superseded_ids
from prime_runs_spool.importer.agreement import spool_episode_ids
from prime_runs_spool.local_platform.store import Store
from support.env import CLI, child_env

TASKS = 4
PRE, PLAIN, SYNC = "prime-runs eval", "plain vf-eval", "sync"


@dataclass
class Folder:
    """One run folder and what the model has written to it."""

    root: Path
    attempts: int = 0
    numbers: int = 0
    spool_run_id: str | None = None
    syncs: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.root / "outputs" / "mixed"

    @property
    def traces(self) -> Path:
        return self.run_dir / "traces.jsonl"

    def rows(self) -> list[dict[str, Any]]:
        if not self.traces.exists():
            return []
        return [json.loads(line) for line in self.traces.read_text().splitlines() if line.strip()]

    def begin(self) -> list[dict[str, Any]]:
        """An attempt starts: verifiers' config and log; on a resume, the rewrite. Returns the kept rows."""
        self.attempts += 1
        resolved = self.run_dir / "configs" / "resolved"
        resolved.mkdir(parents=True, exist_ok=True)
        (resolved / "eval.json").write_text(json.dumps({"run": {"name": "mixed"}, "model": "fake/model",
                                                        "num_rollouts": 1, "env": {"taskset": {"id": "gsm8k"}}}))
        kept = [row for row in self.rows() if row["ok"]]
        if self.traces.exists():  # verifiers' --resume: kept rows only, through a rename
            tmp = self.traces.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
            tmp.replace(self.traces)
        self.log(f"INFO running {TASKS}x1 rollouts on fake/model" if self.attempts == 1 else "INFO resuming")
        return kept

    def log(self, line: str) -> None:
        folder = self.run_dir / "logs" / f"attempt_{self.attempts}"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "eval.log", "a") as handle:
            handle.write(line + "\n")

    def rollout(self, idx: int, run_id: str, ok: bool) -> dict[str, Any]:
        self.numbers += 1
        episode = make_episode(self.numbers, size=1_600, run_id=run_id, idx=idx, ok=ok, salt=self.root.name)
        self.log(f"INFO rollout start: id={episode['id']} task={idx}")
        with open(self.traces, "a") as handle:  # verifiers' append_episode
            handle.write(json.dumps(episode) + "\n")
        return episode

    def end(self, interrupted: bool) -> None:
        self.log("WARNING interrupted - cleaning up" if interrupted else "INFO interception down")


def owed(kept: list[dict[str, Any]]) -> list[int]:
    done = {row["task"]["data"]["idx"] for row in kept}
    return [idx for idx in range(TASKS) if idx not in done]


def run_pre(folder: Folder, done: int, errored: set[int]) -> None:
    """``prime-runs eval`` (or ``--resume``): ``done`` owed slots complete, then Ctrl-C unless all did."""
    kept = folder.begin()
    slots = owed(kept)
    spool_ids = spool_episode_ids(folder.run_dir) if (folder.run_dir / "spool").exists() else []
    supersedes = superseded_ids(spool_ids, kept_episode_ids(folder.traces))
    run = open_run(folder.run_dir, name="mixed", environments=["gsm8k"], model="fake/model", mode="offline",
                   supersedes=supersedes)
    run.log_episodes(kept)  # verifiers logs the finished ones to the resumed run
    for position, idx in enumerate(slots[:done]):
        run.log_episodes([folder.rollout(idx, run.id, ok=position not in errored)])
    interrupted = done < len(slots)
    folder.end(interrupted)
    if interrupted:
        run.abort(KeyboardInterrupt())
    else:
        run.finish()


def run_plain(folder: Folder, done: int, errored: set[int]) -> None:
    """Plain vf-eval, pushing off: ``traces.jsonl`` only, stamped ``disabled-<hex>``."""
    kept = folder.begin()
    slots = owed(kept)
    run_id = f"disabled-{secrets.token_hex(8)}"
    for position, idx in enumerate(slots[:done]):
        folder.rollout(idx, run_id, ok=position not in errored)
    folder.end(done < len(slots))


def sync(folder: Folder) -> None:
    result = subprocess.run(CLI + ["sync", "--local", "--db", str(folder.root / "platform.db"), "outputs"],
                            cwd=folder.root, capture_output=True, text=True, timeout=120,
                            env=child_env(HOME=str(folder.root)))
    folder.syncs.append(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr


def platform_rows(db: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    store = Store(db)
    try:
        evaluations, _ = store.list_evaluations(skip=0, limit=100)
        rows = []
        for evaluation in evaluations:
            bodies, _ = store.list_samples(evaluation["evaluation_id"], offset=0, limit=10_000)
            rows += [json.loads(body) for body in bodies]
        return [store.get_evaluation(e["evaluation_id"]) for e in evaluations], rows
    finally:
        store.close()


#: One step: which program, how many owed slots complete before Ctrl-C (all: no Ctrl-C),
#: which of them error (only in an interrupted attempt: a completed run with errors that a
#: later resume retries is the documented "superseded after push" case, not this property).
step = st.one_of(
    st.just((SYNC, 0, frozenset())),
    st.tuples(st.sampled_from([PRE, PLAIN]), st.integers(0, TASKS), st.frozensets(st.integers(0, TASKS - 1))),
)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("PRIME_RUNS_MIXED_EXAMPLES", "10")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=5), last=st.sampled_from([PRE, PLAIN]))
def test_any_interleaving_ends_with_each_episode_of_traces_jsonl_on_the_platform_once(
        steps: list[tuple[str, int, frozenset[int]]], last: str) -> None:
    with tempfile.TemporaryDirectory(prefix="mixed-") as tmp:
        folder = Folder(Path(tmp))
        for kind, done, errored in steps:
            if kind == SYNC:
                if folder.traces.exists():
                    sync(folder)
                continue
            slots = len(owed([row for row in folder.rows() if row["ok"]]))
            done = min(done, slots)
            interrupted_errors = {e for e in errored if e < done} if done < slots else set()
            (run_pre if kind == PRE else run_plain)(folder, done, interrupted_errors)
        (run_pre if last == PRE else run_plain)(folder, TASKS, set())  # the run completes
        sync(folder)
        final = folder.rows()
        assert sorted(row["task"]["data"]["idx"] for row in final) == list(range(TASKS))
        evaluations, rows = platform_rows(folder.root / "platform.db")
        assert len(evaluations) == 1, folder.syncs
        assert sorted(row["sample_id"] for row in rows) == sorted(row["id"] for row in final), folder.syncs
        assert (evaluations[0]["status"], evaluations[0]["finalize_count"]) == ("COMPLETED", 1)
        assert read_run(folder.run_dir).status == "completed"
