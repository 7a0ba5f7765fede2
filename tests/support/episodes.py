"""Small synthetic episodes for the run API's tests (``small_episode``, ``small_trace``).

The sized, fully verifiers-shaped factory that sync tests and benchmarks use is
``fixtures.episodes.make_episode``; this one builds the smallest records the run API reads.

Small on purpose: these tests fsync for every call, so records stay a few hundred bytes.
The shape is the one verifiers writes (episode_example.json), reduced to what the run API
reads: ids, ``ok``, and per trace its agent (trainable, resolved config), task idx,
rewards and metrics.
"""

from __future__ import annotations

from typing import Any

from fixtures.episodes import make_episode


def small_trace(
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


def small_episode(
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
        "traces": traces if traces is not None else [small_trace(idx, **trace_kwargs)],
    }


def episode_with_word(n: int, run_id: str, word: str, hostile: str, where: str | None) -> dict[str, Any]:
    """Episode ``n`` with ``word`` planted where a search must find it: the answer
    (``message``), a tool call's arguments (``call``), or a tool's output (``output``, as
    ``hostile`` markup that must stay text); ``None`` plants nothing."""
    episode = make_episode(n, size=0, run_id=run_id, idx=n)
    nodes = episode["traces"][0]["nodes"]
    if where == "message":
        nodes[1]["message"]["content"] = f"the answer mentions {word} once"
    elif where == "call":
        nodes[1]["message"]["tool_calls"] = [{"id": "c1", "type": "function", "function": {
            "name": "bash", "arguments": f'{{"command": "echo {word}"}}'}}]
    elif where == "output":
        nodes.append({"parent": 1, "message": {"role": "tool", "tool_call_id": "c1", "content": hostile}})
    return episode
