"""Hostile review, round 4, kept as regression tests: what round 3 left (a store state's
messages, sync-state writes that fail, odd paths and environment values, odd manifests, a
platform whose answers lack what the wire contract promises), then new attacks."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import build_run


def _cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout, env=child_env(**env))


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def _memory_store_with(tmp_path: Path, *names: str):  # noqa: ANN202
    """A memory:// store holding one small sealed run per name, at ``<name>/spool/``."""
    from prime_runs_spool.spool.layout import list_segments
    from prime_runs_spool.store.objects import ObjectStore

    store = ObjectStore(f"memory:///{uuid.uuid4().hex}")
    for name in names:
        builder = build_run(tmp_path / "src" / name, f"r4-{name}-{uuid.uuid4().hex[:6]}", 2)
        for _, path in list_segments(builder.run_dir):
            store.create(f"{name}/spool/{path.name}", path.read_bytes())
    return store


def _store_sync_local(tmp_path: Path, store) -> list:  # noqa: ANN001
    """``sync_store`` in this process against the embedded local platform."""
    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.state import local_destination
    from prime_runs_spool.sync.store_sync import sync_store

    db = tmp_path / "local.db"
    with EmbeddedPlatform(db) as platform:
        settings = Settings(base_url=platform.base_url, api_key=Secret("local"), team_id=None,
                            frontend_url="http://frontend.invalid")
        with PlatformClient(settings, timeout=10) as client:
            return sync_store(store.url, client, local_destination(db, None),
                              SyncOptions(request_lifetime=1.0, to=SAMPLES), store=store)


# -- 1. a store run's damaged state is named by its URL, not by this machine's cache -----------


def test_a_damaged_state_in_a_store_is_named_by_its_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning named ~/.cache/prime-runs/store/<hash>/...: a file the user never made
    and cannot find the object from."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = _memory_store_with(tmp_path, "a")
    (first,) = _store_sync_local(tmp_path, store)
    assert first.state == "synced", first
    (key,) = [k for k in (info.key for info in store.list()) if k.startswith("a/spool/sync/") and k.endswith(".json")]
    store.replace(key, b"{not json", store.read(key)[1])
    (again,) = _store_sync_local(tmp_path, store)
    assert again.state == "synced" and again.pushed_total == 2, again
    (warning,) = [w for w in again.warnings if "damaged" in w]
    assert warning.startswith(f"{store.url}/{key} is damaged"), warning
    assert str(tmp_path / "cache") not in warning, warning


# -- 2. a sync-state write that fails leaves no temporary file ---------------------------------


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


# -- 3. a path that is a FIFO (or a device) is named as such, not "nothing found" --------------


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_verify_given_a_fifo_or_a_device_says_what_it_is(tmp_path: Path, kind: str) -> None:
    """verify said "nothing found: neither a spool nor eval outputs under it", as if the path
    were an empty folder; a regular file that is no segment was already a usage error."""
    path = tmp_path / "odd"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    result = _cli("verify", str(path), timeout=20)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    expected = "a FIFO" if kind == "fifo" else "a device"
    assert f"is {expected}, not a regular file or folder" in _last_line(result), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["status"], ["import"], ["sync", "--local", "--db", "{db}"]])
def test_the_other_commands_given_a_fifo_say_it_is_not_a_file_or_folder(tmp_path: Path, command: list[str]) -> None:
    os.mkfifo(tmp_path / "pipe")
    argv = [a.replace("{db}", str(tmp_path / "local.db")) for a in command]
    result = _cli(*argv, str(tmp_path / "pipe"), timeout=30)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "it is a FIFO, not a regular file or folder" in _last_line(result), result.stderr


# -- 4. lease and mirror seconds from the environment get the finite check ---------------------


