"""The sync state file: what a received or damaged one is taken for, and how a write of it
fails without leaving a temporary file behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import build_run
from support.cli import local_sync
from support.odd_files import not_a_regular_file


@pytest.mark.slow
@pytest.mark.parametrize("key", ["samples_pushed", "in_flight", "finalized", "checksum"])
def test_a_damaged_byte_that_still_parses_is_damage_not_a_state(tmp_path: Path, key: str) -> None:
    """One letter of a key flipped (a bit gone bad on the disk) still parses, and the field
    silently took its default: "0 samples pushed" told of a run the platform holds whole,
    ``in_flight`` forgotten with its request in doubt. The state's checksum makes it damage:
    ``status`` says so, and sync reconciles with the platform, pushing nothing twice. The
    checksum's own key flipped left a file read as one written before checksums were kept,
    every other field trusted: a key no state has, in a file without a checksum, is damage."""
    from prime_runs_spool.sync.state import sync_dir

    builder = build_run(tmp_path / "runs" / "r", "flipped-key", 3)
    db = tmp_path / "local.db"
    first = local_sync(tmp_path / "runs", db)
    assert first.returncode == 0, first.stderr
    evaluation_id = json.loads(first.stdout)["runs"][0]["evaluation_id"]
    (state_file,) = sync_dir(builder.run_dir).glob("*.json")
    data = bytearray(state_file.read_bytes())
    at = data.index(f'"{key}"'.encode()) + 3
    data[at] ^= 0x20  # its second letter's case
    state_file.write_bytes(bytes(data))
    json.loads(data)  # still JSON
    status = subprocess.run(CLI + ["status", "--json", str(tmp_path / "runs")], capture_output=True, text=True,
                            env=child_env(), timeout=60)
    assert any("damaged" in warning for warning in json.loads(status.stdout)["runs"][0]["warnings"]), status.stdout
    again = local_sync(tmp_path / "runs", db)
    (run,) = json.loads(again.stdout)["runs"]
    assert (run["state"], run["evaluation_id"], run["pushed_now"], run["pushed_total"]) == (
        "synced", evaluation_id, 0, 3), run
    assert any("damaged" in warning for warning in run["warnings"]), run


@pytest.mark.slow
@pytest.mark.parametrize(("field", "value"), [
    ("evaluation_id", "../../../teams/someone-else"),   # aimed the user's key at another path of the API
    ("cursor", {"segment_index": -1, "offset": 0, "next_seq": 0, "rows_done": 0}),  # "corrupt seg--00001"
    ("store", "bogus"),                                  # "sync it with --to bogus"
])
def test_a_received_state_with_values_no_sync_writes_is_damaged(tmp_path: Path, field: str, value: object) -> None:
    """A spool received with its sync state (a CI artifact): values of the right JSON type
    that no sync writes were trusted. The state is damaged instead: sync reconciles with
    the platform, finds the run's evaluation and reports the run synced."""
    from prime_runs_spool.sync.state import sync_dir

    builder = build_run(tmp_path / "runs" / "r", "received-state", 3)
    db = tmp_path / "local.db"
    first = local_sync(tmp_path / "runs", db)
    assert first.returncode == 0, first.stderr
    evaluation_id = json.loads(first.stdout)["runs"][0]["evaluation_id"]
    (state_file,) = sync_dir(builder.run_dir).glob("*.json")
    state = json.loads(state_file.read_text())
    state.update({field: value, "finalized": False, "terminal": None})
    state.pop("checksum")  # the values' checks, not the checksum's: as a sync that kept none wrote it
    state_file.write_text(json.dumps(state))
    again = local_sync(tmp_path / "runs", db)
    (run,) = json.loads(again.stdout)["runs"]
    assert (run["state"], run["evaluation_id"], run["pushed_total"]) == ("synced", evaluation_id, 3), run
    assert any("damaged" in warning for warning in run["warnings"]), run


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_sync_state_that_is_not_a_regular_file_does_not_hang_status_or_sync(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked status and sync at open forever; a link to /dev/zero read until memory
    ran out. A received spool (an artifact unpacked from a tarball) can hold either."""
    from prime_runs_spool.sync.state import sync_dir

    builder = build_run(tmp_path / "runs" / "r", f"state-{kind}", 2)
    db = tmp_path / "local.db"
    assert local_sync(tmp_path / "runs", db).returncode == 0
    (state_file,) = sync_dir(builder.run_dir).glob("*.json")
    not_a_regular_file(state_file, kind)
    status = subprocess.run(CLI + ["status", str(tmp_path / "runs")], capture_output=True, text=True, timeout=20,
                            env=child_env())
    assert status.returncode == 0 and "not a regular file" in status.stdout, status.stdout + status.stderr
    again = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "--to", "samples", "--request-lifetime", "1",
                                  "--json", str(tmp_path / "runs")],
                           capture_output=True, text=True, timeout=30, env=child_env())
    (run,) = json.loads(again.stdout)["runs"]
    assert (run["state"], run["pushed_total"]) == ("synced", 2), run
    assert state_file.is_file() and not state_file.is_symlink()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _state(run_id: str = "tmp-left"):  # noqa: ANN202
    from prime_runs_spool.sync.state import SyncState, remote_destination

    return SyncState(destination=remote_destination("http://platform.invalid", None), local_run_id=run_id)


def test_a_state_write_that_cannot_be_renamed_into_place_leaves_no_tmp_file(tmp_path: Path) -> None:
    from prime_runs_spool.sync.state import save_state

    target = tmp_path / "sync" / "dest.json"
    target.mkdir(parents=True)  # a folder where the state goes: the rename fails
    with pytest.raises(OSError):
        save_state(target, _state())
    assert _leftovers(target.parent) == []


def test_a_state_write_on_a_full_disk_leaves_no_tmp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from prime_runs_spool.sync import state as state_module

    target = tmp_path / "sync" / "dest.json"
    target.parent.mkdir()
    state_module.save_state(target, _state())
    before = target.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_module.os, "fsync", full)
    with pytest.raises(OSError):
        state_module.save_state(target, _state())
    monkeypatch.undo()
    assert _leftovers(target.parent) == []
    assert target.read_bytes() == before  # the old state, whole: the write stayed atomic


def test_a_store_state_cache_write_that_fails_leaves_no_tmp_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from prime_runs_spool import files

    target = tmp_path / "cache" / "dest.json"
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "write", full)
    with pytest.raises(OSError):
        files.replace_private(target, b"{}", durable=False)  # the store state cache's writer
    monkeypatch.setattr(files.os, "write", real_write)
    assert _leftovers(target.parent) == []


def test_a_huge_local_state_file_is_set_aside_not_read_into_memory(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from prime_runs_spool import files
    from prime_runs_spool.sync.state import load_state, remote_destination
    from prime_runs_spool.errors import StateProblem

    monkeypatch.setattr(files, "MAX_SMALL_FILE_BYTES", 4096)
    path = tmp_path / "state.json"
    with open(path, "wb") as f:
        f.truncate(1 << 30)  # a sparse gigabyte: nothing of it may be read
    with pytest.raises(StateProblem) as caught:
        load_state(path, destination=remote_destination("http://x", None), local_run_id="r")
    assert "larger than 4,096 bytes" in str(caught.value), caught.value


def _rich_state():  # noqa: ANN202
    """A state with every kind of field set: nested objects, lists, a request in flight."""
    from prime_runs_spool.sync.state import Cursor, InFlight

    state = _state("every-field")
    state.evaluation_id, state.viewer_url, state.store = "ev-1", "https://platform.invalid/ev-1", "samples"
    state.cursor = Cursor(segment_index=2, offset=4096, next_seq=17, rows_done=1)
    state.segments = {"1": {"offset": 900, "seq": 9}, "2": {"offset": 4096, "seq": 17}}
    state.seal = {"status": "completed", "summary": {"avg_reward": 0.25, "n": 3}}
    state.samples_pushed, state.episodes_pushed, state.last_sample_id = 12, 11, "s-12"
    state.in_flight = InFlight(kind="samples", sent_at=1733500000.5, rows=2, episodes=2, released=["e-3"],
                               end=Cursor(segment_index=2, offset=5000, next_seq=19), last_sample_id="s-14")
    state.metrics_sent, state.metadata_sent = {"avg_reward": 0.25}, "0" * 32
    state.skipped = [{"segment": 1, "offset": 10, "reason": "a damaged line"}]
    state.updated_at = 1733500000.25
    return state


def test_a_state_file_is_one_sorted_serialization_and_its_checksum() -> None:
    """The file is the state's content serialized once, keys sorted at every level, and that
    same serialization is its checksum's input: what a reader parses, sorts and digests again
    (a file written by hand, or by an earlier version, in any order) agrees byte for byte."""
    from prime_runs_spool.sync.state import CHECKSUM_KEY, SyncState, _checksum

    state = _rich_state()
    data = state.to_json()
    document = json.loads(data)
    assert list(document)[-1] == CHECKSUM_KEY
    digest = document.pop(CHECKSUM_KEY)
    content = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    assert data == content[:-1] + f',"{CHECKSUM_KEY}":"{digest}"}}'.encode()
    assert digest == _checksum(document)
    assert SyncState.from_json(data) == state
    indented = json.dumps({**document, CHECKSUM_KEY: digest}, indent=2).encode()  # as earlier versions wrote it
    assert SyncState.from_json(indented) == state


def test_a_state_file_holds_its_fields_alone_whatever_else_the_state_object_carries(tmp_path: Path) -> None:
    """A state's document is taken from its object's attributes in one copy: a state read
    back (which carries whether this process wrote it, a private field) or given an attribute
    no field names is written as its fields alone, the same bytes as read field by field,
    and this process knows the file as its own write."""
    import dataclasses

    from prime_runs_spool.sync.state import SyncState, load_state, save_state

    state = _rich_state()
    path = tmp_path / "state.json"
    save_state(path, state)
    loaded = load_state(path, destination=state.destination, local_run_id=state.local_run_id)
    assert loaded is not None and loaded.written_here and "_written_here" in vars(loaded)
    loaded.scratch = "not a field"  # type: ignore[attr-defined]
    for kept in (loaded, state):
        data = kept.to_json()
        fields = {f.name: getattr(kept, f.name) for f in dataclasses.fields(SyncState) if not f.name.startswith("_")}
        assert set(json.loads(data)) == {*fields, "checksum"}
        assert SyncState.from_json(data) == state
    save_state(path, loaded)
    assert json.loads(path.read_bytes())["version"] == state.version
    again = load_state(path, destination=state.destination, local_run_id=state.local_run_id)
    assert again is not None and again.written_here
    path.write_bytes(path.read_bytes().rstrip() + b"  ")  # the same bytes, its padding aside: still its own
    assert load_state(path, destination=state.destination, local_run_id=state.local_run_id).written_here
    document = json.loads(path.read_bytes())
    path.write_bytes(json.dumps(document, indent=1).encode())  # the same state, other bytes: not its write
    assert not load_state(path, destination=state.destination, local_run_id=state.local_run_id).written_here


def test_every_byte_of_a_state_file_damaged_is_damage_or_the_same_state() -> None:
    """A bit flipped anywhere in a state file either fails to parse, fails its checksum or
    its model, or reads back as the very same state (an exponent's ``e`` read as ``E``):
    never another state trusted. A bit flipped in the checksum's own key name is always
    damage: it left a file read as one written before checksums were kept, so whatever else
    the bad sector took (a count, ``in_flight``) was trusted with it."""
    from prime_runs_spool.errors import StateFormatError
    from prime_runs_spool.sync.state import CHECKSUM_KEY, SyncState

    state = _rich_state()
    data = state.to_json()
    key_at = data.rindex(f'"{CHECKSUM_KEY}"'.encode()) + 1
    key_bytes = range(key_at, key_at + len(CHECKSUM_KEY))
    trusted = []
    for at in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[at] ^= 1 << bit
            try:
                read = SyncState.from_json(bytes(damaged))
            except StateFormatError:
                continue
            if read != state or at in key_bytes:
                trusted.append((at, bit, bytes(damaged[max(0, at - 12):at + 12])))
    assert trusted == [], trusted[:5]


def test_a_key_no_state_has_is_damage_in_a_file_without_a_checksum() -> None:
    """A file with no checksum (as a sync before checksums wrote it) is read as it is, but a
    key no state has, at any level, is a name a damaged byte made: ``rows_done`` flipped read
    as absent put the cursor at the episode's first row again. With a checksum that holds, a
    field a later version added is still ignored."""
    from prime_runs_spool.errors import StateFormatError
    from prime_runs_spool.sync.state import CHECKSUM_KEY, SyncState, _checksum

    document = json.loads(_rich_state().to_json())
    document.pop(CHECKSUM_KEY)
    assert SyncState.from_json(json.dumps(document).encode()).cursor.rows_done == 1
    for path in (("cursor", "rows_done"), ("in_flight", "end", "offset"), ("seal",)):
        damaged = json.loads(json.dumps(document))
        *parents, key = path
        holder = damaged
        for parent in parents:
            holder = holder[parent]
        holder[key[:-1] + chr(ord(key[-1]) ^ 1)] = holder.pop(key)
        with pytest.raises(StateFormatError, match="a key no state has"):
            SyncState.from_json(json.dumps(damaged).encode())
    later = {**document, "a_later_field": {"x": 1}}
    later[CHECKSUM_KEY] = _checksum({k: v for k, v in later.items()})
    assert SyncState.from_json(json.dumps(later).encode()).cursor.rows_done == 1


class _PowerCut(BaseException):
    """The power going off: nothing of the pass runs on (raised past every handler)."""


@pytest.mark.slow
@pytest.mark.parametrize(("torn", "at"), [("file", 1), ("file", 2), ("file", 3), ("twin", 1), ("twin", 2)])
def test_a_power_cut_that_tears_an_overwrite_leaves_the_state_whole_in_its_twin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: str, at: int) -> None:
    """After its first announcement a pass overwrites its state file in place, its twin
    first and each made durable by one fdatasync (sync/state_file.py). A power cut during
    an overwrite can leave the file torn, old bytes and new: the twin then holds the whole
    new state (an announcement not sent yet: the next sync settles it), or, for the pass's
    last write, which announces nothing, the one before it. A cut during the twin's own
    overwrite leaves the file whole. Played: a new run's pass cut during its ``at``-th
    overwrite of the file (the samples', the finalize's announcement, the pass's end) or of
    the twin (the two announcements), the disk left as the cut leaves it; the next sync
    ends the run synced with each episode once and one finalize."""
    import httpx

    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.sync import state_file as state_file_module
    from prime_runs_spool.sync.engine import RunSync
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import Destination, sync_dir
    from support.local_client import local_settings

    builder = build_run(tmp_path / "run", "torn-overwrite", 3)
    real_pwrite = os.pwrite
    image: dict[str, bytes] = {}
    seen = {"file": 0, "twin": 0}

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        target = os.readlink(f"/proc/self/fd/{fd}")
        which = "twin" if target.endswith(".twin") else "file"
        if Path(target).parent == sync_dir(builder.run_dir).resolve() and not data.isspace():
            seen[which] += 1
            if which == torn and seen[which] == at:
                before = Path(target).read_bytes()
                assert len(before) == len(data)  # an overwrite, the same length: no metadata
                half = len(data.rstrip()) // 2  # within the JSON, not its padding
                image[target] = data[:half] + before[half:]  # part of the new bytes reached the disk
                folder, name = os.path.split(target)
                other = os.path.join(folder, name[1:-len(".twin")]) if which == "twin" else (
                    state_file_module.twin_path(target))
                image[other] = Path(other).read_bytes()
                raise _PowerCut
        return real_pwrite(fd, data, offset)

    destination = Destination(key="local", base_url="")
    options = SyncOptions(request_lifetime=1.0)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        destination = Destination(key="local", base_url=platform.base_url)
        monkeypatch.setattr(os, "pwrite", pwrite)
        with pytest.raises(_PowerCut), PlatformClient(local_settings(platform)) as client:
            RunSync(builder.run_dir, client, destination, options).run()
        monkeypatch.undo()
        assert image, seen
        for path, data in image.items():  # the disk as the cut left it
            Path(path).write_bytes(data)
        with PlatformClient(local_settings(platform)) as client:
            again = RunSync(builder.run_dir, client, destination, options).run()
        (evaluation,) = httpx.get(f"{platform.base_url}/api/v1/evaluations/").json()["evaluations"]
        samples = httpx.get(f"{platform.base_url}/api/v1/evaluations/{evaluation['evaluation_id']}/samples",
                            params={"limit": 100}).json()["samples"]
    assert (again.state, again.pushed_total) == ("synced", 3), again
    assert not any("damaged" in warning for warning in again.warnings), again.warnings
    ids = [sample["sample_id"] for sample in samples]
    assert len(ids) == len(set(ids)) == 3 and evaluation["status"] == "COMPLETED", (ids, evaluation)


@pytest.mark.slow
def test_a_state_file_damaged_after_its_pass_has_no_twin_to_be_read_for_it(tmp_path: Path) -> None:
    """The pass's end blanks the twin: a file damaged afterwards (by hand, by the disk) is
    damage, reconciled with the platform, never an older state read in its place."""
    from prime_runs_spool.sync.state import sync_dir
    from prime_runs_spool.sync.state_file import twin_path

    builder = build_run(tmp_path / "runs" / "r", "twin-blanked", 3)
    db = tmp_path / "local.db"
    assert local_sync(tmp_path / "runs", db).returncode == 0
    (state_file,) = sync_dir(builder.run_dir).glob("*.json")
    assert Path(twin_path(str(state_file))).read_bytes().isspace()
    state_file.write_bytes(b"{not a state")
    again = local_sync(tmp_path / "runs", db)
    (run,) = json.loads(again.stdout)["runs"]
    assert (run["state"], run["pushed_now"], run["pushed_total"]) == ("synced", 0, 3), run
    assert any("damaged" in warning for warning in run["warnings"]), run


@pytest.mark.parametrize("failing", ["file", "twin"])
def test_an_overwrite_in_place_that_fails_leaves_the_last_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                failing: str) -> None:
    """An overwrite that fails part way (a disk error) is a write that failed, as a rename that
    fails is: the last state is what the file reads (given back to the file and its twin when
    the file's own write failed), never the announcement of a request that is not sent,
    which the next sync would wait out as a request in doubt."""
    import errno

    from prime_runs_spool.sync import state_file
    from prime_runs_spool.sync.state import InFlight, load_state, save_state

    path = tmp_path / "sync" / "dest.json"
    state = _state("in-place-fails")
    state.in_flight = InFlight(kind="create", sent_at=1.0)
    writer = state_file.Writer(str(path))
    try:
        save_state(path, state, writer)  # the first: renamed into place, its twin made
        state.in_flight, state.evaluation_id = InFlight(kind="samples", sent_at=2.0, rows=3), "eval-1"
        real_pwrite = os.pwrite

        def pwrite(fd: int, data: bytes, offset: int) -> int:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".twin") == (failing == "twin"):
                real_pwrite(fd, data[:100], offset)  # part of it, then the disk fails
                raise OSError(errno.EIO, "Input/output error")
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)
        with pytest.raises(OSError) as failed:
            save_state(path, state, writer)
        monkeypatch.undo()
        assert failed.value.filename == str(path)
    finally:
        writer.end()
    read = load_state(path, destination=state.destination, local_run_id="in-place-fails")
    assert read is not None and read.in_flight is not None and read.in_flight.kind == "create", read
    assert read.evaluation_id is None


def test_a_pass_stopped_while_it_overwrites_its_state_keeps_the_twin(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass stopped (a signal's exception) after the file's new bytes were written but
    before they were made durable ends with the file whole in memory only: a power cut could
    still tear it, so the pass's end leaves the twin, which holds the new state, as it is."""
    from prime_runs_spool.sync import state_file
    from prime_runs_spool.sync.state import InFlight, SyncState, save_state

    path = tmp_path / "sync" / "dest.json"
    state = _state("in-place-stopped")
    state.in_flight = InFlight(kind="create", sent_at=1.0)
    writer = state_file.Writer(str(path))
    try:
        save_state(path, state, writer)
        state.in_flight, state.evaluation_id = InFlight(kind="samples", sent_at=2.0, rows=3), "eval-1"
        real_fdatasync = os.fdatasync

        def fdatasync(fd: int) -> None:
            if not os.readlink(f"/proc/self/fd/{fd}").endswith(".twin"):
                raise KeyboardInterrupt  # the file's bytes written, not yet durable
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        with pytest.raises(KeyboardInterrupt):
            save_state(path, state, writer)
        monkeypatch.undo()
    finally:
        writer.end()
    twin = SyncState.from_json(Path(state_file.twin_path(str(path))).read_bytes())
    assert twin.in_flight is not None and twin.in_flight.kind == "samples" and twin.evaluation_id == "eval-1"
