"""The supersede rule for a results file rewritten by verifiers' --resume."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, strategies as st

from prime_runs_spool.content.supersede import effective, kept_episode_ids, superseded_ids, supersedes_of


def test_kept_ids_are_the_rows_verifiers_would_read(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(
        json.dumps({"id": "a", "traces": []}).encode() + b"\n"
        + b"\n"                                              # blank
        + b'{"id": "torn", "traces": [\n'                    # torn row: dropped by verifiers too
        + json.dumps({"id": "no-traces"}).encode() + b"\n"   # not an episode row
        + json.dumps({"id": "b", "traces": []}).encode()     # no final newline
    )
    assert kept_episode_ids(path) == {"a", "b"}
    assert kept_episode_ids(tmp_path / "missing.jsonl") == set()


def test_the_spools_episodes_missing_from_the_rewritten_file_are_superseded() -> None:
    spool = ["ok1", "err1", "ok2", "err2", "err1", None]
    assert superseded_ids(spool, kept={"ok1", "ok2"}) == ["err1", "err2"]
    assert supersedes_of([{"supersedes": ["err1"]}, {"name": "x"}, None, {"supersedes": ["err2"]}]) == {"err1", "err2"}


@given(st.lists(st.sampled_from("abcdef"), max_size=12), st.sets(st.sampled_from("abcdef")))
def test_effective_set_is_the_spool_minus_the_superseded(spool: list[str], kept: set[str]) -> None:
    gone = set(superseded_ids(spool, kept))
    assert gone == set(spool) - kept
    assert list(effective(((i, i) for i in spool), gone)) == [i for i in spool if i in kept]
