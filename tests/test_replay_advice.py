"""Every ``--replay`` a sync refusal advises pushes the run again as a new evaluation when run
as printed, also when the refused sync was itself an unfinished replay: ``--replay`` alone
continues that replay (sync/replay.py) and met the same refusal again, so there the advice
is ``--replay --replay-id NEW``. An evaluation deleted on the platform, a platform holding
rows the state cannot account for, and lines lost under the cursor; each on a replay that
has not ended (its writer still live), the real command line and the real local platform.
A 404 on a path that names no evaluation gets no replay advice at all."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.spool.layout import durable_mark_path_of, segment_path
from support.env import CLI, child_env
from support.runs import RunBuilder

pytestmark = pytest.mark.slow  # three or four syncs each

#: The replay options an advice may give.
ADVICE = re.compile(r"--replay(?: --replay-id [0-9a-f]{32})?")


class Local:
    """``prime-runs sync RUN --local --db DB --to samples --json OPTIONS``: exit code and report."""

    def __init__(self, tmp_path: Path, run_dir: Path) -> None:
        self.run_dir, self.db = run_dir, tmp_path / "local.db"
        self.env = child_env(XDG_CACHE_HOME=str(tmp_path / "cache"))

    def __call__(self, *options: str) -> tuple[int, dict]:
        return self.pasted(shlex.join(["--replay", *options]))

    def pasted(self, options: str) -> tuple[int, dict]:
        """The sync with ``options`` as a shell reads them from a message."""
        command = shlex.join([*CLI, "sync", str(self.run_dir), "--local", "--db", str(self.db), "--to", "samples",
                              "--request-lifetime", "1", "--json"]) + " " + options
        ran = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120, env=self.env)
        assert "Traceback" not in ran.stderr, ran.stderr
        (report,) = json.loads(ran.stdout)["runs"]
        return ran.returncode, report


def _live_replay(tmp_path: Path, name: str, episodes: int) -> tuple[RunBuilder, Local, dict]:
    """A live run pushed with ``--replay``: the replay stays unfinished while its writer lives."""
    builder = RunBuilder(tmp_path / "runs" / name, name)
    builder.open_segment()
    builder.add(episodes)
    local = Local(tmp_path, builder.run_dir)
    code, report = local()
    assert (code, report["state"], report["pushed_total"]) == (0, "live", episodes), report
    assert report["replay_id"], report
    return builder, local, report


def _refused_then_advised(local: Local, first: dict, *, expected: tuple[str, int]) -> str:
    """The refused ``--replay`` (exit 1, one line), then its advice run as printed: a new
    evaluation with the run's state ``expected`` (state, pushed). Returns the refusal."""
    code, refused = local()
    assert code == 1 and refused["state"] in ("error", "lost") and "\n" not in refused["error"], refused
    advised = ADVICE.findall(refused["error"])
    assert len(advised) == 1, refused["error"]
    code, done = local.pasted(advised[0])
    assert (code, done["state"], done["pushed_total"]) == (0, *expected), (advised, refused["error"], done)
    assert done["evaluation_id"] != first["evaluation_id"] and done["replay_id"] != first["replay_id"], done
    return refused["error"]


def test_an_unfinished_replays_deleted_evaluation_is_told_a_replay_that_starts_anew(tmp_path: Path) -> None:
    builder, local, first = _live_replay(tmp_path, "deleted", 3)
    with sqlite3.connect(local.db) as db:  # someone deleted the evaluation on the platform
        db.execute("DELETE FROM samples WHERE evaluation_id = ?", (first["evaluation_id"],))
        db.execute("DELETE FROM evaluations WHERE id = ?", (first["evaluation_id"],))
    builder.add(2)
    error = _refused_then_advised(local, first, expected=("live", 5))
    assert "answered 404" in error and "does not know this evaluation" in error, error


def test_an_unfinished_replays_mismatch_is_told_a_replay_that_starts_anew(tmp_path: Path) -> None:
    builder, local, first = _live_replay(tmp_path, "mismatch", 3)
    store = Store(local.db)  # something else wrote to the evaluation, as the platform takes a push
    try:
        store.append_samples(first["evaluation_id"], ["{}"])
    finally:
        store.close()
    builder.seal()
    error = _refused_then_advised(local, first, expected=("synced", 3))
    assert "holds 4 samples" in error, error


def test_an_unfinished_replays_lost_lines_are_told_a_replay_that_starts_anew(tmp_path: Path) -> None:
    builder, local, first = _live_replay(tmp_path, "lost", 3)
    builder.abandon()  # the writer killed; then a power cut takes back its last two lines
    segment = segment_path(builder.run_dir, 1)
    lines = segment.read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[:-2])
    segment.write_bytes(kept)
    durable_mark_path_of(segment).write_bytes(b"%020d\n" % len(kept))
    error = _refused_then_advised(local, first, expected=("crashed", 1))
    assert "not finalized" in error, error


def test_a_404_about_no_evaluation_advises_no_replay() -> None:
    """A create (``POST /evaluations/``) or an environment's lookup answered 404: no
    evaluation is unknown, and a replay would create again into the same answer."""
    import httpx

    from prime_runs_spool.errors import UnknownEvaluation
    from prime_runs_spool.platform_api.client import classify_response

    for path in ("/evaluations/", "/environmentshub/resolve"):
        error = classify_response("POST", path, httpx.Response(404, json={"detail": "environment not found"}))
        assert not isinstance(error, UnknownEvaluation) and "replay" not in str(error), str(error)
    gone = classify_response("POST", "/evaluations/abc/samples", httpx.Response(404))
    assert isinstance(gone, UnknownEvaluation) and "does not know this evaluation" in str(gone), str(gone)
