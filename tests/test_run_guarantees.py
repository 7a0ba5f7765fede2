"""What the run API guarantees when an eval misbehaves (the runner's part).

A malformed or oversized episode is refused whole, before anything of its call is numbered;
settling an append can never strand ``finish``; a cancelled async append is still accounted
for; ``finish`` stops admitting appends; a forked child never touches its parent's run.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from prime_runs_spool.spool import durable_file
from prime_runs_spool import RunClosedError, open_run, read_run
from prime_runs_spool.errors import (EpisodeTooLargeError, MalformedEpisodeError, RecordNotSerializableError,
    SpoolWriteError, WriterClosedError)
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.spool.format import parse_line
from prime_runs_spool.spool.layout import list_segments

from support.disk import split_synced_writes
from support.env import CLI, child_env
from support.episodes import small_episode, small_trace
from support.cli import run_cli


def basic_run(run_dir: Path, **kwargs: Any):
    return open_run(run_dir, name="guarantees", environments=["gsm8k"], model="m", **kwargs)


def episode_lines(run_dir: Path) -> list[Any]:
    """Every intact episode line of the run, read straight from the segment files."""
    found = []
    for _, path in list_segments(run_dir):
        for raw in path.read_bytes().splitlines(keepends=True):
            line = parse_line(raw)
            if line is not None and line.type == "episode":
                found.append(line)
    return found


def episode_metas(run_dir: Path) -> list[dict[str, Any]]:
    return [line.meta for line in episode_lines(run_dir)]


def finish_within(run: Any, seconds: float) -> dict[str, Any] | None:
    """``run.finish()`` on a thread; fails (instead of hanging the suite) if it blocks."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["summary"] = run.finish()
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"finish() did not return within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["summary"]


# -- a bad-shape episode is refused whole, and finish never hangs ---------------------


def _with(trace_change: dict[str, Any]) -> dict[str, Any]:
    episode = small_episode("bad")
    episode["traces"][0].update(trace_change)
    return episode


@pytest.mark.parametrize(
    ("episode", "field"),
    [
        (_with({"metrics": [1.0, 2.0]}), "traces[0].metrics"),
        (_with({"rewards": [{"score": 1.0}]}), "traces[0].rewards"),
        (_with({"agent": ["solver"]}), "traces[0].agent"),
        (_with({"task": {"data": ["idx", 0]}}), "traces[0].task.data"),
        ({"id": "bad", "ok": True, "traces": {"t": small_trace()}}, "traces"),
        ({"id": "bad", "ok": True, "traces": ["not a trace"]}, "traces[0]"),
    ],
    ids=["metrics-list", "rewards-list", "agent-list", "task-data-list", "traces-mapping", "trace-string"],
)
def test_a_bad_shape_episode_is_refused_whole_and_finish_returns(
    tmp_path: Path, episode: dict[str, Any], field: str
) -> None:
    run = basic_run(tmp_path)
    with pytest.raises(MalformedEpisodeError) as refused:
        run.log_episodes([small_episode("good"), episode])
    message = str(refused.value)
    assert field in message and "bad" in message and "\n" not in message
    assert episode_metas(tmp_path) == []  # not partly recorded: nothing of the call
    assert run.episodes_logged == 0
    assert run.log_episodes([small_episode("good")]) == 1  # the good one was not taken
    summary = finish_within(run, 10)
    assert summary is not None and summary["avg_reward"] == 1.0
    assert [meta["episode_id"] for meta in episode_metas(tmp_path)] == ["good"]
    assert read_run(tmp_path).status == "completed"


def test_a_bad_shape_async_episode_is_refused_and_finish_returns(tmp_path: Path) -> None:
    run = basic_run(tmp_path)

    async def main() -> None:
        with pytest.raises(MalformedEpisodeError, match=r"traces\[0\]\.metrics"):
            await run.log_episodes_async([_with({"metrics": ["accuracy", 1.0]})])

    asyncio.run(main())
    finish_within(run, 10)
    assert episode_metas(tmp_path) == []


