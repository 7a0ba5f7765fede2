"""Lines that vanish beneath sync's cursor (docs/sync.md, "Lines lost under the cursor"): a
power cut takes back a dead writer's last lines after sync pushed them. The next sync and
``status`` say so, the run is never finalized as if nothing happened, and a reader that
ships a dead writer's tail fsyncs the segment first (docs/spool-format.md, section 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prime_runs_spool.spool.layout import durable_mark_path_of, segment_path
from prime_runs_spool.spool.reader import iter_records
from support.disk import fsynced_files
from support.cli import local_sync, run_cli
from support.env import CLI, REPO_ROOT, child_env
from support.runs import RunBuilder
from support.sync_e2e import TOKEN, api, evaluations_of, run_sync, server  # noqa: F401


def _report(result: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(result.stdout)["runs"][0]


def _status(path: Path) -> dict:
    result = subprocess.run(CLI + ["status", str(path), "--json"], capture_output=True, text=True, env=child_env(),
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["runs"][0]


def _power_cut(segment: Path, keep_episodes: int, how: str) -> int:
    """What a power cut can leave of a dead writer's never-synced last lines: NUL padding
    where they were, or a shorter file; and a durable mark no further than what is left (it
    is never fsync'd either). Returns where the lines now end."""
    data = bytearray(segment.read_bytes())
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    episodes = [s for s in starts[:-1] if b'"type":"episode"' in data[s:data.index(b"\n", s)]]
    cut = episodes[keep_episodes]
    if how == "nul":
        end = starts[-1]
        data[cut:end] = bytes(end - cut)
    else:
        del data[cut:]
    segment.write_bytes(bytes(data))
    durable_mark_path_of(segment).write_bytes(b"%020d\n" % cut)
    return cut


@pytest.mark.slow
@pytest.mark.parametrize("how", ["nul", "shorter"])
def test_lines_lost_under_the_cursor_are_reported_and_never_finalized(tmp_path: Path, server, api, how) -> None:
    builder = RunBuilder(tmp_path / "run", f"e2e-lost-{how}")
    builder.open_segment()
    builder.add(6)
    builder.abandon()  # a killed writer: unsealed, its lines in the file
    first = run_sync(server.base_url, str(tmp_path), "--json")
    assert (_report(first)["state"], _report(first)["pushed_now"]) == ("crashed", 6), first.stdout + first.stderr

    segment = segment_path(builder.run_dir, 1)
    _power_cut(segment, 3, how)
    assert _status(tmp_path)["destinations"][0]["lost"], "status must say the spool lost pushed lines"

    lost = run_sync(server.base_url, str(tmp_path), "--json")
    report = _report(lost)
    assert lost.returncode == 1 and report["state"] == "lost", lost.stdout + lost.stderr
    assert "seg-000001.jsonl" in report["error"] and report["pushed_now"] == 0
    text = subprocess.run(CLI + ["status", str(tmp_path)], capture_output=True, text=True, env=child_env(), timeout=60)
    assert "LOST: the spool no longer holds what was pushed" in text.stdout, text.stdout
    assert "MISMATCH" in text.stdout, text.stdout  # recorded in the state by the sync that found it

    # The run is resumed and completed: still never finalized over the lost rows.
    builder.open_segment()
    builder.add(2)
    builder.seal()
    again = run_sync(server.base_url, str(tmp_path), "--json")
    assert again.returncode == 1 and _report(again)["state"] == "lost", again.stdout + again.stderr
    evaluation = api.get(f"/evaluations/{evaluations_of(api, builder.run_id)[0]['evaluation_id']}").json()
    assert evaluation["finalize_count"] == 0 and evaluation["status"] != "COMPLETED"
    assert evaluation["total_samples"] == 6
    assert "lost lines already pushed" in evaluation["metadata"]["prime_runs_mismatch"]["detail"]


@pytest.mark.slow
def test_the_ci_script_names_a_run_that_lost_lines_as_failed(tmp_path: Path, server) -> None:
    """docs/ci/sync-artifacts.sh exits 1 for a ``lost`` run, as sync does; the job's log must
    name that run on stderr (``FAILED ...``), as it names an ``error`` or ``corrupt`` one, or
    the job fails with nothing in its log saying which run or why."""
    builder = RunBuilder(tmp_path / "outputs" / "run", "ci-lost")
    builder.open_segment()
    builder.add(4)
    builder.abandon()
    env = child_env(PRIME_RUNS=f"{sys.executable} -m commands", PRIME_API_BASE_URL=server.base_url,
                    PRIME_API_KEY=TOKEN, HOME=str(tmp_path))

    def job() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(REPO_ROOT / "docs" / "ci" / "sync-artifacts.sh"), "outputs"],
                              cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)

    first = job()
    assert first.returncode == 0 and "crashed" in first.stdout, first.stdout + first.stderr
    _power_cut(segment_path(builder.run_dir, 1), 2, "shorter")
    lost = job()
    assert lost.returncode == 1, lost.stdout + lost.stderr
    assert "FAILED outputs/run: " in lost.stderr and "seg-000001.jsonl" in lost.stderr, lost.stderr


