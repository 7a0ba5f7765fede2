"""What the run API guarantees when an eval misbehaves (issue 11, the runner's part).

A malformed or oversized episode is refused whole, before anything of its call is numbered;
settling an append can never strand ``finish``; a cancelled async append is still accounted
for; ``finish`` stops admitting appends; a forked child never touches its parent's run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import prime_runs_spool.spool.writer as writer_module
from prime_runs_spool import RunClosedError, open_run, read_run
from prime_runs_spool.errors import (
    EpisodeTooLargeError,
    MalformedEpisodeError,
    RecordNotSerializableError,
    RunForkedError,
)
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.spool.format import parse_line
from prime_runs_spool.spool.layout import list_segments
from support.env import CLI, child_env
from support.episodes import small_episode, small_trace


def basic_run(run_dir: Path, **kwargs: Any):
    return open_run(run_dir, name="guarantees", environments=["gsm8k"], model="m", **kwargs)


def episode_lines(run_dir: Path) -> list[Any]:
    """Every intact episode line of the run, read straight from the segment files."""
    found = []
    for _, path in list_segments(run_dir):
        for raw in path.read_bytes().splitlines(keepends=True):
            line = parse_line(raw)
            if line is not None and line.type == "episode":
                found.append(line)
    return found


def episode_metas(run_dir: Path) -> list[dict[str, Any]]:
    return [line.meta for line in episode_lines(run_dir)]


def finish_within(run: Any, seconds: float) -> dict[str, Any] | None:
    """``run.finish()`` on a thread; fails (instead of hanging the suite) if it blocks."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["summary"] = run.finish()
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"finish() did not return within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["summary"]


# -- deep nesting and circular references ----------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    current = top
    for _ in range(depth):
        current["a"] = {}
        current = current["a"]
    return top


def _circular_info() -> dict[str, Any]:
    episode = small_episode("loop")
    info: dict[str, Any] = {"ok": 1}
    info["self"] = info
    episode["traces"][0]["info"] = info
    return episode


def _circular_config() -> dict[str, Any]:
    episode = small_episode("loop")
    config = episode["traces"][0]["agent"]["config"]
    config["parent"] = config  # inside the subtree masking walks
    return episode


@pytest.mark.parametrize(
    ("episode", "field", "reason"),
    [
        ({**small_episode("deep"), "extra": _nested(300)}, "extra.a.a", "nested"),
        ({**small_episode("deep"), "extra": _nested(5000)}, "extra.a.a", "nested"),
        (_circular_info(), "traces[0].info.self", "circular"),
        (_circular_config(), "traces[0].agent.config.parent", "circular"),
    ],
    ids=["300-levels", "5000-levels", "cycle", "cycle-in-config"],
)
def test_deep_nesting_and_cycles_raise_not_serializable_naming_the_field(
    tmp_path: Path, episode: dict[str, Any], field: str, reason: str
) -> None:
    run = basic_run(tmp_path)
    with pytest.raises(RecordNotSerializableError) as refused:
        run.log_episodes([small_episode("good"), episode])
    message = str(refused.value)
    assert field in message and reason in message
    assert "\n" not in message and len(message) < 400
    assert episode_metas(tmp_path) == []
    assert run.log_episodes([small_episode("good")]) == 1
    finish_within(run, 10)
