"""Sync's Prime Traces batches: stamped and encoded as upstream does it, cut exactly as the
`prime-traces` library cuts the same lines, and sent under the same keys.

In process, against the embedded local platform with its traces service on."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prime_runs.sinks.base import stamp_run as upstream_stamp_run
from prime_traces import LineFormat, TracesAPIClient, TracesClient
from prime_traces.traces import _encode_record as upstream_encode

from fixtures.episodes import make_episode
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.platform_api.traces import encode_line, stamp_run
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import SAMPLES, TRACES, SyncOptions
from prime_runs_spool.sync.state import SyncState, local_destination, read_state
from prime_runs_spool.sync.retry import Backoff
from support.runs import RunBuilder, build_run

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
                      st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=8)
runs = st.one_of(st.none(), st.text(max_size=5), st.dictionaries(st.sampled_from(["id", "type", "name", "work"]),
                                                                   json_values, max_size=4))
members = st.lists(st.one_of(st.dictionaries(st.sampled_from(["id", "run", "nodes"]), json_values, max_size=3)
                             .flatmap(lambda m: runs.map(lambda r: {**m, "run": r} if r is not None else m)),
                             json_leaf), max_size=3)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(run=runs, traces=st.one_of(st.none(), members), extra=st.dictionaries(st.text(max_size=6), json_values,
                                                                             max_size=3),
       run_id=st.text(min_size=1, max_size=12))
def test_stamping_and_encoding_match_upstream(run, traces, extra, run_id) -> None:
    record = {**extra, "id": "e-1"}
    if run is not None:
        record["run"] = run
    if traces is not None:
        record["traces"] = traces
    ours = stamp_run(record, run_id)
    assert ours == upstream_stamp_run(record, run_id)
    assert encode_line(ours) == upstream_encode(ours, 1)
    assert ours["run"]["id"] == run_id and ours["run"]["type"] == "eval"


def _sync(tmp_path: Path, db: Path, *, to: str, batch_bytes: int, traces: bool = True) -> tuple[list, Settings]:
    with EmbeddedPlatform(db, traces=traces) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with PlatformClient(settings, timeout=10) as client:
            reports = sync_paths([tmp_path / "runs"], client, local_destination(db, None),
                                 SyncOptions(to=to, traces_batch_bytes=batch_bytes, request_lifetime=0.5,
                                             backoff=Backoff(base=0.01, cap=0.05, max_attempts=3)))
    return reports, settings


def _state(run_dir: Path) -> SyncState:
    (path,) = (run_dir / "spool" / "sync").glob("*.json")
    return read_state(path)[0]  # its files of ids beside it (sync/id_sets.py)


def test_our_batches_are_the_librarys_batching_of_the_same_lines(tmp_path: Path) -> None:
    """The keys sync committed are the keys ``TracesClient.upload_records`` sends for the same
    episodes stamped by upstream prime-runs: same lines, same boundaries, same gzip bytes."""
    builder = RunBuilder(tmp_path / "runs" / "run", "byte-equal")
    builder.open_segment()
    builder.add(30, size=3_000, traces=2)
    builder.abandon()
    builder.open_segment()  # a resumed run: the lines of both segments, in order
    builder.add(17, size=2_500)
    builder.seal()
    (report,), _ = _sync(tmp_path, tmp_path / "p.db", to=TRACES, batch_bytes=20_000)
    assert (report.state, report.store, report.pushed_now) == ("synced", TRACES, 47), report
    state = _state(builder.run_dir)

    records = [upstream_stamp_run(r.data, str(state.evaluation_id)) for r in iter_records(builder.run_dir)
               if r.type == "episode"]
    sent: list[tuple[str, bytes]] = []

    def platform(request: httpx.Request) -> httpx.Response:
        body = request.read()
        start = body.index(b"\x1f\x8b")  # the gzip member inside the traces part
        member = body[start:body.rindex(b"\r\n--")]
        sent.append((request.headers["Idempotency-Key"], member))
        return httpx.Response(200, json={"upload_id": request.headers["Idempotency-Key"][7:], "status": "committed"})

    library = TracesClient(api_client=TracesAPIClient(api_key="k", base_url="http://traces.test",
                                                      transport=httpx.MockTransport(platform)))
    library.upload_records(records, line_format=LineFormat.EPISODE, target_batch_bytes=20_000)
    assert len(sent) > 5
    assert [f"sha256:{digest}" for digest in state.uploads] == [key for key, _ in sent]
    # and the uncompressed bytes behind each key are exactly what the library would send
    uploaded = b"".join(gzip.decompress(member) for _, member in sent)
    assert uploaded == b"".join(encode_line(stamp_run(r.data, str(state.evaluation_id)))
                                for r in iter_records(builder.run_dir) if r.type == "episode")


def test_a_lost_state_sends_nothing_the_service_holds(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "lost-state", 20)
    db = tmp_path / "p.db"
    _sync(tmp_path, db, to=TRACES, batch_bytes=8_000)
    first = _state(builder.run_dir)
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    path.unlink()
    (report,), settings = _sync(tmp_path, db, to=TRACES, batch_bytes=8_000)
    assert (report.state, report.pushed_now, report.pushed_total, report.bytes_sent) == ("synced", 0, 20, 0), report
    again = _state(builder.run_dir)
    assert again.evaluation_id == first.evaluation_id and again.uploads == []
    assert sorted(again.held_there.ids()) == sorted(builder.ids)
    with EmbeddedPlatform(db, traces=True) as platform, \
            TracesClient(api_key="x", base_url=platform.base_url) as traces:
        items = traces.list_episodes(run_id=str(first.evaluation_id), limit=100).items
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}


def test_the_store_is_recorded_and_a_run_never_ends_up_half_in_each(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "half")
    builder.open_segment()
    builder.add(4)
    builder.abandon()
    db = tmp_path / "p.db"
    (report,), _ = _sync(tmp_path, db, to="auto", batch_bytes=8_000)
    assert (report.state, report.store) == ("crashed", TRACES)
    builder.open_segment()
    builder.add(3)
    builder.seal()
    (refused,), _ = _sync(tmp_path, db, to=SAMPLES, batch_bytes=8_000)
    assert refused.state == "error" and "went to traces" in refused.error and "--replay" in refused.error
    # auto follows the recorded choice even on a platform that now says it has no traces
    (stuck,), _ = _sync(tmp_path, db, to="auto", batch_bytes=8_000, traces=False)
    assert stuck.state == "error" and "stays in Prime Traces" in stuck.error
    (done,), _ = _sync(tmp_path, db, to="auto", batch_bytes=8_000)
    assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, 7)
    assert _state(builder.run_dir).samples_pushed == 0


def test_auto_falls_back_to_samples_on_service_not_enabled(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "fallback", 6)
    db = tmp_path / "p.db"
    (report,), _ = _sync(tmp_path, db, to="auto", batch_bytes=8_000, traces=False)
    assert (report.state, report.store, report.pushed_total) == ("synced", SAMPLES, 6), report
    assert any("not enabled" in w for w in report.notices)
    state = _state(builder.run_dir)
    assert (state.store, state.uploads, state.samples_pushed) == (SAMPLES, [], 6)
    (strict,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=8_000, traces=True)
    assert strict.state == "error" and "went to samples" in strict.error
    json.dumps(report.as_json())


def test_a_live_runs_announced_tail_batch_is_resent_byte_for_byte_after_more_appends(tmp_path: Path) -> None:
    """The case the announcement exists for: a batch cut at a live run's durable end, committed,
    its answer lost, the sync gone; then the writer appends more. Cutting afresh would put
    the new episodes in that batch (another key: every episode in it stored twice); the
    next sync must rebuild the announced bytes instead, and the platform replay them."""
    from fixtures.fault_proxy import FaultProxy

    builder = RunBuilder(tmp_path / "runs" / "run", "live-tail")
    builder.open_segment()
    builder.add(3)
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db, traces=True) as platform:
        with FaultProxy(platform.base_url, rates={"drop_after": 1.0}, methods=["POST"], paths=r"/traces$") as proxy:
            settings = Settings(base_url=proxy.base_url, api_key=Secret("local"), team_id=None,
                                frontend_url=proxy.base_url)
            with PlatformClient(settings, timeout=5) as client:
                (lost,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None),
                                     SyncOptions(to=TRACES, backoff=Backoff(base=0.01, cap=0.01, max_attempts=1)))
        assert lost.state == "error" and [f for f in proxy.faults() if f != "none"] == ["drop_after"]
        announced = _state(builder.run_dir).in_flight
        assert announced is not None and announced.kind == "traces" and announced.episodes == 3
        builder.add(4)  # the writer goes on; its tail is now longer than the announced batch
        builder.seal()
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with PlatformClient(settings, timeout=5) as client:
            (done,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None), SyncOptions(to=TRACES))
        assert (done.state, done.pushed_total) == ("synced", 7), done
        state = _state(builder.run_dir)
        assert state.uploads[0] == announced.digest
        with TracesClient(api_key="x", base_url=platform.base_url) as traces:
            items = traces.list_episodes(run_id=str(state.evaluation_id), limit=100).items
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}


@pytest.mark.slow
def test_local_mode_to_traces_uses_the_embedded_traces_service(tmp_path: Path) -> None:
    import subprocess

    from support import platform_process
    from support.env import CLI, child_env

    builder = build_run(tmp_path / "runs" / "run", "local-traces", 5)
    db = tmp_path / "local.db"
    cmd = CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--to", "traces", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    assert (report["state"], report["store"], report["pushed_total"]) == ("synced", TRACES, 5)
    with platform_process.running(db, "--traces") as proc, \
            TracesClient(api_key="x", base_url=proc.base_url) as traces:
        assert traces.get_run(report["evaluation_id"]).episode_count == 5
        assert httpx.get(f"{proc.api}/evaluations/{report['evaluation_id']}").json()["finalize_count"] == 1
    assert len(builder.ids) == 5


@pytest.mark.parametrize("traces", [False, True])
def test_the_runs_of_one_sync_share_one_traces_uploader_and_one_probe(tmp_path: Path, monkeypatch,
                                                                     traces: bool) -> None:
    """The uploader is made once per client, not per run (each costs an SSL context, about
    30 ms of CPU, and a connection: most of the first sync of many small runs), and ``auto``'s
    probe is answered once for them all (Dec 1, benchmarks/sync_many.py). The
    probe is asked on the platform client's connection: an account without Prime Traces
    gets no uploader at all (platform_api/traces_probe.py)."""
    from prime_runs_spool.platform_api.traces import TracesUploader

    made, probes = [], []
    make, send = TracesUploader.__init__, httpx.Client.send

    def counting_init(self, *args, **kwargs):
        made.append(self)
        make(self, *args, **kwargs)

    def counting_send(self, request, *args, **kwargs):
        if request.url.path.endswith("/episodes"):
            probes.append(request.url.path)
        return send(self, request, *args, **kwargs)

    monkeypatch.setattr(TracesUploader, "__init__", counting_init)
    monkeypatch.setattr(httpx.Client, "send", counting_send)
    for number in range(5):
        build_run(tmp_path / "runs" / f"run-{number}", f"shared-{number}", 2)
    reports, _ = _sync(tmp_path, tmp_path / "p.db", to="auto", batch_bytes=8_000, traces=traces)
    assert [(r.state, r.store) for r in reports] == [("synced", TRACES if traces else SAMPLES)] * 5, reports
    assert (len(made), len(probes)) == (1 if traces else 0, 1)


def test_the_probe_reads_the_service_as_the_library_does() -> None:
    """The probe's two names of the service's contract are the library's own."""
    from prime_traces import ErrorCode

    from prime_runs_spool.platform_api.traces_probe import SERVICE_NOT_ENABLED, TEAM_HEADER

    assert SERVICE_NOT_ENABLED == ErrorCode.SERVICE_NOT_ENABLED.value
    library = TracesAPIClient(api_key="k", base_url="http://traces.test", team_id="team-1")
    try:
        assert library.client.headers[TEAM_HEADER] == "team-1"
    finally:
        library.close()


