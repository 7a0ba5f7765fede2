"""A spool segment cut short below its durable mark (a bad disk, a truncated artifact) while
verifiers' ``traces.jsonl`` beside it is complete. The episodes past the cut are still the
eval's: the import step spools them in a new segment after the damaged one (the damaged
bytes untouched), a plain sync still stops at the damage (``corrupt``, exit 1), and
``sync --skip-corrupt`` puts every episode on the platform exactly once, in the eval's order,
through a SIGKILL and a re-sync; episodes pushed before the spool was cut are not pushed
again (docs/sync.md, "A spool cut short")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.eval_outputs import spooled_as_eval, vf040_outputs
from support.sync_e2e import TOKEN, api, kill_on_progress, server, sync_cmd  # noqa: F401

pytestmark = pytest.mark.slow  # an eval process, sync processes against the platform process

EPISODES = 40
#: Small requests (an episode's rows are about 3 KB): a sync makes many, so a SIGKILL lands mid-way.
SMALL_REQUESTS = ("--max-request-bytes", "6000")


def evaluated(outputs: Path) -> tuple[Path, str, list[str]]:
    """A run folder as ``prime-runs eval`` leaves it: ``traces.jsonl`` (as verifiers writes
    it) and the spool hold the same episodes. The folder, the spool's local run id and the
    episode ids in ``traces.jsonl`` order."""
    run_dir, ids = plain_outputs(outputs)
    return run_dir, spooled_as_eval(run_dir), ids


def plain_outputs(outputs: Path) -> tuple[Path, list[str]]:
    """A run folder as plain ``vf-eval`` leaves it (no spool), ``EPISODES`` episodes in its
    ``traces.jsonl``, and their ids in order."""
    run_dir = outputs / "cut-spool"
    return run_dir, vf040_outputs(run_dir, EPISODES)


def cut(run_dir: Path, keep: int) -> None:
    """Cut the spool's segment in the middle of its line ``keep`` after the header, far below
    its durable mark (which says where the writer's synced bytes ended)."""
    [segment] = sorted((run_dir / "spool").glob("seg-*.jsonl"))
    cut_segment(segment, keep)


def cut_segment(segment: Path, keep: int) -> None:
    lines = segment.read_bytes().split(b"\n")
    at = sum(len(line) + 1 for line in lines[:1 + keep]) + len(lines[1 + keep]) // 2
    with open(segment, "r+b") as handle:
        handle.truncate(at)
    assert at < int(segment.with_suffix(".durable").read_text())


def synced(base_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sync_cmd(base_url, *args), capture_output=True, text=True, timeout=300,
                          env=sync_env(home), stdin=subprocess.DEVNULL)


def sync_env(home: Path) -> dict[str, str]:
    home.mkdir(exist_ok=True)
    return child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))


def evaluations_of(api, local_run_id: str) -> list[dict]:
    """The run's evaluations, whatever their environment."""
    found, skip = [], 0
    while True:
        page = api.get("/evaluations/", params={"skip": skip, "limit": 100}).json()
        found += [e for e in page["evaluations"] if (e.get("metadata") or {}).get("local_run_id") == local_run_id]
        skip += len(page["evaluations"])
        if not page["evaluations"] or skip >= page["total"]:
            return found


def platform_episode_ids(api, run_id: str) -> list[str]:
    """The episode id of every row the platform holds for the run, in order (one evaluation)."""
    evaluations = evaluations_of(api, run_id)
    if not evaluations:
        return []
    [evaluation] = evaluations
    ids, page = [], 1
    while True:
        body = api.get(f"/evaluations/{evaluation['evaluation_id']}/samples",
                       params={"page": page, "limit": 100}).json()
        ids += [row["episode_id"] for row in body["samples"]]
        if not body["hasMore"]:
            return ids
        page += 1


