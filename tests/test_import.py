"""``prime-runs import``: real verifiers 0.4.0 output folders (fixtures/eval_outputs) become
spools exactly as the live path writes them, once, incrementally, with nothing in clear text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fixtures.make_eval_outputs import FAKE_CREDENTIAL
from prime_runs_spool import read_run
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.importer.outputs import import_output
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.layout import list_segments

from support.env import CLI, REPO_ROOT, VF040, child_env
from support.files import all_bytes_under
from support.odd_files import not_a_regular_file
from support.cli import last_line, run_cli

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def copy_fixture(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "outputs"
    root.mkdir(exist_ok=True)
    for name in names:
        shutil.copytree(EVAL_OUTPUTS / name, root / name, symlinks=True)
    return root


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout, env=child_env())


def traces_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]


def spool_files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted((run_dir / "spool").rglob("*")) if p.is_file()}


def db_rows(db: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    store = Store(db)
    try:
        evaluations, _ = store.list_evaluations(skip=0, limit=100)
        out = []
        for evaluation in evaluations:
            bodies, _ = store.list_samples(evaluation["evaluation_id"], offset=0, limit=1000)
            out.append((evaluation, [json.loads(body) for body in bodies]))
        return out
    finally:
        store.close()


def upstream_rows(episodes: list[dict[str, Any]], evaluation_id: str) -> list[dict[str, Any]]:
    """prime_runs.projection.build_samples over verifiers' own episode objects (as the live
    SDK projects them), from the masked episodes keyed to the evaluation as the SDK keys them
    (``stamp_run``: run.id on the episode and every member trace)."""
    from prime_runs.projection import build_samples
    from prime_runs.sinks.base import stamp_run
    from verifiers.v1.episode import WireEpisode
    from verifiers.v1.task import WireTaskData
    from verifiers.v1.trace import Trace

    objects = []
    for record in episodes:
        record = stamp_run(mask(record, MaskRules.defaults_for_episode()), evaluation_id)
        episode = WireEpisode.model_validate({**record, "traces": []})
        episode.traces = [Trace[WireTaskData].model_validate(trace) for trace in record["traces"]]
        objects.append(episode)
    return json.loads(json.dumps(build_samples(objects)))


@pytest.mark.slow
def test_import_then_sync_local_one_evaluation_per_run_rows_are_the_projection(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed", "vf040-cancelled", "v0-completed")
    done = cli("import", str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("imported ") == 3
    db = tmp_path / "platform.db"
    synced = cli("sync", str(root), "--local", "--db", str(db), "--json")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    reports = {Path(r["path"]).name: r for r in json.loads(synced.stdout)["runs"]}
    assert {name: r["pushed_now"] for name, r in reports.items()} == {
        "vf040-completed": 4, "vf040-cancelled": 1, "v0-completed": 4}
    assert reports["vf040-completed"]["state"] == "synced" and reports["vf040-cancelled"]["state"] == "cancelled"

    stored = db_rows(db)
    assert len(stored) == 3  # one evaluation per run
    by_run = {evaluation["metadata"]["local_run_id"]: (evaluation, rows) for evaluation, rows in stored}
    for name in ("vf040-completed", "vf040-cancelled"):
        episodes = traces_of(root / name)
        evaluation, rows = by_run[episodes[0]["run"]["id"]]
        assert [row["sample_id"] for row in rows] == [e["id"] for e in episodes]  # each episode once
        assert rows == upstream_rows(episodes, evaluation["evaluation_id"])
        assert evaluation["metadata"]["client"]["headers"] == {"X-Fake-Gateway-Token": "***"}
        assert "config_source" not in evaluation["metadata"]
    completed = by_run[traces_of(root / "vf040-completed")[0]["run"]["id"]][1]
    assert [(r["example_id"], r["rollout_number"]) for r in completed] == [(0, 1), (0, 2), (1, 1), (1, 2)]

    # The fake credential is in the sources, and in nothing the package wrote.
    assert FAKE_CREDENTIAL.encode() in all_bytes_under(root / "vf040-completed")
    for name in ("vf040-completed", "vf040-cancelled", "v0-completed"):
        assert FAKE_CREDENTIAL.encode() not in all_bytes_under(root / name / "spool")
    assert FAKE_CREDENTIAL.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("platform.db*"))
    assert FAKE_CREDENTIAL not in synced.stdout + synced.stderr + done.stdout + done.stderr


def test_the_spool_is_what_the_live_path_writes(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    report = import_output(run_dir)
    assert (report.state, report.episodes_added, report.status) == ("imported", 4, "completed")
    assert report.warnings == ["config_source left out: eval.toml sets the credential table client.headers"]
    spool = read_run(run_dir)
    episodes = traces_of(run_dir)
    assert spool.run_id == episodes[0]["run"]["id"]
    manifest = spool.manifest
    assert (manifest["name"], manifest["model"], manifest["environments"]) == (
        "vf040-completed", "fake/tiny-model", ["tiny_taskset"])
    assert (manifest["config"]["num_examples"], manifest["config"]["rollouts_per_example"]) == (2, 2)
    records = [r for r in spool.records() if r.type == "episode"]
    assert [r.meta for r in records] == [{"episode_id": e["id"], "rollout_number": n}
                                         for e, n in zip(episodes, [1, 2, 1, 2])]
    assert [r.data for r in records] == [mask(e, MaskRules.defaults_for_episode()) for e in episodes]
    assert all(r.data["traces"][0]["agent"]["config"]["client"]["headers"] == {"X-Fake-Gateway-Token": "***"}
               for r in records)
    assert spool.segments[-1].sealed == "completed"


@pytest.mark.slow
def test_import_twice_changes_nothing(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed", "vf040-cancelled", "vf040-torn")
    assert cli("import", str(root)).returncode == 0
    before = {name: spool_files(root / name) for name in ("vf040-completed", "vf040-cancelled", "vf040-torn")}
    again = cli("import", str(root))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("up_to_date") == 3
    after = {name: spool_files(root / name) for name in before}
    assert after == before  # not even an empty segment


def test_lines_appended_to_traces_go_into_a_new_segment(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    lines = (run_dir / "traces.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "traces.jsonl").write_bytes(b"".join(lines[:2]))
    first = import_output(run_dir)
    assert (first.state, first.episodes_added) == ("imported", 2)
    # Rollouts missing, and the log shows verifiers leaving through its teardown: failed.
    assert (first.status, first.outcome) == ("failed", "failed")
    with open(run_dir / "traces.jsonl", "ab") as handle:
        handle.write(b"".join(lines[2:]))
    second = import_output(run_dir)
    assert (second.state, second.episodes_added, second.episodes_total, second.status) == (
        "appended", 2, 4, "completed")
    segments = read_run(run_dir).segments
    assert [s.episodes for s in segments] == [2, 2]
    episodes = traces_of(run_dir)
    records = [r for r in read_run(run_dir).records() if r.type == "episode"]
    assert [r.meta["episode_id"] for r in records] == [e["id"] for e in episodes]
    assert [r.meta["rollout_number"] for r in records] == [1, 2, 1, 2]
    assert import_output(run_dir).state == "up_to_date"
    assert len(list_segments(run_dir)) == 2


def test_torn_last_line_is_the_end_of_the_data(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-torn")
    report = import_output(root / "vf040-torn")
    assert (report.state, report.episodes_added, report.status) == ("imported", 3, "crashed")
    assert "torn" in report.reason


@pytest.mark.slow
def test_a_bad_middle_line_refuses_that_run_and_the_others_go_on(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-corrupt", "vf040-completed")
    done = cli("import", str(root))
    assert done.returncode == 1
    assert f"{root / 'vf040-corrupt' / 'traces.jsonl'}: line 3 is damaged" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (root / "vf040-corrupt" / "spool").exists()  # nothing imported for that run
    assert read_run(root / "vf040-completed").episodes_count == 4


def test_a_damaged_last_line_that_ends_in_a_line_feed_is_told_as_it_is(tmp_path: Path) -> None:
    """A whole line that does not parse is corruption even when it is the last: the message
    said "and lines follow it" of a line with none after it, sending the user looking for
    lines that are not there."""
    outputs = tmp_path / "other-tool"
    (outputs / "configs").mkdir(parents=True)
    (outputs / "traces.jsonl").write_bytes(b"not json\n")
    done = run_cli("import", str(outputs))
    assert done.returncode == 1, done.stderr
    assert last_line(done) == (
        f"prime-runs: 1 of 1 run could not be imported: {outputs / 'traces.jsonl'}: line 1 is damaged (not JSON: "
        "invalid literal, expected 'null') and it ends in a line feed, so it is no torn tail; nothing of this run "
        "was imported (repair or remove that line, or re-run the eval)")


@pytest.mark.slow
def test_a_resume_that_retried_rollouts_supersedes_them_as_the_live_path_does(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    traces = run_dir / "traces.jsonl"
    episodes = traces_of(run_dir)
    episodes[1]["ok"] = False  # an errored attempt: what verifiers' --resume re-runs
    traces.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    assert import_output(run_dir).episodes_added == 4
    retry = json.loads(json.dumps(episodes[1]))
    retry["id"], retry["ok"] = "retry-of-" + episodes[1]["id"], True
    # verifiers' resume rewrites the file with the rollouts it keeps, then appends the retries.
    final = [episodes[0], episodes[2], episodes[3], retry]
    traces.write_text("".join(json.dumps(e) + "\n" for e in final))
    report = import_output(run_dir)
    assert (report.state, report.episodes_added, report.superseded, report.episodes_total) == ("appended", 1, 1, 4)
    assert read_run(run_dir).segments[-1].sealed == "completed"
    again = import_output(run_dir)
    assert (again.state, again.episodes_total) == ("up_to_date", 4)
    assert len(read_run(run_dir).segments) == 2
    db = tmp_path / "p.db"
    synced = cli("sync", str(root), "--local", "--db", str(db), "--json")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    ((evaluation, rows),) = db_rows(db)
    assert [row["sample_id"] for row in rows] == [e["id"] for e in final]  # each slot once, the retry
    assert rows == upstream_rows(final, evaluation["evaluation_id"])


@pytest.mark.slow
def test_a_traces_file_that_lost_its_last_lines_in_place_supersedes_nothing(tmp_path: Path) -> None:
    """vf-eval never fsyncs ``traces.jsonl``: a power cut after an import can take back its
    last lines, leaving the same file, shorter. No ``--resume`` did that (it writes a new file
    and renames it in), so the episodes the spool holds durably are not superseded: the run
    is left as imported (exit 1, said), and sync ships every one of them."""
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    traces = run_dir / "traces.jsonl"
    lines = traces.read_bytes().splitlines(keepends=True)
    assert import_output(run_dir).episodes_added == len(lines) == 4
    before = spool_files(run_dir)
    with open(traces, "r+b") as handle:  # what the power cut leaves: the same file, its last line gone
        handle.truncate(sum(map(len, lines[:-1])))
    shown = cli("status", str(root))
    assert "lost in place" in shown.stdout and "supersedes them" not in shown.stdout, shown.stdout
    report = import_output(run_dir)
    assert report.state == "left" and "lines were lost in place" in report.error, report
    assert spool_files(run_dir) == before  # nothing superseded, no segment re-sealing it failed
    db = tmp_path / "p.db"
    synced = cli("sync", str(root), "--local", "--db", str(db), "--json")
    assert synced.returncode == 1, synced.stdout + synced.stderr  # the import's refusal is said
    ((evaluation, rows),) = db_rows(db)
    assert len(rows) == 4 and evaluation["status"] == "COMPLETED"


def test_a_changed_v0_results_file_is_left_as_imported(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "v0-completed")
    run_dir = root / "v0-completed"
    import_output(run_dir)
    before = spool_files(run_dir)
    results = run_dir / "results.jsonl"
    results.write_bytes(b"".join(results.read_bytes().splitlines(keepends=True)[1:]))
    report = import_output(run_dir)
    assert report.state == "left" and "no longer in results.jsonl" in report.error
    assert spool_files(run_dir) == before


@pytest.mark.slow
def test_a_v0_results_file_without_its_metadata_is_named_not_passed_over(tmp_path: Path) -> None:
    """``results.jsonl`` whose ``metadata.json`` is gone (lost in a copy, or the eval stopped
    before writing it) cannot be imported (the run id is derived from the metadata), and a
    walk passed it over without a word: status listed nothing, sync said nothing of it and
    exited 0, and its episodes never reached the platform. It is now found, named in one
    line (exit 1), the other runs synced; a ``results.jsonl`` that is no v0 run (a table
    ``prime-runs export`` wrote) is still no run."""
    root = copy_fixture(tmp_path, "v0-completed", "vf040-completed")
    (root / "v0-completed" / "metadata.json").unlink()
    table = root / "tables" / "results.jsonl"
    table.parent.mkdir()
    assert import_output(root / "vf040-completed").state == "imported"
    assert run_cli("export", str(root / "vf040-completed"), "-o", str(table)).returncode == 0
    missing = root / "v0-completed" / "metadata.json"

    status = run_cli("status", str(root))
    assert f"not spooled {root / 'v0-completed'}" in status.stdout, status.stdout
    assert "tables" not in status.stdout + status.stderr
    done = run_cli("sync", "--local", "--db", str(tmp_path / "platform.db"), str(root))
    assert done.returncode == 1, done.stdout + done.stderr
    said = f"{missing} is missing beside results.jsonl: the older layout's run is named by it"
    assert said in done.stdout and said in done.stderr and "Traceback" not in done.stderr
    assert "synced     " + str(root / "vf040-completed") in done.stdout
    assert not (root / "v0-completed" / "spool").exists() and "tables" not in done.stdout + done.stderr
    alone = run_cli("import", str(root / "v0-completed"))
    assert alone.returncode == 1 and said in last_line(alone) and "nothing found" not in alone.stderr

    # Lost after an import took the run: the spool holds it all (the file is written last), so
    # the run is up to date as spooled, said in a warning, and sync goes on: exit 0.
    shutil.copy(EVAL_OUTPUTS / "v0-completed" / "metadata.json", missing)
    assert run_cli("import", str(root / "v0-completed")).returncode == 0
    missing.unlink()
    again = run_cli("sync", "--local", "--db", str(tmp_path / "platform.db"), "--json", str(root / "v0-completed"))
    assert again.returncode == 0, again.stdout + again.stderr
    report = json.loads(again.stdout)
    [kept] = report["imports"]
    assert (kept["state"], kept["episodes_total"]) == ("up_to_date", 4), kept
    assert kept["warnings"] == [f"{missing} is missing beside results.jsonl: the spool keeps what an earlier "
                                "import took from these outputs (sync ships it); nothing more is read from them "
                                "until it is back"]
    assert [run["state"] for run in report["runs"]] == ["synced"]


@pytest.mark.parametrize("case, status, kind", [
    ("vf040-completed", "completed", "completed"),
    ("vf040-cancelled", "cancelled", "cancelled"),
    ("vf040-torn", "crashed", "crashed"),
    ("vf040-killed", "crashed", "crashed"),  # SIGKILL: the log ends mid-run, no teardown
])
def test_how_the_run_ended(tmp_path: Path, case: str, status: str, kind: str) -> None:
    root = copy_fixture(tmp_path, case)
    report = import_output(root / case)
    assert (report.status, report.outcome) == (status, kind)
    assert read_run(root / case).status == status


def test_without_a_log_or_with_a_log_cut_short_it_never_claims_completed(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    lines = (run_dir / "traces.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "traces.jsonl").write_bytes(b"".join(lines[:3]))
    log = run_dir / "logs" / "attempt_1" / "eval.log"
    text = log.read_text().splitlines(keepends=True)
    log.write_text("".join(line for line in text if "interception down" not in line))  # killed
    killed = import_output(run_dir)
    assert (killed.status, killed.outcome) == ("crashed", "crashed")
    shutil.rmtree(run_dir / "logs")
    shutil.rmtree(run_dir / "spool")
    (run_dir / "traces.jsonl").write_bytes(b"".join(lines))  # every rollout, but no log
    unknown = import_output(run_dir)
    assert unknown.status == "crashed" and "do not say" in unknown.reason


@pytest.mark.slow
def test_nothing_found_exits_1_unless_allow_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = cli("import", str(empty))
    assert done.returncode == 1 and "nothing found" in done.stderr
    assert cli("import", str(empty), "--allow-empty").returncode == 0


def test_concurrent_imports_of_one_run_record_each_episode_once(tmp_path: Path) -> None:
    import threading

    root = copy_fixture(tmp_path, "vf040-completed")
    start = threading.Barrier(6)
    reports = []

    def one() -> None:
        start.wait()
        reports.append(import_output(root / "vf040-completed"))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.state for r in reports) == ["imported"] + ["up_to_date"] * 5, [r.error for r in reports]
    spool = read_run(root / "vf040-completed")
    assert spool.episodes_count == 4 and len(spool.segments) == 1


def test_everything_written_is_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    root = copy_fixture(tmp_path, "vf040-completed")
    import_output(root / "vf040-completed", state_dir=state)
    written = [p for p in state.rglob("*")]
    assert written and all((p.stat().st_mode & 0o777) == (0o700 if p.is_dir() else 0o600) for p in written)


def test_abort_with_a_status_seals_that_status(tmp_path: Path) -> None:
    from prime_runs_spool import open_run

    run = open_run(tmp_path / "r", name="r")
    with pytest.raises(ValueError):
        run.abort("no", status="completed")
    run.abort("the outputs do not say", status="crashed")
    segment = read_run(tmp_path / "r").segments[-1]
    assert segment.sealed == "crashed"


def test_a_run_the_eval_spooled_itself_is_caught_up_in_its_own_spool_never_a_state_dir(tmp_path: Path) -> None:
    """The eval's own spool is the run's one spool: what only traces.jsonl holds (plain
    vf-eval continued the run) goes into it, once; nothing is imported elsewhere."""
    from prime_runs_spool import open_run

    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    episodes = traces_of(run_dir)
    with open_run(run_dir, name="live") as run:
        run.log_episodes(episodes[:1])
    states = []
    for state_dir in (None, tmp_path / "state", None):
        report = import_output(run_dir, state_dir=state_dir)
        states.append((report.state, report.episodes_added))
    assert states == [("appended", len(episodes) - 1), ("spooled", 0), ("spooled", 0)]
    spool = read_run(run_dir)
    assert sorted(e["id"] for e in spool.episodes()) == sorted(e["id"] for e in episodes)
    assert (len(spool.segments), spool.status) == (2, "completed")
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_a_traces_file_beside_the_evals_own_spool_that_lost_lines_in_place_supersedes_nothing(
        tmp_path: Path) -> None:
    """The same for a spool the eval wrote: once its ``traces.jsonl`` was found to agree, the
    same file coming back shorter lost lines, and the spool's episodes are kept."""
    from prime_runs_spool import open_run

    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    traces = run_dir / "traces.jsonl"
    lines = traces.read_bytes().splitlines(keepends=True)
    with open_run(run_dir, name="live") as run:
        run.log_episodes(traces_of(run_dir)[:2])
    assert import_output(run_dir).episodes_added == 2  # plain vf-eval wrote the other two: caught up
    before = spool_files(run_dir)
    with open(traces, "r+b") as handle:  # a power cut takes back its last line, in place
        handle.truncate(sum(map(len, lines[:-1])))
    shown = cli("status", str(root))  # and status says what happened, not that a resume dropped them
    assert "lost in place" in shown.stdout and "supersedes them" not in shown.stdout, shown.stdout
    report = import_output(run_dir)
    assert report.state == "left" and "lines were lost in place" in report.error, report
    assert spool_files(run_dir) == before and len(list(read_run(run_dir).episodes())) == 4