@pytest.mark.parametrize(("status", "body", "answer", "kept"), [
    (200, {"items": [], "next_cursor": None}, True, True),
    (200, {"detail": "not the listing"}, True, False),
    (403, {"error": {"code": "service_not_enabled", "message": "off"}}, False, True),
    (403, {"error": {"code": "forbidden", "message": "write-only token"}}, True, True),
    (403, {"detail": "Not authenticated"}, True, True),
    (403, {"message": "Forbidden"}, True, False),
    (401, {"error": {"code": "unauthorized"}}, True, False),
    (503, {"detail": "down"}, True, False),
])
def test_the_probe_answers_and_keeps_only_what_the_service_said_of_the_account(
        status: int, body: dict, answer: bool, kept: bool) -> None:
    from prime_runs_spool.platform_api.traces_probe import TracesProbe

    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        probe = TracesProbe(http.get, "http://traces.test", "team-1")
        assert (probe.enabled(), probe.enabled()) == (answer, answer)
    assert len(seen) == (1 if kept else 2)
    assert str(seen[0].url) == "http://traces.test/api/v1/episodes?limit=1"
    assert seen[0].headers["X-Prime-Team-ID"] == "team-1"


@pytest.mark.parametrize("status", [200, 403])
def test_a_captive_portals_page_to_the_probe_is_no_answer(status: int) -> None:
    """A network that answers every address with its sign-in page (a captive portal: 200 or
    403, HTML) answered the probe for Prime Traces, which read it as "the account has it"
    (the 403 as a write-only token's): kept for a minute, and a new evaluation named traces.
    The page is not the service's answer, so it says nothing of the account: no answer,
    asked again by the next run."""
    import http.server
    import threading

    seen: list[str] = []

    class Portal(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            page = b"<!doctype html><html><head><title>Sign in to Cafe Wi-Fi</title></head><body>Accept</body></html>"
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    portal = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=portal.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{portal.server_address[1]}"
    try:
        settings = Settings(base_url=url, api_key=Secret("key"), team_id=None, frontend_url=url, traces_url=url)
        with PlatformClient(settings, timeout=5) as client:
            probe = client.traces_probe()
            assert (probe.answer(), probe.answer()) == (None, None)
    finally:
        portal.shutdown()
        portal.server_close()
    assert seen == ["/api/v1/episodes?limit=1"] * 2, seen


def test_an_upload_answered_service_not_enabled_falls_back_too(tmp_path: Path, monkeypatch) -> None:
    """Where the read that ``auto`` asks first does not tell (a write-only token, say), the
    first upload's ``service_not_enabled`` sends the run to samples just the same."""
    from prime_runs_spool.platform_api.traces_probe import TracesProbe

    monkeypatch.setattr(TracesProbe, "enabled", lambda self: True)
    builder = build_run(tmp_path / "runs" / "run", "upload-fallback", 4)
    (report,), _ = _sync(tmp_path, tmp_path / "p.db", to="auto", batch_bytes=8_000, traces=False)
    assert (report.state, report.store, report.pushed_total) == ("synced", SAMPLES, 4), report
    state = _state(builder.run_dir)
    assert (state.store, state.in_flight, state.samples_pushed) == (SAMPLES, None, 4)


def test_dry_run_to_traces_counts_episodes_and_sends_nothing(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "dry-traces", 9)
    with EmbeddedPlatform(tmp_path / "p.db", traces=True) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=platform.base_url)
        with PlatformClient(settings, timeout=5) as client:
            (report,) = sync_paths([tmp_path / "runs"], client, local_destination(tmp_path / "p.db", None),
                                   SyncOptions(to=TRACES, dry_run=True))
    assert (report.state, report.store, report.pushed_now) == ("dry_run", TRACES, 9)
    assert report.bytes_sent > 9 * 1_500 and not (builder.run_dir / "spool" / "sync").exists()


