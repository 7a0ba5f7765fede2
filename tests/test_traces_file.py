"""Reading ``traces.jsonl`` strictly (importer/traces_file.py), as properties over any file:
a torn last line is the end of the data; any damaged line before the last is corruption
naming its line; what is read back is exactly the complete episodes, in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_spool.errors import CorruptOutputError
from prime_runs_spool.importer.traces_file import iter_episodes, scan_traces

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
episodes = st.lists(st.builds(lambda n, s: {"id": f"e{n}", "run": {"id": "r"}, "note": s,
                                            "traces": [{"task": {"data": {"idx": n % 3}}}]},
                              st.integers(0, 10_000), _text), max_size=8, unique_by=lambda e: e["id"])


def _write(path: Path, records: list[dict], tail: bytes = b"") -> list[bytes]:
    lines = [json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records]
    path.write_bytes(b"".join(lines) + tail)
    return lines


@settings(max_examples=60, deadline=None)
@given(records=episodes, cut=st.floats(0.05, 0.95), extra=episodes)
def test_a_torn_last_line_is_the_end_of_the_data(tmp_path_factory: pytest.TempPathFactory, records: list[dict],
                                                  cut: float, extra: list[dict]) -> None:
    path = tmp_path_factory.mktemp("t") / "traces.jsonl"
    torn_source = json.dumps({"id": "torn", "traces": [{"x": "y" * 30}]}).encode()
    torn = torn_source[: max(1, int(len(torn_source) * cut))]
    _write(path, records, torn)
    scan = scan_traces(path)
    assert scan.ids == [r["id"] for r in records]
    assert list(iter_episodes(scan)) == records
    assert scan.torn_bytes == len(torn)


@settings(max_examples=60, deadline=None)
@given(before=episodes, after=episodes.filter(bool), garbage=st.binary(min_size=1, max_size=40))
def test_a_damaged_line_before_the_last_is_corruption_naming_it(tmp_path_factory: pytest.TempPathFactory,
                                                                  before: list[dict], after: list[dict],
                                                                  garbage: bytes) -> None:
    path = tmp_path_factory.mktemp("t") / "traces.jsonl"
    bad = b"{" + garbage.replace(b"\n", b" ") + b"\n"
    lines = [json.dumps(r).encode() + b"\n" for r in before] + [bad] + [json.dumps(r).encode() + b"\n" for r in after]
    path.write_bytes(b"".join(lines))
    with pytest.raises(CorruptOutputError) as caught:
        scan_traces(path)
    assert caught.value.line == len(before) + 1 and str(path) in str(caught.value)


def test_blank_lines_are_skipped_and_a_complete_last_line_without_newline_counts(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b'\n{"id":"a","traces":[]}\n  \n{"id":"b","traces":[]}')
    scan = scan_traces(path)
    assert scan.ids == ["a", "b"] and scan.torn_bytes == 0
    path.write_bytes(b'{"id":"a","traces":[]}\n[1,2]\n')  # valid JSON, not an episode, at the end
    with pytest.raises(CorruptOutputError, match="line 2"):
        scan_traces(path)


def test_lines_appended_after_the_scan_are_left_for_the_next_import(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    _write(path, [{"id": "a", "traces": []}])
    scan = scan_traces(path)
    with open(path, "ab") as handle:
        handle.write(b'{"id":"b","traces":[]}\n')
    assert [e["id"] for e in iter_episodes(scan)] == ["a"]


def test_an_episode_the_run_would_refuse_is_refused_before_anything_is_imported(tmp_path: Path) -> None:
    from prime_runs_spool.errors import ImportSourceError

    path = tmp_path / "traces.jsonl"
    _write(path, [{"id": "a", "traces": []}, {"id": "b", "traces": [{"metrics": [1, 2]}]}])
    with pytest.raises(ImportSourceError, match="line 2 cannot be recorded"):
        scan_traces(path)
