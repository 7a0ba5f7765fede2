"""The local platform, end to end: a real ``prime-runs platform serve`` process over HTTP."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.local_platform.store import Store
from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES as MAX_BODY_BYTES

from support import platform_process
from support.env import CLI, child_env
from support.runs import build_run
from support.cli import run_cli

TOKEN = "s3cret-token"


server, client = platform_process.module_fixtures(TOKEN, client_name="client")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def env_id(client: httpx.Client, name: str | None = None) -> str:
    r = client.post("/environmentshub/resolve", json={"name": name or unique("env")})
    assert r.status_code == 200, r.text
    return r.json()["data"]["id"]


def new_eval(client: httpx.Client, **fields) -> dict:
    body = {"name": unique("run"), "environments": [{"id": env_id(client)}], "tags": []}
    body.update(fields)
    r = client.post("/evaluations/", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def get_eval(client: httpx.Client, evaluation_id: str) -> dict:
    r = client.get(f"/evaluations/{evaluation_id}")
    assert r.status_code == 200, r.text
    return r.json()


def push(client: httpx.Client, evaluation_id: str, samples: list[dict]) -> httpx.Response:
    return client.post(f"/evaluations/{evaluation_id}/samples", json={"samples": samples})


# -- environments ---------------------------------------------------------------------


@pytest.mark.slow
def test_resolve_is_get_or_create_and_lookup_finds_it(client):
    name = unique("gsm8k")
    first = env_id(client, name)
    assert env_id(client, name) == first
    assert env_id(client, unique("other")) != first
    r = client.get(f"/environmentshub/local/{name}/@latest")
    assert r.status_code == 200
    assert r.json()["data"]["id"] == first and r.json()["data"]["name"] == name


def test_resolve_with_owner_in_name_and_team(client):
    name = unique("math")
    owned = env_id(client, f"alice/{name}")
    assert client.get(f"/environmentshub/alice/{name}/@latest").json()["data"]["id"] == owned
    r = client.post("/environmentshub/resolve", json={"name": name, "team_id": "team-9"})
    team_env = r.json()["data"]
    assert team_env["owner"] == "team-9" and team_env["id"] != owned


def test_environment_lookup_unknown_is_404(client):
    assert client.get(f"/environmentshub/nobody/{unique('x')}/@latest").status_code == 404


def test_resolve_malformed_is_422(client):
    assert client.post("/environmentshub/resolve", json={"team_id": "t"}).status_code == 422
    assert client.post("/environmentshub/resolve", json={"name": ""}).status_code == 422


# -- evaluations ----------------------------------------------------------------------


def test_create_returns_201_with_the_fields_clients_read(client, server):
    e = new_eval(
        client, model_name="m-1", metadata={"model": "m-1", "num_examples": 3},
        metrics={"x": 1}, tags=["a"], dataset="d", framework="verifiers",
    )
    assert e["status"] == "RUNNING"
    assert e["viewer_url"] == f"{server.base_url}/dashboard/evaluations/{e['evaluation_id']}"
    assert e["created_at"] and e["model_name"] == "m-1" and e["tags"] == ["a"]
    got = get_eval(client, e["evaluation_id"])
    assert got["metadata"] == {"model": "m-1", "num_examples": 3}
    assert got["metrics"] == {"x": 1}
    assert got["total_samples"] == 0 and got["finalize_count"] == 0


def test_create_is_not_idempotent(client):
    team = unique("team")
    env = env_id(client)
    body = {"name": "same", "environments": [{"id": env}], "tags": [], "team_id": team}
    ids = {client.post("/evaluations/", json=body).json()["evaluation_id"] for _ in range(2)}
    assert len(ids) == 2
    assert client.get("/evaluations/", params={"team_id": team}).json()["total"] == 2


def test_create_with_unknown_environment_is_404(client):
    body = {"name": "r", "environments": [{"id": "no-such-env"}], "tags": []}
    assert client.post("/evaluations/", json=body).status_code == 404


@pytest.mark.parametrize(
    "content",
    [b"{", b"[]", b"{}", b'{"name": "r"}', b'{"name": "r", "environments": "e"}',
     b'{"name": 5, "environments": []}', b'{"name": "r", "environments": [], "metadata": []}'],
)
def test_create_malformed_is_422(client, content):
    r = client.post("/evaluations/", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "detail" in r.json()


def test_get_unknown_is_404(client):
    assert client.get("/evaluations/no-such-id").status_code == 404


def test_put_replaces_metadata_whole_and_keeps_what_is_left_out(client):
    e = new_eval(client, metadata={"a": 1, "b": 2}, metrics={"m": 1})
    r = client.put(f"/evaluations/{e['evaluation_id']}", json={"metadata": {"c": 3}})
    assert r.status_code == 200 and r.json()["metadata"] == {"c": 3}
    got = get_eval(client, e["evaluation_id"])
    assert got["metadata"] == {"c": 3} and got["metrics"] == {"m": 1}
    client.put(f"/evaluations/{e['evaluation_id']}", json={"metrics": {"n": 2}})
    got = get_eval(client, e["evaluation_id"])
    assert got["metadata"] == {"c": 3} and got["metrics"] == {"n": 2}


def test_put_unknown_is_404_and_malformed_is_422(client):
    assert client.put("/evaluations/nope", json={"metadata": {}}).status_code == 404
    e = new_eval(client)
    assert client.put(f"/evaluations/{e['evaluation_id']}", json={"metadata": [1]}).status_code == 422


def test_finalize_completes_and_a_second_finalize_is_recorded(client):
    e = new_eval(client, metrics={"kept": 1})
    r = client.post(f"/evaluations/{e['evaluation_id']}/finalize", json={"metrics": {"avg_reward": 0.5}})
    assert r.status_code == 200
    assert r.json()["status"] == "COMPLETED" and r.json()["finalize_count"] == 1
    assert r.json()["metrics"] == {"kept": 1, "avg_reward": 0.5}
    r = client.post(f"/evaluations/{e['evaluation_id']}/finalize", json={"metrics": {}})
    assert r.status_code == 200
    got = get_eval(client, e["evaluation_id"])
    assert got["finalize_count"] == 2 and got["status"] == "COMPLETED" and got["finalized_at"]


def test_put_status_closes_out_failed_or_cancelled_and_a_closed_one_is_409(client):
    """prime-runs 0.1.4's close-out: PUT {"status", "error_message"}; 409 once closed."""
    cancelled = new_eval(client)["evaluation_id"]
    r = client.put(f"/evaluations/{cancelled}", json={"status": "CANCELLED", "error_message": "interrupted"})
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["error_message"]) == ("CANCELLED", "interrupted")
    again = client.put(f"/evaluations/{cancelled}", json={"status": "FAILED", "metadata": {"x": 1}})
    assert again.status_code == 409  # the whole update refused: nothing written
    assert get_eval(client, cancelled)["metadata"] != {"x": 1}
    assert get_eval(client, cancelled)["status"] == "CANCELLED"
    # a resumed run that completes may still finalize it
    assert client.post(f"/evaluations/{cancelled}/finalize", json={"metrics": {}}).json()["status"] == "COMPLETED"

    failed = new_eval(client)["evaluation_id"]
    r = client.put(f"/evaluations/{failed}", json={"status": "FAILED", "error_message": "x" * 5000})
    assert r.json()["status"] == "FAILED" and len(r.json()["error_message"]) == 4096
    assert client.put(f"/evaluations/{failed}", json={"status": "COMPLETED"}).status_code == 422