def test_to_traces_on_an_account_without_them_keeps_no_store_and_says_what_to_do(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "run", "strict-off", 3)
    db = tmp_path / "p.db"
    (refused,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=8_000, traces=False)
    assert refused.state == "error" and "--to samples" in refused.error, refused
    # Asked before the create: no evaluation names a sink that holds nothing of the run
    # (found again with the state lost, it would keep the run there for good).
    assert refused.evaluation_id is None and "(Prime Traces is not enabled" not in refused.error, refused
    for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
        assert _state(builder.run_dir).store is None  # not trapped in a store that holds nothing
    (done,), _ = _sync(tmp_path, db, to=SAMPLES, batch_bytes=8_000, traces=False)
    assert (done.state, done.store, done.pushed_total) == ("synced", SAMPLES, 3), done


def test_a_line_over_the_single_line_limit_is_refused_before_anything_is_sent(tmp_path: Path, monkeypatch) -> None:
    import prime_runs_spool.platform_api.traces as contract

    monkeypatch.setattr(contract, "MAX_LINE_BYTES", 1_000)  # 64 MiB in truth; episodes here are ~2 KB
    builder = build_run(tmp_path / "runs" / "run", "too-long", 2)
    (report,), _ = _sync(tmp_path, tmp_path / "p.db", to=TRACES, batch_bytes=8_000)
    assert report.state == "error" and "over Prime Traces' 1000-byte limit for one line" in report.error
    state = _state(builder.run_dir)
    assert (state.uploads, state.in_flight, state.episodes_pushed) == ([], None, 0)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(2, 300), min_size=1, max_size=60), target=st.integers(1, 1_000),
       data=st.data())
