"""A batch in doubt (sent, its answer lost) keeps the run in its sink: no sink choice, ``auto``'s
fallback or ``--to``, sends the run's episodes anywhere else while it may have been committed.

In process, against the embedded local platform over HTTP; answers are lost by the fault
proxy after the platform committed the request, and Prime Traces is turned off by starting
the platform on the same database without it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
from prime_traces import TracesClient

from fixtures.fault_proxy import FaultProxy
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import AUTO, SAMPLES, TRACES, SyncOptions
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import InFlight, SyncState, local_destination
from support.ports import closed_url
from support.runs import build_run

EPISODES = 5


def _sync(root: Path, db: Path, base_url: str, to: str, *, replay: bool = False):
    settings = Settings(base_url=base_url, api_key=Secret("local"), team_id=None, frontend_url=base_url)
    with PlatformClient(settings, timeout=5) as client:
        (report,) = sync_paths([root], client, local_destination(db, None),
                               SyncOptions(to=to, request_lifetime=0.2, replay=replay,
                                           backoff=Backoff(base=0.01, cap=0.01, max_attempts=1)))
    return report


def _sync_losing_answers(root: Path, db: Path, to: str, route: str, *, traces: bool,
                         methods: tuple[str, ...] = ("POST",)):
    """A sync whose requests to ``route`` are answered and the answer lost: it stops, announced."""
    with EmbeddedPlatform(db, traces=traces) as platform, \
            FaultProxy(platform.base_url, rates={"drop_after": 1.0}, methods=list(methods), paths=route) as proxy:
        lost = _sync(root, db, proxy.base_url, to)
        assert {f for f in proxy.faults() if f != "none"} == {"drop_after"}, proxy.faults()
    return lost


def _state(run_dir: Path) -> SyncState:
    """The run's state (not a replay's)."""
    (path,) = (p for p in (run_dir / "spool" / "sync").glob("*.json") if "-replay-" not in p.name)
    return SyncState.from_json(path.read_bytes())


def _announced(run_dir: Path) -> InFlight | None:
    """The batch the run's state announces, but for its send time (each try of it stamps
    its own: the lease says until when it may land)."""
    pending = _state(run_dir).in_flight
    return None if pending is None else dataclasses.replace(pending, sent_at=0.0)


def _held(base_url: str, evaluation_id: str) -> tuple[int, list[str]]:
    """The evaluation's samples, and the episode ids Prime Traces holds for it (one each)."""
    samples = httpx.get(f"{base_url}/api/v1/evaluations/{evaluation_id}").json()["total_samples"]
    with TracesClient(api_key="x", base_url=base_url) as traces:
        items = traces.list_episodes(run_id=evaluation_id, limit=100).items
    return samples, sorted(i.episode_id for i in items)


@pytest.mark.slow
@pytest.mark.parametrize("first", [AUTO, TRACES])
def test_a_traces_batch_in_doubt_keeps_the_run_in_traces_once_traces_is_off(tmp_path: Path, first: str) -> None:
    """Committed, its answer lost; then the account has Prime Traces off. Every sink choice
    (``auto``'s fallback, ``--to traces`` and then its advice, ``--to samples``) stops the run
    with a line saying what to do, pushes no sample and keeps the batch announced; with
    Prime Traces back on, the batch is settled under its key and each episode is there once."""
    builder = build_run(tmp_path / "runs" / "run", "traces-in-doubt", EPISODES)
    db = tmp_path / "p.db"
    lost = _sync_losing_answers(tmp_path / "runs", db, AUTO, r"/traces$", traces=True)
    assert lost.state == "error", lost
    announced = _announced(builder.run_dir)
    assert announced is not None and announced.kind == TRACES
    evaluation_id = str(_state(builder.run_dir).evaluation_id)
    with EmbeddedPlatform(db, traces=False) as platform:
        for to in (first, AUTO, SAMPLES, TRACES):
            refused = _sync(tmp_path / "runs", db, platform.base_url, to)
            assert refused.state == "error" and refused.pushed_now == 0, (to, refused)
            assert "\n" not in refused.error and "traces" in refused.error.lower(), refused.error
            assert _announced(builder.run_dir) == announced, to
            assert httpx.get(f"{platform.base_url}/api/v1/evaluations/{evaluation_id}").json()[
                "total_samples"] == 0, to
        # its advice, as printed: a replay to samples is a new evaluation, the run's own untouched
        assert "--replay --to samples" in refused.error
        replayed = _sync(tmp_path / "runs", db, platform.base_url, SAMPLES, replay=True)
        assert (replayed.state, replayed.store, replayed.pushed_now) == ("synced", SAMPLES, EPISODES), replayed
        assert replayed.evaluation_id != evaluation_id
        assert httpx.get(f"{platform.base_url}/api/v1/evaluations/{evaluation_id}").json()["total_samples"] == 0
    with EmbeddedPlatform(db, traces=True) as platform:
        done = _sync(tmp_path / "runs", db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, EPISODES), done
        assert _held(platform.base_url, evaluation_id) == (0, sorted(builder.ids))
    state = _state(builder.run_dir)
    assert (state.uploads[0], state.samples_pushed, state.in_flight) == (announced.digest, 0, None)


