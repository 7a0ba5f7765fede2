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

    from prime_runs_spool.sync import state as state_module

    target = tmp_path / "cache" / "dest.json"
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_module.os, "write", full)
    with pytest.raises(OSError):
        state_module.replace_private(target, b"{}", durable=False)  # the store state cache's writer
    monkeypatch.setattr(state_module.os, "write", real_write)
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