def test_cutting_from_a_committed_boundary_gives_the_same_batches_as_from_the_start(sizes, target, data) -> None:
    """What a resumed sync relies on: the library's builder starts afresh after each batch, so
    the batches after boundary k are those of the lines after it, cut alone."""
    from prime_traces import iter_batches

    lines = [b"x" * (size - 1) + b"\n" for size in sizes]  # never blank, as an episode line
    whole = list(iter_batches(lines, target_bytes=target))
    k = data.draw(st.integers(0, len(whole) - 1))
    start = sum(batch.num_lines for batch in whole[:k])
    assert [b.digest for b in iter_batches(lines[start:], target_bytes=target)] == [b.digest for b in whole[k:]]


# -- resumed runs (docs/sync.md, "Resumed runs" and "Prime Traces"): the samples rule, for traces --


def _in_traces(db: Path, run_dir: Path) -> tuple[list, dict]:
    """The run's episodes in Prime Traces and its evaluation, read from the local platform."""
    state = _state(run_dir)
    with EmbeddedPlatform(db, traces=True) as platform, \
            TracesClient(api_key="x", base_url=platform.base_url) as traces:
        items = traces.list_episodes(run_id=str(state.evaluation_id), limit=100).items
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{state.evaluation_id}").json()
    return items, evaluation


