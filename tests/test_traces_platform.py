"""The local platform's Prime Traces service, driven by the real ``prime_traces.TracesClient``
against a real ``prime-runs platform serve --traces`` process over loopback HTTP."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prime_traces import (
    ErrorCode,
    ForbiddenError,
    LineFormat,
    LineFormatConflictError,
    NotFoundError,
    TracesAPIClient,
    TracesClient,
    ValidationRejectedError,
    iter_batches,
)

from fixtures.episodes import make_episode
from prime_runs_spool.platform_api.traces import encode_line, stamp_run
from support import platform_process

TOKEN = "traces-token-not-a-secret"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[platform_process.PlatformProcess]:
    db = tmp_path_factory.mktemp("traces") / "platform.db"
    with platform_process.running(db, "--token", TOKEN, "--traces") as proc:
        yield proc


@pytest.fixture()
def client(server) -> Iterator[TracesClient]:
    with TracesClient(api_key=TOKEN, base_url=server.base_url) as traces:
        yield traces


def lines_for(run_id: str, count: int, salt: str, traces: int = 2) -> list[bytes]:
    return [encode_line(stamp_run(make_episode(n, salt=salt, traces=traces), run_id)) for n in range(count)]


@pytest.mark.slow
def test_round_trip_upload_list_get_and_runs(client: TracesClient) -> None:
    lines = lines_for("run-round-trip", 12, "round-trip")
    receipts = client.upload_lines(lines, line_format=LineFormat.EPISODE, context={"source": "test"},
                                   target_batch_bytes=20_000)
    assert len(receipts) > 1 and {r.status for r in receipts} == {"committed"}
    expected = [b.digest for b in iter_batches(lines, target_bytes=20_000)]
    assert [r.upload_id for r in receipts] == expected
    first = next(iter_batches(lines, target_bytes=20_000))
    assert receipts[0].upload_id == hashlib.sha256(first.data).hexdigest()

    episodes = client.list_episodes(run_id="run-round-trip", limit=5)
    assert len(episodes.items) == 5 and episodes.next_cursor
    everything = [*episodes.items, *client.list_episodes(run_id="run-round-trip", cursor=episodes.next_cursor,
                                                         limit=100).items]
    assert sorted(e.episode_id for e in everything) == sorted(make_episode(n, salt="round-trip")["id"]
                                                               for n in range(12))
    one = everything[0]
    detail = client.get_episode(one.episode_id)
    assert detail.traces.trace_count == 2 and detail.run_id == "run-round-trip"
    members = client.list_episode_traces(one.episode_id)
    assert len(members.items) == 2 and all(t.run_id == "run-round-trip" for t in members.items)
    trace = client.get(members.items[0].trace_id)
    assert trace.model.id == "Qwen/Qwen3-8B" and trace.context == {"source": "test"}
    assert b'"run":{"type":"eval","id":"run-round-trip"' in client.get_raw(trace.trace_id)
    assert client.get_episode_raw(one.episode_id).count(trace.trace_id.encode()) == 1
    by_upload = client.list(upload_id=receipts[0].upload_id, limit=100)
    assert by_upload.items and {t.upload_id for t in by_upload.items} == {receipts[0].upload_id}

    run = client.get_run("run-round-trip")
    assert (run.episode_count, run.trace_count) == (12, 24)
    assert "run-round-trip" in {r.run_id for r in client.list_runs(limit=100).items}
    with pytest.raises(NotFoundError) as missing:
        client.get_run("no-such-run")
    assert missing.value.code == ErrorCode.RUN_NOT_FOUND.value


@pytest.mark.slow
def test_the_same_key_replays_its_receipt_and_stores_nothing_twice(client: TracesClient) -> None:
    lines = lines_for("run-replay", 6, "replay")
    first = client.upload_lines(lines, line_format=LineFormat.EPISODE, target_batch_bytes=15_000)
    again = client.upload_lines(lines, line_format=LineFormat.EPISODE, target_batch_bytes=15_000)
    assert [r.upload_id for r in again] == [r.upload_id for r in first]
    items = client.list_episodes(run_id="run-replay", limit=100).items
    assert len(items) == 6 and {item.model_extra["generation"] for item in items} == {1}
    assert client.get_run("run-replay").trace_count == 12


def test_a_different_body_under_a_known_key_is_refused(server, client: TracesClient) -> None:
    lines = lines_for("run-mismatch", 2, "mismatch")
    (receipt,) = client.upload_lines(lines, line_format=LineFormat.EPISODE)
    api = TracesAPIClient(api_key=TOKEN, base_url=server.base_url)
    with pytest.raises(ValidationRejectedError) as refused:
        api.upload_batch(lines[0], f"sha256:{receipt.upload_id}", line_format=LineFormat.EPISODE)
    assert refused.value.code == ErrorCode.DIGEST_MISMATCH.value
    with pytest.raises(LineFormatConflictError) as conflict:  # the one header the digest does not cover
        api.upload_batch(b"".join(lines), f"sha256:{receipt.upload_id}", line_format=LineFormat.TRACE)
    assert conflict.value.code == ErrorCode.LINE_FORMAT_CONFLICT.value
    with pytest.raises(ValidationRejectedError) as bad_key:
        api.upload_batch(lines[0], "sha256:NOT-HEX", line_format=LineFormat.EPISODE)
    assert bad_key.value.code == ErrorCode.INVALID_IDEMPOTENCY_KEY.value
    assert len(client.list_episodes(run_id="run-mismatch").items) == 2


def test_episode_ids_twice_in_one_upload_are_refused_and_across_uploads_are_a_new_copy(
        client: TracesClient) -> None:
    lines = lines_for("run-dup", 3, "dup")
    with pytest.raises(ValidationRejectedError) as refused:
        client.upload_lines([lines[0], lines[1], lines[0]], line_format=LineFormat.EPISODE)
    assert refused.value.code == ErrorCode.DUPLICATE_EPISODE_ID.value
    with pytest.raises(NotFoundError):  # nothing of the refused upload was stored
        client.get_episode(make_episode(1, salt="dup")["id"])
    client.upload_lines(lines[:2], line_format=LineFormat.EPISODE)
    client.upload_lines(lines[1:], line_format=LineFormat.EPISODE)  # episode 1 again, new bytes
    items = client.list_episodes(run_id="run-dup", limit=100).items
    generations = {item.episode_id: item.model_extra["generation"] for item in items}
    assert len(items) == 3 and sorted(generations.values()) == [1, 1, 2]
    assert generations[make_episode(1, salt="dup")["id"]] == 2


def test_samples_and_traces_of_one_evaluation_are_both_visible(server, client: TracesClient) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.api, headers=headers) as api:
        env = api.post("/environmentshub/resolve", json={"name": "gsm8k"}).json()["data"]["id"]
        evaluation = api.post("/evaluations/", json={"name": "both", "environments": [{"id": env}]}).json()
        eid = evaluation["evaluation_id"]
        api.post(f"/evaluations/{eid}/samples", json={"samples": [{"sample_id": "s0"}]}).raise_for_status()
        client.upload_lines(lines_for(eid, 3, "both"), line_format=LineFormat.EPISODE)
        held = api.get(f"/evaluations/{eid}").json()
        rows = api.get(f"/evaluations/{eid}/samples").json()["samples"]
    # one evaluation id, both stores: its samples, and Prime Traces' run of the same id
    assert held["total_samples"] == 1 and [row["sample_id"] for row in rows] == ["s0"]
    run = client.get_run(eid)
    assert (run.episode_count, run.trace_count) == (3, 6)
    assert len(client.list_episodes(run_id=eid).items) == 3


@pytest.mark.slow
def test_a_platform_without_traces_answers_service_not_enabled(tmp_path: Path) -> None:
    with platform_process.running(tmp_path / "off.db") as proc, \
            TracesClient(api_key="any", base_url=proc.base_url) as traces:
        with pytest.raises(ForbiddenError) as refused:
            traces.upload_lines(lines_for("run-off", 1, "off"), line_format=LineFormat.EPISODE)
        assert refused.value.code == ErrorCode.SERVICE_NOT_ENABLED.value
        with pytest.raises(ForbiddenError):
            traces.list_episodes()
