"""Runs in an object store read like local files (store/source.py, store/lease.py), on
obstore's in-memory store: the reader's verdicts over ranged, bounded reads, and the lease."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.content.remask import copy_masking
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool.errors import LeaseLost, StoreConflict
from prime_runs_spool.spool.reader import Position, iter_records
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.store import source
from prime_runs_spool.store.lease import Lease
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.store.source import find_store_runs
from support.segments import as_tuples, build_segment, write_segment


def _memory_store() -> ObjectStore:
    import uuid

    return ObjectStore(f"memory:///{uuid.uuid4().hex}")


def _run_in_store(store: ObjectStore, segments: list[bytes], relative: str = "node/run"):
    for index, data in enumerate(segments, start=1):
        store.create(f"{relative}/spool/seg-{index:06d}.jsonl", data)
    [run] = [r for r in find_store_runs(store, store.list(), Path("/unused")) if r.relative == relative]
    return run


def _verdicts(spool) -> list[dict]:
    return [{f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "path"} for s in spool.segments]


episodes = st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=300), max_size=3), min_size=1, max_size=8)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=episodes, second=episodes, cut=st.floats(0, 1), flip=st.one_of(st.none(), st.floats(0, 1)),
       first_window=st.integers(1, 300), max_window=st.integers(1, 2000), resume=st.floats(0, 1))
def test_a_run_in_the_store_reads_exactly_as_the_same_bytes_on_disk(
        monkeypatch: pytest.MonkeyPatch, first, second, cut, flip, first_window, max_window, resume) -> None:
    """Whatever the spool, its damage (a cut anywhere: torn; a flipped byte: corrupt or torn)
    and the read windows, the store's run gives the local verdicts and the same records,
    from the start and from any record's position."""
    monkeypatch.setattr(source, "FIRST_WINDOW", first_window)
    monkeypatch.setattr(source, "MAX_WINDOW", max(first_window, max_window))
    one, _ = build_segment(first, seal=None)
    two, written = build_segment(second, seal="completed", index=2)
    two = bytearray(two[: int(len(two) * (0.5 + cut / 2))])
    if flip is not None and two:
        two[int(flip * (len(two) - 1))] ^= 0x20
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        write_segment(run_dir, one, 1)
        write_segment(run_dir, bytes(two), 2)
        run = _run_in_store(_memory_store(), [one, bytes(two)])
        assert _verdicts(read_run(run)) == _verdicts(read_run(run_dir))
        local_records = _records(run_dir, None)
        assert _records(run, None) == local_records
        good = [r for r in local_records[1] if r[0] == 2]
        if good:
            segment, offset, seq = good[int(resume * (len(good) - 1))]
            start = Position(segment, offset, seq)
            assert _records(run, start) == _records(run_dir, start)


def _records(run_dir, start):
    out, error = [], None
    try:
        for record in iter_records(run_dir, start):
            out.append((record.segment_index, record.offset, record.seq))
    except Exception as exc:  # the verdict: corruption (or a bad header) after the good records
        error = (type(exc).__name__, getattr(exc, "offset", None), getattr(exc, "reason", None))
    return error, out