@pytest.mark.slow
def test_a_resume_that_supersedes_an_errored_episode_leaves_each_slot_once_in_traces(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-supersede")
    builder.open_segment()
    builder.add(3)
    builder.add(1, ok=False)
    builder.abandon()  # crashed; verifiers --resume retries the errored rollout
    db = tmp_path / "p.db"
    (crashed,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert crashed.state == "crashed", crashed
    errored = builder.ids[3]
    builder.open_segment(supersedes=[errored])
    builder.add(1)  # the retry, in the errored attempt's slot
    builder.seal()
    (done,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert (done.state, done.store) == ("synced", TRACES), done
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids[:3] + [builder.ids[4]])
    assert {i.model_extra["generation"] for i in items} == {1}
    assert evaluation["finalize_count"] == 1 and evaluation["metrics"]["avg_error"] == 0.0
    state = _state(builder.run_dir)
    assert (state.episodes_pushed, state.released, state.superseded_pushed) == (4, [], [])


@pytest.mark.slow
def test_errored_episodes_wait_in_the_spool_until_the_run_completes(tmp_path: Path) -> None:
    from prime_runs_spool.sync.status import run_status

    builder = RunBuilder(tmp_path / "runs" / "run", "traces-held")
    builder.open_segment()
    builder.add(2)
    builder.add(2, ok=False)
    builder.add(1)
    errored = builder.ids[2:4]
    ok = [builder.ids[i] for i in (0, 1, 4)]
    db = tmp_path / "p.db"
    (live,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert live.state == "live", live
    assert sorted(i.episode_id for i in _in_traces(db, builder.run_dir)[0]) == sorted(ok)
    builder.seal("failed", error="boom")
    (failed,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert failed.state == "failed", failed
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(ok)
    assert evaluation["metadata"]["prime_runs"]["held_back"] == 2 and evaluation["finalize_count"] == 0
    (dest,) = run_status(builder.run_dir).destinations
    assert (dest.held_back, dest.superseded_after_push) == (2, 0)
    builder.open_segment()  # resumed, nothing retried: it completes with the errors
    builder.add(1)
    builder.seal()
    (done,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert (done.state, done.pushed_total) == ("synced", 6), done
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}
    assert evaluation["finalize_count"] == 1
    state = _state(builder.run_dir)
    assert (state.released, state.held_back, state.in_flight) == (errored, 0, None)
    (again,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert again.state == "up_to_date", again


def _sync_losing_uploads(tmp_path: Path, db: Path, platform: EmbeddedPlatform):
    """A sync whose every upload commits and then loses its answer: it stops, announced."""
    from fixtures.fault_proxy import FaultProxy

    with FaultProxy(platform.base_url, rates={"drop_after": 1.0}, methods=["POST"], paths=r"/traces$") as proxy:
        settings = Settings(base_url=proxy.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=proxy.base_url)
        with PlatformClient(settings, timeout=5) as client:
            (lost,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None),
                                 SyncOptions(to=TRACES, traces_batch_bytes=5_000,
                                             backoff=Backoff(base=0.01, cap=0.01, max_attempts=1)))
    return lost


def _sync_with(platform: EmbeddedPlatform, tmp_path: Path, db: Path):
    settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                        frontend_url=platform.base_url)
    with PlatformClient(settings, timeout=5) as client:
        (report,) = sync_paths([tmp_path / "runs"], client, local_destination(db, None),
                               SyncOptions(to=TRACES, traces_batch_bytes=5_000))
    return report


def _held_run(tmp_path: Path, run_id: str) -> RunBuilder:
    builder = RunBuilder(tmp_path / "runs" / "run", run_id)
    builder.open_segment()
    builder.add(2)
    builder.add(2, ok=False)
    builder.seal("cancelled", error="interrupted")
    return builder


def test_a_release_batch_announced_then_lost_is_resent_under_the_same_key(tmp_path: Path) -> None:
    builder = _held_run(tmp_path, "traces-release-lost")
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db, traces=True) as platform:
        assert _sync_with(platform, tmp_path, db).state == "cancelled"
        builder.open_segment()  # resumed, nothing left to run: completes with its errors
        builder.seal()
        lost = _sync_losing_uploads(tmp_path, db, platform)
        assert lost.state == "error", lost
        announced = _state(builder.run_dir).in_flight
        assert announced is not None and announced.kind == "traces"
        assert announced.released == builder.ids[2:4]  # the release batch, committed, answer lost
        done = _sync_with(platform, tmp_path, db)
        assert (done.state, done.pushed_total) == ("synced", 4), done
    state = _state(builder.run_dir)
    assert announced.digest in state.uploads and state.released == builder.ids[2:4]
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}  # the same key: replayed, not stored again
    assert evaluation["finalize_count"] == 1


def test_a_resume_after_a_batch_was_announced_resends_the_announced_bytes_and_says_so(tmp_path: Path) -> None:
    """An announced batch is never re-cut: a later resume that supersedes one of its episodes
    does not change what is sent again (another key would store the others twice)."""
    builder = _held_run(tmp_path, "traces-announced-resume")
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db, traces=True) as platform:
        assert _sync_with(platform, tmp_path, db).state == "cancelled"
        builder.open_segment()
        builder.seal()
        assert _sync_losing_uploads(tmp_path, db, platform).state == "error"
        announced = _state(builder.run_dir).in_flight
        assert announced is not None and announced.released == builder.ids[2:4]
        gone = builder.ids[2]
        builder.open_segment(supersedes=[gone])  # resumed again: one errored slot retried
        builder.add(1)
        builder.seal()
        done = _sync_with(platform, tmp_path, db)
        assert done.state == "synced", done
        assert any("superseded" in w for w in done.warnings)
    state = _state(builder.run_dir)
    assert announced.digest in state.uploads and state.superseded_pushed == [gone]
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}
    assert evaluation["metadata"]["prime_runs"]["superseded_after_push"] == [gone]
    from prime_runs_spool.sync.status import run_status

    (dest,) = run_status(builder.run_dir).destinations
    assert (dest.held_back, dest.superseded_after_push) == (0, 1)


