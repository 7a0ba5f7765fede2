"""A sync state's sets of episode ids (``held_there``, ``on_platform``) kept in files of their own
beside it (sync/id_sets.py): a save costs the same for any number of ids, and the state and
its files stay consistent through a crash at any point, a copy, an adoption, an object store,
and a state of the version that held them inline."""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from pathlib import Path

import orjson
import pytest

from prime_runs_spool.errors import StateProblem
from prime_runs_spool.sync import state_file
from prime_runs_spool.sync.state import SyncState, load_state, local_destination, read_state, save_state

RUN_ID = "id-sets"
DESTINATION = local_destination(Path("/tmp/p.db"), None)


def _ids(n: int, salt: int = 0) -> list[str]:
    return [str(uuid.UUID(int=salt * 10**9 + i + 1, version=4)) for i in range(n)]


def _state(held: list[str], on_platform: list[str] = ()) -> SyncState:
    """A traces run's state part way, holding ``held`` ids, read from a document as a state of
    version 1 held them (inline arrays): what every version can read."""
    document = {"version": 1, "destination": {"key": DESTINATION.key, "base_url": DESTINATION.base_url},
                "local_run_id": RUN_ID, "evaluation_id": "0" * 24, "store": "traces",
                "cursor": {"segment_index": 3, "offset": 1 << 20, "next_seq": 5000},
                "uploads": [f"{n:064x}" for n in range(40)], "episodes_pushed": 5000, "traces_pushed": 5000,
                "held_there": held, "on_platform": list(on_platform)}
    return SyncState.from_json(orjson.dumps(document))


def _load(path: Path) -> SyncState:
    state = load_state(path, destination=DESTINATION, local_run_id=RUN_ID)
    assert state is not None
    return state


def _ids_of(state: SyncState, name: str) -> set[str]:
    found = getattr(state, name)  # an array where a version 1 state is read as it was
    return set() if found is None else set(found if isinstance(found, list) else found.ids())


