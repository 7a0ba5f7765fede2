"""Hostile review of this session's speed cuts on the append path (append1, append2).

Each test holds a guarantee one of the cuts could have weakened: an episode refused by a
call is not taken for a duplicate later (the run frames episode meta itself, under its
lock); masking's one-key route masks exactly what a plain walk does; the writer's inline
lone-appender path reports nothing durable that is not, and never hangs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.disk import BOTH_PATHS, choose_path, split_synced_writes
from prime_runs_spool import open_run
from prime_runs_spool.errors import MalformedEpisodeError, RecordNotSerializableError
from prime_runs_spool.spool.format import parse_line
from prime_runs_spool.spool.layout import list_segments


def basic_run(run_dir: Path, **kwargs: Any):
    return open_run(run_dir, name="hostile-append", environments=["gsm8k"], model="m", **kwargs)


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


# -- the writer's inline lone-appender path -------------------------------------------------

import asyncio  # noqa: E402
import errno  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from prime_runs_spool.errors import SpoolWriteError, WriterClosedError  # noqa: E402
from prime_runs_spool.spool import durable_file  # noqa: E402
from prime_runs_spool.spool.format import episode_rest, prepare  # noqa: E402
from prime_runs_spool.spool.reader import iter_records  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402


def _lines(tag: str, n: int) -> list[Any]:
    return [(prepare({"tag": tag, "i": i}), episode_rest(f"{tag}-{i}", i)) for i in range(n)]


@pytest.mark.parametrize("fails", [False, True])
def test_appenders_arriving_while_a_lone_appender_flushes_inline_share_its_fate_or_the_next_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool):
    """A lone appender writes and syncs inline; threads and async tasks that arrive during
    that sync queue behind it. A failed sync fails every one of them (nothing queued behind
    a broken segment can be written); a good one hands them the next sync. Nobody hangs,
    and what is reported durable is on disk with contiguous numbers."""
    w = SegmentWriter.create(tmp_path, "r")
    real = durable_file._fdatasync
    entered, release = threading.Event(), threading.Event()
    calls = 0
    synced_size = 0

    def gated(fd: int) -> None:
        nonlocal calls, synced_size
        calls += 1
        if calls == 1:
            entered.set()
            assert release.wait(10)
            if fails:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)
        synced_size = os.fstat(fd).st_size

    monkeypatch.setattr(durable_file, "_fdatasync", gated)
    split_synced_writes(monkeypatch)
    outcomes: dict[str, Any] = {}

    def append(name: str, n: int) -> None:
        try:
            outcomes[name] = ("ok", w.append_episodes(_lines(name, n)), n)
        except (SpoolWriteError, WriterClosedError) as exc:
            outcomes[name] = ("error", type(exc).__name__)

    lead = threading.Thread(target=append, args=("lead", 2))
    lead.start()
    assert entered.wait(10)
    assert w._group._flushing  # the lone appender is mid-flush, inline
    threads = [threading.Thread(target=append, args=(f"t{i}", 3)) for i in range(4)]
    for t in threads:
        t.start()

    async def tasks() -> None:
        async def one(name: str) -> None:
            try:
                outcomes[name] = ("ok", await w.append_episodes_async(_lines(name, 2)), 2)
            except (SpoolWriteError, WriterClosedError) as exc:
                outcomes[name] = ("error", type(exc).__name__)
        await asyncio.gather(*(one(f"a{i}") for i in range(4)))

    loop_thread = threading.Thread(target=asyncio.run, args=(tasks(),))
    loop_thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # every late comer queued behind the flush
        batch = w._group._open
        if batch is not None and len(batch.waiters) == 4 and len(batch.futures) == 4:
            break
        time.sleep(0.005)
    else:
        pytest.fail("the late appenders never queued")
    release.set()
    for t in (lead, *threads, loop_thread):
        t.join(10)
        assert not t.is_alive(), "an appender hung"
    assert len(outcomes) == 9
    if fails:
        assert all(o[0] == "error" for o in outcomes.values()), outcomes
        assert outcomes["lead"] == ("error", "SpoolWriteError")
        with pytest.raises(WriterClosedError):
            w.append_episodes(_lines("after", 1))
    else:
        assert all(o[0] == "ok" for o in outcomes.values()), outcomes
        firsts = sorted((o[1], o[2]) for o in outcomes.values())
        seq = 1
        for first, n in firsts:  # contiguous, each call's lines together
            assert first == seq
            seq += n
        assert w.next_seq == seq
        ends = {r.seq: r.end_offset for r in iter_records(tmp_path)}
        assert max(ends[s] for s in range(1, seq)) <= synced_size
        w.seal("completed")
    w.close()
    if not fails:
        assert len([r for r in iter_records(tmp_path) if r.type == "episode"]) == 2 + 4 * 3 + 4 * 2


@BOTH_PATHS
@pytest.mark.parametrize("first", [0, 5])
def test_a_short_first_writev_on_the_inline_path_is_written_out_or_fails_the_append(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: int, path: str):
    """The inline path writes with one call (a synced pwritev, or a writev) and only loops
    when it came back short: a first write of some bytes is completed; one of none is an
    error, not a success or a loop forever."""
    choose_path(monkeypatch, path)
    w = SegmentWriter.create(tmp_path, "r")
    real = durable_file._writev
    real_at = durable_file._pwritev
    calls = 0

    def short(fd: int, parts: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real(fd, [bytes(parts[0])[:first]]) if first else 0
        return real(fd, parts)

    def short_at(fd: int, parts: Any, offset: int, flags: int = 0) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_at(fd, [bytes(parts[0])[:first]], offset, flags) if first else 0
        return real_at(fd, parts, offset, flags)

    monkeypatch.setattr(durable_file, "_writev", short)
    monkeypatch.setattr(durable_file, "_pwritev", short_at)
    if first:
        assert w.append_episodes(_lines("x", 3)) == 1
        monkeypatch.undo()
        w.seal("completed")
        assert [r.seq for r in iter_records(tmp_path)] == [1, 2, 3, 4]  # 3 episodes, the seal
        assert [r.data for r in iter_records(tmp_path) if r.type == "episode"] == [
            {"tag": "x", "i": i} for i in range(3)]
    else:
        with pytest.raises(SpoolWriteError):
            w.append_episodes(_lines("x", 3))
        with pytest.raises(WriterClosedError):
            w.append_episodes(_lines("y", 1))
    w.close()


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


@BOTH_PATHS
def test_a_short_first_writev_then_a_full_disk_on_the_inline_path_reports_nothing_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str):
    choose_path(monkeypatch, path)
    w = SegmentWriter.create(tmp_path, "r")
    assert w.append_episodes(_lines("before", 1)) == 1
    real = durable_file._writev
    real_at = durable_file._pwritev
    calls = 0

    def short_then_full(fd: int, parts: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real(fd, [bytes(parts[0])[:3], bytes(parts[1])[:10]])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def short_then_full_at(fd: int, parts: Any, offset: int, flags: int = 0) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_at(fd, [bytes(parts[0])[:3], bytes(parts[1])[:10]], offset, flags)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable_file, "_writev", short_then_full)
    monkeypatch.setattr(durable_file, "_pwritev", short_then_full_at)
    with pytest.raises(SpoolWriteError, match=os.strerror(errno.ENOSPC)):
        w.append_episodes(_lines("lost", 2))
    monkeypatch.undo()
    with pytest.raises(WriterClosedError):
        w.append_episodes(_lines("after", 1))
    w.close()
    assert [r.data for r in iter_records(tmp_path)] == [{"tag": "before", "i": 0}]  # the torn line is not read


# -- the summary: what the run counts live against what is read back -------------------------

import itertools  # noqa: E402

import orjson  # noqa: E402

from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402

from prime_runs_spool.content.summary import compute_summary  # noqa: E402
from prime_runs_spool.spool.reader import read_run  # noqa: E402


def test_the_live_summary_is_the_summary_of_what_was_written(tmp_path: Path):
    run = basic_run(tmp_path / "run")
    run.log_episodes([{"id": "a", "ok": True, "traces": [
        {"agent": {"trainable": True}, "rewards": {"r": {"score": float("nan")}}}]}])
    live = run.summary()
    run.finish()
    written = [r.data for r in iter_records(tmp_path / "run") if r.type == "episode"]
    assert compute_summary(written) == live


# Floats of every kind orjson writes otherwise than it holds them (NaN and ±inf as null) or
# exactly (-0.0, huge, subnormal); integers within what JSON here holds; and the values a
# reward's or metric's reading drops or skips anyway.
_any_float = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
_odd_number = st.one_of(_any_float, st.sampled_from([-0.0, 5e-324, -1.5e308, 1.7976931348623157e308]),
                        st.integers(-2**63, 2**63 - 1), st.booleans(), st.none())
_names = st.sampled_from(["a", "b", "m"])  # a metric and a reward of the same name meet
_traces = st.lists(st.fixed_dictionaries({
    "agent": st.fixed_dictionaries({"trainable": st.one_of(st.booleans(), _any_float, st.none())}),
    "rewards": st.dictionaries(_names, st.one_of(st.none(), st.fixed_dictionaries(
        {"score": _odd_number, "weight": st.one_of(st.none(), _any_float)}))),
    "metrics": st.dictionaries(_names, _odd_number),
}), max_size=3)
_episodes = st.lists(st.fixed_dictionaries({"ok": st.one_of(st.booleans(), st.none()), "traces": _traces}),
                     max_size=6)


def _spool_summary(run_dir: Path) -> dict[str, Any]:
    return compute_summary(read_run(run_dir).episodes())


def _sealed_summary(run_dir: Path) -> Any:
    return [r.data.get("summary") for r in iter_records(run_dir) if r.type == "seal"][-1]


_examples = itertools.count()
nan, inf = float("nan"), float("inf")


def _scored(trainable: Any, rewards: dict[str, tuple[Any, Any]], metrics: dict[str, Any] | None = None) -> dict:
    return {"agent": {"trainable": trainable}, "metrics": metrics or {},
            "rewards": {name: {"score": score, "weight": weight} for name, (score, weight) in rewards.items()}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_episodes, st.integers(0, 6))
@example([{"ok": True, "traces": [_scored(True, {"a": (nan, None)})]},  # each way a non-finite value reads
          {"ok": True, "traces": [_scored(True, {"a": (1.0, inf)})]},  # otherwise than its null, one an episode
          {"ok": True, "traces": [_scored(True, {"m": (0.5, None)}, {"m": -inf})]},
          {"ok": True, "traces": [_scored(nan, {"a": (0.25, 2.0)})]}], 2)
@example([{"ok": False, "traces": [{"agent": {"trainable": True}, "metrics": {"m": -1.5e308}}] * 2}], 1)  # overflows
def test_the_live_summary_is_the_spools_for_any_floats_and_after_a_resume(
        tmp_path: Path, episodes: list[dict[str, Any]], split: int):
    # repr: NaN equals itself and -0.0 differs from 0.0 (a mean of finite values can overflow to inf or NaN)
    run_dir = tmp_path / f"run-{next(_examples)}"
    episodes = [{"id": f"e{i}", **episode} for i, episode in enumerate(episodes)]
    first = basic_run(run_dir)
    first.log_episodes(episodes[:split])
    assert repr(first.summary()) == repr(_spool_summary(run_dir))
    first.abort(KeyboardInterrupt())
    second = basic_run(run_dir)  # resumed: its summary continues from the spool
    assert second.resumed
    assert second.log_episodes(episodes) == len(episodes[split:])  # the kept ones are skipped
    assert repr(second.summary()) == repr(_spool_summary(run_dir))
    sealed = second.finish()
    assert repr(sealed) == repr(_spool_summary(run_dir))
    # the seal holds it as JSON does: a mean whose finite values' sum overflowed (to ±inf) as null
    assert _sealed_summary(run_dir) == orjson.loads(orjson.dumps(sealed))
