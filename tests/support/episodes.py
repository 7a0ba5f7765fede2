"""Small synthetic episodes and configs for the run API's tests.

Small on purpose: these tests fsync for every call, so records stay a few hundred bytes.
The shape is the one verifiers writes (episode_example.json), reduced to what the run API
reads: ids, ``ok``, and per trace its agent (trainable, resolved config), task idx,
rewards and metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_trace(
    idx: Any = 0,
    *,
    trainable: bool = True,
    rewards: dict[str, tuple[float, float]] | None = None,
    metrics: dict[str, Any] | None = None,
    headers: dict[str, Any] | None = None,
    harness_env: dict[str, Any] | None = None,
    trace_id: str = "t",
) -> dict[str, Any]:
    return {
        "id": trace_id,
        "agent": {
            "name": "solver" if trainable else "judge",
            "trainable": trainable,
            "config": {
                "model": "m",
                "client": {"base_url": "https://example.invalid/v1", "api_key_var": "PRIME_API_KEY",
                           "headers": dict(headers or {})},
                "harness": {"id": "bash", "env": dict(harness_env or {}), "forward_env": ["GITHUB_TOKEN"]},
            },
        },
        "task": {"type": "T", "data": {"idx": idx, "prompt": "p"}},
        "rewards": {name: {"score": s, "weight": w} for name, (s, w) in (rewards or {"r": (1.0, 1.0)}).items()},
        "metrics": dict(metrics or {}),
        "ok": True,
    }


def make_episode(
    episode_id: str | None,
    idx: Any = 0,
    *,
    ok: bool = True,
    traces: list[dict[str, Any]] | None = None,
    run_id: str = "local",
    **trace_kwargs: Any,
) -> dict[str, Any]:
    return {
        "id": episode_id,
        "run": {"type": "eval", "id": run_id},
        "ok": ok,
        "traces": traces if traces is not None else [make_trace(idx, **trace_kwargs)],
    }


def all_bytes_under(root: Path) -> bytes:
    """Every byte of every file under ``root``, concatenated (for 'no secret anywhere' checks)."""
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


def run_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())
