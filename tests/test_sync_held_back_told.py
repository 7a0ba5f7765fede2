"""A run that did not complete keeps its errored episodes for a ``--resume`` to retry
(docs/sync.md, "Resumed runs"); sync says so on the run's line and in ``--json``
(``held_back``). It used to print ``crashed ... pushed 0 (total 0)``, exit 0, and nothing
more: the episodes were in the spool and nowhere said why none went."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import local_sync, run_cli
from support.runs import RunBuilder

HELD_LINE = ("  held back: 3 episodes that errored, kept for a --resume to retry; sent once the run completes "
             "(docs/sync.md, \"Resumed runs\")")


def _lines(root: Path, db: Path) -> list[str]:
    result = run_cli("sync", "--local", "--db", str(db), "--to", "samples", "--request-lifetime", "1", str(root))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.slow
def test_a_crashed_run_s_held_back_episodes_are_said_until_it_completes(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "r", "held-told")
    builder.open_segment()
    builder.add(2)
    builder.add(3, ok=False)
    builder.abandon()  # crashed: its writer gone without a seal
    db = tmp_path / "local.db"
    first = _lines(tmp_path / "runs", db)
    assert first[0].startswith("crashed ") and " pushed 2 (total 2) " in first[0], first
    assert first[1] == HELD_LINE, first
    again = _lines(tmp_path / "runs", db)  # up to date: still said
    assert again[0].startswith("up_to_date ") and again[1] == HELD_LINE, again
    (report,) = json.loads(local_sync(tmp_path / "runs", db).stdout)["runs"]
    assert report["held_back"] == 3, report
    builder.open_segment()  # a --resume that completes the run: the held ones go
    builder.seal()
    done = _lines(tmp_path / "runs", db)
    assert done[0].startswith("synced ") and " pushed 3 (total 5) " in done[0], done
    assert not any("held back" in line for line in done), done
    (report,) = json.loads(local_sync(tmp_path / "runs", db).stdout)["runs"]
    assert report["held_back"] == 0, report