def test_a_released_episode_a_later_resume_supersedes_is_said_and_metrics_follow(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-released-superseded")
    builder.open_segment()
    builder.add(2)
    builder.add(1, ok=False)
    builder.seal()  # completed with an error: it is released to Prime Traces
    db = tmp_path / "p.db"
    (first,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert (first.state, first.pushed_total) == ("synced", 3), first
    errored = builder.ids[2]
    builder.open_segment(supersedes=[errored])  # then verifiers --resume retried it
    builder.add(1)
    builder.seal()
    (second,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert second.state == "synced", second
    assert any("superseded" in w and "append-only" in w for w in second.warnings)
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)  # it cannot be taken back
    assert evaluation["metadata"]["prime_runs"]["superseded_after_push"] == [errored]
    assert evaluation["metrics"]["avg_error"] == 0.0 and evaluation["finalize_count"] == 1


def test_dry_run_to_traces_counts_what_a_completed_run_releases_and_not_what_is_held(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "dry-held")
    builder.open_segment()
    builder.add(3)
    builder.add(2, ok=False)

    def dry() -> int:
        with EmbeddedPlatform(tmp_path / "p.db", traces=True) as platform:
            settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                                frontend_url=platform.base_url)
            with PlatformClient(settings, timeout=5) as client:
                (report,) = sync_paths([tmp_path / "runs"], client, local_destination(tmp_path / "p.db", None),
                                       SyncOptions(to=TRACES, dry_run=True))
        assert report.state == "dry_run", report
        return report.pushed_now

    assert dry() == 3  # live: the errored ones wait
    builder.seal()
    assert dry() == 5  # completed: they would be released


def test_auto_releases_a_completed_runs_errored_episodes_to_traces_before_any_receipt(tmp_path: Path) -> None:
    """Every episode errored: nothing is sent before the run's end, so no receipt has
    recorded the store yet when the release comes; it still goes to Prime Traces."""
    builder = RunBuilder(tmp_path / "runs" / "run", "auto-all-errored")
    builder.open_segment()
    builder.add(3, ok=False)
    builder.seal()
    db = tmp_path / "p.db"
    (report,), _ = _sync(tmp_path, db, to="auto", batch_bytes=5_000)
    assert (report.state, report.store, report.pushed_total) == ("synced", TRACES, 3), report
    state = _state(builder.run_dir)
    assert (state.store, state.samples_pushed, state.released) == (TRACES, 0, builder.ids)
    items, _ = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)