def test_a_summary_failure_after_the_write_never_strands_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: whatever the summary code meets after an episode is durable, the
    append is counted as recorded (it is on disk) and finish still returns."""
    run = basic_run(tmp_path)

    def broken_add(self: Any, episode: Any) -> None:
        raise AttributeError("'list' object has no attribute 'items'")

    monkeypatch.setattr("prime_runs_spool.content.summary.SummaryAccumulator.add", broken_add)
    assert run.log_episodes([small_episode("a")]) == 1
    assert run.episodes_logged == 1
    finish_within(run, 10)
    assert [meta["episode_id"] for meta in episode_metas(tmp_path)] == ["a"]


# -- a failed call admits none of its episodes ----------------------------------------


@pytest.mark.parametrize("idx", [[0, 1], {"i": 0}], ids=["list", "mapping"])
def test_a_failed_call_marks_none_of_its_good_episodes_as_seen(tmp_path: Path, idx: Any) -> None:
    run = basic_run(tmp_path)
    good, bad = small_episode("good", 0), small_episode("bad", idx)
    with pytest.raises(MalformedEpisodeError, match=r"traces\[0\]\.task\.data\.idx"):
        run.log_episodes([good, bad])
    assert run.episodes_skipped == 0
    assert run.log_episodes([good]) == 1
    finish_within(run, 10)
    # The failed call took no rollout number either: the retried episode is rollout 1.
    assert episode_metas(tmp_path) == [{"episode_id": "good", "rollout_number": 1}]


# -- an episode too large for any request -----------------------------------------------------


def _blob_episode(episode_id: str, size: int) -> dict[str, Any]:
    episode = small_episode(episode_id)
    episode["traces"][0]["info"] = {"blob": "x" * size}
    return episode


def test_an_episode_no_request_can_carry_is_refused_at_append(tmp_path: Path) -> None:
    run = basic_run(tmp_path)
    with pytest.raises(EpisodeTooLargeError) as refused:
        run.log_episodes([small_episode("small"), _blob_episode("huge", MAX_REQUEST_BYTES + 1_000_000)])
    message = str(refused.value)
    assert "huge" in message and str(MAX_REQUEST_BYTES) in message and "\n" not in message
    assert episode_metas(tmp_path) == []
    # Over the limit as one row (the wrapper repeats the trace) but not as per-trace rows:
    # sync splits it, so it is accepted.
    assert run.log_episodes([small_episode("small"), _blob_episode("splits", MAX_REQUEST_BYTES * 2 // 3)]) == 2
    finish_within(run, 10)
    assert [meta["episode_id"] for meta in episode_metas(tmp_path)] == ["small", "splits"]


def _star_episode(episode_id: str, leaves: int, message_bytes: int) -> dict[str, Any]:
    """A small line whose second trace's row is over the request limit: its first node's
    message is repeated in each of ``leaves`` branches (one per root-to-leaf path). That
    trace is the trainable one, so the episode's one row is built from it."""
    episode = small_episode(episode_id, traces=[small_trace(0, trainable=False), small_trace(0, trace_id="u")])
    episode["traces"][0]["nodes"] = [{"message": {"role": "user", "content": "q"}}]
    episode["traces"][1]["nodes"] = [{"message": {"role": "user", "content": "y" * message_bytes}}] + [
        {"parent": 0, "message": {"role": "assistant", "content": "a"}} for _ in range(leaves)]
    return episode


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer SECRETSTAR"}], ids=["plain", "masked"])
def test_an_episode_whose_branches_pass_the_limit_is_refused_by_its_nodes(tmp_path: Path, headers: Any) -> None:
    """The size a row may reach is bounded by the line's size and the most nodes one trace
    holds, counted in the shape check's pass: an episode of about 150 KB is measured, and
    refused, because its second trace has 200 branches (its rows over 25 MiB); with 20 it is
    accepted. Masked for writing (a config to mask, its memo warmed) it is refused alike."""
    run = basic_run(tmp_path)
    if headers:
        warm = [small_episode(f"warm-{n}", headers=headers) for n in range(2)]
        assert run.log_episodes(warm) == 2
    huge = _star_episode("star", 200, MAX_REQUEST_BYTES // 180)
    if headers:
        for trace in huge["traces"]:
            trace["agent"]["config"]["client"]["headers"] = dict(headers)
    assert len(json.dumps(huge)) < MAX_REQUEST_BYTES // 100
    with pytest.raises(EpisodeTooLargeError, match=r"episode star .*trace u"):
        run.log_episodes([huge])
    assert run.log_episodes([_star_episode("fits", 20, MAX_REQUEST_BYTES // 180)]) == 1
    finish_within(run, 10)
    assert [meta["episode_id"] for meta in episode_metas(tmp_path)][-1:] == ["fits"]


# -- episodes masked for writing: what cannot be written, or must be measured ---------------


def _masked_config_episode(episode_id: str, **extra_info: Any) -> dict[str, Any]:
    """An episode whose trace config has a header to mask: from its config's second
    sighting on, the run writes that config as its memoized masked serialization."""
    episode = small_episode(episode_id, headers={"Authorization": "Bearer SECRETFRAG1"})
    episode["traces"][0]["info"] = dict(extra_info)
    return episode


def test_an_episode_masked_for_writing_is_refused_or_measured_as_the_plain_masked_record(tmp_path: Path) -> None:
    """Once the memo answers the config, an episode whose rows must be measured as the
    platform measures them (compact ``json``, which a fragment cannot go through), or that
    cannot be written at all, is masked again plainly: accepted, or refused naming the field,
    exactly as before; and the lines hold the masked config, never the secret."""
    run = basic_run(tmp_path)
    assert run.log_episodes([_masked_config_episode(f"warm-{n}") for n in range(3)]) == 3
    # Its one row (the record, and its trace's info again) is over a third of the request
    # budget: measured by json as well, which the plain masked record goes through.
    assert run.log_episodes([_masked_config_episode("measured", blob="x" * (MAX_REQUEST_BYTES // 5))]) == 1
    with pytest.raises(EpisodeTooLargeError):
        run.log_episodes([_masked_config_episode("huge", blob="x" * (MAX_REQUEST_BYTES + 1_000_000))])
    for bad, field in (({"tags": {"a"}}, "traces[0].info.bad.tags"), ({0: "int key"}, "traces[0].info.bad")):
        with pytest.raises(RecordNotSerializableError) as refused:
            run.log_episodes([_masked_config_episode("bad", bad=bad)])
        assert field in str(refused.value) and "episode bad" in str(refused.value)
    finish_within(run, 10)
    lines = episode_lines(tmp_path)
    assert [line.meta["episode_id"] for line in lines] == ["warm-0", "warm-1", "warm-2", "measured"]
    for line in lines:
        assert line.data["traces"][0]["agent"]["config"]["client"]["headers"] == {"Authorization": "***"}
    assert not any(b"SECRETFRAG1" in path.read_bytes() for _, path in list_segments(tmp_path))


# -- deep nesting and circular references ----------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    current = top
    for _ in range(depth):
        current["a"] = {}
        current = current["a"]
    return top


def _circular_info() -> dict[str, Any]:
    episode = small_episode("loop")
    info: dict[str, Any] = {"ok": 1}
    info["self"] = info
    episode["traces"][0]["info"] = info
    return episode


def _circular_config() -> dict[str, Any]:
    episode = small_episode("loop")
    config = episode["traces"][0]["agent"]["config"]
    config["parent"] = config  # inside the subtree masking walks
    return episode


@pytest.mark.parametrize(
    ("episode", "field", "reason"),
    [
        ({**small_episode("deep"), "extra": _nested(300)}, "extra.a.a", "nested"),
        ({**small_episode("deep"), "extra": _nested(5000)}, "extra.a.a", "nested"),
        (_circular_info(), "traces[0].info.self", "circular"),
        (_circular_config(), "traces[0].agent.config.parent", "circular"),
    ],
    ids=["300-levels", "5000-levels", "cycle", "cycle-in-config"],
)
def test_deep_nesting_and_cycles_raise_not_serializable_naming_the_field(
    tmp_path: Path, episode: dict[str, Any], field: str, reason: str
) -> None:
    run = basic_run(tmp_path)
    with pytest.raises(RecordNotSerializableError) as refused:
        run.log_episodes([small_episode("good"), episode])
    message = str(refused.value)
    assert field in message and reason in message
    assert f"episode {episode['id']}" in message  # which episode of the call, too
    assert "\n" not in message and len(message) < 400
    assert episode_metas(tmp_path) == []
    assert run.log_episodes([small_episode("good")]) == 1
    finish_within(run, 10)


def test_a_value_json_cannot_hold_is_refused_naming_the_episode_and_the_field(tmp_path: Path) -> None:
    """The name is built only once the serialization failed (admission.prepare_episode):
    the message still says which episode of the call, and where in it."""
    run = basic_run(tmp_path)
    episode = small_episode("has-a-set")
    episode["traces"][0]["info"] = {"tags": {"a", "b"}}
    with pytest.raises(RecordNotSerializableError) as refused:
        run.log_episodes([small_episode("good"), episode])
    message = str(refused.value)
    assert "episode has-a-set" in message and "traces[0].info.tags" in message
    assert episode_metas(tmp_path) == []
    assert run.log_episodes([small_episode("good")]) == 1
    finish_within(run, 10)


class _Score(float):
    """A float subclass, as numpy's float64 is: JSON's json module writes it, orjson not."""


@pytest.mark.parametrize("value", [{"a", "b"}, _Score(0.5), b"bytes"])
def test_a_value_json_cannot_hold_is_refused_saying_what_to_do(tmp_path: Path, value: Any) -> None:
    """The refusal said what was wrong ('Type is not JSON serializable: numpy.float64'), not
    that nothing was recorded nor what to do, as every other refusal of log_episodes does."""
    run = basic_run(tmp_path)
    episode = small_episode("odd", metrics={"m": value})
    with pytest.raises(RecordNotSerializableError,
                       match=r"traces\[0\]\.metrics\.m: .*nothing of this call was recorded: .*float\(x\)"):
        run.log_episodes([episode])
    episode["traces"][0]["metrics"]["m"] = 0.5
    assert run.log_episodes([episode]) == 1
    finish_within(run, 10)


_json_leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5)
_json_values = st.recursive(
    _json_leaves,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=_json_values, bad=st.sampled_from(["object", "cycle", "deep"]), data=st.data())
def test_the_first_field_json_cannot_hold_is_named(value: Any, bad: str, data: st.DataObject) -> None:
    """Property: whatever the value, planting one bad thing at a container's place in it
    makes serialize fail with that place named (or an earlier one in iteration order)."""
    from prime_runs_spool.spool.format import find_unserializable, serialize

    assert find_unserializable(value) == ("", "")
    top: dict[str, Any] = {"v": value}
    containers: list[tuple[Any, str]] = []  # (container, its path)
    stack = [(top, "")]
    while stack:
        node, path = stack.pop()
        containers.append((node, path))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            child_path = f"{path}[{key}]" if isinstance(node, list) else (f"{path}.{key}" if path else key)
            if isinstance(child, (dict, list)):
                stack.append((child, child_path))
    node, path = data.draw(st.sampled_from(containers))
    planted: Any = object() if bad == "object" else (node if bad == "cycle" else _nested(300))
    key: Any
    if isinstance(node, dict):
        key = "zz-planted"
        node[key] = planted
        where = f"{path}.{key}" if path else key
    else:
        key = len(node)
        node.append(planted)
        where = f"{path}[{key}]"
    with pytest.raises(RecordNotSerializableError) as refused:
        serialize(top)
    named = refused.value.field_path
    if bad == "deep":  # the 255th level, somewhere inside the planted nesting: a shortened path
        true_path = where + ".a" * 300
    else:
        true_path = where
    if "...(" in named:  # a long path keeps its first keys and its last two
        assert true_path.startswith(named.split("...(")[0]) and "more levels" in named
    else:
        assert named == true_path
    expected = {"object": "not JSON serializable", "cycle": "circular", "deep": "nested deeper"}[bad]
    assert expected in refused.value.reason


# -- a cancelled async append ------------------------------------------------


def test_a_cancelled_async_append_is_still_known_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = basic_run(tmp_path)
    real_sync = durable_file._fdatasync

    def slow_sync(fd: int) -> None:
        time.sleep(0.05)
        real_sync(fd)

    monkeypatch.setattr(durable_file, "_fdatasync", slow_sync)
    split_synced_writes(monkeypatch)
    episodes = [small_episode(f"e{i}", i % 5) for i in range(50)]

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(asyncio.wait_for(run.log_episodes_async([episode]), 0.01) for episode in episodes),
            return_exceptions=True,
        )

    outcomes = asyncio.run(main())
    assert sum(isinstance(outcome, asyncio.TimeoutError) for outcome in outcomes) >= 40
    monkeypatch.setattr(durable_file, "_fdatasync", real_sync)
    assert run.log_episodes(episodes) == 0  # every one is on its way to the disk already
    finish_within(run, 10)
    ids = [meta["episode_id"] for meta in episode_metas(tmp_path)]
    assert sorted(ids) == sorted(e["id"] for e in episodes)  # each once
    assert run.episodes_logged == 50
    seal = json.loads(list_segments(tmp_path)[-1][1].read_bytes().splitlines()[-1])["data"]
    assert seal["episodes"] == 50 and seal["summary"]["avg_error"] == 0.0




def test_the_writer_tells_a_cancelled_async_append_its_fate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's side: ``on_settled`` is called once the lines are durable, by the thread
    that made them so, even though the task awaiting them was cancelled."""
    from prime_runs_spool.spool.writer import SegmentWriter

    real_sync = durable_file._fdatasync
    monkeypatch.setattr(durable_file, "_fdatasync", lambda fd: (time.sleep(0.05), real_sync(fd)))
    split_synced_writes(monkeypatch)
    writer = SegmentWriter.create(tmp_path, "run")
    heard: list[Any] = []
    settled = threading.Event()

    def on_settled(error: BaseException | None) -> None:
        heard.append(error)
        settled.set()

    async def main() -> None:
        task = asyncio.ensure_future(writer.append_many_async([("episode", {"id": "a"})], on_settled=on_settled))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert settled.wait(10) and heard == [None]
    writer.close()
    assert [line.data["id"] for line in episode_lines(tmp_path)] == ["a"]
    with pytest.raises(Exception):
        asyncio.run(writer.append_many_async([("episode", {"id": "b"})], on_settled=on_settled))
    assert len(heard) == 2 and heard[1] is not None  # refused before queueing: told at once
# -- finish stops admitting -------------------------------------------------


def test_finish_refuses_new_appends_and_returns_while_threads_keep_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = basic_run(tmp_path)
    real_sync = durable_file._fdatasync

    def slow_sync(fd: int) -> None:
        time.sleep(0.005)  # something is always in flight
        real_sync(fd)

    monkeypatch.setattr(durable_file, "_fdatasync", slow_sync)
    split_synced_writes(monkeypatch)
    stop = threading.Event()
    closed: list[BaseException] = []

    def keep_logging(worker: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                run.log_episodes([small_episode(f"w{worker}-{n}", n)])
            except RunClosedError as exc:
                closed.append(exc)
                return
            n += 1

    workers = [threading.Thread(target=keep_logging, args=(w,), daemon=True) for w in range(4)]
    for worker in workers:
        worker.start()
    try:
        while run.episodes_logged < 20:
            time.sleep(0.01)
        summary = finish_within(run, 10)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    assert len(closed) == 4 and all("finish" in str(exc) or "completed" in str(exc) for exc in closed)
    on_disk = len(episode_metas(tmp_path))
    seal = json.loads(list_segments(tmp_path)[-1][1].read_bytes().splitlines()[-1])["data"]
    assert seal["episodes"] == on_disk == run.episodes_logged
    assert summary is not None and summary["avg_error"] == 0.0


# -- fork ----------------------------------------------------------------------

_FORK_SCENARIOS = r"""
import multiprocessing, os, sys
from prime_runs_spool import open_run, read_run
from prime_runs_spool.errors import RunForkedError

def episode(episode_id, idx=0):
    return {"id": episode_id, "ok": True, "run": {"id": "local"},
            "traces": [{"id": "t", "agent": {"name": "solver", "trainable": True},
                        "task": {"data": {"idx": idx}}, "rewards": {"r": {"score": 1.0, "weight": 1.0}}}]}

def open_(name):
    return open_run(os.path.join(sys.argv[1], name), name=name, environments=["gsm8k"], model="m")

def in_child(body):
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            sys.stdout.flush()
        sys.exit(0)  # a normal exit: the exit hooks run in the child
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status

# 1. a child that logs
run = open_("child-logs")
run.log_episodes([episode("p0"), episode("p1")])
def child_logs():
    try:
        run.log_episodes([episode("c0")])
        print("child-logs: logged")
    except RunForkedError as exc:
        print("child-logs: refused:", exc)
    try:
        run.finish()  # nor may it seal the parent's run
        print("child-logs: finished")
    except RunForkedError:
        print("child-logs: finish refused")
in_child(child_logs)
run.log_episodes([episode("p2"), episode("p3")])
run.finish()

# 2. a child that only exits
run = open_("child-exits")
run.log_episodes([episode("p0")])
in_child(lambda: None)
print("child-exits: after the child:", read_run(run.dir).status)
run.log_episodes([episode(f"p{i}") for i in range(1, 4)])
run.finish()

# 3. a fork pool of 4 workers
run = open_("pool")
run.log_episodes([episode("p0")])
def work(i):
    made = episode(f"w{i}", i % 4)
    try:
        run.log_episodes([made])
        return "logged", made
    except RunForkedError as exc:
        return "refused: " + str(exc), made
with multiprocessing.get_context("fork").Pool(4) as pool:
    results = pool.map(work, range(40))
print("pool:", sorted({outcome.split(":")[0] for outcome, _ in results}))
run.log_episodes([made for outcome, made in results if outcome != "logged"])  # the parent logs them
print("pool: status before finish:", read_run(run.dir).status)
run.finish()

# 4. forks while another thread keeps logging: the child may inherit a held lock, never waits on it
import threading
run = open_("busy")
stop = threading.Event()
def keep_logging():
    n = 0
    while not stop.is_set() and n < 300:
        run.log_episodes([episode(f"b{n}", n % 4)])
        n += 1
logger = threading.Thread(target=keep_logging)
logger.start()
def child_busy():
    try:
        run.log_episodes([episode("child")])
    except RunForkedError:
        pass
    run.status, run.episodes_logged, run.summary()  # no lock a lost thread held
    run.abort(RuntimeError("a child's abort"))      # does nothing
for _ in range(10):
    in_child(child_busy)
stop.set()
logger.join()
print("busy: status before finish:", read_run(run.dir).status)
run.finish()
print("busy: logged", run.episodes_logged)
"""


@pytest.mark.slow
def test_a_forked_child_never_touches_its_parents_run(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    script = tmp_path / "fork_scenarios.py"
    script.write_text(_FORK_SCENARIOS)
    done = subprocess.run([sys.executable, str(script), str(outputs)], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "child-logs: refused:" in out and "fork" in out and "child-logs: finish refused" in out
    assert "child-exits: after the child: live" in out
    assert "pool: ['refused']" in out and "pool: status before finish: live" in out
    assert "busy: status before finish: live" in out
    busy_logged = int(out.split("busy: logged ")[1].split()[0])

    expected = {"child-logs": 4, "child-exits": 4, "pool": 41, "busy": busy_logged}
    for name, count in expected.items():
        spool = read_run(outputs / name)
        assert spool.status == "completed", name
        seqs = [line.seq for _, path in list_segments(outputs / name)
                for line in map(parse_line, path.read_bytes().splitlines(keepends=True))]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), name
        assert len(episode_metas(outputs / name)) == count, name

    verify = subprocess.run(CLI + ["verify", str(outputs)], capture_output=True, text=True,
                            env=child_env(), timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    db = tmp_path / "local.db"
    sync = subprocess.run(CLI + ["sync", str(outputs), "--local", "--db", str(db), "--json"],
                          capture_output=True, text=True, env=child_env(), timeout=120)
    assert sync.returncode == 0, sync.stdout + sync.stderr

    from prime_runs_spool.local_platform.store import Store

    store = Store(db)
    try:
        evaluations, total = store.list_evaluations(skip=0, limit=100)
        assert total == 4
        for evaluation in evaluations:
            name = evaluation["name"]
            bodies, pushed = store.list_samples(evaluation["evaluation_id"], offset=0, limit=1000)
            ids = [json.loads(body)["sample_id"] for body in bodies]
            assert pushed == expected[name] and len(set(ids)) == len(ids) == expected[name], name
    finally:
        store.close()


def test_check_episode_fast_path_refuses_and_accepts_as_field_by_field() -> None:
    """check_episode's common case (exact dicts, lists, float scores) is checked in C-level
    passes; every other kind falls back to the field-by-field checks: other mappings and
    tuples pass, other kinds are refused naming the first bad field, in the fields' order."""
    from types import MappingProxyType

    from prime_runs_spool.content.episodes import check_episode

    def episode(**change: Any) -> dict[str, Any]:
        out = small_episode("e")
        out["traces"][0].update(change)
        return out

    check_episode(episode(agent=MappingProxyType({"trainable": True}), nodes=(), info=MappingProxyType({})))
    check_episode(episode(rewards={"r": {"score": 1, "weight": True}, "s": None, "t": "x"}))
    check_episode(episode(rewards={"r": {"score": None, "weight": 0.5}}))
    for change, field in (({"info": [1], "nodes": "x"}, "traces[0].info"), ({"nodes": "x", "tools": 1}, "traces[0].nodes"),
                          ({"tools": {}}, "traces[0].tools"), ({"metrics": "m", "calls": 3}, "traces[0].metrics"),
                          ({"rewards": {"r": {"score": "1"}}}, "traces[0].rewards.r.score"),
                          ({"rewards": {"r": {"score": 1.0, "weight": "2"}}}, "traces[0].rewards.r.weight")):
        with pytest.raises(MalformedEpisodeError, match=re.escape(field) + " must"):
            check_episode(episode(**change))
    from prime_runs_spool.content.episodes import _TRACE_LISTS, _TRACE_MAPPINGS

    for name in [key for key, _ in _TRACE_MAPPINGS] + list(_TRACE_LISTS):  # each named field is checked
        with pytest.raises(MalformedEpisodeError, match=re.escape(f"traces[0].{name}") + " must"):
            check_episode(episode(**{name: 3}))


def episode_ids_on_disk(run_dir: Path) -> list[Any]:
    found = []
    for _, path in list_segments(run_dir):
        for raw in path.read_bytes().splitlines(keepends=True):
            line = parse_line(raw)
            if line is not None and line.type == "episode":
                found.append(line.meta["episode_id"])
    return found


class _SurrogateId(str):
    """An id that serializes (orjson writes a str subclass by its content) but whose text,
    the id the run de-duplicates and frames by, is not valid UTF-8."""

    def __str__(self) -> str:
        return "bad-\udc80"


def test_an_episode_id_the_meta_cannot_hold_is_refused_before_any_id_is_taken(tmp_path: Path):
    # The run frames the meta itself (format.episode_rest) under its lock, after taking the
    # call's ids: an id that meta cannot serialize once raised there, leaving every id of
    # the call taken, so a retry of the good episodes was silently skipped as duplicates.
    run = basic_run(tmp_path / "run")
    with pytest.raises(RecordNotSerializableError, match=r"episode bad-\\udc80 id") as info:
        run.log_episodes([{"id": "good", "traces": []}, {"id": _SurrogateId("x"), "traces": []}])
    str(info.value).encode("utf-8")  # printable: the surrogate escaped in the message
    assert run.log_episodes([{"id": "good", "traces": []}]) == 1
    assert run.episodes_skipped == 0
    with pytest.raises(RecordNotSerializableError):  # the bad one meets its error again
        run.log_episodes([{"id": _SurrogateId("x"), "traces": []}])
    run.finish()
    assert episode_ids_on_disk(tmp_path / "run") == ["good"]


class _UnhashableIdx(str):
    """A ``task.data.idx`` check_episode takes (a string) that the rollout counter cannot hash."""

    __hash__ = None  # type: ignore[assignment]


def test_a_rollout_key_the_counter_cannot_hash_gives_the_calls_ids_back(tmp_path: Path):
    # _admit numbers each episode after taking its id, under the run's lock: a key the counter
    # raised on left the call's ids taken, and a retry of its good episodes silently skipped.
    # check_episode now refuses such an idx before the lock; _admit gives ids back anyway.
    run = basic_run(tmp_path / "run")
    bad = {"id": "bad", "traces": [{"task": {"data": {"idx": _UnhashableIdx("a")}}}]}
    with pytest.raises(MalformedEpisodeError, match=r"traces\[0\]\.task\.data\.idx"):
        run.log_episodes([{"id": "good", "traces": []}, {"id": "good", "traces": []}, bad])
    assert run.log_episodes([{"id": "good", "traces": []}]) == 1
    with pytest.raises(MalformedEpisodeError):
        run.log_episodes([bad])
    run.finish()
    assert episode_ids_on_disk(tmp_path / "run") == ["good"]


def test_admit_gives_the_calls_ids_back_whatever_raises_under_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run = basic_run(tmp_path / "run")
    real = run._counter.next_number_for

    def failing(key: Any) -> Any:
        if key == "boom":
            raise RuntimeError("counter failed")
        return real(key)

    monkeypatch.setattr(run._counter, "next_number_for", failing)
    bad = {"id": "bad", "traces": [{"task": {"data": {"idx": "boom"}}}]}
    with pytest.raises(RuntimeError):
        run.log_episodes([{"id": "good", "traces": []}, {"id": "good", "traces": []}, bad])
    assert run.log_episodes([{"id": "good", "traces": []}]) == 1
    monkeypatch.undo()
    assert run.log_episodes([bad]) == 1
    run.finish()
    assert episode_ids_on_disk(tmp_path / "run") == ["good", "bad"]


def test_an_async_append_cancelled_while_its_sync_fails_is_not_taken_for_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """log_episodes_async hands the writer its lines with their framing
    (append_episodes_async); cancelled while the sync is under way and the sync then fails,
    the run still learns the episodes are not durable: a retry meets the error instead of
    being skipped as a duplicate, and finish does not wait for it forever."""
    run = basic_run(tmp_path / "run")
    run.log_episodes([{"id": "first", "traces": []}])
    entered, release = threading.Event(), threading.Event()

    def failing(fd: int) -> None:
        entered.set()
        assert release.wait(10)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(durable_file, "_fdatasync", failing)
    split_synced_writes(monkeypatch)

    async def main() -> None:
        task = asyncio.ensure_future(run.log_episodes_async([{"id": "late", "traces": []}]))
        while not entered.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while run._state.inflight and time.monotonic() < deadline:  # settled by the helper thread
        time.sleep(0.005)
    assert run._state.inflight == 0
    with pytest.raises((SpoolWriteError, WriterClosedError)):
        run.log_episodes([{"id": "late", "traces": []}])
    assert run.episodes_logged == 1 and run.episodes_skipped == 0
    done = threading.Event()
    finisher = threading.Thread(target=lambda: (pytest.raises(Exception, run.finish), done.set()), daemon=True)
    finisher.start()
    assert done.wait(10), "finish hung after a failed, cancelled async append"


@pytest.mark.slow
def test_an_episode_whose_line_would_pass_the_format_limit_is_refused_not_written(tmp_path: Path) -> None:
    """format.prepare leaves 200 bytes for the framing; the meta repeats the episode id, so
    an id of megabytes made a line over MAX_LINE_BYTES. The writer wrote it, and every
    reader then stopped at it as corrupt ("a line longer than the format's limit"), with
    every episode after it: `prime-runs import` of such a traces.jsonl made a corrupt spool."""
    from fixtures.episodes import make_episode
    from prime_runs_spool import open_run
    from prime_runs_spool.errors import RecordTooLargeError
    from prime_runs_spool.spool import format as spool_format
    from prime_runs_spool.spool.writer import SegmentWriter

    limit = 1 << 20
    original = spool_format.MAX_LINE_BYTES
    with pytest.MonkeyPatch.context() as patch:  # a small limit, so the test writes little
        for module in ("prime_runs_spool.spool.format", "prime_runs_spool.runner.admission"):
            patch.setattr(f"{module}.MAX_LINE_BYTES", limit, raising=False)
        with open_run(tmp_path / "api", name="long-id", environments=["gsm8k"], model="m") as run:
            episode = make_episode(0, size=100, run_id=run.id, salt="long")
            episode["id"] = "z" * (limit * 2 // 3)
            with pytest.raises(RecordTooLargeError) as caught:
                run.log_episodes([episode])
            assert len(str(caught.value)) < 300
            run.log_episodes([make_episode(1, size=100, run_id=run.id, salt="long")])
        writer = SegmentWriter.create(tmp_path / "direct", "direct-long-meta")
        with pytest.raises(RecordTooLargeError):
            writer.append("episode", {"id": "q"}, {"episode_id": "q" * limit})
        writer.close()
    assert spool_format.MAX_LINE_BYTES == original
    result = run_cli("verify", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


_RUN_SENT_TO_A_POOL = """
import multiprocessing, sys
from prime_runs_spool import open_run

def child_logs(run, episode):
    return run.log_episodes([episode])

if __name__ == "__main__":
    episode = {"id": "e1", "ok": True, "traces": []}
    with open_run(sys.argv[1], name="spawned") as run:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            try:
                pool.apply(child_logs, (run, episode))
            except TypeError as exc:
                print("refused:", exc)
        run.log_episodes([episode])
        print("parent logged", run.episodes_logged)
"""


@pytest.mark.slow
def test_a_run_sent_to_another_process_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """A run handed to a spawn pool's task is pickled: the refusal says why and what to do
    (it read "cannot pickle '_thread.lock' object"), and the parent's run goes on."""
    script = tmp_path / "send_run.py"
    script.write_text(_RUN_SENT_TO_A_POOL)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True,
                          text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    refusal = done.stdout.split("refused: ")[1].splitlines()[0]
    assert "_thread.lock" not in refusal and "cannot be sent to another process" in refusal, refusal
    assert "return the episodes to" in refusal, refusal
    assert "parent logged 1" in done.stdout
    assert read_run(tmp_path / "run").status == "completed"


@pytest.mark.parametrize("copier", [pickle.dumps, copy.copy, copy.deepcopy])
def test_a_run_cannot_be_copied(tmp_path: Path, copier: Any) -> None:
    """A copy would share the writer but count apart: a copy that logged and finished sealed
    the run with a summary its original never saw. Refused, saying what to do instead."""
    with open_run(tmp_path / "run", name="r") as run:
        with pytest.raises(TypeError, match="cannot be sent to another process or copied"):
            copier(run)
        run.log_episodes([small_episode("e1")])
    assert read_run(tmp_path / "run").episodes_count == 1