def test_a_dead_writers_segment_is_fsynced_before_a_shipping_read(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that ships (``durable_only``) makes a dead writer's page-cache bytes durable
    before it reads them; a live writer's are read only up to its mark, never synced here."""
    builder = RunBuilder(tmp_path / "run", "fsync-dead")
    builder.open_segment()
    builder.add(2)
    synced = fsynced_files(monkeypatch)
    segment = segment_path(builder.run_dir, 1)
    identity = (segment.stat().st_dev, segment.stat().st_ino)
    list(iter_records(builder.run_dir, durable_only=True))
    assert identity not in synced  # the writer lives: its mark says what is durable
    builder.abandon()
    records = list(iter_records(builder.run_dir, durable_only=True))
    assert synced.count(identity) == 1 and len(records) == 3
    list(iter_records(builder.run_dir, durable_only=True))
    assert synced.count(identity) == 1  # unchanged since: not synced again
    list(iter_records(builder.run_dir))  # a read that ships nothing never syncs
    assert synced.count(identity) == 1


def test_a_position_that_no_longer_starts_a_line_is_refused_by_the_reader(tmp_path: Path) -> None:
    from prime_runs_spool.errors import PositionLostError
    from prime_runs_spool.spool.reader import Position, position_lost
    from support.segments import build_segment, write_segment

    content, written = build_segment([{"i": i} for i in range(4)], seal=None)
    position = Position(1, written[3][0], written[3][2])  # the start of the third episode
    segment = write_segment(tmp_path, content)
    assert [r.seq for r in iter_records(tmp_path, position)] == [4, 5]
    for name, lost in (("nul", content[:written[2][0]] + bytes(len(content) - written[2][0])),
                       ("shorter", content[:written[2][0]]),
                       ("mid-line", content[:written[3][0] - 5] + content[written[3][0]:])):
        segment.write_bytes(lost)
        assert position_lost(segment, position), name
        with pytest.raises(PositionLostError, match="seg-000001.jsonl: corrupt at byte"):
            list(iter_records(tmp_path, position))
    # A line glued to a damaged one starts after no line feed, and still holds.
    glued = bytearray(content)
    glued[written[3][0] - 1] = ord("x")
    segment.write_bytes(bytes(glued))
    assert position_lost(segment, position) is None
    assert [r.seq for r in iter_records(tmp_path, position)] == [4, 5]


@pytest.mark.slow
def test_a_synced_segment_cut_to_nothing_reports_what_was_pushed_before(tmp_path: Path, server, api) -> None:
    """A synced run whose only segment is cut to zero bytes (its header and manifest gone,
    so the pass meets the damage before it reads the run's state) is ``corrupt``; its line,
    ``--json`` and ``status`` still count the episodes the platform holds from before
    (not "pushed 0 (total 0)"), and nothing is sent again."""
    builder = RunBuilder(tmp_path / "run", "e2e-cut-to-nothing")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    first = run_sync(server.base_url, str(tmp_path), "--json")
    assert (_report(first)["state"], _report(first)["pushed_total"]) == ("synced", 3), first.stdout + first.stderr

    segment_path(builder.run_dir, 1).write_bytes(b"")
    cut = run_sync(server.base_url, str(tmp_path), "--json")
    report = _report(cut)
    assert cut.returncode == 1 and report["state"] == "corrupt", cut.stdout + cut.stderr
    assert (report["pushed_now"], report["pushed_total"]) == (0, 3), report
    text = run_sync(server.base_url, str(tmp_path))
    assert "pushed 0 (total 3)" in text.stdout, text.stdout + text.stderr
    status = _status(tmp_path)
    assert status["destinations"][0]["episodes_pushed"] == 3, status
    evaluation = evaluations_of(api, builder.run_id)
    assert len(evaluation) == 1 and evaluation[0]["total_samples"] == 3


def _flip(segment: Path, offset: int) -> None:
    data = bytearray(segment.read_bytes())
    data[offset] ^= 1
    segment.write_bytes(bytes(data))


@pytest.mark.slow
def test_damage_in_lines_already_pushed_is_said_by_every_sync_while_it_is_there(tmp_path: Path) -> None:
    """A byte flipped in a synced segment keeps its size: sync said up_to_date, nothing more,
    while status and verify said corrupt. The platform holds every line, so the run stays
    up to date (exit 0), with a warning naming the damage, until the copy is whole again;
    then the new version is recorded and nothing is said."""
    builder = RunBuilder(tmp_path / "runs" / "run", "flipped-after-push")
    builder.open_segment()
    builder.add(4)
    builder.seal()
    db = tmp_path / "local.db"
    first = local_sync(tmp_path / "runs", db)
    assert first.returncode == 0 and _report(first)["state"] == "synced", first.stdout + first.stderr
    segment = segment_path(builder.run_dir, 1)
    middle = segment.stat().st_size // 2
    _flip(segment, middle)

    for _ in range(2):  # said again while the damage is there: the version is not recorded over it
        damaged = local_sync(tmp_path / "runs", db)
        report = _report(damaged)
        assert damaged.returncode == 0 and report["state"] == "up_to_date", damaged.stdout + damaged.stderr
        assert report["pushed_now"] == 0 and report["pushed_total"] == 4
        said = [w for w in report["warnings"] if "corrupt at byte" in w]
        assert said and "in lines already pushed" in said[0] and "prime-runs verify" in said[0], report["warnings"]
    text = run_cli("sync", "--local", "--db", str(db), "--to", "samples", str(tmp_path / "runs"))
    assert text.returncode == 0 and "warning: " in text.stdout and "corrupt at byte" in text.stdout, text.stdout

    _flip(segment, middle)  # whole again, at another version: read once, then nothing said
    for _ in range(2):
        whole = local_sync(tmp_path / "runs", db)
        assert whole.returncode == 0 and _report(whole)["state"] == "up_to_date", whole.stdout + whole.stderr
        assert _report(whole)["warnings"] == [], _report(whole)["warnings"]


@pytest.mark.slow
@pytest.mark.parametrize("damaged", [1, 2])
def test_damage_in_an_earlier_segment_of_a_resumed_run_is_said_by_every_sync(tmp_path: Path, damaged: int) -> None:
    """As above, in a segment before the last of a run resumed twice (its first, or one in
    the middle): only the last segment's version was kept, so sync said up_to_date, nothing
    more, while verify said corrupt. Each segment's version is kept when the run's end is
    recorded; one that moved is read again by the pass, once, as the last one's is."""
    builder = RunBuilder(tmp_path / "runs" / "run", f"flipped-earlier-{damaged}")
    builder.open_segment()
    builder.add(2)
    builder.abandon()
    builder.open_segment(counted=True)
    builder.add(2)
    builder.abandon()
    builder.open_segment(counted=True)
    builder.add(2)
    builder.seal()
    db = tmp_path / "local.db"
    first = local_sync(tmp_path / "runs", db)
    assert first.returncode == 0 and _report(first)["state"] == "synced", first.stdout + first.stderr
    segment = segment_path(builder.run_dir, damaged)
    middle = segment.stat().st_size // 2
    _flip(segment, middle)

    for _ in range(2):  # said again while the damage is there
        report = _report(local_sync(tmp_path / "runs", db))
        assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("up_to_date", 0, 6), report
        said = [w for w in report["warnings"] if "corrupt at byte" in w]
        assert said and "in lines already pushed" in said[0] and f"seg-00000{damaged}" in said[0], report["warnings"]

    _flip(segment, middle)  # whole again, at another version: read once, then nothing said
    for _ in range(2):
        whole = local_sync(tmp_path / "runs", db)
        assert whole.returncode == 0 and _report(whole)["state"] == "up_to_date", whole.stdout + whole.stderr
        assert _report(whole)["warnings"] == [], _report(whole)["warnings"]


@pytest.mark.slow
def test_a_run_whose_segments_were_deleted_is_named_by_every_walk(tmp_path: Path) -> None:
    """A cleanup that deleted a synced run's ``*.jsonl`` (``find -name '*.jsonl' -delete``)
    leaves its spool folder with the segment's durable mark and the sync state: the run's
    episodes are gone from this copy. ``status``, ``verify``, ``sync`` and ``export`` of the
    folder above it name the run and why, with the exit codes of an unreadable run (docs/cli.md);
    they passed over it as a folder holding no run (``status``: 1 run listed of 2, exit 0;
    the run given itself: "nothing found"). The other run is reported as before."""
    from support.runs import build_run

    gone, kept = build_run(tmp_path / "runs" / "gone", "segments-deleted", 3), build_run(
        tmp_path / "runs" / "kept", "segments-kept", 2)
    db = tmp_path / "local.db"
    first = local_sync(tmp_path / "runs", db)
    assert first.returncode == 0, first.stdout + first.stderr
    assert durable_mark_path_of(segment_path(gone.run_dir, 1)).exists()
    segment_path(gone.run_dir, 1).unlink()

    status = run_cli("status", str(tmp_path / "runs"), "--json")
    runs = {Path(run["path"]).name: run for run in json.loads(status.stdout)["runs"]}
    assert status.returncode == 0 and set(runs) == {"gone", "kept"}, status.stdout + status.stderr
    assert runs["gone"]["state"] == "error" and "no segment left" in json.dumps(runs["gone"]), runs["gone"]
    verify = run_cli("verify", str(tmp_path / "runs"))
    assert verify.returncode == 1 and "gone" in verify.stdout and "no segment left" in verify.stdout + verify.stderr
    sync = local_sync(tmp_path / "runs", db)
    reports = {Path(run["path"]).name: run for run in json.loads(sync.stdout)["runs"]}
    assert sync.returncode == 1 and reports["gone"]["state"] == "error", sync.stdout + sync.stderr
    assert reports["kept"]["state"] == "up_to_date", reports
    export = run_cli("export", str(tmp_path / "runs"), "-o", str(tmp_path / "rows.jsonl"))
    assert export.returncode == 1 and "no segment left" in export.stderr, export.stdout + export.stderr
    alone = run_cli("status", str(gone.run_dir))
    assert "nothing found" not in alone.stderr and "no segment left" in alone.stdout + alone.stderr, alone.stderr
    assert kept.run_dir.is_dir()


@pytest.mark.slow
def test_a_sync_of_a_run_whose_segments_were_deleted_counts_what_the_platform_holds(tmp_path: Path) -> None:
    """A synced run whose ``*.jsonl`` a cleanup deleted (its durable mark and sync state
    left): its sync says ``error`` and why, exit 1, as ``status`` does, and counts what its
    destination holds from before, the state's evaluation and total. It said ``pushed 0
    (total 0)`` of a run whose 3 episodes the platform holds (its state was not read)."""
    from support.runs import build_run

    gone = build_run(tmp_path / "runs" / "gone", "segments-deleted-count", 3)
    db = tmp_path / "local.db"
    first = local_sync(gone.run_dir, db)
    assert first.returncode == 0, first.stdout + first.stderr
    evaluation = _report(first)["evaluation_id"]
    segment_path(gone.run_dir, 1).unlink()

    sync = local_sync(gone.run_dir, db)
    report = _report(sync)
    assert sync.returncode == 1 and report["state"] == "error", sync.stdout + sync.stderr
    assert "no segment left" in report["error"], report
    assert (report["evaluation_id"], report["pushed_now"], report["pushed_total"]) == (evaluation, 0, 3), report
    text = run_cli("sync", "--local", "--db", str(db), "--to", "samples", str(gone.run_dir))
    assert text.returncode == 1 and "pushed 0 (total 3)" in text.stdout, text.stdout + text.stderr
