"""Hostile review of this session's speed cuts on the append path (append1, append2).

Each test holds a guarantee one of the cuts could have weakened: an episode refused by a
call is not taken for a duplicate later (the run frames episode meta itself, under its
lock); masking's one-key route masks exactly what a plain walk does; the writer's inline
lone-appender path reports nothing durable that is not, and never hangs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import open_run
from prime_runs_spool.errors import RecordNotSerializableError
from prime_runs_spool.spool.format import parse_line
from prime_runs_spool.spool.layout import list_segments


def basic_run(run_dir: Path, **kwargs: Any):
    return open_run(run_dir, name="hostile-append", environments=["gsm8k"], model="m", **kwargs)


def episode_ids_on_disk(run_dir: Path) -> list[Any]:
    found = []
    for _, path in list_segments(run_dir):
        for raw in path.read_bytes().splitlines(keepends=True):
            line = parse_line(raw)
            if line is not None and line.type == "episode":
                found.append(line.meta["episode_id"])
    return found


class _SurrogateId(str):
    """An id that serializes (orjson writes a str subclass by its content) but whose text,
    the id the run de-duplicates and frames by, is not valid UTF-8."""

    def __str__(self) -> str:
        return "bad-\udc80"


def test_an_episode_id_the_meta_cannot_hold_is_refused_before_any_id_is_taken(tmp_path: Path):
    # The run frames the meta itself (format.episode_rest) under its lock, after taking the
    # call's ids: an id that meta cannot serialize once raised there, leaving every id of
    # the call taken, so a retry of the good episodes was silently skipped as duplicates.
    run = basic_run(tmp_path / "run")
    with pytest.raises(RecordNotSerializableError):
        run.log_episodes([{"id": "good", "traces": []}, {"id": _SurrogateId("x"), "traces": []}])
    assert run.log_episodes([{"id": "good", "traces": []}]) == 1
    assert run.episodes_skipped == 0
    with pytest.raises(RecordNotSerializableError):  # the bad one meets its error again
        run.log_episodes([{"id": _SurrogateId("x"), "traces": []}])
    run.finish()
    assert episode_ids_on_disk(tmp_path / "run") == ["good"]
