"""sync/store_follow.py: a follow over store URLs is a pass every interval; what it reports,
when it ends idle, and what a failing store does to it (the end-to-end test against a real
S3 API is tests/test_sync_store.py)."""

from __future__ import annotations

import pytest

from prime_runs_spool.errors import StoreError, StoreSetupError
from prime_runs_spool.sync.options import RunReport
from prime_runs_spool.sync.store_follow import StoreFollower
from support.sync_e2e import api, server  # noqa: F401  (fixtures)


def _passes(*passes):
    """A pass function answering with each of ``passes`` in turn (an exception is raised)."""
    queue = list(passes)

    def sync_pass(url: str) -> list[RunReport]:
        answer = queue.pop(0) if queue else [RunReport(path=f"{url}/r", state="up_to_date")]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return sync_pass


def test_only_changes_are_reported_and_an_idle_pass_ends_it():
    heard: list[tuple[str, int]] = []
    follower = StoreFollower(["s3://b/p"], _passes(
        [RunReport(path="s3://b/p/r", state="crashed", pushed_now=5)],
        [RunReport(path="s3://b/p/r", state="synced", pushed_now=2)],
        [RunReport(path="s3://b/p/r", state="up_to_date")],  # synced, read again: no news
    ), interval=0, exit_when_idle=True, on_report=lambda r: heard.append((r.state, r.pushed_now)))
    assert [r.state for r in follower.run()] == ["up_to_date"]  # the pass with nothing to do ended it
    assert heard == [("crashed", 5), ("synced", 2)]
    heard.clear()
    follower = StoreFollower(["s3://b/p"], _passes(
        [RunReport(path="s3://b/p/r", state="crashed", pushed_now=5)],
        [RunReport(path="s3://b/p/r", state="crashed")],  # an upload still to come: nothing new
    ), interval=0, exit_when_idle=True, on_report=lambda r: heard.append((r.state, r.pushed_now)))
    assert [r.state for r in follower.run()] == ["crashed"]
    assert heard == [("crashed", 5)]


def test_a_live_run_keeps_it_from_idle_until_its_writer_is_gone():
    """A mirrored writer still running (its run ``live``, nothing new this pass) is not idle:
    the run has more to come."""
    follower = StoreFollower(["s3://b/p"], _passes(
        [RunReport(path="s3://b/p/r", state="live", pushed_now=5)],
        [RunReport(path="s3://b/p/r", state="live")],
        [RunReport(path="s3://b/p/r", state="live")],
        [RunReport(path="s3://b/p/r", state="synced", pushed_now=1)],
    ), interval=0, exit_when_idle=True)
    assert [r.state for r in follower.run()] == ["up_to_date"]  # only after the writer's end


def test_a_store_failing_later_is_told_and_tried_again_but_failing_first_raises():
    told: list[str] = []
    follower = StoreFollower(["s3://b/p"], _passes(
        [RunReport(path="s3://b/p/r", state="synced", pushed_now=1)], StoreError("connection reset"),
    ), interval=0, exit_when_idle=True, on_error=told.append)
    assert [r.state for r in follower.run()] == ["up_to_date"]
    assert len(told) == 1 and "connection reset" in told[0] and "trying again" in told[0]
    for first in (StoreError("no such bucket"), StoreSetupError("not a store URL")):
        with pytest.raises(type(first)):
            StoreFollower(["s3://b/p"], _passes(first), interval=0, exit_when_idle=True).run()
    with pytest.raises(StoreSetupError):  # a setup error is never retried
        StoreFollower(["s3://b/p"], _passes([], StoreSetupError("bad")), interval=0).run()


def test_stop_ends_it_after_the_pass_in_progress():
    follower = StoreFollower(["s3://b/p"], _passes(), interval=3600)

    def sync_pass(url: str) -> list[RunReport]:
        follower.stop.set()  # a SIGINT during the pass
        return [RunReport(path=f"{url}/r", state="synced", pushed_now=1)]

    follower.sync_pass = sync_pass
    assert [r.pushed_now for r in follower.run()] == [1]