@pytest.mark.slow
def test_a_samples_request_in_doubt_keeps_the_run_in_samples_once_traces_is_on(tmp_path: Path) -> None:
    """The reverse: ``auto`` fell back to samples, a request committed with its answer lost;
    with Prime Traces on now, neither ``auto`` nor ``--to traces`` sends the run there: the
    request is settled by the count and each row is there once."""
    builder = build_run(tmp_path / "runs" / "run", "samples-in-doubt", EPISODES)
    db = tmp_path / "p.db"
    # the samples POST commits and loses its answer, and so does the read of the count that
    # would settle it: the pass ends with the request announced
    lost = _sync_losing_answers(tmp_path / "runs", db, AUTO, r"/evaluations/[^/]+(/samples)?$", traces=False,
                                methods=("POST", "GET"))
    assert lost.state == "error", lost
    announced = _announced(builder.run_dir)
    assert announced is not None and announced.kind == SAMPLES
    evaluation_id = str(_state(builder.run_dir).evaluation_id)
    with EmbeddedPlatform(db, traces=True) as platform:
        refused = _sync(tmp_path / "runs", db, platform.base_url, TRACES)
        assert refused.state == "error" and "went to samples" in refused.error, refused
        done = _sync(tmp_path / "runs", db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", SAMPLES, EPISODES), done
        assert _held(platform.base_url, evaluation_id) == (EPISODES, [])


@pytest.mark.slow
def test_a_batch_in_doubt_in_a_sink_found_on_the_platform_is_kept_where_traces_is_off(tmp_path: Path) -> None:
    """The run's sink read from its evaluation (its state lost): a batch of a live run sent
    there and its answer lost, then a pass where Prime Traces is off stops the run and keeps
    the announcement. Forgotten, the run's tail, grown since, would be cut into another batch
    under another key: its episodes stored twice."""
    from support.runs import RunBuilder

    builder = RunBuilder(tmp_path / "runs" / "run", "found-in-doubt")
    builder.open_segment()
    builder.add(3)
    db, root = tmp_path / "p.db", tmp_path / "runs"
    with EmbeddedPlatform(db, traces=True) as platform:  # the create names traces; Prime Traces' port is closed
        assert "connection refused" in _sync_to_traces_at(root, db, platform.base_url,
                                                          closed_url(), TRACES).error
    evaluation_id = str(_state(builder.run_dir).evaluation_id)
    for path in (builder.run_dir / "spool" / "sync").glob("*.json"):
        path.unlink()
    lost = _sync_losing_answers(root, db, AUTO, r"/traces$", traces=True)
    assert lost.state == "error" and _state(builder.run_dir).sink_from_platform, lost
    announced = _announced(builder.run_dir)
    assert announced is not None and announced.kind == TRACES and announced.episodes == 3
    with EmbeddedPlatform(db, traces=False) as platform:
        refused = _sync(root, db, platform.base_url, AUTO)
        assert refused.state == "error" and "\n" not in refused.error, refused
    assert _announced(builder.run_dir) == announced
    builder.add(2)
    builder.seal()
    with EmbeddedPlatform(db, traces=True) as platform:
        done = _sync(root, db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, 5), done
        with TracesClient(api_key="x", base_url=platform.base_url) as traces:
            items = traces.list_episodes(run_id=evaluation_id, limit=100).items
    assert sorted(i.episode_id for i in items) == sorted(builder.ids)
    assert {i.model_extra["generation"] for i in items} == {1}


@pytest.mark.slow
def test_prime_traces_turned_off_while_a_batch_is_in_doubt_in_one_pass(tmp_path: Path) -> None:
    """Within one pass: ``auto``'s probe finds Prime Traces, the first upload commits and its
    answer is lost, and the retry meets Prime Traces turned off (the proxy now forwards to the
    same database served without it). The batch sent without an answer may be there: the pass
    stops rather than falling back to samples, and a later one settles it under its key."""
    from urllib.parse import urlsplit

    builder = build_run(tmp_path / "runs" / "run", "off-mid-pass", EPISODES)
    db, root = tmp_path / "p.db", tmp_path / "runs"
    with EmbeddedPlatform(db, traces=True) as on, EmbeddedPlatform(db, traces=False) as off, \
            FaultProxy(on.base_url, rates={"drop_after": 1.0}, methods=["POST"], paths=r"/traces$") as proxy:
        def turn_traces_off(_retry) -> None:
            proxy.set_rates({})
            address = urlsplit(off.base_url)
            proxy.upstream = (address.hostname, address.port)

        settings = Settings(base_url=proxy.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url=proxy.base_url)
        with PlatformClient(settings, timeout=5) as client:
            (refused,) = sync_paths([root], client, local_destination(db, None),
                                    SyncOptions(to=AUTO, backoff=Backoff(base=0.01, cap=0.01, max_attempts=3,
                                                                         on_retry=turn_traces_off)))
        assert refused.state == "error" and "may have been committed" in refused.error, refused
        assert proxy.faults()[-2:] == ["drop_after", "none"], proxy.faults()
        evaluation_id = str(_state(builder.run_dir).evaluation_id)
        assert httpx.get(f"{off.base_url}/api/v1/evaluations/{evaluation_id}").json()["total_samples"] == 0
    with EmbeddedPlatform(db, traces=True) as platform:
        done = _sync(root, db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, EPISODES), done
        assert _held(platform.base_url, evaluation_id) == (0, sorted(builder.ids))


def _sync_to_traces_at(root: Path, db: Path, base_url: str, traces_url: str, to: str, *,
                       on_retry=None):
    """A sync whose Prime Traces uploads go to ``traces_url``, three tries each."""
    settings = Settings(base_url=base_url, api_key=Secret("local"), team_id=None, frontend_url=base_url,
                        traces_url=traces_url)
    with PlatformClient(settings, timeout=5) as client:
        (report,) = sync_paths([root], client, local_destination(db, None),
                               SyncOptions(to=to, request_lifetime=0.2,
                                           backoff=Backoff(base=0.01, cap=0.01, max_attempts=3, on_retry=on_retry)))
    return report


@pytest.mark.slow
@pytest.mark.parametrize("first", [AUTO, TRACES])
def test_a_batch_whose_every_try_was_refused_a_connection_is_not_in_doubt(tmp_path: Path, first: str) -> None:
    """Prime Traces' port closed: every try of the batch is refused a connection, so nothing
    left this machine. The pass fails, and the batch is not left announced: ``--to samples``
    then takes the run (it was refused, "this run's episodes went to traces"), each episode
    once, and Prime Traces holds nothing of it."""
    builder = build_run(tmp_path / "runs" / "run", "refused-connection", EPISODES)
    db, root = tmp_path / "p.db", tmp_path / "runs"
    with EmbeddedPlatform(db, traces=True) as platform:
        refused = _sync_to_traces_at(root, db, platform.base_url, closed_url(), first)
        assert refused.state == "error" and "connection refused" in refused.error, refused
        state = _state(builder.run_dir)
        assert (state.in_flight, state.store, state.uploads) == (None, None, []), state
        done = _sync(root, db, platform.base_url, SAMPLES)
        assert (done.state, done.store, done.pushed_now) == ("synced", SAMPLES, EPISODES), done
        assert _held(platform.base_url, str(state.evaluation_id)) == (EPISODES, [])


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["reset_after", "status_504"])
def test_a_batch_that_may_have_been_sent_stays_in_doubt_though_its_last_try_was_refused(tmp_path: Path,
                                                                                        fault: str) -> None:
    """The first try is sent whole and its connection reset instead of the answer (the fault
    proxy: committed), or answered 504 by the gateway before the service (the proxy: not
    forwarded, but a gateway's 504 cannot tell); the proxy is then gone, so the later tries
    are refused a connection. One try may have landed, so the batch stays announced: ``--to
    samples`` is refused, and a sync that reaches Prime Traces again settles it under its
    key, each episode once."""
    builder = build_run(tmp_path / "runs" / "run", f"{fault}-then-refused", EPISODES)
    db, root = tmp_path / "p.db", tmp_path / "runs"
    with EmbeddedPlatform(db, traces=True) as platform:
        proxy = FaultProxy(platform.base_url, rates={fault: 1.0}, methods=["POST"], paths=r"/traces$").start()
        try:
            lost = _sync_to_traces_at(root, db, platform.base_url, proxy.base_url, AUTO,
                                      on_retry=lambda _retry: proxy.stop())
            assert [f for f in proxy.faults() if f != "none"] == [fault], proxy.faults()
        finally:
            proxy.stop()
        assert lost.state == "error" and "connection refused" in lost.error, lost
        announced = _announced(builder.run_dir)
        assert announced is not None and announced.kind == TRACES
        refused = _sync(root, db, platform.base_url, SAMPLES)
        assert refused.state == "error" and "went to traces" in refused.error, refused
        assert _announced(builder.run_dir) == announced
        done = _sync(root, db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, EPISODES), done
        assert _held(platform.base_url, str(_state(builder.run_dir).evaluation_id)) == (0, sorted(builder.ids))


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["status_504_after", "status_503_after"])
def test_a_batch_a_gateway_answered_for_after_forwarding_it_stays_in_doubt(tmp_path: Path, fault: str) -> None:
    """A gateway in front of Prime Traces forwards each try of the batch and answers for it
    (504: it stopped waiting for the service, which committed; a codeless 503: envoy's reset
    before the answer's headers). An answer that is not the service's refusal may follow a
    commit, so the batch stays announced when the pass gives up: ``--to samples`` is refused
    (else the run was in both sinks, each episode twice), and a sync that reaches Prime
    Traces settles it under its key, each episode once."""
    builder = build_run(tmp_path / "runs" / "run", "gateway-after", EPISODES)
    db, root = tmp_path / "p.db", tmp_path / "runs"
    with EmbeddedPlatform(db, traces=True) as platform:
        with FaultProxy(platform.base_url, rates={fault: 1.0}, methods=["POST"], paths=r"/traces$") as proxy:
            lost = _sync_to_traces_at(root, db, platform.base_url, proxy.base_url, AUTO)
            assert [f for f in proxy.faults() if f != "none"] == [fault] * 3, proxy.faults()
        assert lost.state == "error", lost
        announced = _announced(builder.run_dir)
        assert announced is not None and announced.kind == TRACES
        refused = _sync(root, db, platform.base_url, SAMPLES)
        assert refused.state == "error" and "went to traces" in refused.error, refused
        assert _announced(builder.run_dir) == announced
        evaluation_id = str(_state(builder.run_dir).evaluation_id)
        done = _sync(root, db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, EPISODES), done
        assert _held(platform.base_url, evaluation_id) == (0, sorted(builder.ids))


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["ok_null_after", "ok_empty"])
def test_a_traces_upload_answered_2xx_without_a_receipt_stays_in_doubt(tmp_path: Path, fault: str) -> None:
    """A proxy passes the upload on (the service stores it) and answers 200 ``null``
    (``ok_null_after``), or answers 200 with no body and passes nothing on (``ok_empty``):
    no receipt either way. The batch stays announced, ``--to samples`` is refused, and the
    next sync settles it under its key, each episode in Prime Traces once. Before, ``null``
    read as a refusal ('answered None: refused'): the batch was withdrawn with the run's
    sink and ``--to samples`` pushed every stored episode again as samples; an empty body
    ended the run in 'internal error: JSONDecodeError'."""
    builder = build_run(tmp_path / "runs" / "run", "bare-2xx-traces", EPISODES)
    db = tmp_path / "p.db"
    with EmbeddedPlatform(db, traces=True) as platform, \
            FaultProxy(platform.base_url, rates={fault: 1.0}, methods=["POST"], paths=r"/traces$") as proxy:
        bare = _sync(tmp_path / "runs", db, proxy.base_url, TRACES)
        assert fault in proxy.faults()
    assert bare.state == "error" and "without a receipt" in bare.error and "\n" not in bare.error, bare
    announced = _announced(builder.run_dir)
    assert announced is not None and announced.kind == TRACES
    evaluation_id = str(_state(builder.run_dir).evaluation_id)
    with EmbeddedPlatform(db, traces=True) as platform:
        refused = _sync(tmp_path / "runs", db, platform.base_url, SAMPLES)
        assert refused.state == "error" and "went to traces" in refused.error, refused
        done = _sync(tmp_path / "runs", db, platform.base_url, AUTO)
        assert (done.state, done.store, done.pushed_total) == ("synced", TRACES, EPISODES), done
        assert _held(platform.base_url, evaluation_id) == (0, sorted(builder.ids))
