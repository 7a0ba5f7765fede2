"""Hostile review, round 3, kept as regression tests: the command line and the viewer
against odd file names, received sync states, odd base URLs and slow platforms."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from support import platform_process
from support.env import CLI, REPO_ROOT, child_env
from support.runs import build_run

#: A folder name that is not UTF-8: Python decodes it to lone surrogates.
ODD_NAME = os.fsdecode(b"run-\xff\xfe")
VF040 = REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed"


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, env=child_env(**env))


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    """Two runs side by side: one in a folder whose name is not UTF-8, one plain."""
    root = tmp_path / "runs"
    build_run(root / ODD_NAME, "odd-name-run", 2)
    build_run(root / "plain", "plain-run", 2)
    return root


@pytest.mark.parametrize("command", ["verify", "status"])
def test_a_json_report_names_a_folder_whose_name_is_not_utf8(odd_tree: Path, command: str) -> None:
    """orjson refuses the surrogates such a name decodes to: `--json` ended in a traceback
    and the report of every other run was lost with it."""
    result = _cli(command, "--json", str(odd_tree))
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(result.stdout)
    paths = sorted(run.get("run_dir") or run.get("path") for run in document["runs"])
    assert paths == [f"{odd_tree}/plain", f"{odd_tree}/run-\\xff\\xfe"], paths
    assert result.returncode == 0, result.stderr


def test_a_json_import_and_sync_report_name_a_folder_whose_name_is_not_utf8(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    shutil.copytree(VF040, root / ODD_NAME)
    imported = _cli("import", "--json", str(root))
    assert "Traceback" not in imported.stderr, imported.stderr
    assert [r["state"] for r in json.loads(imported.stdout)["imports"]] == ["imported"]
    synced = _cli("sync", "--local", "--db", str(tmp_path / "local.db"), "--json", str(root))
    assert "Traceback" not in synced.stderr, synced.stderr
    document = json.loads(synced.stdout)
    assert [r["state"] for r in document["runs"]] == ["synced"], document
    assert document["runs"][0]["path"].endswith("run-\\xff\\xfe")


def test_the_viewer_lists_and_opens_a_run_whose_folder_name_is_not_utf8(odd_tree: Path) -> None:
    """The run's key went into the page's links as it was: urlencode raised, and the list
    of runs (every run's, not only this one's) answered 500."""
    proc = subprocess.Popen(CLI + ["view", str(odd_tree)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        url = platform_process.first_line(proc).rstrip("/")
        with httpx.Client(base_url=url, timeout=30) as client:
            index = client.get("/")
            assert index.status_code == 200, index.text[-500:]
            assert "/run?run=plain" in index.text
            page = client.get("/run", params={"run": "run-\\xff\\xfe"})
            assert page.status_code == 200
            assert client.get("/episode", params={"run": "run-\\xff\\xfe", "n": 1}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(15)


def _local_sync(root: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli("sync", "--local", "--db", str(db), "--to", "samples", "--request-lifetime", "1", "--json",
                str(root), *args)


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
    first = _local_sync(tmp_path / "runs", db)
    assert first.returncode == 0, first.stderr
    evaluation_id = json.loads(first.stdout)["runs"][0]["evaluation_id"]
    (state_file,) = sync_dir(builder.run_dir).glob("*.json")
    state = json.loads(state_file.read_text())
    state.update({field: value, "finalized": False, "terminal": None})
    state_file.write_text(json.dumps(state))
    again = _local_sync(tmp_path / "runs", db)
    (run,) = json.loads(again.stdout)["runs"]
    assert (run["state"], run["evaluation_id"], run["pushed_total"]) == ("synced", evaluation_id, 3), run
    assert any("damaged" in warning for warning in run["warnings"]), run


def test_the_client_sends_nothing_for_an_id_that_is_not_one_path_segment() -> None:
    from prime_runs_spool.errors import FailureKind, PlatformError
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings

    sent: list[str] = []
    evaluation = {"evaluation_id": "dd8a5b36-5461-44c7-9384-9c341638dd79", "status": "RUNNING", "total_samples": 0}
    transport = httpx.MockTransport(lambda request: sent.append(str(request.url)) or httpx.Response(200,
                                                                                                  json=evaluation))
    settings = Settings(base_url="http://platform.invalid", api_key=Secret("k"), team_id=None,
                        frontend_url="http://platform.invalid")
    with PlatformClient(settings, transport=transport) as client:
        for bad in ("..", "../../x", "a/b", "a?b=1", "a%2Fb", "", "x" * 65):
            with pytest.raises(PlatformError) as caught:
                client.push_samples(bad, b'{"samples":[]}')
            assert caught.value.kind is FailureKind.FATAL
        client.get_evaluation("dd8a5b36-5461-44c7-9384-9c341638dd79")
    assert sent == ["http://platform.invalid/api/v1/evaluations/dd8a5b36-5461-44c7-9384-9c341638dd79"], sent


def test_a_base_url_with_a_password_is_a_usage_error_that_does_not_show_it(tmp_path: Path) -> None:
    """It was taken: httpx sent the userinfo as Basic auth in place of the API key (401), and
    a platform that took it would have had the password written into the state file's
    destination."""
    build_run(tmp_path / "runs" / "r", "userinfo-url", 1)
    result = _cli("sync", str(tmp_path / "runs"), "--base-url", "http://someone:pw-s3cret@127.0.0.1:9",
                  "--max-attempts", "1", PRIME_API_KEY="key")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "pw-s3cret" not in result.stdout + result.stderr
    assert "user:password@" in result.stderr.strip().splitlines()[-1]
    assert not list((tmp_path / "runs" / "r" / "spool").glob("sync/*.json"))


@pytest.fixture
def trickling_platform():
    """A platform (or a proxy before it) that answers every request with a status line and
    then one header line every 0.3 s, forever: never silent long enough for a read timeout."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not stop.wait(0.3):
                    conn.sendall(b"X-Still-Here: yes\r\n")
            except OSError:
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


