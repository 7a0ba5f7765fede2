"""The reader resynchronizes after damage (docs/spool-format.md, section 4.2): a line that
fails its check is reported with its segment, offset and length, and reading goes on at the
next line boundary; ``verify`` lists every damaged record, and ``sync --skip-corrupt``
pushes every intact record after the damage, one line per stretch skipped."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool.spool.layout import segment_path
from prime_runs_spool.spool.reader import Record, iter_records, resync_records
from prime_runs_spool.spool.resync import Damage
from prime_runs_spool.spool.scan import read_run
from support.env import CLI, child_env
from support.runs import RunBuilder
from support.segments import build_segment, write_segment
from support.sync_e2e import api, evaluations_of, run_sync, sample_ids, server  # noqa: F401

_payloads = st.lists(st.dictionaries(st.sampled_from(["a", "b", "text"]),
                                     st.one_of(st.integers(-(2**40), 2**40), st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))), min_size=1, max_size=8)


def _read(run_dir: Path) -> tuple[list[Record], list[Damage]]:
    records: list[Record] = []
    damage: list[Damage] = []
    for item in resync_records(run_dir):
        (damage if isinstance(item, Damage) else records).append(item)  # type: ignore[arg-type]
    return records, damage


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(st.tuples(_payloads, st.booleans()), min_size=1, max_size=3), data=st.data())
def test_random_corruption_yields_exactly_the_intact_records_and_reports_every_damaged_one(
        tmp_path_factory, segments, data) -> None:
    """Flip random bytes anywhere in a run of one to three segments, headers included."""
    run_dir = tmp_path_factory.mktemp("run")
    expected: list[tuple[int, int, int, str, object]] = []
    built = []
    for index, (episodes, sealed) in enumerate(segments, start=1):
        content, written = build_segment(episodes, seal="completed" if sealed and index == len(segments) else None,
                                         index=index)
        flips = data.draw(st.dictionaries(st.integers(0, len(content) - 1), st.integers(1, 255), max_size=3),
                          label=f"flips in segment {index}")
        damaged = bytearray(content)
        for at, mask in flips.items():
            damaged[at] ^= mask
        write_segment(run_dir, bytes(damaged), index)
        header_whole = not any(at < written[0][0] for at in flips)
        intact = [w for w in written if header_whole and not any(w[0] <= at < w[1] for at in flips)]
        expected += [(index, w[0], w[2], w[3], w[4]) for w in intact]
        built.append((index, len(content), written, intact, header_whole))

    records, damage = _read(run_dir)
    # Exactly the intact records, in order (none can follow a torn tail: it ends the data;
    # nothing of a segment whose header is damaged can be trusted, so none of it is intact).
    assert [(r.segment_index, r.offset, r.seq, r.type, r.data) for r in records] == expected
    infos = read_run(run_dir).segments
    for (index, size, written, intact, header_whole), info in zip(built, infos):
        mine = [d for d in damage if d.segment_index == index]
        assert all(d.path == segment_path(run_dir, index) and d.length >= 0 for d in mine)
        if not header_whole:  # one stretch: the whole segment
            assert [(d.offset, d.length) for d in mine] == [(0, size)], mine
            continue
        torn = info.torn_offset if info.torn_offset is not None else size
        # Every damaged record is inside a reported stretch, or in the torn tail that ends the
        # segment (its last line feed damaged; or a NUL byte, which reads as unwritten padding).
        for w in written:
            if w not in intact:
                assert w[0] >= torn or any(d.offset <= w[0] and w[1] <= d.end_offset + 1 for d in mine), (w, mine)
        # No stretch reported holds an intact record.
        for d in mine:
            assert not any(d.offset < w[1] and w[0] < d.end_offset for w in intact), (d, intact)
        assert info.damage_count == len(mine) and (info.corrupt_offset is None) == (not mine)


def test_a_damaged_line_feed_loses_one_record_not_the_one_glued_to_it(tmp_path: Path) -> None:
    content, written = build_segment([{"i": i} for i in range(4)])
    second = written[2]  # the second episode's line
    damaged = bytearray(content)
    damaged[second[1] - 1] = ord("x")  # its line feed: the third episode is glued to it
    write_segment(tmp_path, bytes(damaged))
    records, damage = _read(tmp_path)
    assert [r.seq for r in records] == [w[2] for w in written if w is not second]
    assert [(d.offset, d.length, d.first_seq, d.lost) for d in damage] == [(second[0], second[1] - second[0], 3, 1)]


def test_a_damaged_header_loses_its_segment_alone(tmp_path: Path) -> None:
    first, _ = build_segment([{"i": 0}, {"i": 1}], seal=None, index=1)
    second, _ = build_segment([{"i": 2}], seal=None, index=2)
    third, written = build_segment([{"i": 3}], index=3)
    damaged = bytearray(second)
    damaged[10] ^= 0x20
    for index, data in ((1, first), (2, bytes(damaged)), (3, third)):
        write_segment(tmp_path, data, index)
    records, damage = _read(tmp_path)
    assert [(d.segment_index, d.offset, d.length) for d in damage] == [(2, 0, len(second))]
    assert "header" in damage[0].reason
    assert [(r.segment_index, r.seq) for r in records][-len(written):] == [(3, w[2]) for w in written]


def test_lines_cut_out_cleanly_are_reported_as_missing_records(tmp_path: Path) -> None:
    content, written = build_segment([{"i": i} for i in range(5)])
    cut = content[:written[2][0]] + content[written[4][0]:]  # episodes 2 and 3 gone, nothing damaged
    write_segment(tmp_path, cut)
    records, damage = _read(tmp_path)
    assert [r.seq for r in records] == [1, 2, 5, 6, 7]
    assert [(d.offset, d.length, d.first_seq, d.lost) for d in damage] == [(written[2][0], 0, 3, 2)]


@pytest.mark.slow
def test_verify_lists_every_damaged_record(tmp_path: Path) -> None:
    content, written = build_segment([{"i": i} for i in range(6)])
    damaged = bytearray(content)
    for w in (written[2], written[5]):  # the second and the fifth episode
        damaged[w[0] + 12] ^= 0x01
    write_segment(tmp_path / "run", bytes(damaged))
    result = subprocess.run(CLI + ["verify", str(tmp_path / "run"), "--json"], capture_output=True, text=True,
                            env=child_env(), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    segment = json.loads(result.stdout)["runs"][0]["segments"][0]
    assert [(d["offset"], d["length"], d["lost"]) for d in segment["damage"]] == [
        (w[0], w[1] - w[0], 1) for w in (written[2], written[5])]
    assert segment["episodes"] == 4 and segment["sealed"] == "completed"
    human = subprocess.run(CLI + ["verify", str(tmp_path / "run")], capture_output=True, text=True,
                           env=child_env(), timeout=60)
    for w in (written[2], written[5]):
        assert f"CORRUPT at byte {w[0]} ({w[1] - w[0]} bytes" in human.stdout, human.stdout


def _flip_inside_episode(run_dir: Path, number: int) -> int:
    """Flip one byte inside the ``number``-th episode (from 1); returns that line's offset."""
    segment = segment_path(run_dir, 1)
    data = bytearray(segment.read_bytes())
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A][:-1]
    episodes = [s for s in starts if b'"type":"episode"' in data[s:data.index(b"\n", s)]]
    at = episodes[number - 1]
    data[at + 200] ^= 0x01
    segment.write_bytes(bytes(data))
    return at


