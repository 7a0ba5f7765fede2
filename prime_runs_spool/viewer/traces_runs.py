"""A run the local platform's Prime Traces service holds that no evaluation names.

Sync's ``--to traces`` creates an evaluation and uploads the episodes under its id, and the
dashboard shows them as that evaluation's (``index.PlatformIndex``). A run uploaded to Prime
Traces by other means (``prime_traces.TracesClient``, another tool) has episodes and no
evaluation: it is listed beside the evaluations, read the same way, with what Prime Traces
keeps of it (no model, no config, no status of its own).
"""

from __future__ import annotations

from typing import Any

from prime_runs_spool.viewer.index import PlatformIndex

#: The status such a run is shown with: Prime Traces keeps none of its own.
UPLOADED = "uploaded"
#: Its key in the viewer's URLs: the run id after this prefix, so it never meets an evaluation id.
KEY_PREFIX = "traces:"


class TracesRunIndex(PlatformIndex):
    def __init__(self, store: Any, traces: Any, run_id: str, created_at: str | None) -> None:
        super().__init__(store, {"evaluation_id": KEY_PREFIX + run_id, "name": run_id, "created_at": created_at},
                         traces)
        self.run_id = run_id
        self.manifest = {**self.manifest, "evaluation_id": None, "prime_traces_run": run_id}

    @property
    def status(self) -> str:
        return UPLOADED

    @property
    def live(self) -> bool:
        return False

    @property
    def in_traces(self) -> bool:
        return True

    @property
    def summary(self) -> dict[str, Any]:
        """The mean reward of the episodes read so far (there is no evaluation's to show)."""
        rewards = [row.reward for row in self.rows if row.reward is not None]
        return {"avg_reward": sum(rewards) / len(rewards)} if rewards else {}

    def _read(self, deadline: float) -> None:
        self.behind = self._read_episodes(deadline)