def test_a_stop_during_one_urls_pass_is_not_followed_by_the_next_urls_pass():
    """SIGINT while the first URL's pass runs: the follow ends after it, without a pass
    over the second URL (which could take as long again)."""
    called: list[str] = []
    follower = StoreFollower(["s3://b/one", "s3://b/two"], lambda url: [], interval=0)

    def sync_pass(url: str) -> list[RunReport]:
        called.append(url)
        follower.stop.set()
        return [RunReport(path=f"{url}/r", state="synced", pushed_now=1)]

    follower.sync_pass = sync_pass
    follower.run()
    assert called == ["s3://b/one"]


def test_a_crashed_run_read_again_with_nothing_new_is_no_news():
    """A run uploaded a piece at a time is ``crashed`` after each pass that pushed, and the
    next pass, finding nothing new, reads ``up_to_date``: that was a line per upload, for a
    run whose state had not changed. So is a lease another follower held for one pass."""
    heard: list[tuple[str, int]] = []
    path = "s3://b/p/r"
    follower = StoreFollower(["s3://b/p"], _passes(
        [RunReport(path=path, state="crashed", pushed_now=3, pushed_total=3)],
        [RunReport(path=path, state="up_to_date", pushed_total=3)],
        [RunReport(path=path, state="crashed", pushed_now=2, pushed_total=5)],
        [RunReport(path=path, state="up_to_date", pushed_total=5)],
        [RunReport(path=path, state="skipped", error="another prime-runs sync holds this run's lease")],
        [RunReport(path=path, state="up_to_date", pushed_total=5)],
        [RunReport(path=path, state="up_to_date", pushed_total=9)],  # another machine pushed 4
        [RunReport(path=path, state="up_to_date", pushed_total=9)],
    ), interval=0, on_report=lambda r: heard.append((r.state, r.pushed_total)))
    passes, answers = follower.sync_pass, [0]

    def counted(url: str) -> list[RunReport]:
        answers[0] += 1
        if answers[0] == 8:
            follower.stop.set()
        return passes(url)

    follower.sync_pass = counted
    follower.run()
    assert heard == [("crashed", 3), ("crashed", 5), ("skipped", 0), ("up_to_date", 9)]


def test_a_run_another_syncer_holds_is_not_idle():
    """``skipped``: another syncer holds the run's lease, perhaps one SIGKILLed mid-pass whose
    lease has still to expire. The run is not done; ``--exit-when-idle`` ended the follow at
    the second pass (exit 0) with the rest of the run never pushed."""
    held = RunReport(path="s3://b/p/r", state="skipped", error="another prime-runs sync holds this run's lease")
    follower = StoreFollower(["s3://b/p"], _passes(
        [held], [held], [held],
        [RunReport(path="s3://b/p/r", state="synced", pushed_now=7, pushed_total=9)],
        [RunReport(path="s3://b/p/r", state="up_to_date", pushed_total=9)],
    ), interval=0, exit_when_idle=True)
    assert [r.state for r in follower.run()] == ["up_to_date"]


def _follow_until_the_resumed_eval_ends(fleet, builder, api) -> None:  # noqa: ANN001
    """Follow ``fleet``'s store with ``--exit-when-idle`` while ``builder``'s resumed run,
    its 2 new episodes mirrored, is live: four passes say ``live`` (none ends the follow),
    then the eval ends and its mirror copies the rest; synced, then idle, each episode once."""
    from support.sync_e2e import assert_exactly_once

    passes = []

    def sync_pass(url: str) -> list[RunReport]:
        if len(passes) == 4:  # the resumed eval ends, its mirror copies the rest
            builder.add(2)
            builder.seal()
            fleet.mirror()
        passes.append(fleet.sync("m"))
        return [passes[-1]]

    StoreFollower([fleet.url], sync_pass, interval=0, exit_when_idle=True).run()
    assert [(r.state, r.pushed_now) for r in passes[:4]] == [("live", 2)] + [("live", 0)] * 3, passes
    assert [r.state for r in passes[4:]] == ["synced", "up_to_date"]
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_resumed_run_live_in_the_store_keeps_a_follow_from_idle_until_it_ends(tmp_path, server, api,
                                                                                 monkeypatch) -> None:
    """A run that crashed, was synced so (its end recorded), then resumed: its new segment,
    mirrored while its writer runs, is live. A sync with nothing new to push said
    ``up_to_date`` for it (the state still held the crash recorded before the resume), so
    ``--follow --exit-when-idle`` ended while the resumed eval still wrote: what it wrote
    after was never pushed by that job, and the run never finalized."""
    from support.store_runs import Fleet

    fleet = Fleet(tmp_path, server.base_url, monkeypatch)
    builder, first = fleet.crashed_run("resumed-live-follow", "m")
    assert first.state == "crashed"
    fleet.resume(builder, 2)
    _follow_until_the_resumed_eval_ends(fleet, builder, api)