@pytest.mark.slow
def test_sync_skip_corrupt_pushes_every_intact_episode_after_the_damage(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-resync")
    builder.open_segment()
    builder.add(6)
    builder.seal()
    offset = _flip_inside_episode(builder.run_dir, 2)

    plain = run_sync(server.base_url, str(tmp_path), "--json")
    report = json.loads(plain.stdout)["runs"][0]
    assert plain.returncode == 1 and report["state"] == "corrupt"
    assert f"seg-000001.jsonl: corrupt at byte {offset}" in report["error"]
    assert report["pushed_total"] == 1  # everything before the damage, nothing after it

    skipping = run_sync(server.base_url, str(tmp_path), "--json", "--skip-corrupt")
    assert skipping.returncode == 0, skipping.stdout + skipping.stderr
    report = json.loads(skipping.stdout)["runs"][0]
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("synced", 4, 5)
    assert (report["skipped_corrupt"], report["skipped_records"]) == (1, 1)
    [said] = [w for w in report["warnings"] if w.startswith("skipped: ")]
    assert f"corrupt at byte {offset}" in said and builder.ids[1] in said and "1 record lost" in said
    evaluation = api.get(f"/evaluations/{evaluations_of(api, builder.run_id)[0]['evaluation_id']}").json()
    assert sample_ids(api, evaluation["evaluation_id"]) == [builder.ids[0], *builder.ids[2:]]
    assert evaluation["finalize_count"] == 1
    assert [s["offset"] for s in evaluation["metadata"]["skipped_corruption"]] == [offset]

    again = run_sync(server.base_url, str(tmp_path))  # nothing new: nothing said twice
    assert again.returncode == 0 and "skipped:" not in again.stdout, again.stdout



def _traces_beside(builder: RunBuilder) -> list[dict]:
    """verifiers' ``traces.jsonl`` beside the spool, as ``prime-runs eval`` leaves it: the
    same episodes, one JSON line each."""
    episodes = [r.data for r in iter_records(builder.run_dir) if r.type == "episode"]
    with open(builder.run_dir / "traces.jsonl", "wb") as handle:
        for episode in episodes:
            handle.write(orjson.dumps(episode) + b"\n")
    return episodes


@pytest.mark.slow
def test_a_damaged_episode_is_recovered_from_traces_jsonl_and_said(tmp_path: Path, server, api) -> None:
    builder = RunBuilder(tmp_path / "run", "e2e-recover")
    builder.open_segment()
    builder.add(6)
    builder.seal()
    _traces_beside(builder)
    offset = _flip_inside_episode(builder.run_dir, 2)

    result = run_sync(server.base_url, str(tmp_path), "--json", "--skip-corrupt")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)["runs"][0]
    assert (report["state"], report["pushed_now"], report["skipped_corrupt"], report["skipped_records"]) == (
        "synced", 6, 1, 0)
    [said] = [w for w in report["warnings"] if w.startswith("skipped: ")]
    assert f"corrupt at byte {offset}" in said
    assert f"episode {builder.ids[1]} recovered from {builder.run_dir / 'traces.jsonl'}" in said
    evaluation = api.get(f"/evaluations/{evaluations_of(api, builder.run_id)[0]['evaluation_id']}").json()
    assert sample_ids(api, evaluation["evaluation_id"]) == builder.ids  # all six, in spool order, once
    assert evaluation["finalize_count"] == 1
    [skipped] = evaluation["metadata"]["skipped_corruption"]
    assert skipped["recovered"] == str(builder.run_dir / "traces.jsonl")
    assert _status(tmp_path)["destinations"][0]["lost"] is None