@pytest.mark.parametrize(("name", "value", "said"), [
    ("PRIME_RUNS_LEASE_TTL", "nan", "finite"),        # NaN expiry: every other syncer took it for no lease
    ("PRIME_RUNS_LEASE_TTL", "inf", "finite"),
    ("PRIME_RUNS_LEASE_TTL", "-5", "below"),          # expired as it was written
    ("PRIME_RUNS_LEASE_TTL", "172800", "more than"),  # past every syncer's horizon: no lease to them
    ("PRIME_RUNS_LEASE_TTL", "soon", "not a number"),  # was an internal error per run
    ("PRIME_RUNS_LEASE_CLOCK_SKEW", "nan", "finite"),
    ("PRIME_RUNS_LEASE_CLOCK_SKEW", "-1", "below"),
])
def test_lease_settings_that_are_not_usable_are_a_usage_error(tmp_path: Path, name: str, value: str,
                                                              said: str) -> None:
    result = _cli("sync", "--local", "--db", str(tmp_path / "local.db"), f"memory:///{uuid.uuid4().hex}",
                  timeout=60, **{name: value})
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert _last_line(result).startswith(f"prime-runs: {name}") and said in _last_line(result), result.stderr


def test_a_lease_ttl_of_a_few_seconds_is_still_taken(tmp_path: Path) -> None:
    from prime_runs_spool.sync.store_sync import lease_problem

    for ttl, skew in (("1.5", "0"), ("2", ""), ("", ""), ("86400", "5")):
        env = {"PRIME_RUNS_LEASE_TTL": ttl, "PRIME_RUNS_LEASE_CLOCK_SKEW": skew}
        with pytest.MonkeyPatch.context() as patch:
            for key, text in env.items():
                patch.setenv(key, text)
            assert lease_problem() is None, env


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_mirror_interval_from_the_environment_is_checked_like_the_option(tmp_path: Path, value: str) -> None:
    """It was float(env) unchecked: NaN or a negative one made Event.wait return at once (a
    pass after pass, a listing each, as fast as the store answered), inf ended the mirror in
    an OverflowError traceback after its first pass."""
    build_run(tmp_path / "runs" / "r", "mirror-interval", 1)
    result = _cli("mirror", "--once", str(tmp_path / "runs"), f"memory:///{uuid.uuid4().hex}", timeout=30,
                  PRIME_RUNS_MIRROR_INTERVAL=value)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "PRIME_RUNS_MIRROR_INTERVAL" in _last_line(result), result.stderr


# -- 5. a manifest sync cannot send is that run's precise error, not an internal error ---------


def _foreign_run(run_dir: Path, local_id: str, **manifest: object) -> None:
    """A run whose manifest some other producer wrote (the writer takes any JSON object)."""
    from prime_runs_spool.spool.writer import SegmentWriter
    from support.runs import manifest_for

    writer = SegmentWriter.create(run_dir, local_id)
    writer.append("manifest", {**manifest_for(local_id), **manifest})
    writer.seal("completed")


def test_a_manifest_sync_cannot_send_is_that_runs_precise_error(tmp_path: Path) -> None:
    """Each was "internal error: TypeError: cannot convert dictionary update sequence..."
    (config), "internal error: InvalidURL: URL too long" (a 100 KB environment name, put in
    the evaluations listing's query), "internal error: TypeError: Value after * must be an
    iterable" (tags), "internal error: KeyError: 'run_id'" (a manifest without one)."""
    from prime_runs_spool.content.environments import MAX_ENVIRONMENT_NAME_CHARS

    root = tmp_path / "runs"
    cases = {
        "config-list": ({"config": [1, 2]}, "its config is list '[1, 2]', not an object"),
        "config-text": ({"config": "model=x"}, "its config is str 'model=x', not an object"),
        "env-long": ({"environments": ["e" * 100_000]}, "is 100,000 characters, over the limit of 256"),
        "env-number": ({"environments": [7]}, "an environment name is int '7', not a string"),
        "tags-number": ({"tags": 5}, "its tags are '5', not a list of strings"),
        "no-run-id": ({"run_id": None}, "its run_id is 'None', not a run id"),
    }
    for name, (manifest, _) in cases.items():
        _foreign_run(root / name, f"r4-{name}", **manifest)
    _foreign_run(root / "env-at-limit", "r4-env-at-limit", environments=["e" * MAX_ENVIRONMENT_NAME_CHARS])
    _foreign_run(root / "tags-text", "r4-tags-text", tags="nightly")
    result = _cli("sync", "--local", "--db", str(tmp_path / "local.db"), "--to", "samples", "--json", str(root))
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, (result.stdout, result.stderr)
    runs = {Path(run["path"]).name: run for run in json.loads(result.stdout)["runs"]}
    for name, (_, said) in cases.items():
        assert runs[name]["state"] == "error", runs[name]
        assert said in runs[name]["error"] and "internal error" not in runs[name]["error"], runs[name]["error"]
        assert runs[name]["error"].startswith("the run's manifest cannot be sent: "), runs[name]["error"]
    assert runs["env-at-limit"]["state"] == "synced", runs["env-at-limit"]
    assert runs["tags-text"]["state"] == "synced", runs["tags-text"]