def test_the_client_treats_409_as_already_closed(server):
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.platform_api.v0 import terminal_status_body

    with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {TOKEN}"}) as raw:
        evaluation_id = new_eval(raw)["evaluation_id"]
    settings = Settings(base_url=server.base_url, api_key=Secret(TOKEN), team_id=None, frontend_url=server.base_url)
    with PlatformClient(settings) as platform:
        body = terminal_status_body("crashed", "the process exited without finishing the run")
        assert body == {"status": "FAILED", "error_message": "crashed: the process exited without finishing the run"}
        assert platform.set_terminal_status(evaluation_id, body) is True
        assert platform.set_terminal_status(evaluation_id, terminal_status_body("cancelled", "interrupted")) is False
        assert platform.get_evaluation(evaluation_id)["status"] == "FAILED"


def test_finalize_unknown_is_404_and_malformed_is_422(client):
    assert client.post("/evaluations/nope/finalize", json={"metrics": {}}).status_code == 404
    e = new_eval(client)
    r = client.post(f"/evaluations/{e['evaluation_id']}/finalize", json={"metrics": 3})
    assert r.status_code == 422
    assert get_eval(client, e["evaluation_id"])["finalize_count"] == 0


# -- listing --------------------------------------------------------------------------


def test_list_pages_newest_first_with_filters(client):
    team = unique("team")
    env_name = unique("listenv")
    env = env_id(client, env_name)
    ids = [
        client.post(
            "/evaluations/",
            json={"name": f"r{i}", "environments": [{"id": env}], "tags": [], "team_id": team},
        ).json()["evaluation_id"]
        for i in range(3)
    ]
    new_eval(client, team_id=team)  # same team, other environment
    page = client.get("/evaluations/", params={"environment_name": env_name, "limit": 2}).json()
    assert page["total"] == 3 and page["skip"] == 0 and page["limit"] == 2
    assert [e["evaluation_id"] for e in page["evaluations"]] == ids[::-1][:2]
    rest = client.get("/evaluations/", params={"environment_name": env_name, "skip": 2, "limit": 2}).json()
    assert [e["evaluation_id"] for e in rest["evaluations"]] == ids[:1]
    past = client.get("/evaluations/", params={"environment_name": env_name, "skip": 3}).json()
    assert past["evaluations"] == [] and past["total"] == 3
    full = client.get("/evaluations/", params={"environment_name": f"local/{env_name}"}).json()
    assert full["total"] == 3
    assert client.get("/evaluations/", params={"team_id": team}).json()["total"] == 4
    listed = page["evaluations"][0]
    assert {"evaluation_id", "name", "model_name", "status", "metadata", "metrics"} <= listed.keys()