def test_an_episode_traces_jsonl_holds_only_malformed_is_not_recovered(tmp_path: Path) -> None:
    from prime_runs_spool.sync.records import durable_records

    builder = RunBuilder(tmp_path / "run", "recover-malformed")
    builder.open_segment()
    builder.add(3)
    builder.seal()
    episodes = _traces_beside(builder)
    broken = dict(episodes[1], traces="not a list of traces")
    (builder.run_dir / "traces.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n"
                                                           for e in (episodes[0], broken, episodes[2])))
    _flip_inside_episode(builder.run_dir, 2)
    skipped: list[dict] = []
    got = [r.meta["episode_id"] for r in durable_records(builder.run_dir, skip_corrupt=True, skipped=skipped)
           if r.type == "episode"]
    assert got == [builder.ids[0], builder.ids[2]]
    assert len(skipped) == 1 and "recovered" not in skipped[0]


def _status(path: Path) -> dict:
    result = subprocess.run(CLI + ["status", str(path), "--json"], capture_output=True, text=True, env=child_env(),
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["runs"][0]


@pytest.mark.slow
def test_skip_corrupt_to_prime_traces_uploads_every_intact_and_recovered_episode(tmp_path: Path) -> None:
    """The same reader under the content-addressed sink: two damaged episodes, one of them
    in traces.jsonl (recovered), the other not (skipped and said); the rest all uploaded once."""
    import httpx
    from prime_traces import TracesClient

    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import TRACES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import SyncState, local_destination

    builder = RunBuilder(tmp_path / "runs" / "run", "traces-resync")
    builder.open_segment()
    builder.add(6)
    builder.seal()
    episodes = _traces_beside(builder)
    (builder.run_dir / "traces.jsonl").write_bytes(
        b"".join(orjson.dumps(e) + b"\n" for n, e in enumerate(episodes) if n != 3))  # the 4th is not there
    _flip_inside_episode(builder.run_dir, 2)
    _flip_inside_episode(builder.run_dir, 4)
    db = tmp_path / "platform.db"
    with EmbeddedPlatform(db, traces=True) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with PlatformClient(settings, timeout=10) as client:
            (report,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None),
                                   SyncOptions(to=TRACES, skip_corrupt=True, request_lifetime=0.5,
                                               backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)))
        assert (report.state, report.skipped_corrupt, report.skipped_records) == ("synced", 2, 1), report
        said = [w for w in report.warnings if w.startswith("skipped: ")]
        assert len(said) == 2 and "recovered from" in said[0] and "recovered" not in said[1]
        (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
        state = SyncState.from_json(path.read_bytes())
        with TracesClient(api_key="x", base_url=platform.base_url) as traces:
            items = traces.list_episodes(run_id=str(state.evaluation_id), limit=100).items
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{state.evaluation_id}").json()
    assert sorted(i.episode_id for i in items) == sorted(i for n, i in enumerate(builder.ids) if n != 3)
    assert {i.model_extra["generation"] for i in items} == {1}  # each uploaded once
    assert evaluation["status"] == "COMPLETED"
    assert [s["offset"] for s in evaluation["metadata"]["skipped_corruption"]] == [
        s["offset"] for s in state.skipped]