@pytest.mark.slow
def test_a_completed_run_resumed_live_in_the_store_keeps_a_follow_from_idle_until_it_ends(tmp_path, server, api,
                                                                                          monkeypatch) -> None:
    """A run that completed, was synced so (finalized), then resumed (``vf-eval --resume``
    writes a new segment after the seal): its new segment, mirrored while its writer runs,
    is live. A sync with nothing new to push said ``up_to_date`` (the state still said
    ``finalized``), so ``--follow --exit-when-idle`` ended before the resumed eval did."""
    from support.runs import RunBuilder
    from support.store_runs import Fleet

    fleet = Fleet(tmp_path, server.base_url, monkeypatch)
    builder = RunBuilder(fleet.outputs / "eval-1", "completed-resumed-live-follow")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    fleet.mirror()
    assert fleet.sync("m").state == "synced"
    fleet.resume(builder, 2)
    _follow_until_the_resumed_eval_ends(fleet, builder, api)


@pytest.mark.slow
def test_a_run_deleted_from_the_store_under_a_follow_is_said_gone_once(tmp_path) -> None:
    """``sync file://... --follow``: a run deleted from the store (or moved elsewhere in it)
    was dropped without a word; it is ``gone`` once, naming its evaluation, as a local
    follower says it of a folder deleted, and the follow goes on with the others."""
    import json
    import queue
    import shutil
    import signal
    import subprocess
    import threading
    import time

    from support.children import reaped
    from support.env import CLI, child_env
    from support.runs import build_run

    bucket = tmp_path / "bucket"
    for name in ("kept", "deleted"):
        build_run(bucket / name, f"store-follow-{name}", 2)
    proc = subprocess.Popen(CLI + ["sync", f"file://{bucket}", "--follow", "--local", "--db", str(tmp_path / "l.db"),
                                   "--to", "samples", "--poll-interval", "0.2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(HOME=str(tmp_path)))
    events: list[dict] = []
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def until(what: str, done) -> None:  # noqa: ANN001
        deadline = time.monotonic() + 30
        while not done():
            try:
                events.append(json.loads(lines.get(timeout=max(0.0, deadline - time.monotonic()))))
            except queue.Empty:
                raise AssertionError((what, events, proc.poll())) from None

    with reaped(proc):
        until("both synced", lambda: {e["path"].rsplit("/", 1)[-1] for e in events if e["state"] == "synced"}
              == {"kept", "deleted"})
        shutil.rmtree(bucket / "deleted")
        until("the deleted run gone", lambda: any(e["state"] == "gone" for e in events))
        time.sleep(1.0)  # passes after it: said once
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # stdout is the reader thread's: not communicate()
        err = proc.stderr.read()
    time.sleep(0.2)
    while not lines.empty():
        events.append(json.loads(lines.get()))
    assert proc.returncode == 0, err
    [gone] = [e for e in events if e["state"] == "gone"]
    assert gone["path"] == f"file://{bucket}/deleted" and gone["evaluation_id"], gone
    assert "no longer in the store" in gone["error"] and gone["pushed_total"] == 2, gone
    assert "0 runs finished" not in err and "1 run finished, 0 not yet" in err, err