def test_a_save_writes_the_same_bytes_for_any_number_of_held_ids(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids are fixed once found: written once, in a file of their own, never again with
    every save. Held in the state, 20,000 ids made every save write 780 KB (3.9 MB for
    100,000: docs/benchmarks.md)."""
    written: list[int] = []
    real_write, real_pwrite = os.write, os.pwrite
    monkeypatch.setattr(os, "write", lambda fd, data: (written.append(len(data)), real_write(fd, data))[1])
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: (written.append(len(data)), real_pwrite(fd, data, at))[1])
    per_save = {}
    sizes = {}
    for held in (20, 20_000):
        path = tmp_path / f"held-{held}" / "dest.json"
        state = _state(_ids(held))
        save_state(path, state)  # the first: the ids' file written here, once
        written.clear()
        for n in range(3):
            state.episodes_pushed += 1
            save_state(path, state)
        per_save[held] = sum(written) / 3
        sizes[held] = path.stat().st_size
        assert _ids_of(_load(path), "held_there") == set(_ids(held))
    assert per_save[20_000] <= per_save[20] + 8, per_save  # the count's digits aside
    assert sizes[20_000] <= sizes[20] + 8, sizes


def test_a_pass_overwriting_in_place_writes_the_ids_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same through the pass's writer, which overwrites the state in place: its twin too
    stays small, and the file of ids is written by the first save alone."""
    from prime_runs_spool.sync import id_sets
    from prime_runs_spool.sync.state import InFlight

    stored: list[str] = []
    real_replace = id_sets.replace_private
    monkeypatch.setattr(id_sets, "replace_private", lambda path, *a, **k: (stored.append(str(path)),
                                                                           real_replace(path, *a, **k))[1])
    path = tmp_path / "sync" / "dest.json"
    state = _state(_ids(5_000))
    writer = state_file.Writer(str(path))
    for n in range(4):
        state.in_flight = InFlight(kind="traces", sent_at=float(n), digest="a" * 64) if n % 2 == 0 else None
        save_state(path, state, writer)
    writer.end()
    assert len(stored) == 1 and Path(stored[0]).parent == path.parent, stored
    assert path.stat().st_size == Path(state_file.twin_path(str(path))).stat().st_size == 2 * state_file.BLOCK
    assert _ids_of(_load(path), "held_there") == set(_ids(5_000))


def test_a_state_of_version_1_is_read_and_written_as_version_2(tmp_path: Path) -> None:
    """A state written before the files of ids (version 1: the ids inline) is read with its
    ids; its next save keeps them in a file and the state names it."""
    path = tmp_path / "sync" / "dest.json"
    path.parent.mkdir()
    path.write_bytes(_version_1_bytes(_ids(50), _ids(7, salt=1)))
    state = _load(path)
    assert _ids_of(state, "held_there") == set(_ids(50)) and _ids_of(state, "on_platform") == set(_ids(7, salt=1))
    save_state(path, state)
    document = orjson.loads(path.read_bytes())
    assert document["version"] == 2
    assert document["held_there"]["count"] == 50 and document["on_platform"]["count"] == 7
    files = sorted(p.name for p in path.parent.glob("ids-*.ids"))
    assert files == sorted([f"ids-{document['held_there']['digest']}.ids",
                            f"ids-{document['on_platform']['digest']}.ids"])
    again = _load(path)
    assert _ids_of(again, "held_there") == set(_ids(50)) and _ids_of(again, "on_platform") == set(_ids(7, salt=1))


def _version_1_bytes(held: list[str], on_platform: list[str]) -> bytes:
    """A state file as version 1 wrote it: the ids inline, then its checksum."""
    import hashlib

    document = {"version": 1, "destination": {"key": DESTINATION.key, "base_url": DESTINATION.base_url,
                                              "team_id": None},
                "local_run_id": RUN_ID, "evaluation_id": "0" * 24, "store": "traces", "episodes_pushed": 3,
                "held_there": held, "on_platform": on_platform}
    content = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    return content[:-1] + b',"checksum":"%s"}' % hashlib.sha256(content).hexdigest()[:32].encode()


@pytest.mark.parametrize("failing", ["ids", "state"])
def test_a_save_cut_short_leaves_the_last_state_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      failing: str) -> None:
    """A crash (a full disk here) while the file of ids is written, or after it and before
    the state: the last state is read, whole, naming no file it lacks; the next save writes
    both. The file of ids is durable, its name too, before any state names it."""
    from prime_runs_spool.sync import id_sets

    path = tmp_path / "sync" / "dest.json"
    state = _state([])
    save_state(path, state)
    events: list[str] = []
    real_replace, real_write = id_sets.replace_private, state_file.write

    def replace(target, data, *, durable, rename_durable=None, parents=True):  # noqa: ANN001, ANN202
        if failing == "ids":
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        real_replace(target, data, durable=durable, rename_durable=rename_durable, parents=parents)
        events.append(f"ids durable={durable} rename_durable={rename_durable is not False}")

    def write(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if failing == "state":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        events.append("state")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(id_sets, "replace_private", replace)
    monkeypatch.setattr(state_file, "write", write)
    from prime_runs_spool.sync.id_sets import IdSet

    state.held_there = IdSet.of(_ids(300))
    with pytest.raises(OSError):
        save_state(path, state)
    assert events == ([] if failing == "ids" else ["ids durable=True rename_durable=True"])
    assert _load(path).held_there is None  # the last state, whole
    monkeypatch.undo()
    save_state(path, state)
    assert _ids_of(_load(path), "held_there") == set(_ids(300))


def test_a_state_copied_without_its_file_of_ids_is_refused_in_one_line(tmp_path: Path) -> None:
    """A copy that kept the state and lost the file it names (a partial artifact): the state
    is not trusted (the pass reconciles with the platform, as for any damaged state), and
    the line names the file."""
    path = tmp_path / "sync" / "dest.json"
    save_state(path, _state(_ids(10)))
    (side,) = path.parent.glob("ids-*.ids")
    side.unlink()
    with pytest.raises(StateProblem) as refused:
        _load(path)
    assert side.name in str(refused.value) and "missing" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_damaged_file_of_ids_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "sync" / "dest.json"
    save_state(path, _state(_ids(10)))
    (side,) = path.parent.glob("ids-*.ids")
    side.write_bytes(side.read_bytes().replace(b"4", b"5", 1))
    state = _load(path)
    with pytest.raises(StateProblem) as refused:
        state.held_there.ids()
    assert str(side) in str(refused.value) and "damaged" in str(refused.value) and "\n" not in str(refused.value)


def test_a_digest_that_could_name_another_file_is_a_damaged_state(tmp_path: Path) -> None:
    path = tmp_path / "sync" / "dest.json"
    save_state(path, _state(_ids(10)))
    document = orjson.loads(path.read_bytes())
    del document["checksum"]
    document["held_there"]["digest"] = "../../../etc/passwd"
    path.write_bytes(orjson.dumps(document))
    with pytest.raises(StateProblem, match="damaged"):
        _load(path)


def test_the_sync_folder_copied_elsewhere_carries_its_ids(tmp_path: Path) -> None:
    """``cp -r`` of the state's folder (a backup, a CI artifact unpacked): the copy reads its
    own files of ids."""
    path = tmp_path / "a" / "sync" / "dest.json"
    save_state(path, _state(_ids(100), _ids(5, salt=2)))
    shutil.copytree(path.parent, tmp_path / "b" / "sync")
    shutil.rmtree(tmp_path / "a")
    copy = _load(tmp_path / "b" / "sync" / "dest.json")
    assert _ids_of(copy, "held_there") == set(_ids(100)) and _ids_of(copy, "on_platform") == set(_ids(5, salt=2))


def test_an_adopted_state_brings_its_files_of_ids(tmp_path: Path) -> None:
    """A read-only spool synced from a state directory: its states are copied there
    (``adopt_states``), and the files of ids they name with them."""
    from prime_runs_spool.sync.state import sync_dir, sync_state_path
    from prime_runs_spool.sync.state_adoption import adopt_states

    run, home = tmp_path / "run", tmp_path / "home"
    save_state(sync_state_path(run, DESTINATION.key), _state(_ids(100)))
    adopt_states(run, home)
    assert sorted(p.name for p in sync_dir(home).iterdir()) == sorted(p.name for p in sync_dir(run).iterdir())
    assert _ids_of(_load(sync_state_path(home, DESTINATION.key)), "held_there") == set(_ids(100))


@pytest.mark.slow
@pytest.mark.parametrize("announced", [False, True], ids=["nothing-announced", "a-request-announced"])
def test_an_adopted_state_whose_file_of_ids_cannot_be_read_is_reconciled_not_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: bool) -> None:
    """A read-only spool synced from a state directory, the file of ids its state names not
    readable (a FIFO where it was; an I/O error). The state was left behind: the sync began
    as if the run had never been synced, without a word, and without waiting out a request
    the state announced, which may still land (a row twice). Now it is adopted without the
    file: the report names the file and why, and the pass reconciles with the platform,
    waiting out the request the state announces, and only that (none: no wait)."""
    from prime_runs_spool.sync.options import TRACES
    from prime_runs_spool.sync.protocol import Protocol
    from prime_runs_spool.sync.state import InFlight
    from support.runs import RunBuilder
    from test_sync_id_sets_removal import _lose_state, _segment, _stored_once, _sync

    builder, db = RunBuilder(tmp_path / "runs" / "run", f"adopt-unreadable-{announced}"), tmp_path / "p.db"
    _segment(builder, 2)
    _sync(tmp_path / "runs", db)
    _lose_state(builder.run_dir)
    _segment(builder, 1)
    _sync(tmp_path / "runs", db)  # found again: its state names a file of ids
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    state, _ = read_state(path)
    sent_at = time.time() - 1.0
    state.in_flight = InFlight(kind=TRACES, sent_at=sent_at, digest="0" * 64) if announced else None
    save_state(path, state)
    (side,) = path.parent.glob("ids-*.ids")
    side.unlink()
    os.mkfifo(side)  # not a file that can be read
    _segment(builder, 1)
    spool = builder.run_dir / "spool"
    for found in [spool, *spool.rglob("*")]:  # archived read-only
        found.chmod(0o555 if found.is_dir() else 0o444)
    fences: list[tuple[float, str]] = []
    monkeypatch.setattr(Protocol, "fence", lambda self, at, why="": fences.append((at, why)))
    try:
        report = _sync(tmp_path / "runs", db, state_dir=tmp_path / "state")
    finally:
        for found in [spool, *spool.rglob("*")]:
            found.chmod(0o755 if found.is_dir() else 0o644)
    assert (report.state, report.pushed_now, report.error) == ("synced", 1, None), report
    (line,) = [w for w in report.warnings if str(side) in w]
    assert "cannot be read" in line and "\n" not in line, line
    assert [w for w in report.warnings if "reconciling with the platform" in w], report.warnings
    assert [at for at, why in fences if "cannot be trusted" in why] == ([sent_at] if announced else []), fences
    _stored_once(db, builder)