def test_an_announced_batch_is_rebuilt_under_the_supersede_lists_it_was_cut_with(tmp_path: Path) -> None:
    """A resume may supersede an episode that is not errored (its task no longer selected):
    if that episode is in an announced batch, the batch is still sent as announced."""
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-announced-ok")
    builder.open_segment()
    builder.add(3)
    builder.abandon()
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db, traces=True) as platform:
        assert _sync_losing_uploads(tmp_path, db, platform).state == "error"
        announced = _state(builder.run_dir).in_flight
        assert announced is not None and announced.episodes == 2 and announced.released == []  # ids 0 and 1
        gone = builder.ids[0]
        builder.open_segment(supersedes=[gone])
        builder.add(1)
        builder.seal()
        done = _sync_with(platform, tmp_path, db)
        assert done.state == "synced", done
    state = _state(builder.run_dir)
    assert state.uploads[0] == announced.digest and state.superseded_pushed == [gone]
    items, evaluation = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}
    assert evaluation["metadata"]["prime_runs"]["superseded_after_push"] == [gone]


@pytest.mark.slow
def test_a_lost_state_after_the_release_sends_nothing_again(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "traces-release-lost-state")
    builder.open_segment()
    builder.add(6)
    builder.add(3, ok=False)
    builder.add(2)
    builder.seal()
    db = tmp_path / "p.db"
    _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    first = _state(builder.run_dir)
    assert len(first.released) == 3 and len(first.uploads) > 2
    (path,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    path.unlink()
    (report,), _ = _sync(tmp_path, db, to=TRACES, batch_bytes=5_000)
    assert report.state == "synced", report
    again = _state(builder.run_dir)
    assert (again.evaluation_id, again.uploads, report.pushed_now) == (first.evaluation_id, [], 0), report
    assert sorted(again.held_there.ids()) == sorted(builder.ids) and report.held_back == 0
    items, _ = _in_traces(db, builder.run_dir)
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}


def test_status_of_a_finalized_run_with_no_episode_says_nothing_is_left_to_push(tmp_path: Path) -> None:
    """``auto``, a completed run with no episode: finalized, no sink ever needed. ``status``
    said "nothing pushed yet, 0 episodes pending, finalized", as if something were to come."""
    from support.cli import run_cli

    build_run(tmp_path / "runs" / "run", "traces-no-episode", 0)
    (report,), _ = _sync(tmp_path, tmp_path / "p.db", to="auto", batch_bytes=8_000)
    assert (report.state, report.pushed_total) == ("synced", 0), report
    shown = run_cli("status", str(tmp_path / "runs")).stdout
    assert "nothing to push, 0 episodes pending, finalized" in shown and "yet" not in shown, shown
