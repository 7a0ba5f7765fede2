"""``prime-runs sync --follow`` end to end: the real command following spools that a writer
is still appending to, against the real local platform process, with SIGKILLs, SIGTERM and
a network outage through the fault proxy."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from support.children import interrupted
from support.env import REPO_ROOT, child_env
from support.platform_process import first_line
from fixtures.fault_proxy import FaultProxy
from support.runs import RunBuilder
from support.sync_e2e import TOKEN, api, assert_exactly_once, evaluations_of, sample_ids, server, sync_cmd  # noqa: F401


#: How many followers test_follower_killed_and_stopped_midway_then_exactly_once SIGKILLs.
FOLLOW_KILLS = int(os.environ.get("PRIME_RUNS_FOLLOW_KILLS", "5"))
EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def follow(base_url: str, *paths: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    cmd = sync_cmd(base_url, "--follow", "--json", *map(str, paths), *extra)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(PRIME_API_KEY=TOKEN))


def interrupted_events(proc: subprocess.Popen[str]) -> list[dict]:
    """Every event a follower printed, read after a SIGINT (a person's Ctrl-C) ends it: it
    must end on its own, exit 0."""
    out, err, _ = interrupted(proc, timeout=30)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> float:
    """Poll until ``condition()``; returns the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def pushed(api: httpx.Client, run_id: str) -> int:
    evaluations = evaluations_of(api, run_id)
    return len(sample_ids(api, evaluations[0]["evaluation_id"])) if evaluations else -1


@pytest.mark.slow
def test_follow_streams_live_runs_picks_up_new_ones_and_finishes_each(tmp_path: Path, server, api) -> None:
    outputs = tmp_path / "outputs"
    first = RunBuilder(outputs / "a", "follow-live-a")
    first.open_segment()
    proc = follow(server.base_url, outputs, extra=("--exit-when-idle",))
    try:
        # The evaluation exists as soon as the manifest is durable, before any episode.
        wait_for(lambda: pushed(api, first.run_id) == 0, what="the evaluation of a run with no episode")
        delays = []
        for _ in range(3):
            first.add(2)
            delays.append(wait_for(lambda: pushed(api, first.run_id) == len(first.ids), what="live episodes"))
        assert max(delays) < 2.5, delays
        second = RunBuilder(outputs / "b", "follow-live-b")
        second.open_segment()
        second.add(4)
        wait_for(lambda: pushed(api, second.run_id) == 4, what="a run that appeared while following")
        first.add(1)
        first.seal()
        second.abandon()  # its writer "dies": the run must be recorded crashed
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert {(Path(e["path"]).name, e["state"]) for e in events} >= {("a", "live"), ("a", "synced"), ("b", "crashed")}
    assert_exactly_once(api, first)
    crashed = assert_exactly_once(api, second, finalized=False)
    assert crashed["metadata"]["prime_runs"]["status"] == "crashed"


@pytest.mark.slow
def test_follower_killed_and_stopped_midway_then_exactly_once(tmp_path: Path, server, api) -> None:
    """SIGKILL the follower (FOLLOW_KILLS times) while a writer appends, each time once it has
    pushed a few more samples (a moment chosen by what it did, not by a clock, so the test
    holds on a fast machine and a loaded one alike: the writer keeps writing until the kills
    are done, so there is always work left to kill a follower in); then SIGTERM one (exit 0,
    promptly), and a last follower finishes the run: every episode once, one finalize."""
    builder = RunBuilder(tmp_path / "run", "follow-kill")
    builder.open_segment()
    enough = threading.Event()

    def write() -> None:
        while not enough.is_set() and len(builder.ids) < 1_000:
            builder.add(5, size=1_500)
            time.sleep(0.2)

    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(611)
    extra = ("--max-request-bytes", "5000")
    kills = 0
    try:
        while kills < FOLLOW_KILLS:
            proc = follow(server.base_url, tmp_path, extra=extra)
            target = max(0, pushed(api, builder.run_id)) + rng.randint(1, 15)
            wait_for(lambda: proc.poll() is not None or pushed(api, builder.run_id) >= target, timeout=60,
                     what="the follower pushing more samples")
            assert proc.poll() is None, "a follower of a live run exited by itself"
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills += 1
        enough.set()
        writer.join()  # the run stays live (its writer open), but a pass can now reach its end
        stopped = follow(server.base_url, tmp_path, extra=extra)
        assert json.loads(first_line(stopped))["state"] == "live"  # following, mid-run
        stopped.send_signal(signal.SIGTERM)
        _, err = stopped.communicate(timeout=15)
        assert stopped.returncode == 0, err
    finally:
        enough.set()
        writer.join()
    builder.seal()
    last = follow(server.base_url, tmp_path, extra=(*extra, "--exit-when-idle"))
    out, err = last.communicate(timeout=60)
    assert last.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["state"] == "synced"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_follow_rides_out_a_network_outage(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "follow-outage")
    builder.open_segment()
    builder.add(3)
    with FaultProxy(server.base_url, seed=7) as proxy:
        proc = follow(proxy.base_url, tmp_path, extra=("--exit-when-idle", "--max-attempts", "3"))
        try:
            wait_for(lambda: pushed(api, builder.run_id) == 3, what="the first episodes")
            proxy.set_rates({"reset_before": 1.0})
            for _ in range(6):
                builder.add(2)
                time.sleep(0.4)
            assert pushed(api, builder.run_id) == 3  # nothing got through the outage
            proxy.set_rates({})
            catch_up = wait_for(lambda: pushed(api, builder.run_id) == len(builder.ids), what="catching up")
            builder.seal()
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert "reset_before" in proxy.faults()
    assert proc.returncode == 0, err
    assert catch_up < 5, catch_up
    states = [json.loads(line)["state"] for line in out.splitlines()]
    assert "error" in states and "synced" in states  # it gave up a pass, then came back
    assert states[-1] in ("synced", "up_to_date")
    assert_exactly_once(api, builder)


@pytest.mark.slow
@pytest.mark.parametrize("state_dir", [False, True], ids=["beside", "state-dir"])
def test_follow_imports_plain_outputs_that_appear_and_grow_while_following(tmp_path: Path, server, api,
                                                                          state_dir: bool) -> None:
    """Plain vf-eval outputs (no spool) that appear under a followed path after the follower
    started, and grow there, are imported on its passes and pushed: every episode once; with
    ``--state-dir`` the spool is kept there, and followed there."""
    outputs = tmp_path / "outputs"
    keeper = RunBuilder(outputs / "spooled", f"follow-plain-keeper-{state_dir}")  # keeps the follower busy
    keeper.open_segment()
    extra = ("--exit-when-idle", *(("--state-dir", str(tmp_path / "state")) if state_dir else ()))
    proc = follow(server.base_url, outputs, extra=extra)
    try:
        wait_for(lambda: pushed(api, keeper.run_id) == 0, what="the follower following")
        staging = tmp_path / "staging"
        shutil.copytree(EVAL_OUTPUTS / "vf040-completed", staging, symlinks=True)
        traces = staging / "traces.jsonl"
        fixture_run = json.loads(traces.read_bytes().splitlines()[0])["run"]["id"]
        # A run id of this test's own: the platform process serves every test of the module.
        own_run = f"disabled-{os.urandom(8).hex()}".encode()
        lines = traces.read_bytes().replace(fixture_run.encode(), own_run).splitlines(keepends=True)
        traces.write_bytes(b"".join(lines[:2]))
        plain = outputs / "evals" / "plain"
        plain.parent.mkdir()
        staging.rename(plain)  # appears whole, as vf-eval's folder with its first two rollouts
        run_id = json.loads(lines[0])["run"]["id"]
        wait_for(lambda: plain_pushed(api, run_id) == 2, timeout=30, what="the plain outputs' first episodes")
        for line in lines[2:]:  # vf-eval goes on appending: each import adds only what is new
            with open(plain / "traces.jsonl", "ab") as handle:
                handle.write(line)
            wait_for(lambda: plain_pushed(api, run_id) >= lines.index(line) + 1, timeout=30,
                     what="an episode appended to the plain outputs")
        keeper.seal()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    [evaluation] = evaluations_of(api, run_id, environment=ENVIRONMENT)
    ids = sample_ids(api, evaluation["evaluation_id"])
    assert sorted(ids) == sorted(json.loads(line)["id"] for line in lines)  # each once
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["total_samples"] == len(lines)
    imports = [json.loads(line) for line in out.splitlines() if '"source"' in line]
    assert [(event["state"], event["episodes_added"]) for event in imports] == [
        ("imported", 2), ("appended", 1), ("appended", 1)]
    assert (Path(imports[0]["run_dir"]).is_relative_to(tmp_path / "state")) == state_dir
    assert (plain / "spool").exists() != state_dir  # with --state-dir, nothing written into the outputs


#: The environment of the fixture vf-eval outputs (fixtures/eval_outputs).
ENVIRONMENT = "tiny_taskset"


def plain_pushed(api: httpx.Client, run_id: str) -> int:
    evaluations = evaluations_of(api, run_id, environment=ENVIRONMENT)
    return sum(len(sample_ids(api, e["evaluation_id"])) for e in evaluations) if evaluations else -1


@pytest.mark.slow
def test_a_follower_whose_pass_failed_reading_a_found_evaluation_pushes_nothing_twice(tmp_path: Path, server,
                                                                                     api) -> None:
    """A live run synced, its state then lost, followed while the platform fails the samples
    listing (down past --max-attempts): the pass that found the evaluation again fails, and
    the follower's next pass (the writer appends one more) pushed every row again, trusting
    the state its failed pass left (tests/test_sync_own_state_after_failure.py)."""
    builder = RunBuilder(tmp_path / "run", "follow-failed-reconcile")
    builder.open_segment()
    builder.add(3)
    with FaultProxy(server.base_url, methods={"GET"}, paths=r"/samples") as proxy:
        done = subprocess.run(sync_cmd(proxy.base_url, str(tmp_path)), capture_output=True, text=True, timeout=120,
                              env=child_env(PRIME_API_KEY=TOKEN))
        assert done.returncode == 0 and pushed(api, builder.run_id) == 3, done.stdout + done.stderr
        shutil.rmtree(builder.run_dir / "spool" / "sync")
        proxy.set_rates({"status_503": 1.0})
        proc = follow(proxy.base_url, tmp_path, extra=("--max-attempts", "2"))
        try:
            failed = json.loads(first_line(proc))
            assert failed["state"] == "error" and "reading samples" in failed["error"], failed
            proxy.set_rates({})
            builder.add(1)
            wait_for(lambda: pushed(api, builder.run_id) >= 4, what="the appended episode pushed")
            time.sleep(1.0)  # a second pass would push more
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    builder.seal()
    assert pushed(api, builder.run_id) == 4


@pytest.mark.slow
def test_a_followed_run_deleted_or_moved_is_said_gone_once_and_a_move_is_followed_where_it_went(
        tmp_path: Path, server, api) -> None:
    """A run folder deleted while followed got 'error: the spool has no manifest record', then
    'runs/c/spool is read-only: ... give --state-dir DIR', neither true nor of use, and its
    state's save could make the deleted folder again. A run moved under the paths was never
    looked at again (no event on its spool), so it kept its lock and its new folder was
    'skipped: another prime-runs sync is working on this run' for as long as it followed."""
    from fixtures.episodes import make_episode
    from prime_runs_spool import open_run

    outputs = tmp_path / "outputs"
    deleted = RunBuilder(outputs / "deleted", "follow-deleted")
    deleted.open_segment()
    deleted.add(2)
    proc = follow(server.base_url, outputs)
    try:
        with open_run(outputs / "moved", name="follow-moved", environments=["gsm8k"]) as moved:  # a live writer
            moved.log_episodes([make_episode(n, run_id=moved.id) for n in range(2)])
            wait_for(lambda: pushed(api, deleted.run_id) == 2 and pushed(api, moved.id) == 2, what="both runs live")
            shutil.rmtree(outputs / "deleted")
            (outputs / "moved").rename(outputs / "moved-here")
            moved.log_episodes([make_episode(2, run_id=moved.id)])
            moved.finish()
        wait_for(lambda: pushed(api, moved.id) == 3, what="the moved run followed where it went")
        time.sleep(1.5)  # a few more looks and walks: the deleted folder must stay deleted
        events = interrupted_events(proc)
    finally:
        proc.kill()
    said = [(Path(e["path"]).name, e["state"]) for e in events]
    assert said.count(("deleted", "gone")) == 1 and said.count(("moved", "gone")) == 1, said
    assert not [e for e in events if e["state"] in ("error", "skipped")], events
    assert ("moved-here", "synced") in said, said
    gone = next(e for e in events if e["state"] == "gone" and Path(e["path"]).name == "deleted")
    assert gone["evaluation_id"] == evaluations_of(api, deleted.run_id)[0]["evaluation_id"], gone
    assert not (outputs / "deleted").exists()
    assert len(evaluations_of(api, moved.id)) == 1


@pytest.mark.slow
def test_a_run_moved_while_a_pass_reads_it_is_gone_not_lost_and_another_spool_at_its_path_is_a_new_run(
        tmp_path: Path, server, api) -> None:
    """A run moved (``mv``) while a pass was reading it made that pass say ``lost`` (the
    segment of the recorded position missing: recorded as a mismatch in the evaluation's
    metadata), ``error`` (a segment or its state 'No such file or directory', 'no manifest
    record') or, where it went, ``skipped`` by the follower's own lock on it. It is ``gone``,
    once a move, and followed where it went: nothing lost, nothing sent twice, exit 0. A new
    spool made at the old path is a new run, followed on its own."""
    from fixtures.episodes import make_episode
    from prime_runs_spool import open_run

    outputs = tmp_path / "outputs"
    proc = follow(server.base_url, outputs)
    moves, n = 5, 0
    try:
        with open_run(outputs / "m0", name="follow-moving", environments=["gsm8k"]) as run:
            for move in range(1, moves + 1):
                end = time.monotonic() + 0.6
                while time.monotonic() < end:  # passes all along: some run as the folder moves
                    run.log_episodes([make_episode(n, run_id=run.id)])
                    n += 1
                    time.sleep(0.01)
                (outputs / f"m{move - 1}").rename(outputs / f"m{move}")
            run.finish()
        wait_for(lambda: pushed(api, run.id) == n, timeout=40, what="every episode, wherever it was written")
        again = RunBuilder(outputs / "m0", "follow-new-at-old-path")  # a new spool where the run was
        again.open_segment()
        again.add(2)
        again.seal()
        wait_for(lambda: pushed(api, again.run_id) == 2, what="the new spool at the old path")
        time.sleep(1.0)
        events = interrupted_events(proc)
    finally:
        proc.kill()
    said = [(Path(e["path"]).name, e["state"]) for e in events]
    assert not [e for e in events if e["state"] in ("lost", "error", "corrupt", "skipped")], events
    gone = [name for name, state in said if state == "gone"]
    assert len(gone) == len(set(gone)) and set(gone) <= {f"m{i}" for i in range(moves)} and gone, said
    assert (f"m{moves}", "synced") in said and ("m0", "synced") in said, said
    [only] = evaluations_of(api, run.id)
    assert len(set(sample_ids(api, only["evaluation_id"]))) == n == len(sample_ids(api, only["evaluation_id"]))
    detail = api.get(f"/evaluations/{only['evaluation_id']}").json()
    assert "prime_runs_mismatch" not in (detail.get("metadata") or {}), detail["metadata"]
    assert detail["status"] == "COMPLETED" and detail["finalize_count"] == 1, detail
