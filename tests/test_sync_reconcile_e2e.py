"""The state file is a cache of what the platform holds, never the truth: end to end, the
real ``prime-runs sync`` against the real local platform process (docs/sync.md, "State").

- a stale or edited state file is checked against the platform before anything is pushed;
- a send time in the future (a clock stepped back, a state copied from a machine whose clock
  runs ahead) never makes sync wait longer than one request lifetime;
- a request that commits after its lifetime (the one thing the protocol assumes away) is
  noticed and reported loudly, never finalized over.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

from fixtures.fault_proxy import FaultProxy
import pytest
from support.env import CLI, child_env
from support.runs import RunBuilder, build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, evaluations_of, run_sync, sample_ids, server, sync_cmd  # noqa: F401


def state_file(run_dir: Path) -> Path:
    (path,) = (run_dir / "spool" / "sync").glob("*.json")
    return path


def report_of(done: subprocess.CompletedProcess[str]) -> dict:
    (report,) = json.loads(done.stdout)["runs"]
    return report


@pytest.mark.slow
def test_an_older_copy_of_the_state_restored_after_the_run_grew_duplicates_nothing(tmp_path: Path, server,
                                                                                    api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-stale-state")
    builder.open_segment()
    builder.add(5)
    builder.abandon()
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    old = tmp_path / "old-state.json"
    shutil.copy(state_file(builder.run_dir), old)
    builder.open_segment()
    builder.add(5)
    builder.seal()
    assert report_of(run_sync(server.base_url, str(tmp_path), "--json"))["state"] == "synced"
    shutil.copy(old, state_file(builder.run_dir))  # a backup restored, an rsync gone wrong...
    done = run_sync(server.base_url, str(tmp_path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = report_of(done)
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("synced", 0, 10), report
    assert_exactly_once(api, builder)  # 10 rows, one finalize (was: 15 rows, two finalizes)
    again = report_of(run_sync(server.base_url, str(tmp_path), "--json"))
    assert again["state"] == "up_to_date", again


@pytest.mark.slow
def test_a_state_edited_to_point_back_to_the_start_duplicates_nothing(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-edited-state")
    builder.open_segment()
    builder.add(6)
    builder.abandon()
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    path = state_file(builder.run_dir)
    state = json.loads(path.read_text())
    state.update(cursor=None, segments={}, samples_pushed=0, episodes_pushed=0, terminal=None, terminal_size=None)
    state.pop("checksum")  # edited by hand: as a sync that kept no checksum wrote it
    path.write_text(json.dumps(state))
    builder.open_segment()
    builder.add(2)
    builder.seal()
    done = run_sync(server.base_url, str(tmp_path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = report_of(done)
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("synced", 2, 8), report
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_send_time_an_hour_ahead_costs_one_request_lifetime_not_an_hour(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-future-sent-at")
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    assert run_sync(server.base_url, str(tmp_path)).returncode == 0
    builder.open_segment()
    builder.add(2)
    builder.seal()
    path = state_file(builder.run_dir)
    state = json.loads(path.read_text())
    # A samples request announced by a machine whose clock runs an hour ahead, never landed.
    state["in_flight"] = {"kind": "samples", "sent_at": time.time() + 3600, "rows": 2, "episodes": 2,
                          "end": state["cursor"], "seal": None}
    state.pop("checksum")  # edited by hand: as a sync that kept no checksum wrote it
    path.write_text(json.dumps(state))
    done = run_sync(server.base_url, str(tmp_path), "--json", timeout=60)  # the old sync waited the hour
    assert done.returncode == 0, done.stdout + done.stderr
    assert report_of(done)["state"] == "synced"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_state_copied_while_a_request_was_out_and_put_back_later_is_no_mismatch(tmp_path: Path, server,
                                                                                   api) -> None:
    """A copy of the run folder taken while a samples request was out (a CI artifact of a
    run the online shipper was shipping, a backup) holds that announcement; put back after
    later syncs settled it and pushed the rest, its count cannot say whether that request
    landed. The platform's rows are checked as for any older state: no mismatch is reported
    or written to the evaluation, nothing is sent twice."""
    builder = RunBuilder(tmp_path / "run", "e2e-copied-mid-request")
    builder.open_segment()
    builder.add(5)
    env = child_env(PRIME_API_KEY=TOKEN)
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/samples$") as proxy:
        first = subprocess.Popen(sync_cmd(proxy.base_url, str(tmp_path)), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while not proxy.holding():
            assert first.poll() is None and time.monotonic() < deadline, "the samples request never came"
            time.sleep(0.01)
        copied = state_file(builder.run_dir).read_bytes()  # the announcement is written before the request
        assert json.loads(copied)["in_flight"]["kind"] == "samples"
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert proxy.release_held()  # it lands, within its lifetime
        builder.add(5)
        builder.seal()
        assert report_of(run_sync(proxy.base_url, str(tmp_path), "--json"))["state"] == "synced"
        state_file(builder.run_dir).write_bytes(copied)  # the copy put back
        done = run_sync(proxy.base_url, str(tmp_path), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert (report_of(done)["state"], report_of(done)["pushed_now"]) == ("synced", 0), done.stdout
        again = run_sync(proxy.base_url, str(tmp_path), "--json")
        assert report_of(again)["state"] == "up_to_date", again.stdout
    evaluation = assert_exactly_once(api, builder)  # 10 rows, finalized once
    assert "prime_runs_mismatch" not in evaluation["metadata"]


@pytest.mark.slow
def test_a_request_that_commits_after_its_lifetime_is_reported_and_never_finalized_over(
        tmp_path: Path, server, api) -> None:
    """The first sync's samples request is held by the proxy while that sync is SIGKILLed;
    the next sync waits out the lifetime, finds nothing landed and resends, and the proxy
    lets the held request commit just before the resend. The platform then holds every row
    twice: the protocol assumes this away (docs/sync.md), so the point is that it is seen."""
    builder = build_run(tmp_path / "run", "e2e-late-commit", 5)
    env = child_env(PRIME_API_KEY=TOKEN)
    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/samples$") as proxy:
        first = subprocess.Popen(sync_cmd(proxy.base_url, str(tmp_path)), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while "held" not in proxy.faults():
            assert first.poll() is None and time.monotonic() < deadline, "the samples request never came"
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = run_sync(proxy.base_url, str(tmp_path), "--json")
        again = run_sync(proxy.base_url, str(tmp_path), "--json")  # the same destination, again
    (evaluation,) = evaluations_of(api, builder.run_id)
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert evaluation["total_samples"] == 10 and len(sample_ids(api, evaluation["evaluation_id"])) == 10
    assert second.returncode == 1, second.stdout + second.stderr
    report = report_of(second)
    assert report["state"] == "error" and "10 samples" in report["error"] and "5" in report["error"], report
    assert evaluation["finalize_count"] == 0 and evaluation["status"] != "COMPLETED"
    mismatch = evaluation["metadata"]["prime_runs_mismatch"]
    assert (mismatch["platform_samples"], mismatch["spool_samples"]) == (10, 5), mismatch
    # It stays loud: the next sync says it again (and still does not finalize), status shows it;
    # so does a sync to the platform straight (another destination: it finds the evaluation).
    assert again.returncode == 1 and "holds 10 samples" in report_of(again)["error"], again.stdout
    third = run_sync(server.base_url, str(tmp_path), "--json")
    assert third.returncode == 1 and "holds 10 samples" in report_of(third)["error"], third.stdout
    assert api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["finalize_count"] == 0
    status = subprocess.run(CLI + ["status", str(tmp_path), "--json"], capture_output=True, text=True,
                            env=child_env(), timeout=60)
    destinations = json.loads(status.stdout)["runs"][0]["destinations"]  # via the proxy, and direct
    assert len(destinations) == 2 and all("holds 10 samples" in (d["mismatch"] or "") for d in destinations), \
        destinations
    text = subprocess.run(CLI + ["status", str(tmp_path)], capture_output=True, text=True, env=child_env())
    assert "MISMATCH" in text.stdout, text.stdout



@pytest.mark.slow
def test_samples_that_cannot_be_read_while_the_state_is_lost_are_no_mismatch(tmp_path: Path, server, api) -> None:
    """A run synced, its state then lost (a copy of the run folder without ``spool/sync/``),
    synced again while the platform fails the samples listing the cursor is derived again
    from (down past the retries; a key refused mid-sync goes the same way): that is a failed
    pass, to carry on from. It was recorded as a sample-count mismatch ("holds 3 samples
    where this spool's sync accounts for 0 ... sync the run with --replay as a new one"):
    kept in the state, shown by ``status``, and the advised ``--replay`` pushed the run twice."""
    builder = build_run(tmp_path / "runs" / "run", "e2e-state-lost-listing-fails", 3)
    with FaultProxy(server.base_url, methods=["GET"], paths=r"/samples") as proxy:
        assert run_sync(proxy.base_url, str(tmp_path / "runs")).returncode == 0
        shutil.rmtree(builder.run_dir / "spool" / "sync")
        proxy.set_rates({"status_503": 1.0})
        failed = run_sync(proxy.base_url, str(tmp_path / "runs"), "--max-attempts", "2")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "reading samples" in failed.stdout, failed.stdout
        assert "mismatch" not in failed.stdout.lower() and "--replay" not in failed.stdout, failed.stdout
        shown = subprocess.run(CLI + ["status", str(tmp_path / "runs")], capture_output=True, text=True,
                               env=child_env())
        assert "MISMATCH" not in shown.stdout, shown.stdout
        proxy.set_rates({})
        again = run_sync(proxy.base_url, str(tmp_path / "runs"), "--json")
        assert again.returncode == 0, again.stdout + again.stderr
        assert report_of(again)["state"] in ("synced", "up_to_date"), again.stdout
    assert_exactly_once(api, builder)