def test_status_counts_the_ids_without_reading_them(tmp_path: Path) -> None:
    """``prime-runs status`` and the viewer read the count the state holds."""
    path = tmp_path / "sync" / "dest.json"
    save_state(path, _state(_ids(10), _ids(4, salt=3)))
    for side in path.parent.glob("ids-*.ids"):
        side.unlink()
    state, _ = read_state(path)
    assert (state.held_there.count, state.on_platform.count) == (10, 4)


def _store_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, episodes: int):  # noqa: ANN202
    """A run of ``episodes`` episodes in a file:// store, and ``sync(machine)``, a Prime Traces
    sync of the store into a local platform from that machine (its own cache)."""
    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.options import TRACES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.store_sync import sync_store
    from support.runs import RunBuilder
    from support.store_runs import upload_run

    url, db = f"file://{tmp_path / 'bucket'}", tmp_path / "p.db"
    (tmp_path / "bucket").mkdir()
    builder = RunBuilder(tmp_path / "run", name)

    def add(count: int) -> None:
        builder.open_segment()
        builder.add(count)
        builder.seal()
        upload_run(url, builder.run_dir, "run")

    def sync(machine: str):  # noqa: ANN202
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / machine / "cache"))
        with EmbeddedPlatform(db, traces=True) as platform:
            settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                                frontend_url=platform.base_url)
            with PlatformClient(settings, timeout=10) as client:
                (report,) = sync_store(url, client, local_destination(db, None), SyncOptions(
                    to=TRACES, request_lifetime=0.5, backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)), jobs=1)
        return report

    def stored_once() -> dict[str, int]:
        import sqlite3

        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            stored = dict(conn.execute("SELECT episode_id, COUNT(*) FROM trace_episodes GROUP BY episode_id"))
        assert sorted(stored) == sorted(builder.ids) and set(stored.values()) == {1}, stored
        return stored

    add(episodes)
    return url, builder, add, sync, stored_once