def stops_at_the_cut(base_url: str, home: Path, outputs: Path, *options: str, lost: int) -> dict:
    """A plain sync of a cut spool stops at the cut (exit 1, ``corrupt``), and the import
    warns that ``traces.jsonl`` holds the ``lost`` episodes past it: the import's report."""
    plain = synced(base_url, home, str(outputs), *options, "-o", "json")
    assert plain.returncode == 1, plain.stdout + plain.stderr
    report = json.loads(plain.stdout)
    [run] = report["runs"]
    assert run["state"] == "corrupt" and "seg-000001.jsonl: corrupt at byte" in run["error"], run
    [spooled] = report["imports"]
    assert [w for w in spooled["warnings"] if f"holds {lost} episodes the spool lost past the cut" in w], spooled
    return spooled


def killed_then_synced_whole(base_url: str, home: Path, outputs: Path, api, run_id: str, *options: str,
                             pushed_before: int) -> None:
    """A ``--skip-corrupt`` sync SIGKILLed once it pushed past the ``pushed_before`` episodes
    already there, then run again to its end: the platform holds every episode."""
    proc = subprocess.Popen(sync_cmd(base_url, str(outputs), *options, "--skip-corrupt", *SMALL_REQUESTS),
                            env=sync_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    assert kill_on_progress(proc, lambda: held(api, run_id), 6), "the sync ended before it was killed"
    assert pushed_before < held(api, run_id) < EPISODES
    resumed = synced(base_url, home, str(outputs), *options, "--skip-corrupt", *SMALL_REQUESTS, "-o", "json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [run] = json.loads(resumed.stdout)["runs"]
    assert run["pushed_total"] == EPISODES, run


def held(api, run_id: str) -> int:
    return sum(e.get("total_samples") or 0 for e in evaluations_of(api, run_id))


def test_episodes_a_cut_spool_lost_reach_the_platform_once_from_traces_jsonl(tmp_path: Path, server, api) -> None:
    outputs = tmp_path / "outputs"
    run_dir, run_id, ids = evaluated(outputs)
    cut(run_dir, keep=10)  # the manifest and 9 episodes stay readable
    home = tmp_path / "home"

    stops_at_the_cut(server.base_url, home, outputs, lost=EPISODES - 9)
    assert platform_episode_ids(api, run_id) == ids[:9]
    damaged = (run_dir / "spool" / "seg-000001.jsonl").read_bytes()

    killed_then_synced_whole(server.base_url, home, outputs, api, run_id, pushed_before=9)
    assert platform_episode_ids(api, run_id) == ids  # each once, in the eval's order
    [evaluation] = evaluations_of(api, run_id)
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert evaluation["total_samples"] == EPISODES
    assert [s for s in evaluation["metadata"]["skipped_corruption"] if s["segment"] == 1], evaluation["metadata"]

    again = synced(server.base_url, home, str(outputs), "--skip-corrupt", "-o", "json")
    assert again.returncode == 0, again.stdout + again.stderr
    [run] = json.loads(again.stdout)["runs"]
    assert (run["pushed_now"], run["pushed_total"]) == (0, EPISODES), run
    assert platform_episode_ids(api, run_id) == ids
    assert (run_dir / "spool" / "seg-000001.jsonl").read_bytes() == damaged  # never rewritten


def test_a_spool_cut_in_its_seal_ends_as_the_eval_did_and_ships_whole(tmp_path: Path, server, api) -> None:
    """Only the seal was cut off (every episode intact): the import made nothing good, since
    traces.jsonl held no episode the spool lacked, so ``--skip-corrupt`` ended the run
    ``crashed``, exit 0, its evaluation closed out as crashed though the eval completed. The
    import now seals the run as the eval ended it, in a new segment after the cut, and
    ``--skip-corrupt`` finalizes it with every episode once."""
    outputs = tmp_path / "outputs"
    run_dir, run_id, ids = evaluated(outputs)
    [segment] = sorted((run_dir / "spool").glob("seg-*.jsonl"))
    with open(segment, "r+b") as handle:
        handle.truncate(segment.stat().st_size - 40)  # within the seal, the last line
    home = tmp_path / "home"

    plain = synced(server.base_url, home, str(outputs), "-o", "json")
    assert plain.returncode == 1, plain.stdout + plain.stderr
    [spooled] = json.loads(plain.stdout)["imports"]
    assert [w for w in spooled["warnings"] if "sealed completed in a new segment" in w], spooled

    passed = synced(server.base_url, home, str(outputs), "--skip-corrupt", "-o", "json")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    [run] = json.loads(passed.stdout)["runs"]
    assert (run["state"], run["pushed_total"]) == ("synced", EPISODES), run
    assert platform_episode_ids(api, run_id) == ids
    [evaluation] = evaluations_of(api, run_id)
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["status"] == "COMPLETED"
    again = synced(server.base_url, home, str(outputs), "--skip-corrupt", "-o", "json")
    assert again.returncode == 0 and json.loads(again.stdout)["imports"] == [], again.stdout
    assert len(sorted((run_dir / "spool").glob("seg-*.jsonl"))) == 2


@pytest.mark.parametrize("state_kept", [True, False], ids=["same-machine", "state-lost"])
def test_episodes_pushed_before_the_spool_was_cut_are_not_pushed_again(tmp_path: Path, server, api,
                                                                        state_kept: bool) -> None:
    outputs = tmp_path / "outputs"
    run_dir, run_id, ids = evaluated(outputs)
    first = synced(server.base_url, tmp_path / "home-1", str(outputs))
    assert first.returncode == 0, first.stdout + first.stderr
    assert platform_episode_ids(api, run_id) == ids

    cut(run_dir, keep=10)
    home = tmp_path / ("home-1" if state_kept else "home-2")
    for flags in ((), ("--skip-corrupt",)):
        again = synced(server.base_url, home, str(outputs), *flags, "-o", "json")
        assert again.returncode == 1, again.stdout + again.stderr
        [run] = json.loads(again.stdout)["runs"]
        assert (run["state"], run["pushed_now"], run["pushed_total"]) == ("lost", 0, EPISODES), run
        assert "lines already read (and shipped) were lost" in run["error"], run
        assert platform_episode_ids(api, run_id) == ids


def test_a_line_damaged_in_place_is_not_spooled_again(tmp_path: Path) -> None:
    """Damage that leaves the segment its size (the last episode line and the seal rotten where
    they lie) is no cut: a sync may have pushed that episode already, and would take a copy in
    a new segment for a new episode. The import leaves the spool as it is and says why."""
    from prime_runs_spool.importer.outputs import import_output

    run_dir, _, _ = evaluated(tmp_path / "outputs")
    segment = run_dir / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    last_two = data.rindex(b"\n", 0, data.rindex(b"\n", 0, len(data) - 1) - 1) + 1
    data[last_two:-1] = bytes(b if b == 0x0A else 0x2A for b in data[last_two:-1])  # same size, lines kept
    segment.write_bytes(bytes(data))
    report = import_output(run_dir)
    assert "the spool is damaged, so it was not compared with traces.jsonl" in (report.reason or ""), report
    assert sorted(p.name for p in (run_dir / "spool").glob("seg-*.jsonl")) == ["seg-000001.jsonl"]


def test_a_cut_copy_of_a_run_pushed_from_another_copy_adds_nothing(tmp_path: Path, server, api) -> None:
    """The same eval's artifact unpacked twice: one copy synced whole, the other cut short and
    synced on another machine (no state, no read mark). The platform's count of the run's rows
    is where the cut copy's stream (readable episodes, then the new segment) resumes: nothing
    is pushed twice."""
    run_dir, run_id, ids = evaluated(tmp_path / "outputs")
    other = tmp_path / "other" / "outputs"
    shutil.copytree(tmp_path / "outputs", other, symlinks=True)
    first = synced(server.base_url, tmp_path / "home-1", str(tmp_path / "outputs"))
    assert first.returncode == 0, first.stdout + first.stderr

    cut(other / "cut-spool", keep=10)
    for flags, code, state in (((), 1, "corrupt"), (("--skip-corrupt",), 0, "synced")):
        again = synced(server.base_url, tmp_path / "home-2", str(other), *flags, "-o", "json")
        [run] = json.loads(again.stdout)["runs"]
        assert (again.returncode, run["state"], run["pushed_now"]) == (code, state, 0), run
        assert platform_episode_ids(api, run_id) == ids


#: The eval in two processes: the first is interrupted after ``HALF`` episodes (sealed
#: ``cancelled``), the second resumes the run (a second segment) and completes it.
HALF = 20
EVAL_RESUMED = """
import json, sys
from pathlib import Path
from prime_runs_spool import open_run
run_dir, half = Path(sys.argv[1]), int(sys.argv[2])
rows = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines() if line.strip()]
run = open_run(run_dir, name="cut-spool")
print(run.id, flush=True)
run.log_episodes(rows[:half])
run.abort(KeyboardInterrupt())
run = open_run(run_dir, name="cut-spool")
run.log_episodes(rows[half:])
run.finish()
"""


def evaluated_in_two(outputs: Path) -> tuple[Path, str, list[str]]:
    """:func:`evaluated`, the eval interrupted and resumed: two segments of ``HALF`` episodes."""
    run_dir, _, ids = evaluated(outputs)
    shutil.rmtree(run_dir / "spool")
    ran = subprocess.run([sys.executable, "-c", EVAL_RESUMED, str(run_dir), str(HALF)], env=child_env(),
                         timeout=120, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert len(list((run_dir / "spool").glob("seg-*.jsonl"))) == 2
    return run_dir, ran.stdout.strip(), ids


def cut_first(run_dir: Path, keep: int) -> None:
    """Cut the first of two segments in the middle of its line ``keep`` after the header."""
    segment = run_dir / "spool" / "seg-000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    at = sum(len(line) + 1 for line in lines[:1 + keep]) + len(lines[1 + keep]) // 2
    with open(segment, "r+b") as handle:
        handle.truncate(at)
    assert at < int((run_dir / "spool" / "seg-000001.durable").read_text())


def test_episodes_an_earlier_segment_lost_reach_the_platform_once_from_traces_jsonl(tmp_path: Path, server,
                                                                                     api) -> None:
    """The cut is in the first segment, a later one intact after it: the episodes of the first
    past the cut go into a new segment after the last, and --skip-corrupt ships them once,
    with the later segment's, through a SIGKILL and a re-sync."""
    outputs = tmp_path / "outputs"
    run_dir, run_id, ids = evaluated_in_two(outputs)
    cut_first(run_dir, keep=6)  # the manifest and 5 episodes stay readable in segment 1
    home = tmp_path / "home"
    lost_by_cut = ids[5:HALF]

    stops_at_the_cut(server.base_url, home, outputs, lost=len(lost_by_cut))
    assert platform_episode_ids(api, run_id) == ids[:5]
    damaged = (run_dir / "spool" / "seg-000001.jsonl").read_bytes()
    later = (run_dir / "spool" / "seg-000002.jsonl").read_bytes()

    killed_then_synced_whole(server.base_url, home, outputs, api, run_id, pushed_before=5)
    # Each once: what segment 1 still reads, segment 2, then what the cut lost, in the eval's order.
    assert platform_episode_ids(api, run_id) == ids[:5] + ids[HALF:] + lost_by_cut
    [evaluation] = evaluations_of(api, run_id)
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert (evaluation["total_samples"], evaluation["finalize_count"]) == (EPISODES, 1)
    assert [s for s in evaluation["metadata"]["skipped_corruption"] if s["segment"] == 1], evaluation["metadata"]

    again = synced(server.base_url, home, str(outputs), "--skip-corrupt", "-o", "json")
    assert again.returncode == 0, again.stdout + again.stderr
    [run] = json.loads(again.stdout)["runs"]
    assert (run["pushed_now"], run["pushed_total"]) == (0, EPISODES), run
    assert platform_episode_ids(api, run_id) == ids[:5] + ids[HALF:] + lost_by_cut
    assert (run_dir / "spool" / "seg-000001.jsonl").read_bytes() == damaged  # never rewritten
    assert (run_dir / "spool" / "seg-000002.jsonl").read_bytes() == later


@pytest.mark.parametrize("skip_first", [False, True], ids=["cut-after-push", "skipped-before-recovery"])
def test_episodes_an_earlier_segment_held_when_pushed_are_not_pushed_again(tmp_path: Path, server, api,
                                                                           skip_first: bool) -> None:
    """The run was pushed whole, then its first segment cut. The new segment's episodes are
    copies of what was pushed from the first segment before the cut: the run is ``lost``,
    nothing sent, also when a --skip-corrupt pass noted the cut before the new segment was
    spooled (a --no-import sync)."""
    outputs = tmp_path / "outputs"
    run_dir, run_id, ids = evaluated_in_two(outputs)
    home = tmp_path / "home"
    first = synced(server.base_url, home, str(outputs))
    assert first.returncode == 0, first.stdout + first.stderr
    assert platform_episode_ids(api, run_id) == ids

    cut_first(run_dir, keep=6)
    if skip_first:
        # A resume after the cut: a later segment makes the sync read the run from its start,
        # where it passes (and notes) the cut, before any import spooled what it lost.
        subprocess.run([sys.executable, "-c", "import sys; from prime_runs_spool import open_run; "
                        "open_run(sys.argv[1], name='cut-spool', past_damage=True).finish()", str(run_dir)],
                       env=child_env(), check=True, timeout=60)
        noted = synced(server.base_url, home, str(outputs), "--skip-corrupt", "--no-import", "-o", "json")
        [run] = json.loads(noted.stdout)["runs"]
        assert run["pushed_now"] == 0, run
    for flags in ((), ("--skip-corrupt",)):
        again = synced(server.base_url, home, str(outputs), *flags, "-o", "json")
        assert again.returncode == 1, again.stdout + again.stderr
        report = json.loads(again.stdout)
        [run] = report["runs"]
        assert (run["state"], run["pushed_now"], run["pushed_total"]) == ("lost", 0, EPISODES), run
        assert "were read before the cut" in run["error"], run
        assert platform_episode_ids(api, run_id) == ids
    assert len(list((run_dir / "spool").glob("seg-*.jsonl"))) == (4 if skip_first else 3)


def test_a_copy_cut_in_an_earlier_segment_of_a_run_pushed_from_another_copy_adds_nothing(
        tmp_path: Path, server, api) -> None:
    """As above, the first of two segments cut in the second copy: its stream (what segment 1
    still reads, segment 2, then the new segment) holds the run's episodes in another order
    than the rows the first copy pushed, so the platform's last row is not the stream's row
    at that count; the rows are the stream's all the same, in another order (docs/sync.md,
    "Runs continued by plain vf-eval"): with --skip-corrupt, synced with nothing pushed."""
    run_dir, run_id, ids = evaluated_in_two(tmp_path / "outputs")
    other = tmp_path / "other" / "outputs"
    shutil.copytree(tmp_path / "outputs", other, symlinks=True)
    first = synced(server.base_url, tmp_path / "home-1", str(tmp_path / "outputs"))
    assert first.returncode == 0, first.stdout + first.stderr

    cut_first(other / "cut-spool", keep=6)
    for flags, exit_code, state in (((), 1, "corrupt"), (("--skip-corrupt",), 0, "synced")):
        again = synced(server.base_url, tmp_path / "home-2", str(other), *flags, "-o", "json")
        [run] = json.loads(again.stdout)["runs"]
        assert (again.returncode, run["state"], run["pushed_now"]) == (exit_code, state, 0), run
        assert platform_episode_ids(api, run_id) == ids


def read_only(root: Path) -> dict[str, bytes]:
    """Take every write bit off ``root`` (the importer honours them, even for root) and
    return what it holds, name by name, to compare with afterwards."""
    for path in sorted((p for p in [root, *root.rglob("*")] if not p.is_symlink()), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            for p in sorted(root.rglob("*"))}


def test_a_spool_imported_under_a_state_dir_cut_short_is_made_good_from_the_read_only_source(
        tmp_path: Path, server, api) -> None:
    """Plain vf-eval outputs in a read-only folder, imported with --state-dir (the spool and
    its sync state there), whose imported segment is then cut: the import step spools what
    the source holds past the cut in a new segment under the state dir, never writing the
    source, and --skip-corrupt ships every episode once, through a SIGKILL and a re-sync."""
    outputs = tmp_path / "outputs"
    _, ids = plain_outputs(outputs)
    source = read_only(outputs)
    state_dir, home = tmp_path / "state", tmp_path / "home"
    imported = subprocess.run(CLI + ["import", str(outputs), "--state-dir", str(state_dir), "--json"],
                              capture_output=True, text=True, timeout=120, env=sync_env(home))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    [spooled] = json.loads(imported.stdout)["imports"]
    spool_dir, run_id = Path(spooled["run_dir"]), spooled["run_id"]
    assert spool_dir.is_relative_to(state_dir)
    cut_segment(spool_dir / "spool" / "seg-000001.jsonl", keep=10)

    in_state_dir = ("--state-dir", str(state_dir))
    spooled = stops_at_the_cut(server.base_url, home, outputs, *in_state_dir, lost=EPISODES - 9)
    assert spooled["state"] == "appended", spooled
    assert platform_episode_ids(api, run_id) == ids[:9]

    killed_then_synced_whole(server.base_url, home, outputs, api, run_id, *in_state_dir, pushed_before=9)
    again = synced(server.base_url, home, str(outputs), *in_state_dir, "--skip-corrupt", *SMALL_REQUESTS,
                   "-o", "json")
    assert again.returncode == 0, again.stdout + again.stderr
    [run] = json.loads(again.stdout)["runs"]
    assert (run["pushed_now"], run["pushed_total"]) == (0, EPISODES), run
    assert platform_episode_ids(api, run_id) == ids  # each once, in the eval's order
    [evaluation] = evaluations_of(api, run_id)
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["finalize_count"] == 1
    assert read_only(outputs) == source  # the source never written
    assert sorted(p.name for p in (spool_dir / "spool").glob("seg-*.jsonl")) == ["seg-000001.jsonl",
                                                                                 "seg-000002.jsonl"]


def test_a_read_only_spool_cut_short_says_so_and_a_writable_copy_ships_the_rest(tmp_path: Path, server,
                                                                                 api) -> None:
    """The eval's own spool, cut, in a read-only folder synced with --state-dir: nothing may be
    written beside it, and a spool is one folder, so the episodes past the cut cannot be spooled;
    one line says so and what to do, and doing it (a writable copy, synced) ships them once."""
    outputs = tmp_path / "outputs"
    run_dir, run_id, ids = evaluated(outputs)
    cut(run_dir, keep=10)
    source = read_only(outputs)
    state_dir, home = tmp_path / "state", tmp_path / "home"

    first = synced(server.base_url, home, str(outputs), "--state-dir", str(state_dir), "--skip-corrupt",
                   "-o", "json")
    assert first.returncode == 0, first.stdout + first.stderr
    [spooled] = json.loads(first.stdout)["imports"]
    said = [w for w in spooled["warnings"] if "cannot be spooled in a read-only folder" in w]
    assert len(said) == 1 and f"holds {EPISODES - 9} episodes the spool lost past the cut" in said[0], spooled
    assert "copy the folder somewhere writable and sync the copy with --skip-corrupt" in said[0]
    assert platform_episode_ids(api, run_id) == ids[:9]
    assert read_only(outputs) == source

    copy_of = tmp_path / "copy"
    shutil.copytree(outputs, copy_of, symlinks=True)
    for path in [copy_of, *copy_of.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o700 if path.is_dir() else 0o600)
    shipped = synced(server.base_url, home, str(copy_of), "--skip-corrupt", "-o", "json")
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    [run] = json.loads(shipped.stdout)["runs"]
    assert (run["pushed_now"], run["pushed_total"]) == (EPISODES - 9, EPISODES), run
    assert platform_episode_ids(api, run_id) == ids