def test_tags_given_as_one_string_are_one_tag() -> None:
    """As one environment given as a string is one environment: "nightly" was seven tags."""
    from prime_runs_spool.sync.evaluation import _tags

    assert _tags("nightly") == ["nightly"]
    assert _tags(["a", "b"]) == ["a", "b"]
    assert _tags(None) == []


# -- 6. a platform whose answers lack what the contract promises -------------------------------


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


def test_a_put_answered_with_something_else_than_an_object_is_no_evaluation() -> None:
    with _answering([1]) as client:
        assert client.update_evaluation("ev1", metadata={}) == {}


def test_a_platform_that_answers_an_empty_object_to_everything_is_a_per_run_error(tmp_path: Path) -> None:
    """Every run's sync ended in "internal error: KeyError: 'data'"; after resolve, the
    listing ({} read as "no evaluations") and the create ({} read as evaluation "None")
    would have had sync create evaluations and push rows to /evaluations/None."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Empty(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("a", "b"):
            build_run(tmp_path / "runs" / name, f"empty-answers-{name}", 2)
        for to in ("samples", "auto"):
            result = _cli("sync", str(tmp_path / "runs"), "--base-url", f"http://127.0.0.1:{server.server_address[1]}",
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
    platform.fault = lambda m, p, phase: (httpx.Response(200, json={})
                                          if (m, p, phase) == (method, path, "after") else None)
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    options = SyncOptions(request_lifetime=0.01, to=SAMPLES, backoff=Backoff(base=0.01, cap=0.02, max_attempts=3))
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
    options = SyncOptions(request_lifetime=0.01, to=SAMPLES, backoff=Backoff(base=0.01, cap=0.02, max_attempts=3))
    with PlatformClient(settings, transport=platform.transport()) as client:
        (report,) = sync_paths([tmp_path], client, Destination(key="d", base_url="http://fake"), options)
    assert report.state == "synced", report
    assert list(platform.samples) == ["ev1"] and len(platform.samples["ev1"]) == 3


# -- round 4: new findings -----------------------------------------------------------------------


@pytest.mark.parametrize("url", ["s3://AKIAEXAMPLE:pw-s3cret@bucket/runs", "s3://bucket/runs?aws_secret_access_key=pw-s3cret",
                                 "memory:///runs#pw-s3cret"])
@pytest.mark.parametrize("command", [["sync", "--local", "--db", "{db}"], ["status"], ["verify"], ["mirror", "{runs}"]])
def test_a_store_url_carrying_a_secret_is_a_usage_error_that_does_not_show_it(tmp_path: Path, url: str,
                                                                              command: list[str]) -> None:
    """obstore drops a URL's user:password@, ?query and #fragment without a word: a key
    pasted there was not used, and every report line (and --json's paths) printed it back,
    into the CI log."""
    build_run(tmp_path / "runs" / "r", "url-secret", 1)
    argv = [a.replace("{db}", str(tmp_path / "local.db")).replace("{runs}", str(tmp_path / "runs")) for a in command]
    result = _cli(*argv, url, timeout=60, AWS_EC2_METADATA_DISABLED="true", PRIME_RUNS_STORE_RETRIES="0")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "pw-s3cret" not in result.stdout + result.stderr
    assert "a store URL takes no" in _last_line(result), result.stderr


@pytest.mark.parametrize("value", ["abc", "-1", "1000000"])
def test_store_retries_that_are_not_a_small_whole_number_are_a_usage_error(value: str) -> None:
    """`status s3://...` with PRIME_RUNS_STORE_RETRIES=abc ended in a ValueError traceback."""
    result = _cli("status", f"memory:///{uuid.uuid4().hex}", timeout=30, PRIME_RUNS_STORE_RETRIES=value)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert _last_line(result).startswith("prime-runs: PRIME_RUNS_STORE_RETRIES="), result.stderr


def _spool_of(tmp_path: Path, episodes: list[dict]) -> Path:
    from prime_runs_spool.spool.writer import SegmentWriter
    from support.runs import manifest_for

    writer = SegmentWriter.create(tmp_path / "runs" / "odd", "odd-shapes")
    writer.append("manifest", manifest_for("odd-shapes"))
    for n, episode in enumerate(episodes):
        writer.append("episode", episode, {"episode_id": f"odd-{n}", "rollout_number": n})
    writer.seal("completed")
    return tmp_path / "runs"


@pytest.mark.parametrize(("where", "value"), [
    (("traces",), 5), (("traces", 0, "nodes"), 5), (("traces", 0, "calls"), True), (("traces", 0, "rewards"), [1]),
    (("traces", 0, "metrics"), [1, 2]), (("traces", 0, "metrics"), "s"), (("traces", 0, "errors"), 5),
])
def test_an_episode_of_another_shape_shows_its_page(tmp_path: Path, where: tuple, value: object) -> None:
    """trace_views took every field for the type verifiers writes: "internal server error"
    (and a traceback in the viewer's log) for the page of a foreign producer's episode."""
    from fixtures.episodes import make_episode
    from prime_runs_spool.viewer.pages import Pages
    from prime_runs_spool.viewer.render import Links
    from prime_runs_spool.viewer.sources import SpoolSource

    episode = make_episode(0, size=50)
    holder: object = episode
    for step in where[:-1]:
        holder = holder[step]  # type: ignore[index]
    holder[where[-1]] = value  # type: ignore[index]
    pages = Pages(SpoolSource([_spool_of(tmp_path, [episode, make_episode(1, size=50)])]), Links())
    assert "<html" in pages.episode({"run": "odd", "n": "1"}).lower()
    assert "<html" in pages.run({"run": "odd"}, "/run?run=odd&fragment=1").lower()


def test_an_example_id_that_is_not_a_plain_value_does_not_take_the_runs_pages_down(tmp_path: Path) -> None:
    """The index keys search text by example id: an idx of [1] raised "unhashable type" in
    the middle of indexing, so the run's list (and every page of it) answered 500."""
    from fixtures.episodes import make_episode
    from prime_runs_spool.viewer.pages import Pages
    from prime_runs_spool.viewer.render import Links
    from prime_runs_spool.viewer.sources import SpoolSource

    odd = make_episode(0, size=50)
    odd["traces"][0]["task"]["data"]["idx"] = [1]
    for trace in odd["traces"]:
        trace["task"]["data"]["idx"] = {"split": "test", "n": 1}
    source = SpoolSource([_spool_of(tmp_path, [make_episode(1, size=50), odd, make_episode(2, size=50)])])
    pages = Pages(source, Links())
    html = pages.run({"run": "odd"}, "/run?run=odd&fragment=1")
    run = source.get("odd")
    assert len(run.rows) == 3, html[-300:]
    group = pages.group({"run": "odd", "example": str({"split": "test", "n": 1})})
    assert "odd-shapes" in group or "split" in group


def test_an_older_layout_row_whose_prompt_is_a_number_is_imported(tmp_path: Path) -> None:
    """row_to_episode iterated the prompt: `prime-runs import` of such a results.jsonl ended
    in a TypeError traceback, and no other folder under the path was imported either."""
    import shutil

    from support.env import REPO_ROOT

    root = tmp_path / "outputs"
    for name in ("a", "b"):
        shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "v0-completed", root / name)
    results = root / "a" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    rows[0]["prompt"], rows[1]["completion"] = 5, True
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = _cli("import", "--json", str(root))
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 0, result.stderr
    assert [r["state"] for r in json.loads(result.stdout)["imports"]] == ["imported", "imported"]


def test_an_import_that_fails_unexpectedly_does_not_stop_the_others(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from prime_runs_spool.importer import outputs
    from support.env import REPO_ROOT

    root = tmp_path / "outputs"
    for name in ("a", "b"):
        shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", root / name)
    real = outputs.read_source

    def read_source(output_dir: Path):  # noqa: ANN202
        if output_dir.name == "a":
            raise RuntimeError("a bug met on folder a")
        return real(output_dir)

    monkeypatch.setattr(outputs, "read_source", read_source)
    reports = outputs.import_paths([root])
    assert [(Path(r.source).name, r.state) for r in reports] == [("a", "error"), ("b", "imported")]
    assert "internal error: RuntimeError: a bug met on folder a" in (reports[0].error or "")


@pytest.mark.parametrize("command", [["verify"], ["status"], ["import"]])
def test_an_unexpected_error_in_any_command_is_one_line_not_a_traceback(tmp_path: Path, command: list[str],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Only `sync` turned a bug into one line; every other command printed the traceback."""
    import sys

    from commands import cli
    from prime_runs_spool.importer import paths as importer_paths
    from prime_runs_spool.spool import layout

    build_run(tmp_path / "runs" / "r", "unexpected", 1)

    def broken(*args: object, **kwargs: object):  # noqa: ANN202
        raise RuntimeError("a bug met on the way")

    monkeypatch.setattr(layout, "each_once", broken)
    monkeypatch.setattr(importer_paths, "each_once", broken)
    monkeypatch.setattr(sys, "argv", ["prime-runs", *command, str(tmp_path / "runs")])
    monkeypatch.delenv("PRIME_RUNS_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("prime-runs: internal error: RuntimeError: a bug met on the way "
                                            "(set PRIME_RUNS_TRACEBACK=1 for the traceback)")
    monkeypatch.setenv("PRIME_RUNS_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli.main()


@pytest.mark.parametrize("refused", ["POST /evaluations/", "POST /evaluations/ev1/samples"])
def test_a_request_the_platform_refused_is_not_fenced_by_the_next_sync(tmp_path: Path, refused: str) -> None:
    """A 4xx left the request announced in the state: the next sync (the user fixed the
    key's team, or the body) first waited a whole request lifetime, 10 minutes by default,
    for a request the platform had refused. Now it goes at once, and sends each row once."""
    import httpx

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings
    from prime_runs_spool.sync.engine import RunSync
    from prime_runs_spool.sync.options import SAMPLES, SyncOptions
    from prime_runs_spool.sync.retry import Backoff
    from prime_runs_spool.sync.state import Destination
    from support.fake_platform import FakePlatform

    platform = FakePlatform()
    builder = build_run(tmp_path / "r", "refused-then-fixed", 3)
    method, path = refused.split(" ")
    platform.fault = lambda m, p, phase: (httpx.Response(403, json={"detail": "not in this team"})
                                          if (m, p, phase) == (method, path, "before") else None)
    slept: list[float] = []
    now = [1_000_000.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    def sync():  # noqa: ANN202
        settings = Settings("http://fake", Secret("key"), None, "http://app")
        options = SyncOptions(request_lifetime=600.0, to=SAMPLES, backoff=Backoff(base=0.01, cap=0.02))
        client = PlatformClient(settings, transport=platform.transport())
        return RunSync(builder.run_dir, client, Destination(key="d", base_url="http://fake"), options,
                       clock=lambda: now[0], sleep=sleep).run()

    first = sync()
    assert first.state == "error" and "403" in (first.error or ""), first
    platform.fault = None
    second = sync()
    assert second.state == "synced", second
    assert sum(slept) < 5, f"the next sync waited {sum(slept):.0f} s for a refused request"
    assert len(platform.evaluations) == 1 and [len(rows) for rows in platform.samples.values()] == [3]


def test_a_file_url_sync_ships_the_run_once_with_its_lease_and_state_in_the_folder(tmp_path: Path) -> None:
    """obstore's local file store has no If-Match replace: every run's sync failed on its
    lease ("PutMode::Update not yet implemented"). A file:// folder is now served by
    store/local_files.py, whose replace is real: the run is synced, its lease and state
    land beside its spool, and a second sync finds it up to date."""
    import json
    import shutil

    from prime_runs_spool.spool.layout import list_segments

    builder = build_run(tmp_path / "src" / "r", "file-url", 2)
    (tmp_path / "bucket" / "r" / "spool").mkdir(parents=True)
    for _, path in list_segments(builder.run_dir):
        shutil.copy(path, tmp_path / "bucket" / "r" / "spool" / path.name)
    for expected in ("synced", "up_to_date"):
        result = _cli("sync", "--local", "--db", str(tmp_path / "local.db"), f"file://{tmp_path / 'bucket'}",
                      "--json", timeout=60, XDG_CACHE_HOME=str(tmp_path / "cache"))
        assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
        assert [r["state"] for r in json.loads(result.stdout)["runs"]] == [expected]
    lease = json.loads((tmp_path / "bucket" / "r" / "spool" / "sync.lease.json").read_text())
    assert lease["released"] is True
    assert [p.name for p in (tmp_path / "bucket" / "r" / "spool" / "sync").glob("*.json")]
    assert _cli("verify", f"file://{tmp_path / 'bucket'}").returncode == 0  # reading works there


def test_an_imports_unreadable_config_says_why(tmp_path: Path) -> None:
    """It said "cannot be read as JSON (OSError)": the exception's type, not what is wrong."""
    import shutil

    from support.env import REPO_ROOT

    root = tmp_path / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", root / "a")
    config = root / "a" / "configs" / "resolved" / "eval.json"
    config.unlink()
    os.mkfifo(config)
    result = _cli("import", str(root), timeout=30)
    assert result.returncode == 1, result.stderr
    assert "eval.json: cannot be read as JSON (not a regular file)" in _last_line(result), result.stderr


def _echo(request):  # noqa: ANN001, ANN202
    """An endpoint that answers a refusal quoting the request's headers (a debugging proxy,
    an echo service behind a misconfigured base URL)."""
    import httpx

    said = f"you sent {request.headers.get('authorization')}"
    return httpx.Response(400, json={"error": {"code": "invalid_trace", "message": said}, "detail": said})


def test_an_answer_that_echoes_the_api_key_does_not_print_it() -> None:
    """The error line quoted the first 200 characters of the body: the key, in the report,
    the CI log, and the online shipper's log file."""
    import httpx

    from prime_runs_spool.errors import PlatformError
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings

    settings = Settings(base_url="http://platform.invalid", api_key=Secret("sk-live-SECRET-0123456789"), team_id=None,
                        frontend_url="http://platform.invalid")
    with PlatformClient(settings, transport=httpx.MockTransport(_echo)) as client:
        with pytest.raises(PlatformError) as caught:
            client.list_evaluations(environment_name="gsm8k")
    assert "SECRET" not in str(caught.value) and "Bearer ***" in str(caught.value), caught.value


def test_a_traces_answer_that_echoes_the_api_key_does_not_print_it() -> None:
    import hashlib

    import httpx

    from prime_runs_spool.errors import PlatformError
    from prime_runs_spool.platform_api.traces import TracesUploader
    from prime_traces.batching import Batch

    data = b'{"id":"e1","traces":[]}\n'
    batch = Batch(data=data, digest=hashlib.sha256(data).hexdigest(), num_lines=1, first_line_number=1)
    uploader = TracesUploader("http://traces.invalid", "sk-live-SECRET-0123456789", None,
                              transport=httpx.MockTransport(_echo))
    try:
        with pytest.raises(PlatformError) as caught:
            uploader.upload(batch, {})
    finally:
        uploader.close()
    assert "400" in str(caught.value) and "SECRET" not in str(caught.value), caught.value


def test_an_export_writes_no_page_through_a_link_and_leaves_none_readable_by_others(tmp_path: Path) -> None:
    """Pages were opened O_CREAT|O_TRUNC: through a symbolic link planted in an export
    folder someone else prepared (the link's target, a file of the user's, overwritten
    with a page), and keeping an older file's mode (0644: the runs' prompts for all)."""
    import stat

    build_run(tmp_path / "runs" / "r", "export-links", 1)
    out = tmp_path / "report"
    out.mkdir()
    (out / "static").mkdir()
    older = out / "static" / "viewer.css"
    older.write_text("old")
    older.chmod(0o644)
    victim = tmp_path / "bashrc"
    victim.write_text("the user's own file\n")
    (out / "index.html").symlink_to(victim)
    result = _cli("view", "--export", str(out), str(tmp_path / "runs"), timeout=60)
    assert victim.read_text() == "the user's own file\n"
    assert result.returncode == 2 and "index.html" in _last_line(result), (result.returncode, result.stderr)
    (out / "index.html").unlink()
    result = _cli("view", "--export", str(out), str(tmp_path / "runs"), timeout=60)
    assert result.returncode == 0, result.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o600}, modes


@pytest.mark.parametrize("name", ["seg-000001.lock", "seg-000001.durable"])
@pytest.mark.parametrize("command", [["verify"], ["status"], ["sync", "--local", "--db", "{db}"], ["view", "--export", "{out}"]])
def test_a_segment_lock_or_durable_mark_that_is_a_fifo_does_not_hang_any_command(tmp_path: Path, name: str,
                                                                               command: list[str]) -> None:
    """The reader opened a segment's writer lock (to probe it) and its durable mark
    (before every walk of the segment) with a blocking open: a FIFO in either place, in a
    spool received from elsewhere, held verify, status, sync and view forever."""
    builder = build_run(tmp_path / "runs" / "r", "fifo-lock", 2, status=None)  # unsealed: its lock is probed
    target = builder.run_dir / "spool" / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    argv = [a.replace("{db}", str(tmp_path / "local.db")).replace("{out}", str(tmp_path / "site")) for a in command]
    try:
        result = subprocess.run(CLI + argv + [str(tmp_path / "runs")], capture_output=True, text=True, timeout=30,
                                env=child_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command)} still ran after 30 s with {name} a FIFO")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, (result.stdout, result.stderr)


def test_a_huge_object_where_a_state_goes_is_not_read_into_memory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """store.read fetched an object whole: a received bucket with gigabytes at a run's
    sync/<dest>.json (or its lease) was read into memory, run by run."""
    from prime_runs_spool.store import objects

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(objects, "MAX_SMALL_OBJECT_BYTES", 4096)
    store = _memory_store_with(tmp_path, "a", "b")
    reports = _store_sync_local(tmp_path, store)
    assert [r.state for r in reports] == ["synced", "synced"], reports
    (key,) = [i.key for i in store.list() if i.key.startswith("a/spool/sync/") and i.key.endswith(".json")]
    store.replace(key, b"{" + b" " * 10_000 + b"}", store.read(key)[1])
    fetched = store.stats["bytes_read"]
    (first, second) = _store_sync_local(tmp_path, store)
    assert first.state == "error" and "more than a sync state or lease ever holds" in (first.error or ""), first
    assert second.state == "up_to_date", second
    assert store.stats["bytes_read"] - fetched < 10_000


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