def test_list_defaults_and_bad_params(client):
    for _ in range(2):
        new_eval(client)
    page = client.get("/evaluations/").json()
    assert page["skip"] == 0 and page["limit"] == 50
    assert page["total"] >= 2 and len(page["evaluations"]) == min(50, page["total"])
    for params in ({"limit": 0}, {"skip": -1}, {"limit": "x"}):
        assert client.get("/evaluations/", params=params).status_code == 422


# -- samples --------------------------------------------------------------------------


def test_samples_append_without_dedup_in_order(client):
    e = new_eval(client)
    rows = [{"sample_id": "s1", "reward": 1.0}, {"sample_id": "s2", "nested": {"k": [1, 2]}}]
    r = push(client, e["evaluation_id"], rows)
    assert r.status_code == 200
    assert r.json() == {"evaluation_id": e["evaluation_id"], "samples_pushed": 2, "status": "RUNNING"}
    push(client, e["evaluation_id"], rows)  # the very same rows again
    assert get_eval(client, e["evaluation_id"])["total_samples"] == 4
    got = client.get(f"/evaluations/{e['evaluation_id']}/samples").json()
    assert got["samples"] == rows + rows and got["total"] == 4


@pytest.mark.parametrize(
    "content", [b"not json", b"[]", b"{}", b'{"samples": {}}', b'{"samples": [1]}']
)
def test_samples_malformed_is_422(client, content):
    e = new_eval(client)
    r = client.post(
        f"/evaluations/{e['evaluation_id']}/samples",
        content=content, headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert get_eval(client, e["evaluation_id"])["total_samples"] == 0


def test_samples_unknown_evaluation_is_404(client):
    assert push(client, "no-such-id", [{"a": 1}]).status_code == 404
    assert client.get("/evaluations/no-such-id/samples").status_code == 404


def test_samples_pagination_edges(client):
    e = new_eval(client)
    url = f"/evaluations/{e['evaluation_id']}/samples"
    empty = client.get(url).json()
    assert empty == {"samples": [], "total": 0, "page": 1, "limit": 100, "hasMore": False}
    push(client, e["evaluation_id"], [{"i": i} for i in range(200)])
    p1 = client.get(url).json()
    assert [s["i"] for s in p1["samples"]] == list(range(100)) and p1["hasMore"] is True
    p2 = client.get(url, params={"page": 2}).json()
    assert [s["i"] for s in p2["samples"]] == list(range(100, 200)) and p2["hasMore"] is False
    p3 = client.get(url, params={"page": 3}).json()
    assert p3["samples"] == [] and p3["hasMore"] is False and p3["total"] == 200
    odd = client.get(url, params={"page": 3, "limit": 70}).json()
    assert [s["i"] for s in odd["samples"]] == list(range(140, 200)) and odd["hasMore"] is False
    short = client.get(url, params={"page": 2, "limit": 70}).json()
    assert short["hasMore"] is True and len(short["samples"]) == 70
    for params in ({"page": 0}, {"limit": 0}, {"page": "x"}):
        assert client.get(url, params=params).status_code == 422


@pytest.fixture(scope="module")
def paged_eval(client) -> str:
    e = new_eval(client)
    push(client, e["evaluation_id"], [{"i": i} for i in range(237)])
    return e["evaluation_id"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(1, 300))
def test_paging_through_samples_yields_every_row_once_in_order(client, paged_eval, limit):
    rows, page, pages = [], 1, []
    while True:
        got = client.get(f"/evaluations/{paged_eval}/samples", params={"page": page, "limit": limit}).json()
        assert got["total"] == 237 and got["limit"] == limit and got["page"] == page
        rows += got["samples"]
        pages.append(len(got["samples"]))
        if not got["hasMore"]:
            break
        page += 1
    assert rows == [{"i": i} for i in range(237)]
    assert len(pages) == -(-237 // limit) and all(n == limit for n in pages[:-1])


def _body_of_size(size: int) -> bytes:
    head, tail = b'{"samples":[{"pad":"', b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_body_limit_exact_is_accepted_one_over_is_413(client):
    e = new_eval(client)
    url = f"/evaluations/{e['evaluation_id']}/samples"
    headers = {"content-type": "application/json"}
    at_limit = _body_of_size(MAX_BODY_BYTES)
    assert len(at_limit) == 26_214_400
    assert client.post(url, content=at_limit, headers=headers).status_code == 200
    over = _body_of_size(MAX_BODY_BYTES + 1)
    assert client.post(url, content=over, headers=headers).status_code == 413
    # Without a Content-Length (chunked), the streamed size is what counts.
    chunks = (over[i : i + (1 << 20)] for i in range(0, len(over), 1 << 20))
    assert client.post(url, content=chunks, headers=headers).status_code == 413
    assert get_eval(client, e["evaluation_id"])["total_samples"] == 1


def test_concurrent_appends_lose_nothing(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.api, headers=headers, timeout=60) as c:
        evaluation_id = new_eval(c)["evaluation_id"]
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            with httpx.Client(base_url=server.api, headers=headers, timeout=60) as c:
                for i in range(25):
                    r = push(c, evaluation_id, [{"t": t, "i": i, "j": 0}, {"t": t, "i": i, "j": 1}])
                    assert r.status_code == 200, r.text
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    with httpx.Client(base_url=server.api, headers=headers, timeout=60) as c:
        assert get_eval(c, evaluation_id)["total_samples"] == 400
        rows = c.get(f"/evaluations/{evaluation_id}/samples", params={"limit": 1000}).json()["samples"]
    assert len(rows) == 400
    assert {(r["t"], r["i"], r["j"]) for r in rows} == {
        (t, i, j) for t in range(8) for i in range(25) for j in range(2)
    }
    for t in range(8):  # each client's rows arrive in the order it sent them
        mine = [(r["i"], r["j"]) for r in rows if r["t"] == t]
        assert mine == sorted(mine)


def test_one_process_s_writers_take_turns_before_sqlite_s_write_lock(tmp_path: Path) -> None:
    """Writers of one process never wait in SQLite's busy handler, which sleeps (1, 2, 5 ms
    and longer) while the lock it waits for is free: with it switched off, a writer that met
    the write lock held would fail at once. Eight threads of writes, none refused."""
    store = Store(tmp_path / "turns.db")
    connect = store._connect

    def no_busy_handler() -> sqlite3.Connection:
        conn = connect()
        conn.execute("PRAGMA busy_timeout=0")
        return conn

    store._connect = no_busy_handler  # type: ignore[method-assign]
    refused: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(20):
                store.resolve_environment("gsm8k", None)
        except sqlite3.OperationalError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    store.close()
    assert not refused, refused[:1]


def _counting_commits(monkeypatch: pytest.MonkeyPatch, fail: int = 0) -> list[str]:
    """Every connection SQLite opens from now on counts the commits made on it (one entry
    each, appended in this list); the first ``fail`` of them fail as a disk error would."""
    commits: list[str] = []
    failing = [fail]
    connect = sqlite3.connect

    class Counted(sqlite3.Connection):
        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
            if sql.strip().upper() == "COMMIT":
                commits.append(sql)
                if failing[0]:
                    failing[0] -= 1
                    raise sqlite3.OperationalError("disk I/O error")
            return super().execute(sql, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: connect(*a, factory=Counted, **k))
    return commits


def _queued_behind_one(store: Store, names: list[str]) -> tuple[dict[str, BaseException], threading.Event]:
    """One write of the environment ``names[0]`` that holds the write turn until the event
    returned is set, and a thread for each other name that resolves it meanwhile (they queue
    behind it); what each write raised, once all are done, in the dict returned."""
    raised: dict[str, BaseException] = {}
    go, holding = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with store._write() as conn:
                conn.execute("INSERT INTO environments VALUES (?, 'local', ?, NULL, 'now')", (names[0], names[0]))
                holding.set()
                go.wait(30)
        except BaseException as exc:
            raised[names[0]] = exc
        holding.set()

    def writer(name: str) -> None:
        try:
            store.resolve_environment(name, None)
        except BaseException as exc:
            raised[name] = exc

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    holding.wait(30)
    threads += [threading.Thread(target=writer, args=(name,)) for name in names[1:]]
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.5)  # they queue
    go.set()
    for thread in threads:
        thread.join(60)
    return raised, go


def _stored(path: Path, names: list[str]) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM environments") if row[0] in names}


def test_writes_queued_behind_each_other_are_committed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write is fsync'd before its answer, and SQLite holds its write lock through the
    fsync: concurrent requests (a sync's jobs) each waited for a whole commit of each one
    ahead of them. The writes that queued behind one another are committed together, once
    (local_platform/group_commit.py): eight, one commit, where each made its own (8), and
    each answered only once it is stored."""
    commits = _counting_commits(monkeypatch)
    store = Store(tmp_path / "group.db")
    names = [f"env-{n}" for n in range(8)]
    commits.clear()
    raised, _ = _queued_behind_one(store, names)
    store.close()
    assert not raised, raised
    assert len(commits) <= 2, commits  # one; two if a writer came late to the queue
    assert _stored(tmp_path / "group.db", names) == set(names)


def test_a_write_that_fails_in_a_group_takes_back_only_itself(tmp_path: Path) -> None:
    """A write refused midway (an evaluation of an unknown environment: 404) is taken back
    to its own savepoint; the writes committed with it are kept."""
    store = Store(tmp_path / "undo.db")
    raised: list[BaseException] = []

    def refused() -> None:
        try:
            store.create_evaluation(name="x", environments=[{"id": "no-such-environment"}], tags=[])
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=refused)
    with store._write() as conn:
        conn.execute("INSERT INTO environments VALUES ('kept-1', 'local', 'kept-1', NULL, 'now')")
        thread.start()
        time.sleep(0.3)  # the refused write queued behind this one
    store.resolve_environment("kept-2", None)
    thread.join(30)
    assert len(raised) == 1 and "not found" in str(raised[0]), raised
    store.close()
    assert _stored(tmp_path / "undo.db", ["kept-1", "kept-2"]) == {"kept-1", "kept-2"}
    with sqlite3.connect(tmp_path / "undo.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM evaluations").fetchone() == (0,)


def test_a_write_answered_is_stored_and_one_refused_is_not_when_a_groups_commit_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that fails (a disk error) fails every write waiting for it: none is answered
    as stored; the writes after it commit as before."""
    _counting_commits(monkeypatch, fail=1)  # the first commit fails
    store = Store(tmp_path / "failed.db")
    names = [f"env-{n}" for n in range(6)]
    raised, _ = _queued_behind_one(store, names)
    store.resolve_environment("after", None)
    store.close()
    assert raised and all("disk I/O error" in str(exc) for exc in raised.values()), raised
    assert _stored(tmp_path / "failed.db", [*names, "after"]) == {*names, "after"} - set(raised)


# -- auth, dashboard ------------------------------------------------------------------


def test_missing_or_wrong_token_is_401(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.get(f"{server.api}/evaluations/", headers=headers)
        assert r.status_code == 401, headers
        r = httpx.post(f"{server.api}/evaluations/", headers=headers, json={})
        assert r.status_code == 401, headers


def test_viewer_url_serves_a_read_only_page(client, server):
    e = new_eval(client, name=unique("viewme"))
    push(client, e["evaluation_id"], [{"a": 1}] * 3)
    assert httpx.get(e["viewer_url"]).status_code == 303  # behind the token (docs/viewer.md)
    login = httpx.post(f"{server.base_url}/login", data={"token": TOKEN, "next": "/"})
    with httpx.Client(cookies=login.cookies, follow_redirects=True) as browser:
        page = browser.get(e["viewer_url"])
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert e["name"] in page.text and '<b class="total">3</b> samples' in page.text
        assert browser.get(e["viewer_url"].rsplit("/", 1)[0] + "/nope").status_code == 404


@pytest.mark.slow
def test_frontend_url_sets_viewer_url(tmp_path):
    with platform_process.running(tmp_path / "p.db", "--frontend-url", "https://dash.example/") as p:
        env = httpx.post(f"{p.api}/environmentshub/resolve", json={"name": "e"}).json()["data"]["id"]
        e = httpx.post(f"{p.api}/evaluations/", json={"name": "r", "environments": [{"id": env}]}).json()
    assert e["viewer_url"] == f"https://dash.example/dashboard/evaluations/{e['evaluation_id']}"


# -- process lifecycle ----------------------------------------------------------------


@pytest.mark.slow
def test_restart_keeps_everything(tmp_path):
    db = tmp_path / "platform.db"
    proc = platform_process.start(db)
    with httpx.Client(base_url=proc.api, timeout=30) as c:  # no --token: no auth needed
        e = new_eval(c, metadata={"model": "m"})
        push(c, e["evaluation_id"], [{"i": i} for i in range(5)])
        c.post(f"/evaluations/{e['evaluation_id']}/finalize", json={"metrics": {"avg_reward": 1}})
    assert proc.terminate() == 0
    assert proc.proc.stdout.read() == ""  # the URL was the only line
    with platform_process.running(db) as again, httpx.Client(base_url=again.api, timeout=30) as c:
        got = get_eval(c, e["evaluation_id"])
        assert got["total_samples"] == 5 and got["status"] == "COMPLETED"
        assert got["metadata"] == {"model": "m"} and got["finalize_count"] == 1
        rows = c.get(f"/evaluations/{e['evaluation_id']}/samples").json()["samples"]
        assert rows == [{"i": i} for i in range(5)]


@pytest.mark.slow
def test_acknowledged_writes_survive_a_crash(tmp_path):
    db = tmp_path / "platform.db"
    proc = platform_process.start(db)
    with httpx.Client(base_url=proc.api, timeout=30) as c:
        e = new_eval(c)
        for i in range(10):
            assert push(c, e["evaluation_id"], [{"i": i}]).status_code == 200
    proc.proc.kill()
    proc.proc.wait(15)
    with platform_process.running(db) as again, httpx.Client(base_url=again.api, timeout=30) as c:
        assert get_eval(c, e["evaluation_id"])["total_samples"] == 10
        rows = c.get(f"/evaluations/{e['evaluation_id']}/samples").json()["samples"]
        assert rows == [{"i": i} for i in range(10)]


@pytest.mark.slow
def test_sigint_also_stops_cleanly(tmp_path):
    import signal

    proc = platform_process.start(tmp_path / "p.db")
    proc.proc.send_signal(signal.SIGINT)
    assert proc.proc.wait(15) == 0
    assert "Traceback" not in proc.proc.stderr.read()


def _serve_fails(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        CLI + ["platform", "serve", *args], capture_output=True, text=True,
        env=child_env(), timeout=30,
    )


@pytest.mark.slow
def test_unusable_db_path_is_a_one_line_usage_error(tmp_path):
    done = _serve_fails("--db", str(tmp_path / "missing-dir" / "p.db"))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "cannot open database" in done.stderr


@pytest.mark.slow
def test_busy_port_is_a_one_line_usage_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        done = _serve_fails("--db", str(tmp_path / "p.db"), "--port", port)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_embedded_platform_serves_and_stops(tmp_path: Path):
    with EmbeddedPlatform(tmp_path / "p.db", token="t") as platform:
        url = f"{platform.base_url}/api/v1/evaluations/"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer t"}).json()["total"] == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=5)
    with pytest.raises(RuntimeError):
        platform.base_url


@pytest.mark.slow
def test_a_write_past_its_request_deadline_is_refused_and_not_committed(tmp_path: Path) -> None:
    with platform_process.running(tmp_path / "deadline.db", "--request-deadline", "0") as proc, \
            httpx.Client(base_url=proc.api, timeout=30) as api:
        refused = api.post("/environmentshub/resolve", json={"name": "gsm8k"})
        assert refused.status_code == 503 and "deadline" in refused.json()["detail"]
        assert api.get("/environmentshub/local/gsm8k/@latest").status_code == 404  # nothing written
        assert api.get("/evaluations/").json()["total"] == 0  # reads are not refused


@pytest.mark.slow
def test_a_local_db_that_is_not_a_database_is_a_usage_error(tmp_path: Path) -> None:
    """It was "internal error: PlatformDatabaseError" (exit 1), as if the tool had failed."""
    build_run(tmp_path / "runs" / "r", "bad-local-db", 1)
    (tmp_path / "notes.db").write_text("my notes, not SQLite\n")
    result = run_cli("sync", "--local", "--db", str(tmp_path / "notes.db"), str(tmp_path / "runs"))
    assert result.returncode == 2, (result.stdout, result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert "--db" in last and "internal error" not in last, last
    assert (tmp_path / "notes.db").read_text() == "my notes, not SQLite\n"


def _answering(answer: object):  # noqa: ANN202
    """A client whose platform answers 200 ``answer`` to every request."""
    import httpx

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings

    settings = Settings(base_url="http://platform.invalid", api_key=Secret("k"), team_id=None,
                        frontend_url="http://platform.invalid")
    return PlatformClient(settings, transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answer)))


@pytest.mark.parametrize("answer", [{}, [], None, "yes", 7, {"data": {}}, {"data": {"id": ""}},
                                    {"evaluations": [{}], "total": 1}, {"evaluations": [], "total": "3"},
                                    {"status": "RUNNING", "total_samples": -1}, {"samples": [1]}])
def test_every_read_sync_acts_on_checks_the_fields_it_reads(answer: object) -> None:
    from prime_runs_spool.errors import FailureKind, PlatformError

    calls = {
        "resolve": lambda c: c.resolve_environment("gsm8k"),
        "create": lambda c: c.create_evaluation({"name": "x"}),
        "get": lambda c: c.get_evaluation("ev1"),
        "list": lambda c: c.list_evaluations(environment_name="gsm8k"),
        "samples": lambda c: c.list_samples("ev1"),
    }
    with _answering(answer) as client:
        for name, call in calls.items():
            try:
                call(client)
            except PlatformError as exc:
                assert "the platform's answer lacks" in str(exc), (name, exc)
                assert exc.kind is (FailureKind.IN_DOUBT if name == "create" else FailureKind.FATAL), (name, exc)
            else:
                pytest.fail(f"{name} took {answer!r}")


def test_a_put_answered_with_something_else_than_an_object_is_not_taken_as_done() -> None:
    """Not the platform's answer (a proxy's in its place): in doubt, sent again, never an
    AttributeError (``[1].get``) nor a PUT counted as done (answers.acted_on)."""
    from prime_runs_spool.errors import FailureKind, UnexpectedAnswer

    with _answering([1]) as client:
        with pytest.raises(UnexpectedAnswer) as caught:
            client.update_evaluation("ev1", metadata={})
    assert caught.value.kind is FailureKind.IN_DOUBT and "PUT /evaluations/ev1" in str(caught.value)


@pytest.mark.slow
def test_a_platform_that_answers_an_empty_object_to_everything_is_a_per_run_error(tmp_path: Path) -> None:
    """Every run's sync ended in "internal error: KeyError: 'data'"; after resolve, the
    listing ({} read as "no evaluations") and the create ({} read as evaluation "None")
    would have had sync create evaluations and push rows to /evaluations/None. The key
    check's own read of the listing is answered as the platform does (one answering {} there
    too is not the platform: exit 2 before any run, tests/test_not_the_platform.py), so the
    runs meet the empty answers."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Empty(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(f"{self.command} {self.path}")
            key_check = self.command == "GET" and "/evaluations/?" in self.path and "limit=1&" in self.path + "&"
            body = b'{"evaluations": [], "total": 0}' if key_check else b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("a", "b"):
            build_run(tmp_path / "runs" / name, f"empty-answers-{name}", 2)
        for to in ("samples", "auto"):
            result = run_cli("sync", str(tmp_path / "runs"), "--base-url", f"http://127.0.0.1:{server.server_address[1]}",
                          "--to", to, "--request-lifetime", "1", "--max-attempts", "2", "--json",
                          PRIME_API_KEY="key")
            assert result.returncode == 1, (result.stdout, result.stderr)
            assert "Traceback" not in result.stderr and "internal error" not in result.stdout, result.stdout
            runs = json.loads(result.stdout)["runs"]
            assert [r["state"] for r in runs] == ["error", "error"], runs
            assert all("the platform's answer lacks" in r["error"] for r in runs), runs
    finally:
        server.shutdown()
    assert not [request for request in seen if "/None" in request or request.endswith("/samples")], seen


@pytest.mark.parametrize(("method", "path", "said"), [
    ("POST", "/environmentshub/resolve", "lacks data.id"),
    ("GET", "/evaluations/", "lacks evaluations"),
    ("GET", "/evaluations/ev1", "lacks status"),
])
def test_one_answer_lacking_its_fields_stops_that_run_and_sends_nothing_more(tmp_path: Path, method: str,
                                                                            path: str, said: str) -> None:
    import httpx

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import Destination
    from support.fake_platform import FakePlatform

    platform = FakePlatform()
    build_run(tmp_path / "r", "one-empty-answer", 3)
    lost: list[str] = []

    def fault(m: str, p: str, phase: str) -> httpx.Response | None:
        if (m, p, phase) == (method, path, "after"):
            return httpx.Response(200, json={})
        # A pass that created the evaluation and had every answer skips reading it before
        # finalizing: lose the samples answer once, so the read this case is about is made.
        if path == "/evaluations/ev1" and (m, p, phase) == ("POST", "/evaluations/ev1/samples", "after") and not lost:
            lost.append(p)
            return httpx.Response(502, json={"detail": "lost"})
        return None

    platform.fault = fault
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    options = SyncOptions(request_lifetime=0.2, to=SAMPLES, backoff=Backoff(base=0.01, cap=0.02, max_attempts=3))
    with PlatformClient(settings, transport=platform.transport()) as client:
        (report,) = sync_paths([tmp_path], client, Destination(key="d", base_url="http://fake"), options)
    assert report.state == "error" and said in (report.error or ""), report
    assert sum(len(rows) for rows in platform.samples.values()) in (0, 3)
    assert len(platform.evaluations) <= 1


def test_a_create_whose_answer_lacks_the_id_is_settled_as_a_lost_answer(tmp_path: Path) -> None:
    """The evaluation was made; its id is not in the answer: the run finds it by its local
    run id (as after a lost answer) and syncs into it, one evaluation, each row once."""
    import httpx

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import Destination
    from support.fake_platform import FakePlatform

    platform = FakePlatform()
    build_run(tmp_path / "r", "create-without-id", 3)
    platform.fault = lambda m, p, phase: (httpx.Response(201, json={"name": "x", "status": "RUNNING"})
                                          if (m, p, phase) == ("POST", "/evaluations/", "after") else None)
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    options = SyncOptions(request_lifetime=0.2, to=SAMPLES, backoff=Backoff(base=0.01, cap=0.02, max_attempts=3))
    with PlatformClient(settings, transport=platform.transport()) as client:
        (report,) = sync_paths([tmp_path], client, Destination(key="d", base_url="http://fake"), options)
    assert report.state == "synced", report
    assert list(platform.samples) == ["ev1"] and len(platform.samples["ev1"]) == 3


def test_the_runners_unmeasured_bound_is_check_sendables() -> None:
    """The runner asks check_sendable's bound itself (UNMEASURED_BYTES_BY_NODES) for every
    episode and calls it only past that bound: at the bound it projects nothing, one byte past
    it it projects (a record whose projection raises shows it), for any count of nodes."""
    from prime_runs_spool.platform_api.v0 import UNMEASURED_BYTES_BY_NODES, check_sendable

    record = {"id": "e", "traces": [object()]}  # projecting it raises
    for nodes in (0, 1, 5, 97, 500):
        at = UNMEASURED_BYTES_BY_NODES // (3 + nodes)
        check_sendable(record, at, most_nodes=nodes)
        with pytest.raises(AttributeError):
            check_sendable(record, at + 1, most_nodes=nodes)