def test_reads_are_ranged_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large segment is read in windows of at most MAX_WINDOW bytes, never whole."""
    monkeypatch.setattr(source, "MAX_WINDOW", 64 * 1024)
    data, written = build_segment([{"text": "x" * 20_000} for _ in range(200)])  # about 4 MB
    store = _memory_store()
    run = _run_in_store(store, [data])
    sizes: list[int] = []
    original = store.read_range

    def counting(key: str, start: int, end: int, etag: str | None) -> bytes:
        sizes.append(end - start)
        return original(key, start, end, etag)

    monkeypatch.setattr(store, "read_range", counting)
    assert len(as_tuples(iter_records(run))) == len(written)
    assert max(sizes) <= 64 * 1024 and sum(sizes) == len(data)
    sizes.clear()
    resume = written[-3]
    list(iter_records(run, Position(1, resume[0], resume[2])))
    assert sum(sizes) < 2 * 64 * 1024  # the header's window, then from the offset on


def test_a_segment_replaced_while_it_is_read_is_refused_not_mixed() -> None:
    data, _ = build_segment([{"n": n} for n in range(50)])
    store = _memory_store()
    run = _run_in_store(store, [data])
    key = run.segments[0].info.key
    store.replace(key, data + data[-10:], run.segments[0].info.etag)
    with pytest.raises(StoreConflict):
        list(iter_records(run))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_lease_goes_to_one_syncer_and_is_fenced_by_generation() -> None:
    store, clock = _memory_store(), Clock()
    a = Lease(store, "run/spool/sync.lease.json", owner="a", ttl=10, clock_skew=2, clock=clock)
    b = Lease(store, "run/spool/sync.lease.json", owner="b", ttl=10, clock_skew=2, clock=clock)
    assert a.try_take() and a.generation == 1
    assert not b.try_take()  # held
    clock.now += 11
    assert not b.try_take()  # expired by a's clock, but not by more than the skew
    clock.now += 2
    assert b.try_take() and b.generation == 2
    with pytest.raises(LeaseLost):
        a.renew()
    b.renew()
    b.release()
    assert a.try_take() and a.generation == 3  # released: taken at once, the generation grows
    a.release()


def test_a_renewal_keeps_the_lease_through_long_waits() -> None:
    store, clock = _memory_store(), Clock()
    a = Lease(store, "k", owner="a", ttl=3, clock_skew=0, clock=clock)
    b = Lease(store, "k", owner="b", ttl=3, clock_skew=0, clock=clock)
    assert a.try_take()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    a.sleeper(sleep)(30)  # a fence wait ten times the lease's life
    assert not b.try_take()
    a.renew()


def test_a_lease_kept_alive_outlasts_one_long_request() -> None:
    import time

    store = _memory_store()
    a = Lease(store, "k", owner="a", ttl=0.3, clock_skew=0)
    b = Lease(store, "k", owner="b", ttl=0.3, clock_skew=0)
    assert a.try_take()
    with a.kept_alive():
        time.sleep(1.0)  # a request three lease lifetimes long
        assert not b.try_take()
    a.renew()  # still ours
    a.release()
    assert b.try_take()


def test_the_state_is_replaced_only_from_the_version_last_read(tmp_path: Path) -> None:
    """Two syncers that read the same state version: the first write wins, the second is
    refused (and stops its pass) instead of overwriting what the first announced."""
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import Destination, SyncState
    from prime_runs_spool.sync.store_sync import StoreProtocol

    store = _memory_store()
    destination = Destination(key="d", base_url="http://x")
    protocols = []
    for name in ("a", "b"):
        lease = Lease(store, f"lease-{name}", owner=name, ttl=60)  # each its own lease: only CAS guards
        assert lease.try_take()
        protocol = StoreProtocol(tmp_path / name / "state.json", SyncOptions(), clock=lambda: 0.0,
                                 sleep=lambda s: None, on_save=lambda: None, lease=lease, store=store,
                                 key="run/spool/sync/d.json", etag=None)
        protocol.state = SyncState(destination=destination, local_run_id="r", samples_pushed=0)
        protocols.append(protocol)
    a, b = protocols
    a.state.samples_pushed = 5
    a.save()
    b.state.samples_pushed = 7
    with pytest.raises(StoreConflict):
        b.save()  # created-only: a's state exists
    assert isinstance(b.failure, StoreConflict)
    b.etag = a.etag  # b now read a's version...
    a.state.samples_pushed = 6
    a.save()  # ...and a moved on
    with pytest.raises(StoreConflict):
        b.save()
    assert SyncState.from_json(store.read("run/spool/sync/d.json")[0]).samples_pushed == 6
    assert SyncState.from_json(store.read("run/spool/sync/d.json")[0]).fence == 1


def test_a_resumed_runs_superseded_episodes_are_read_from_the_store_too(tmp_path: Path) -> None:
    """The manifests of every segment (what a resume supersedes) come through the store's
    reads like the records do: a store run supersedes what the same run on disk does."""
    from prime_runs_spool.content.supersede import SUPERSEDES_KEY, superseded_in_run
    from prime_runs_spool.spool.format import encode_line
    from support.segments import header

    def segment(index: int, manifest: dict) -> bytes:
        return encode_line(header(index=index), 0, "header") + encode_line(manifest, 1, "manifest")

    one = segment(1, {"name": "run"})
    two = segment(2, {"name": "run", SUPERSEDES_KEY: ["e-3", "e-7"]})
    write_segment(tmp_path / "run", one, 1)
    write_segment(tmp_path / "run", two, 2)
    run = _run_in_store(_memory_store(), [one, two])
    assert superseded_in_run(run) == superseded_in_run(tmp_path / "run") == {"e-3", "e-7"}


def test_runs_are_found_at_any_depth_and_at_the_prefix_itself() -> None:
    data, _ = build_segment([{"n": 1}])
    store = _memory_store()
    for key in ("spool/seg-000001.jsonl", "a/spool/seg-000001.jsonl", "a/b/c/spool/seg-000002.jsonl",
                "a/spool/sync/d.json", "a/spool/sync.lease.json", "x/notes.txt", "y/spool/seg-x.jsonl"):
        store.create(key, data)
    runs = {run.relative: run for run in find_store_runs(store, store.list(), Path("/unused"))}
    assert sorted(runs) == ["", "a", "a/b/c"]
    assert sorted(runs["a"].objects) == ["a/spool/seg-000001.jsonl", "a/spool/sync.lease.json", "a/spool/sync/d.json"]
    assert runs[""].key("spool", "sync.lease.json") == "spool/sync.lease.json"
    assert str(runs["a/b/c"]) == f"{store.url}/a/b/c"


def test_a_half_synced_run_in_the_store_is_probed_without_a_durable_mark(tmp_path: Path) -> None:
    """A pass that stopped half way (the platform down, a sync killed) leaves a state with a
    cursor and no terminal status, and the next sync first probes it: the segment's size
    against the cursor, then, for a live writer, its durable mark. A segment in a store has
    neither a writer nor a mark beside it: the probe says "not up to date", it does not
    fail on the object (it raised AttributeError: no ``with_suffix``)."""
    from prime_runs_spool.sync.engine import RunSync
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import Cursor, Destination, SyncState

    data, _ = build_segment([{"n": n} for n in range(3)], seal=None)
    run = _run_in_store(_memory_store(), [data])
    destination = Destination(key="store-probe", base_url="http://local")
    probe = RunSync(run, None, destination, SyncOptions())  # type: ignore[arg-type]
    probe.protocol.state = SyncState(destination=destination, local_run_id="run-1", evaluation_id="ev",
                                     cursor=Cursor(segment_index=1, offset=len(data) // 2, next_seq=2))
    assert probe._up_to_date() is False  # noqa: SLF001 - the rule the store's sync asks first


def test_a_mirror_pass_over_a_writer_that_seals_meanwhile_uploads_the_sealed_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live segment's file holds its padding (docs/spool-format.md, section 5), and the
    writer cuts it off when it seals. The mirror took the size first and asked whether the
    writer lived after: a seal in between made that size the padded one, of a writer now
    gone, so it uploaded "all" of a file shorter than that and the pass failed (shorter than
    the bytes to upload). Asked the other way round, any answer is a prefix of the file."""
    from prime_runs_spool.spool.writer_state import writer_alive
    from prime_runs_spool.spool.writer import SegmentWriter
    from prime_runs_spool.store import mirror

    run_dir = tmp_path / "run"
    writer = SegmentWriter.create(run_dir, "mirrored")
    writer.append("manifest", {"name": "mirrored", "masking_version": MASKING_VERSION})  # as today's writer
    writer.append("episode", {"n": 1})

    def sealed_meanwhile(segment: Path) -> bool:
        if not writer.closed:
            writer.seal("completed")
        return writer_alive(segment)

    monkeypatch.setattr(mirror, "writer_alive", sealed_meanwhile)
    store = _memory_store()
    [report] = mirror.mirror_pass([run_dir], store, masking=copy_masking)
    assert report.error is None, report.error
    monkeypatch.undo()
    [report] = mirror.mirror_pass([run_dir], store, masking=copy_masking)  # nothing left to upload: the whole sealed segment is there
    assert report.uploaded == [] and report.error is None
    [run] = find_store_runs(store, store.list(), tmp_path / "local")
    assert read_run(run).status == "completed"


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_run_listed_again_gets_the_segments_uploaded_since_and_keeps_its_other_objects(kind: str,
                                                                                        tmp_path: Path) -> None:
    """What a sync lists again when a state it read is further than its listing (sync/store_sync.py,
    ``listing_behind``): that run's folder alone, its keys still from the prefix."""
    store = _memory_store() if kind == "memory" else ObjectStore(f"file://{tmp_path}")
    store.create("node/other/spool/seg-000001.jsonl", b"{}\n")
    run = _run_in_store(store, [b"one\n"])
    store.create("node/run/spool/seg-000002.jsonl", b"two\n")
    store.create("node/run/spool/seg-000002.jsonl.live", b"{}\n")
    store.create("node/run/spool/sync/x.json", b"{}")
    before = dict(run.objects)
    source.relist_segments(run)
    assert [(index, segment.info.key) for index, segment in run.list_segments()] == [
        (1, "node/run/spool/seg-000001.jsonl"), (2, "node/run/spool/seg-000002.jsonl")]
    assert run.segments[1].live_marker is not None and run.objects == before
    assert sorted(info.key for info in store.list("node/other")) == ["node/other/spool/seg-000001.jsonl"]
