"""The fault proxy: each fault happens, looks to httpx as the real network would, and is
logged; after-commit faults leave the platform with the request committed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from support import platform_process
from support.env import REPO_ROOT, child_env
from fixtures.fault_proxy import AFTER_FAULTS, FAULTS, NO_FAULT, FaultProxy, check_rates, spread


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory):
    with platform_process.running(tmp_path_factory.mktemp("platform") / "p.db") as proc:
        yield proc


@pytest.fixture
def proxy(platform):
    with FaultProxy(platform.base_url, seed=1, retry_after=7, delay=1.0) as p:
        yield p


@pytest.fixture
def evaluation_id(platform) -> str:
    api = platform.api
    env = httpx.post(f"{api}/environmentshub/resolve", json={"name": "proxy-env"}).json()["data"]["id"]
    body = {"name": "proxied", "environments": [{"id": env}], "tags": []}
    return httpx.post(f"{api}/evaluations/", json=body).json()["evaluation_id"]


def committed(platform, evaluation_id: str) -> int:
    """total_samples, asked of the platform directly, around the proxy."""
    return httpx.get(f"{platform.api}/evaluations/{evaluation_id}").json()["total_samples"]


def push_through(proxy: FaultProxy, evaluation_id: str, timeout: float = 10.0) -> httpx.Response:
    return httpx.post(
        f"{proxy.base_url}/api/v1/evaluations/{evaluation_id}/samples",
        json={"samples": [{"a": 1}, {"b": 2}]}, timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind,status", [("status_500", 500), ("status_502", 502),
                                         ("status_503", 503), ("status_504", 504)])
def test_status_faults_answer_without_forwarding(proxy, platform, evaluation_id, kind, status):
    proxy.set_rates({kind: 1.0})
    r = push_through(proxy, evaluation_id)
    assert r.status_code == status and r.json()["detail"] == f"injected fault: {status}"
    assert committed(platform, evaluation_id) == 0
    assert proxy.faults() == [kind] and proxy.log[0].upstream_status is None


@pytest.mark.slow
def test_rate_limit_carries_retry_after(proxy, platform, evaluation_id):
    proxy.set_rates({"rate_limit": 1.0})
    r = push_through(proxy, evaluation_id)
    assert r.status_code == 429 and r.headers["Retry-After"] == "7"
    assert committed(platform, evaluation_id) == 0


def test_reset_before_forwarding_is_a_network_error_and_commits_nothing(proxy, platform, evaluation_id):
    proxy.set_rates({"reset_before": 1.0})
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        push_through(proxy, evaluation_id)
    assert committed(platform, evaluation_id) == 0
    assert proxy.faults() == ["reset_before"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,error",
    [("drop_after", httpx.RemoteProtocolError),
     ("reset_after", (httpx.ReadError, httpx.RemoteProtocolError)),
     ("truncate_after", (httpx.ReadError, httpx.RemoteProtocolError)),
     ("delay_after", httpx.ReadTimeout)],
)
def test_after_commit_faults_fail_the_client_but_the_platform_committed(
    proxy, platform, evaluation_id, kind, error
):
    proxy.set_rates({kind: 1.0})
    proxy.delay = 5.0
    # Only the delay is meant to outlast the client; a slow commit on a busy machine must not.
    with pytest.raises(error):
        push_through(proxy, evaluation_id, timeout=1.0 if kind == "delay_after" else 30.0)
    deadline = time.monotonic() + 10
    while proxy.log[0].upstream_status is None and time.monotonic() < deadline:
        time.sleep(0.05)  # a delayed request may still be on its way to the platform
    assert committed(platform, evaluation_id) == 2
    assert proxy.faults() == [kind] and proxy.log[0].upstream_status == 200


def test_delayed_response_still_arrives_for_a_patient_client(platform, evaluation_id):
    with FaultProxy(platform.base_url, rates={"delay_after": 1.0}, delay=0.3) as proxy:
        r = push_through(proxy, evaluation_id, timeout=10)
    assert r.status_code == 200 and r.json()["samples_pushed"] == 2


@pytest.mark.slow
def test_no_fault_forwards_faithfully_including_chunked_bodies(proxy, platform, evaluation_id):
    rows = [{"i": i, "pad": "y" * 1000} for i in range(3000)]  # about 3 MiB
    payload = json.dumps({"samples": rows}).encode()
    chunks = (payload[i : i + 65536] for i in range(0, len(payload), 65536))
    url = f"{proxy.base_url}/api/v1/evaluations/{evaluation_id}/samples"
    r = httpx.post(url, content=chunks, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200 and r.json()["samples_pushed"] == 3000
    page = httpx.get(url, params={"limit": 1000, "page": 3}, timeout=30).json()
    assert page["samples"] == rows[2000:] and page["hasMore"] is False
    assert proxy.faults() == [NO_FAULT, NO_FAULT]
    assert r.headers["connection"] == "close"


@pytest.mark.slow
def test_same_seed_same_faults_other_seed_other_faults(platform, evaluation_id):
    def sequence(seed: int) -> list[str]:
        with FaultProxy(platform.base_url, seed=seed, rates=spread(0.8), delay=0.01) as proxy:
            for _ in range(30):
                try:
                    push_through(proxy, evaluation_id, timeout=5)
                except httpx.TransportError:
                    pass
            return proxy.faults()

    first = sequence(11)
    assert first == sequence(11)
    assert first != sequence(12)
    assert len(set(first)) >= 5 and NO_FAULT in first


@pytest.mark.slow
def test_only_matching_methods_and_paths_are_faulted(platform, evaluation_id):
    with FaultProxy(platform.base_url, rates={"status_503": 1.0}, methods=["post"],
                    paths=r"/samples$") as proxy:
        base = f"{proxy.base_url}/api/v1/evaluations/{evaluation_id}"
        assert httpx.get(f"{base}/samples").status_code == 200
        assert httpx.put(base, json={"metadata": {}}).status_code == 200
        assert httpx.post(f"{base}/finalize", json={"metrics": {}}).status_code == 200
        assert push_through(proxy, evaluation_id).status_code == 503
        assert proxy.faults() == [NO_FAULT, NO_FAULT, NO_FAULT, "status_503"]


def test_unreachable_upstream_is_a_logged_502():
    with FaultProxy("http://127.0.0.1:1") as proxy:
        assert httpx.get(f"{proxy.base_url}/api/v1/evaluations/").status_code == 502
        assert proxy.faults() == ["upstream_unreachable"]


def test_rates_are_checked():
    assert check_rates(spread(0.3)) and abs(sum(spread(0.3).values()) - 0.3) < 1e-12
    assert set(spread(0.3)) == set(FAULTS) and set(AFTER_FAULTS) < set(FAULTS)
    for bad in ({"nope": 0.1}, {"status_500": 0.7, "reset_after": 0.4}, {"drop_after": -0.1}):
        with pytest.raises(ValueError):
            check_rates(bad)


@pytest.mark.slow
def test_script_prints_url_first_logs_to_file_and_stops_on_sigterm(platform, evaluation_id, tmp_path):
    log = tmp_path / "faults.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "fixtures" / "fault_proxy.py"), "--upstream",
         platform.base_url, "--seed", "3", "--rates", "status_503=1", "--methods", "POST",
         "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )
    try:
        url = platform_process.first_line(proc)
        assert url.startswith("http://127.0.0.1:")
        r = httpx.post(f"{url}/api/v1/evaluations/{evaluation_id}/samples", json={"samples": []})
        assert r.status_code == 503
        assert httpx.get(f"{url}/api/v1/evaluations/{evaluation_id}").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, proc.stderr.read()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(d["method"], d["fault"]) for d in lines] == [("POST", "status_503"), ("GET", NO_FAULT)]
    assert lines[0]["path"] == f"/api/v1/evaluations/{evaluation_id}/samples"
