"""Build spools for sync tests straight through the segment writer (no runner API needed).

They hold what ``open_run`` writes today: a manifest of the current masking version and
episodes masked at append, so sync passes them through untouched (content/remask.py);
tests/test_remask_e2e.py builds the older kind on purpose."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fixtures.episodes import make_episode
from prime_runs_spool.content.episodes import RolloutCounter
from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.layout import durable_mark_path_of
from prime_runs_spool.spool.writer import SegmentWriter

_EPISODE_RULES = MaskRules.defaults_for_episode()


def manifest_for(run_id: str, name: str = "synthetic-run", environment: str = "gsm8k") -> dict[str, Any]:
    return {"run_id": run_id, "name": name, "environments": [environment], "model": "Qwen/Qwen3-8B",
            "framework": "verifiers", "config": {"model": "Qwen/Qwen3-8B"}, "num_examples": 10,
            "rollouts_per_example": 3, "masking_version": MASKING_VERSION}


class RunBuilder:
    """Writes one run: a manifest, then episodes numbered as the writer would number them."""

    def __init__(self, run_dir: Path, run_id: str, *, salt: str = "", environment: str = "gsm8k") -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.salt = salt or run_id
        self.environment = environment
        self.counter = RolloutCounter()
        self.count = 0
        self.ids: list[str] = []
        self.writer: SegmentWriter | None = None

    def open_segment(self, *, supersedes: list[str] | None = None, counted: bool = False) -> SegmentWriter:
        """A new segment; ``supersedes`` lists earlier episodes a resume replaces (as
        ``prime-runs eval --resume`` records them in the resumed segment's manifest);
        ``counted``: its header says how many episodes the earlier segments hold
        (``prior_episodes``), as ``open_run`` writes it."""
        self.writer = SegmentWriter.create(self.run_dir, self.run_id,
                                           prior_episodes=self.count if counted else None)
        manifest = manifest_for(self.run_id, environment=self.environment)
        if supersedes:
            manifest.update(resumed=True, supersedes=list(supersedes))
        self.writer.append("manifest", manifest)
        return self.writer

    def add(self, n: int, *, size: int = 2_000, traces: int = 1, ok: bool = True) -> None:
        assert self.writer is not None
        items = []
        for _ in range(n):
            episode = mask(make_episode(self.count, size=size, run_id=self.run_id, salt=self.salt, traces=traces, ok=ok),
                           _EPISODE_RULES)
            self.count += 1
            self.ids.append(episode["id"])
            items.append(("episode", episode, {"episode_id": episode["id"],
                                               "rollout_number": self.counter.next_number(episode)}))
        self.writer.append_many(items)
        self.wait_for_mark()

    def wait_for_mark(self, timeout: float = 5.0) -> None:
        """Until the durable mark says what the writer synced: it is written at most every
        10 ms (spool/durable_mark.py), and a sync of the live run reads up to it."""
        assert self.writer is not None
        path, deadline = self.writer.path, time.monotonic() + timeout
        while durable_mark_path_of(path).exists() and durable_mark(path) != self.writer.durable_bytes:
            assert time.monotonic() < deadline, f"{path}: the durable mark did not catch up"
            time.sleep(0.001)

    def seal(self, status: str = "completed", error: str | None = None) -> None:
        assert self.writer is not None
        self.writer.seal(status, error=error)
        self.writer = None

    def abandon(self) -> None:
        """Close without sealing: as far as readers can tell, the writer crashed."""
        assert self.writer is not None
        self.writer.close()
        self.writer = None


def build_run(run_dir: Path, run_id: str, episodes: int, *, status: str | None = "completed",
              size: int = 2_000) -> RunBuilder:
    builder = RunBuilder(run_dir, run_id)
    builder.open_segment()
    builder.add(episodes, size=size)
    if status is None:
        builder.abandon()
    else:
        builder.seal(status)
    return builder