def _found_again(url: str, sync) -> tuple[str, dict]:  # noqa: ANN001
    """The run's state lost from the bucket, and a sync from machine m2 that finds its Prime
    Traces run again (``held_there``, a file of ids): the state's key and document."""
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(url)
    (state_key,) = [i.key for i in store.list() if i.key.startswith("run/spool/sync/") and i.key.endswith(".json")]
    store.delete(state_key)
    found = sync("m2")
    assert (found.state, found.pushed_now) == ("synced", 0), found
    return state_key, orjson.loads(store.read(state_key)[0])


@pytest.mark.slow
def test_a_run_in_an_object_store_keeps_its_ids_in_an_object_beside_its_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a store the state is one object, replaced by etag at every save: the ids are an
    object of their own beside it, created before the state names it, and fetched by a
    machine whose cache lacks it. Here a state lost from the bucket is found again (its
    Prime Traces run holds the 4 episodes), then the run resumed is synced by a machine
    with nothing cached: it reads the ids, not the platform (no reconciling), and sends only
    the 2 new episodes, each stored once."""
    from prime_runs_spool.store.objects import ObjectStore

    url, builder, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-store", 4)
    first = sync("m1")
    assert (first.state, first.pushed_now) == ("synced", 4), first
    state_key, document = _found_again(url, sync)
    assert document["held_there"]["count"] == 4
    side = f"run/spool/sync/ids-{document['held_there']['digest']}.ids"
    assert sorted(orjson.loads(ObjectStore(url).read(side)[0])) == sorted(builder.ids)
    add(2)  # resumed: two more episodes
    resumed = sync("m3")
    assert (resumed.state, resumed.pushed_now) == ("synced", 2), resumed
    assert not [w for w in resumed.warnings if "reconciling" in w], resumed.warnings
    stored_once()


@pytest.mark.slow
def test_a_new_object_of_ids_is_serialized_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set of ids found by a pass over a store is serialized once, when it is made: the
    object is created from those bytes. Before, the machine's copy was written from them and
    let them go, and the object was serialized again from the ids (once per new object; up to
    100,000 ids)."""
    from prime_runs_spool.sync import id_sets

    url, _, _, sync, _ = _store_run(tmp_path, monkeypatch, "id-sets-once", 4)
    assert sync("m1").pushed_now == 4
    serialized: list[int] = []

    class Counting:  # id_sets' orjson, counting the arrays of ids it serializes
        loads, JSONDecodeError = staticmethod(orjson.loads), orjson.JSONDecodeError

        @staticmethod
        def dumps(value: object, *args: object) -> bytes:
            serialized.append(len(value))  # type: ignore[arg-type]
            return orjson.dumps(value, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(id_sets, "orjson", Counting)
    _, document = _found_again(url, sync)
    assert document["held_there"]["count"] == 4 and document.get("on_platform") is None, document
    assert serialized == [4], serialized


@pytest.mark.slow
def test_a_machines_torn_copy_of_a_file_of_ids_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's copy of a store's file of ids is a cache, written without an fsync: a
    power cut can leave it empty under its name. The store holds it whole, so the next pass
    fetches it again; trusting the copy by its name made every later sync of the run fail
    ("damaged ... move that state aside", naming the cache, which moving changes nothing)."""
    url, _, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-torn", 3)
    assert sync("m2").pushed_now == 3
    _found_again(url, sync)
    (cached,) = (tmp_path / "m2" / "cache").rglob("ids-*.ids")
    cached.write_bytes(b"")  # the power cut
    add(2)
    resumed = sync("m2")
    assert (resumed.state, resumed.pushed_now, resumed.error) == ("synced", 2, None), resumed
    stored_once()


@pytest.mark.slow
def test_a_state_of_version_1_in_an_object_store_is_read_as_it_was(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A state object written before files of ids (version 1, the ids inline): this machine's
    copy of it, written as version 2, names a file of ids, which must be beside it. It was
    not: the engine found the copy naming a missing file, said "a copy made without it?" of
    the user's bucket, and reconciled with the platform instead of carrying on from the
    state. Its next save stores the ids as an object and the state as version 2."""
    from prime_runs_spool.store.objects import ObjectStore

    url, _, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-v1-store", 3)
    assert sync("m1").pushed_now == 3
    state_key, document = _found_again(url, sync)
    store = ObjectStore(url)
    side = f"run/spool/sync/ids-{document['held_there']['digest']}.ids"
    held = orjson.loads(store.read(side)[0])
    store.delete(side)  # as version 1 wrote it: the ids in the state, no object beside it
    document.update(version=1, held_there=held, on_platform=[])
    del document["checksum"]
    store.replace(state_key, orjson.dumps(document), store.read(state_key)[1])
    add(2)
    resumed = sync("m3")
    assert (resumed.state, resumed.pushed_now, resumed.error) == ("synced", 2, None), resumed
    assert not [w for w in resumed.warnings if "reconciling" in w or "missing" in w], resumed.warnings
    stored_once()
    assert orjson.loads(store.read(state_key)[0])["version"] == 2 and sorted(orjson.loads(store.read(side)[0])) == held


def _objects_of_ids(url: str) -> list[str]:
    from prime_runs_spool.store.objects import ObjectStore

    return sorted(i.key for i in ObjectStore(url).list() if i.key.startswith("run/spool/sync/ids-"))


def _cached_ids(tmp_path: Path, machine: str) -> list[Path]:
    return sorted((tmp_path / machine / "cache").rglob("ids-*.ids"))


@pytest.mark.slow
def test_a_store_keeps_no_object_of_ids_no_state_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each state lost from the bucket and found again names a new object of ids (the run's
    Prime Traces run holds more each time); the last one's object, and each machine's copy
    of it, stayed for good: 3 objects after 3 losses. The syncer holding the run's lease
    removes them before it writes; every episode stored once."""
    url, _, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-store-lost", 2)
    assert sync("m1").pushed_now == 2
    for _ in range(3):
        add(1)
        assert sync("m1").pushed_now == 1
        _found_again(url, sync)  # machine m2, with the state gone
        assert len(_objects_of_ids(url)) == 1, _objects_of_ids(url)
        assert len(_cached_ids(tmp_path, "m2")) == 1 and len(_cached_ids(tmp_path, "m1")) <= 1
    add(1)
    assert sync("m1").pushed_now == 1
    assert len(_cached_ids(tmp_path, "m1")) == 1
    stored_once()


@pytest.mark.slow
def test_a_store_bounced_with_an_older_release_piles_up_no_object_of_ids(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A release before files of ids reads the state object as damaged, reconciles and
    writes it back as version 1 (every episode the platform holds, inline); this release
    writes version 2 again, naming a new object each round (the run grew): none is left
    behind, and nothing is sent twice."""
    from prime_runs_spool.store.objects import ObjectStore

    url, builder, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-store-bounce", 2)
    sync("m1")
    state_key, _ = _found_again(url, sync)
    store = ObjectStore(url)
    for _ in range(3):
        add(1)
        assert sync("m1").pushed_now == 1
        data, etag = store.read(state_key)
        document = orjson.loads(data)
        del document["checksum"]
        document.update(version=1, held_there=sorted(builder.ids), on_platform=[], uploads=[], traces_pushed=0,
                        episodes_pushed=0)
        store.replace(state_key, orjson.dumps(document), etag)  # the older release's reconcile
        again = sync("m1")
        assert (again.pushed_now, again.error) == (0, None), again
        assert len(_objects_of_ids(url)) <= 1, _objects_of_ids(url)
    stored_once()


@pytest.mark.slow
def test_a_damaged_object_of_ids_is_named_by_its_url_with_what_to_do(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An object of ids that is not what its state names (damaged in the bucket): the line
    named this machine's copy of it, and said to move the state aside, which changes
    nothing (a pass finding the same ids names the same object, created once, still
    damaged). It names the object's URL and says to delete it; done as said, the next
    sync reconciles and carries on, each episode once. Through ``prime-runs sync`` as a
    user runs it."""
    from support.cli import run_cli

    url, _, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-damaged-object", 3)
    assert sync("m1").pushed_now == 3
    _, document = _found_again(url, sync)
    side = tmp_path / "bucket" / "run" / "spool" / "sync" / f"ids-{document['held_there']['digest']}.ids"
    side.write_bytes(side.read_bytes().replace(b"4", b"5", 1))  # a file:// store's object: its file
    add(2)
    command = ["sync", url, "--local", "--db", str(tmp_path / "p.db"), "--to", "traces", "--request-lifetime", "1"]
    failed = run_cli(*command, XDG_CACHE_HOME=str(tmp_path / "m3" / "cache"))
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    (line,) = [line for line in (failed.stdout + failed.stderr).splitlines() if "not the episode ids" in line]
    object_url = f"{url}/run/spool/sync/{side.name}"
    assert object_url in line and "delete that object" in line and str(tmp_path / "m3") not in line, line
    side.unlink()  # as the line says
    done = run_cli(*command, XDG_CACHE_HOME=str(tmp_path / "m3" / "cache"))
    assert done.returncode == 0, (done.stdout, done.stderr)
    stored_once()


@pytest.mark.slow
def test_an_object_a_state_written_after_the_listing_names_is_kept(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing that found the run was made before its lease was taken: another syncer
    may hold the lease in between and write a state the listing does not show (another
    destination's, a new replay's) naming an object of ids the listing shows unnamed.
    Removed then, that state would name an object gone (its next pass reconciling for
    nothing); a lease written since the listing leaves every object to a later pass."""
    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    url, _, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-store-late-state", 2)
    assert sync("m1").pushed_now == 2
    store = ObjectStore(url)
    data = orjson.dumps(_ids(3, salt=7))
    other = f"run/spool/sync/ids-{_digest(data)}.ids"
    store.create(other, data)  # named by no state yet: the other syncer's, before its state
    real_take, met = Lease.try_take, []

    def take(lease: Lease) -> bool:
        if not met:  # between the listing and this take: another syncer's pass, start to end
            met.append(True)
            theirs = Lease(lease.store, lease.key)
            assert real_take(theirs)
            store.create("run/spool/sync/another-destination.json",
                         orjson.dumps({"held_there": {"count": 3, "digest": _digest(data)}}))
            theirs.release()
        return real_take(lease)

    monkeypatch.setattr(Lease, "try_take", take)
    add(1)
    assert sync("m2").pushed_now == 1 and met
    assert store.read(other) is not None
    monkeypatch.setattr(Lease, "try_take", real_take)
    add(1)
    assert sync("m2").pushed_now == 1
    assert store.read(other) is not None  # the next pass reads that state: named, kept
    store.delete("run/spool/sync/another-destination.json")
    add(1)
    assert sync("m2").pushed_now == 1
    assert store.read(other) is None  # named by none: removed
    stored_once()


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()[:32]


#: ``prime-runs sync`` that stops itself (SIGSTOP) once it has created an object of ids in
#: the store, before the state that names it is written; never while its lease's keep-alive
#: thread replaces the lease, which holds the file:// store's lock on it (a taker would wait
#: on that lock as long as the holder is stopped).
_STOPS_AFTER_AN_OBJECT_OF_IDS = """
import os, runpy, signal, sys, threading, time
from prime_runs_spool.store.local_files import LocalFiles
from prime_runs_spool.store.objects import ObjectStore

real, real_replace, guard = ObjectStore.create, LocalFiles.replace, threading.Lock()

def replace(self, *args):
    with guard:
        return real_replace(self, *args)

def create(self, key, data):
    etag = real(self, key, data)
    if key.rsplit("/", 1)[-1].startswith("ids-"):
        with guard:
            print("between", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            # The stop is the whole process's, taken by some thread a moment later: this one
            # went on past the object, renewed the lease and was stopped inside that replace,
            # holding the lease file's lock, which blocked the taker for good. It waits here.
            time.sleep(0.5)
    return etag

ObjectStore.create, LocalFiles.replace = create, replace
sys.argv = ["prime-runs", *sys.argv[1:]]
runpy.run_module("commands", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_holder_paused_past_its_lease_between_an_object_of_ids_and_its_state_writes_no_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A syncer that found the run again (its state lost) creates the object of ids, then is
    stopped (SIGSTOP) past its lease before it writes the state naming it. Another syncer
    takes the lease over, removes the object as one no state names, and syncs the run to
    another platform. Woken, the first wrote its state naming the object gone, and the next
    sync said "... which is missing (a copy made without it?)" of the bucket and waited a
    request lifetime before reconciling. Now a holder creating an object of ids renews the
    lease before the state names it: taken over, it writes no state and says so."""
    import signal
    import subprocess
    import sys

    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.store.objects import ObjectStore
    from prime_runs_spool.sync.options import TRACES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.store_sync import sync_store
    from support.children import reaped
    from support.env import child_env
    from support.local_client import local_settings

    url, _, add, sync, stored_once = _store_run(tmp_path, monkeypatch, "id-sets-paused-holder", 3)
    assert sync("m1").pushed_now == 3
    store = ObjectStore(url)
    (state_key,) = [i.key for i in store.list() if i.key.startswith("run/spool/sync/") and i.key.endswith(".json")]
    store.delete(state_key)  # lost: the next sync finds the run again, its ids an object of their own
    timing = {"PRIME_RUNS_LEASE_TTL": "1", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}
    for name, value in timing.items():
        monkeypatch.setenv(name, value)
    command = ["sync", url, "--local", "--db", str(tmp_path / "p.db"), "--to", "traces", "--request-lifetime", "1",
               "--json"]
    holder = subprocess.Popen([sys.executable, "-c", _STOPS_AFTER_AN_OBJECT_OF_IDS, *command], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=child_env(XDG_CACHE_HOME=str(tmp_path / "m2" / "cache"), **timing))
    with reaped(holder):
        assert holder.stdout is not None and holder.stdout.readline().strip() == "between"
        assert os.waitpid(holder.pid, os.WUNTRACED)[1]
        (made,) = _objects_of_ids(url)
        time.sleep(1.5)  # past its lease
        other = tmp_path / "q.db"
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "m3" / "cache"))
        with EmbeddedPlatform(other, traces=True) as platform, \
                PlatformClient(local_settings(platform), timeout=10) as client:
            (taker,) = sync_store(url, client, local_destination(other, None), SyncOptions(
                to=TRACES, request_lifetime=0.5, backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)), jobs=1)
        assert (taker.state, taker.pushed_now) == ("synced", 3), taker
        assert store.read(made) is None  # named by no state: removed under the lease taken over
        os.kill(holder.pid, signal.SIGCONT)
        out, err = holder.communicate(timeout=60)
    named = [orjson.loads(store.read(i.key)[0]) for i in store.list()
             if i.key.startswith("run/spool/sync/") and i.key.endswith(".json")]
    for document in named:
        for field in ("held_there", "on_platform"):
            if document.get(field):
                assert store.read(f"run/spool/sync/ids-{document[field]['digest']}.ids") is not None, document
    (stopped,) = orjson.loads(out)["runs"]
    assert holder.returncode == 1 and stopped["state"] == "error" and "taken over" in stopped["error"], (out, err)
    add(1)
    again = sync("m4")
    assert (again.state, again.pushed_now, again.error) == ("synced", 1, None), again
    assert not [w for w in again.warnings if "missing" in w], again.warnings
    stored_once()