def test_a_platform_that_trickles_its_answer_does_not_hold_a_sync_forever(tmp_path: Path, trickling_platform) -> None:
    """--timeout bounded each read, not the answer (httpx has no total deadline): a
    platform or a proxy that trickles bytes held the sync forever."""
    build_run(tmp_path / "runs" / "r", "trickled", 1)
    try:
        result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--base-url", trickling_platform,
                                       "--to", "samples", "--timeout", "1", "--max-attempts", "1",
                                       "--request-lifetime", "1"],
                                capture_output=True, text=True, timeout=8, env=child_env(PRIME_API_KEY="key"))
    except subprocess.TimeoutExpired:
        pytest.fail("sync --timeout 1 against a trickling platform still ran after 8 s")
    assert result.returncode == 1, result.stderr


@pytest.fixture
def samples_gate():
    """A forwarding proxy before a platform that holds every ``POST .../samples`` until a
    second one has arrived (or 10 s passed): two syncs that each read the evaluation's count
    before either append commits, deterministically."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    barrier = threading.Barrier(2, timeout=10)
    upstream: list[str] = []

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "POST" and self.path.endswith("/samples"):
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    pass
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
            answer = httpx.request(self.command, upstream[0] + self.path, content=body, headers=headers, timeout=30)
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = do_PUT = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield upstream, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_two_copies_of_a_spool_synced_at_once_store_each_episode_once(tmp_path: Path, samples_gate) -> None:
    """The sync lock is per folder: two copies of one spool (cp -r, two CI jobs on one
    artifact) synced at once both appended every row, or made two evaluations. The copy lock
    (sync/copies.py) makes the second wait, and it then finds the first's evaluation and rows."""
    from support.sync_e2e import evaluations_of

    upstream, gate = samples_gate
    builder = build_run(tmp_path / "one" / "r", "copied-run", 4)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    db = tmp_path / "platform" / "p.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", "gate-token") as server:
        upstream.append(server.base_url)
        syncs = [subprocess.Popen(CLI + ["sync", str(tmp_path / copy), "--base-url", gate, "--to", "samples",
                                         "--request-lifetime", "1", "--timeout", "20"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=child_env(PRIME_API_KEY="gate-token")) for copy in ("one", "two")]
        outputs = [proc.communicate(timeout=60) for proc in syncs]
        with httpx.Client(base_url=server.api, headers={"Authorization": "Bearer gate-token"}) as api:
            evaluations = evaluations_of(api, builder.run_id)
            totals = [api.get(f"/evaluations/{e['id']}").json()["total_samples"] for e in evaluations]
    assert totals == [4], f"{len(evaluations)} evaluation(s) holding {totals} samples for 4 episodes"
    assert [proc.returncode for proc in syncs] == [0, 0], outputs
    assert sorted(out.split()[0] for out, _ in outputs) == ["synced", "synced"], outputs


def test_the_traces_clients_do_not_wait_forever_for_a_trickled_answer(trickling_platform) -> None:
    """Both ways sync talks to Prime Traces: ``--to auto``'s probe (on the platform client's
    connection) and the uploader's own HTTP client."""
    import time

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.platform_api.traces import TracesUploader

    settings = Settings(base_url=trickling_platform, api_key=Secret("key"), team_id=None,
                        frontend_url="http://x")
    started = time.monotonic()
    with PlatformClient(settings, timeout=1.0) as client:
        assert client.traces_probe().enabled()  # no answer: left for the upload to decide
    assert time.monotonic() - started < 4

    uploader = TracesUploader(trickling_platform, "key", None, timeout=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(httpx.ReadTimeout):
            uploader._client.client.get(trickling_platform + "/api/v1/episodes")
    finally:
        uploader.close()
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("key", ["sk-bad\r\nX-Injected: yes", "sk-bad key", "sk-bad-\u00e9"])
def test_an_api_key_no_header_can_carry_is_a_usage_error_that_does_not_show_it(tmp_path: Path, key: str) -> None:
    """httpx failed on every request with it, which sync took for a lost answer ("no answer
    (LocalProtocolError)": retried, fences waited out) or an internal error."""
    build_run(tmp_path / "runs" / "r", "bad-key", 1)
    result = _cli("sync", str(tmp_path / "runs"), "--base-url", "http://127.0.0.1:9", "--max-attempts", "1",
                  PRIME_API_KEY=key)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "sk-bad" not in result.stdout + result.stderr
    assert "PRIME_API_KEY" in result.stderr.strip().splitlines()[-1]


def test_an_api_key_pasted_with_its_line_feed_is_used_without_it() -> None:
    from prime_runs_spool.platform_api.settings import load_settings

    settings = load_settings(env={"PRIME_API_KEY": "sk-good\n", "HOME": "/nonexistent"})
    assert settings.api_key is not None and settings.api_key.reveal() == "sk-good"


def _not_a_regular_file(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:  # a device: /dev/null, not /dev/zero, so that a regression fails without filling memory
        path.symlink_to("/dev/null")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_sync_state_that_is_not_a_regular_file_does_not_hang_status_or_sync(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked status and sync at open forever; a link to /dev/zero read until memory
    ran out. A received spool (an artifact unpacked from a tarball) can hold either."""
    from prime_runs_spool.sync.state import sync_dir

    builder = build_run(tmp_path / "runs" / "r", f"state-{kind}", 2)
    db = tmp_path / "local.db"
    assert _local_sync(tmp_path / "runs", db).returncode == 0
    (state_file,) = sync_dir(builder.run_dir).glob("*.json")
    _not_a_regular_file(state_file, kind)
    status = subprocess.run(CLI + ["status", str(tmp_path / "runs")], capture_output=True, text=True, timeout=20,
                            env=child_env())
    assert status.returncode == 0 and "not a regular file" in status.stdout, status.stdout + status.stderr
    again = subprocess.run(CLI + ["sync", "--local", "--db", str(db), "--to", "samples", "--request-lifetime", "1",
                                  "--json", str(tmp_path / "runs")],
                           capture_output=True, text=True, timeout=30, env=child_env())
    (run,) = json.loads(again.stdout)["runs"]
    assert (run["state"], run["pushed_total"]) == ("synced", 2), run
    assert state_file.is_file() and not state_file.is_symlink()


def test_an_import_whose_resolved_config_is_a_fifo_is_an_error_not_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    shutil.copytree(VF040, root / "a")
    _not_a_regular_file(root / "a" / "configs" / "resolved" / "eval.json", "fifo")
    result = subprocess.run(CLI + ["import", str(root)], capture_output=True, text=True, timeout=20, env=child_env())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "eval.json" in result.stderr.strip().splitlines()[-1]


def test_environments_given_as_one_string_are_one_environment(tmp_path: Path) -> None:
    """A str is a Sequence[str]: open_run(environments="gsm8k") recorded five environments,
    g, s, m, 8 and k, and sync created each on the platform and attached the evaluation to
    all of them. A foreign manifest holding the bare string was split the same way by sync."""
    import sqlite3

    from prime_runs_spool import open_run
    from prime_runs_spool.spool.writer import SegmentWriter
    from support.runs import manifest_for

    with open_run(tmp_path / "runs" / "api", name="one-string", environments="gsm8k", model="m") as run:
        pass
    foreign = SegmentWriter.create(tmp_path / "runs" / "foreign", "foreign-env-string")
    foreign.append("manifest", {**manifest_for("foreign-env-string"), "environments": "math500"})
    foreign.seal("completed")
    from prime_runs_spool.sync.engine import read_manifest

    assert read_manifest(tmp_path / "runs" / "api")["environments"] == ["gsm8k"], run.id
    db = tmp_path / "local.db"
    result = _local_sync(tmp_path / "runs", db)
    assert result.returncode == 0, result.stdout + result.stderr
    with sqlite3.connect(db) as connection:
        names = sorted(row[0] for row in connection.execute("SELECT name FROM environments"))
    assert names == ["gsm8k", "math500"], names


@pytest.mark.parametrize(("argv", "env"), [
    (["--request-lifetime", "nan"], {}),        # NaN passes FloatRange: every fence ended at once
    ([], {"PRIME_RUNS_REQUEST_LIFETIME": "nan"}),
    (["--timeout", "inf"], {}),                 # internal error: OverflowError
    (["--timeout", "nan"], {}),
    (["--backoff-cap", "nan"], {}),
])
@pytest.mark.parametrize("entry", ["prime-runs", "shipper"])
def test_seconds_that_are_not_finite_are_a_usage_error(tmp_path: Path, argv: list[str], env: dict[str, str],
                                                       entry: str) -> None:
    import sys

    build_run(tmp_path / "runs" / "r", "nan-seconds", 1)
    command = CLI + ["sync"] if entry == "prime-runs" else [sys.executable, "-m", "prime_runs_spool.sync"]
    result = subprocess.run(command + [str(tmp_path / "runs"), "--base-url", "http://127.0.0.1:9",
                                       "--max-attempts", "1", *argv],
                            capture_output=True, text=True, timeout=30, env=child_env(PRIME_API_KEY="key", **env))
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "finite" in result.stderr


def test_an_episode_whose_line_would_pass_the_format_limit_is_refused_not_written(tmp_path: Path) -> None:
    """format.prepare leaves 200 bytes for the framing; the meta repeats the episode id, so
    an id of megabytes made a line over MAX_LINE_BYTES. The writer wrote it, and every
    reader then stopped at it as corrupt ("a line longer than the format's limit"), with
    every episode after it: `prime-runs import` of such a traces.jsonl made a corrupt spool."""
    from fixtures.episodes import make_episode
    from prime_runs_spool import open_run
    from prime_runs_spool.errors import RecordTooLargeError
    from prime_runs_spool.spool import format as spool_format
    from prime_runs_spool.spool.writer import SegmentWriter

    limit = 1 << 20
    original = spool_format.MAX_LINE_BYTES
    with pytest.MonkeyPatch.context() as patch:  # a small limit, so the test writes little
        for module in ("prime_runs_spool.spool.format", "prime_runs_spool.runner.admission"):
            patch.setattr(f"{module}.MAX_LINE_BYTES", limit, raising=False)
        with open_run(tmp_path / "api", name="long-id", environments=["gsm8k"], model="m") as run:
            episode = make_episode(0, size=100, run_id=run.id, salt="long")
            episode["id"] = "z" * (limit * 2 // 3)
            with pytest.raises(RecordTooLargeError) as caught:
                run.log_episodes([episode])
            assert len(str(caught.value)) < 300
            run.log_episodes([make_episode(1, size=100, run_id=run.id, salt="long")])
        writer = SegmentWriter.create(tmp_path / "direct", "direct-long-meta")
        with pytest.raises(RecordTooLargeError):
            writer.append("episode", {"id": "q"}, {"episode_id": "q" * limit})
        writer.close()
    assert spool_format.MAX_LINE_BYTES == original
    result = _cli("verify", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_local_db_that_is_not_a_database_is_a_usage_error(tmp_path: Path) -> None:
    """It was "internal error: PlatformDatabaseError" (exit 1), as if the tool had failed."""
    build_run(tmp_path / "runs" / "r", "bad-local-db", 1)
    (tmp_path / "notes.db").write_text("my notes, not SQLite\n")
    result = _cli("sync", "--local", "--db", str(tmp_path / "notes.db"), str(tmp_path / "runs"))
    assert result.returncode == 2, (result.stdout, result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert "--db" in last and "internal error" not in last, last
    assert (tmp_path / "notes.db").read_text() == "my notes, not SQLite\n"


@pytest.mark.parametrize("lease", [
    {"expires_at": 1e308},           # "held" forever: every syncer skipped the run, always
    {"expires_at": 1000.0 + 2 * 86400},  # more than a day ahead: no syncer writes one
    {"expires_at": float("nan")},    # likewise: NaN is never past
    {"expires_at": 1000.0, "generation": 1e300},  # an internal error ended the whole sync
    {"expires_at": 1000.0, "generation": True},
])
def test_a_lease_no_syncer_writes_is_no_lease(lease: dict) -> None:
    import uuid

    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    body = {"owner": "elsewhere", "generation": 3, "released": False, "written_at": 1000.0, "nonce": "n", **lease}
    store.create("run/spool/sync.lease.json", json.dumps(body).encode())
    taker = Lease(store, "run/spool/sync.lease.json", owner="me", ttl=60, clock_skew=5, clock=lambda: 1000.0)
    assert taker.try_take()
    assert type(taker.generation) is int and taker.generation < 1 << 62
    taker.release()


@pytest.mark.parametrize("expires_at", [1000.0 + 60 + 5,      # its clock 5 s ahead of ours, as the skew allows
                                        1000.0 + 3600,        # its TTL an hour, ours a minute (set per machine)
                                        1000.0 + 86400])      # a day: the longest a lease may claim
def test_a_lease_another_syncer_may_hold_is_still_held(expires_at: float) -> None:
    """The check above must not take over a lease a syncer wrote: one renewed after this
    syncer read its clock (an early version failed tests/test_hostile_store_replay.py that
    way), or one from a machine whose PRIME_RUNS_LEASE_TTL is longer than ours."""
    import uuid

    from prime_runs_spool.store.lease import Lease
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    held = {"owner": "elsewhere", "generation": 3, "released": False, "written_at": 1000.0, "nonce": "n",
            "expires_at": expires_at}
    store.create("run/spool/sync.lease.json", json.dumps(held).encode())
    assert not Lease(store, "run/spool/sync.lease.json", owner="me", ttl=60, clock_skew=5,
                     clock=lambda: 1000.0).try_take()


def test_a_store_run_whose_pass_fails_unexpectedly_does_not_stop_the_others(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A local sync reports a bug met on one run as that run's error (sync/many.py); over a
    store URL the exception went through the pool and the whole command ended in "internal
    error" (a lease of generation 1e300 did it), every other run's report lost."""
    import uuid

    from prime_runs_spool.spool.layout import list_segments
    from prime_runs_spool.store.objects import ObjectStore
    from prime_runs_spool.sync import store_sync
    from prime_runs_spool.sync.options import RunReport, SyncOptions
    from prime_runs_spool.sync.state import remote_destination

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    for name in ("a", "b"):
        builder = build_run(tmp_path / name, f"store-isolation-{name}", 1)
        for _, path in list_segments(builder.run_dir):
            store.create(f"{name}/spool/{path.name}", path.read_bytes())

    def sync(self: store_sync.StoreRunSync) -> RunReport:
        if str(self.run).endswith("/a"):
            raise RuntimeError("a bug met on run a")
        return RunReport(path=str(self.run), state="up_to_date")

    monkeypatch.setattr(store_sync.StoreRunSync, "sync", sync)
    reports = store_sync.sync_store(store.url, None, remote_destination("http://platform.invalid", None),
                                    SyncOptions(), store=store)
    assert [(r.path.rsplit("/", 1)[-1], r.state) for r in reports] == [("a", "error"), ("b", "up_to_date")]
    assert "a bug met on run a" in (reports[0].error or "")


@pytest.mark.parametrize("command", ["verify", "status", "import"])
def test_a_tree_a_thousand_folders_deep_is_walked_not_a_recursion_error(tmp_path: Path, command: str) -> None:
    """The folder walk (files.walk_folders) recursed once per folder: 1,100 levels ended every command that looks
    for runs (verify, status, import, sync, view) in a RecursionError traceback."""
    deep = tmp_path / "tree" / Path(*["d"] * 1100)
    build_run(deep / "run", "deep-run", 1)
    shutil.copytree(VF040, deep / "outputs")
    try:
        result = _cli(command, str(tmp_path / "tree"))
    finally:  # shutil.rmtree (pytest's clean-up of old tmp folders) recurses as deep: unwind it here
        shutil.rmtree(deep)
        while (deep := deep.parent) != tmp_path:
            deep.rmdir()
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-500:]
    assert ("deep-run" in result.stdout or "d/run" in result.stdout or "imported" in result.stdout), result.stdout[-500:]
