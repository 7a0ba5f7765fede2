"""The run-level metrics the dashboard renders: ``avg_reward``, ``avg_metrics``, ``avg_error``.

Computed from episode *records*, streaming, so the runner can seal a run with it and sync
can recompute it for a run that crashed before writing one, without holding a spool in
memory.

Semantics (docs/platform-api.md, "What the dashboard reads"):

- A trace's reward is the projection's: the sum of ``score * weight`` over its non-null
  rewards (0 with none), so ``avg_reward`` agrees with the rows' ``reward`` column.
- Rewards and metrics average over the trainable traces of the whole run. The fallback
  to all traces applies **per run**: only when no trace of any episode is trainable.
  That is the upstream reading (its ``run_metrics`` pooled the traces of all episodes,
  then filtered), and it keeps one definition per run: a per-episode fallback would
  silently mix judges' scores into a policy's average whenever a single episode lost
  its trainable trace.
- A metric's mean is over the traces that report it.
- ``avg_error`` is the share of episodes whose ``ok`` is not ``True`` (a record without
  ``ok`` counts as an error: we cannot claim it succeeded).
- Non-finite numbers (NaN, ±inf) are dropped before averaging, as are non-numeric
  metric values. A mean over nothing is ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from prime_runs_spool.content.episodes import trace_reward


class _Means:
    """Running sums for the reward and each metric over one population of traces."""

    def __init__(self) -> None:
        self.reward_sum = 0.0
        self.reward_count = 0
        self.metric_sums: dict[str, float] = {}
        self.metric_counts: dict[str, int] = {}

    def add(self, trace: Mapping[str, Any]) -> None:
        reward = _finite(_safe_reward(trace))
        if reward is not None:
            self.reward_sum += reward
            self.reward_count += 1
        for name, value in (trace.get("metrics") or {}).items():
            number = _finite(value)
            if number is not None:
                self.metric_sums[name] = self.metric_sums.get(name, 0.0) + number
                self.metric_counts[name] = self.metric_counts.get(name, 0) + 1

    def reward(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None

    def metrics(self) -> dict[str, float]:
        return {name: self.metric_sums[name] / self.metric_counts[name] for name in self.metric_sums}


def _safe_reward(trace: Mapping[str, Any]) -> Any:
    try:
        return trace_reward(trace)
    except TypeError:  # a non-numeric score or weight: not a reward we can average
        return None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class SummaryAccumulator:
    """Incremental form of :func:`compute_summary`: ``add`` each episode, then ``result``."""

    def __init__(self) -> None:
        self._trainable = _Means()
        self._all = _Means()
        self._episodes = 0
        self._errors = 0
        # Counted apart from the means: a trainable trace whose numbers were all dropped
        # as non-finite is still trainable, and must not switch the run to all traces.
        self._trainable_traces = 0

    def add(self, episode: Mapping[str, Any]) -> None:
        self._episodes += 1
        if episode.get("ok") is not True:
            self._errors += 1
        for trace in episode.get("traces") or ():
            self._all.add(trace)
            if (trace.get("agent") or {}).get("trainable"):
                self._trainable_traces += 1
                self._trainable.add(trace)

    def result(self) -> dict[str, Any]:
        """``{avg_reward, avg_metrics, avg_error}`` for the episodes added so far."""
        pool = self._trainable if self._trainable_traces else self._all
        return {
            "avg_reward": pool.reward(),
            "avg_metrics": pool.metrics(),
            "avg_error": self._errors / self._episodes if self._episodes else None,
        }


def compute_summary(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The run summary of ``episodes`` (any iterable; consumed once, not held)."""
    accumulator = SummaryAccumulator()
    for episode in episodes:
        accumulator.add(episode)
    return accumulator.result()