@pytest.mark.slow
def test_an_import_killed_midway_is_completed_by_the_next_each_episode_once(tmp_path: Path) -> None:
    import os
    import signal
    import time

    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    originals = traces_of(run_dir)
    with open(run_dir / "traces.jsonl", "w") as handle:  # 1,200 episodes: long enough to kill midway
        for n in range(1200):
            record = json.loads(json.dumps(originals[n % 4]))
            record["id"] = f"{n:05d}-{record['id']}"
            handle.write(json.dumps(record) + "\n")
    proc = subprocess.Popen(CLI + ["import", str(run_dir)], env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    segment = run_dir / "spool" / "seg-000001.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if segment.exists() and durable_mark(segment) > 200_000:  # not its size: that counts the padding
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the import finished before it could be killed"
    partial = read_run(run_dir).episodes_count
    assert 0 < partial < 1200
    report = import_output(run_dir)
    assert (report.state, report.episodes_total, report.status) == ("appended", 1200, "completed")
    ids = [r.meta["episode_id"] for r in read_run(run_dir).records() if r.type == "episode"]
    assert ids == [f"{n:05d}-{originals[n % 4]['id']}" for n in range(1200)]  # each once, in order
    assert import_output(run_dir).state == "up_to_date"


def test_a_clean_launch_file_is_recorded_as_config_source(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    launch = run_dir / "configs" / "eval.toml"
    text = launch.read_text()
    clean = text[: text.index("[client.headers]")] + text[text.index("[env.taskset]"):]
    launch.write_text(clean)
    report = import_output(run_dir)
    assert report.warnings == []
    # Recorded under today's rule for a live run: byte for byte but for its comments (docs/masking.md).
    from prime_runs_spool.content.manifest import read_config_source

    expected = read_config_source(launch, MaskRules.defaults_for_config(), [])
    assert expected is not None and "tiny_taskset" in expected["text"]
    assert read_run(run_dir).manifest["config_source"] == expected


def test_a_damaged_spool_the_eval_wrote_is_not_caught_up_and_says_so(tmp_path: Path) -> None:
    """Nothing is appended after damage (no reader would reach it): the catch-up passes the
    run over with a warning, and sync reports the damage itself."""
    from prime_runs_spool import open_run

    run_dir = copy_fixture(tmp_path, "vf040-completed") / "vf040-completed"
    episodes = traces_of(run_dir)
    with open_run(run_dir, name="live") as run:
        run.log_episodes(episodes[:2])
    [(_, segment)] = list_segments(run_dir)
    data = bytearray(segment.read_bytes())
    at = data.index(episodes[1]["id"].encode())
    data[at] ^= 0x01
    segment.write_bytes(bytes(data))
    report = import_output(run_dir)
    assert (report.state, report.episodes_added) == ("spooled", 0)
    assert "damaged" in (report.reason or "")
    assert len(list_segments(run_dir)) == 1


def test_an_import_whose_resolved_config_is_a_fifo_is_an_error_not_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    shutil.copytree(VF040, root / "a")
    not_a_regular_file(root / "a" / "configs" / "resolved" / "eval.json", "fifo")
    result = subprocess.run(CLI + ["import", str(root)], capture_output=True, text=True, timeout=20, env=child_env())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "eval.json" in result.stderr.strip().splitlines()[-1]


def test_an_older_layout_row_whose_prompt_is_a_number_is_imported(tmp_path: Path) -> None:
    """row_to_episode iterated the prompt: `prime-runs import` of such a results.jsonl ended
    in a TypeError traceback, and no other folder under the path was imported either."""
    import shutil

    from support.env import REPO_ROOT

    root = tmp_path / "outputs"
    for name in ("a", "b"):
        shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "v0-completed", root / name)
    results = root / "a" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    rows[0]["prompt"], rows[1]["completion"] = 5, True
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_cli("import", "--json", str(root))
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr
    assert [r["state"] for r in json.loads(result.stdout)["imports"]] == ["imported", "imported"]


def test_an_import_that_fails_unexpectedly_does_not_stop_the_others(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from prime_runs_spool.importer import outputs
    from support.env import REPO_ROOT

    root = tmp_path / "outputs"
    for name in ("a", "b"):
        shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", root / name)
    real = outputs.read_source

    def read_source(output_dir: Path):  # noqa: ANN202
        if output_dir.name == "a":
            raise RuntimeError("a bug met on folder a")
        return real(output_dir)

    monkeypatch.setattr(outputs, "read_source", read_source)
    reports = outputs.import_paths([root])
    assert [(Path(r.source).name, r.state) for r in reports] == [("a", "error"), ("b", "imported")]
    assert "internal error: RuntimeError: a bug met on folder a" in (reports[0].error or "")


def test_an_imports_unreadable_config_says_why(tmp_path: Path) -> None:
    """It said "cannot be read as JSON (OSError)": the exception's type, not what is wrong."""
    import shutil

    from support.env import REPO_ROOT

    root = tmp_path / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", root / "a")
    config = root / "a" / "configs" / "resolved" / "eval.json"
    config.unlink()
    os.mkfifo(config)
    result = run_cli("import", str(root), timeout=30)
    assert result.returncode == 1, result.stderr
    assert "eval.json: cannot be read as JSON (not a regular file)" in last_line(result), result.stderr


def test_an_import_mark_that_cannot_be_put_in_place_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk just as ``spool/import.json`` is renamed into place: the import is an
    error that says why, and no ``*.tmp`` is left in the spool for nobody to clean up."""
    import errno

    root = copy_fixture(tmp_path, "vf040-completed")
    real_replace = os.replace

    def full(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(target).endswith("import.json"):
            raise OSError(errno.ENOSPC, "No space left on device", os.fspath(target))
        real_replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full)
    report = import_output(root / "vf040-completed")
    monkeypatch.undo()
    assert report.state == "error" and "No space left on device" in report.error, report
    assert sorted(p.name for p in (root / "vf040-completed").rglob("*.tmp")) == []


@pytest.mark.parametrize("run_id", ["..", ".", "...", "../.."])
def test_a_run_id_of_dots_keeps_each_sources_spool_in_its_own_state_dir_folder(tmp_path: Path, run_id: str) -> None:
    """The state directory files an import under the episodes' run id: one of only dots
    named the folder above (``imports/``), where two sources with that id met in one spool."""
    root = copy_fixture(tmp_path, "vf040-completed", "vf040-cancelled")
    for name in ("vf040-completed", "vf040-cancelled"):
        traces = root / name / "traces.jsonl"
        rows = traces_of(root / name)
        for row in rows:
            row["run"]["id"] = run_id
        traces.write_text("".join(json.dumps(row) + "\n" for row in rows))
    state = tmp_path / "state"
    reports = [import_output(root / name, state_dir=state) for name in ("vf040-completed", "vf040-cancelled")]
    assert [r.state for r in reports] == ["imported", "imported"], reports
    spools = [Path(r.run_dir).resolve() for r in reports]
    assert spools[0] != spools[1]
    for spool in spools:
        assert spool.parent.parent == (state / "imports").resolve(), spool  # imports/<source>/<run>
    assert [len(list(read_run(spool).episodes())) for spool in spools] == [len(traces_of(root / "vf040-completed")),
                                                                           len(traces_of(root / "vf040-cancelled"))]


def test_a_launch_file_that_is_a_symbolic_link_is_not_recorded(tmp_path: Path) -> None:
    """A link's target lies outside the outputs (an artifact unpacked on a CI runner could
    point it at any clean TOML file there): it went to the platform word for word."""
    root = copy_fixture(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text('note = "a file of the machine that imports, not of the run"\n')
    launch = run_dir / "configs" / "eval.toml"
    launch.unlink()
    launch.symlink_to(elsewhere)
    assert import_output(run_dir).state == "imported"
    assert "config_source" not in read_run(run_dir).manifest
    assert b"not of the run" not in all_bytes_under(run_dir / "spool")


def test_a_tree_of_spools_alone_says_there_is_nothing_to_import(tmp_path: Path) -> None:
    """Every run under the path has its spool and no eval output beside it: the import said
    nothing at all (exit 0), as if it had not looked."""
    from support.runs import build_run

    build_run(tmp_path / "outputs" / "run-1", "import-nothing-1", 2)
    build_run(tmp_path / "outputs" / "run-2", "import-nothing-2", 1)
    done = run_cli("import", str(tmp_path / "outputs"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"nothing to import under {tmp_path / 'outputs'}: no eval output without a spool "
                           "(2 spooled runs; prime-runs sync ships them)\n"), done.stdout
