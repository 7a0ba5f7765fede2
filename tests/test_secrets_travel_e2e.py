"""Secrets never travel, end to end: an eval writes a run through ``open_run`` with
credentials in its config, its ``@`` file and every episode, and the API key in its
environment; ``prime-runs sync`` ships it to the real platform process. No credential and
no byte of the API key may appear anywhere: not in the run directory (spool, sync state),
not in the platform's database files, not in anything sync printed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fixtures.episodes import FAKE_ENV_SECRET, FAKE_HEADER_SECRET
from prime_runs_spool import open_run
from prime_runs_spool.sync import state as sync_state

from support import platform_process
from support.env import CLI, child_env
from support.files import all_bytes_under
from support.leaky import API_KEY, LEAKED, leaky_episodes, leaky_seat

CONFIG_HEADER_SECRET = "cfs_CONFIG_HEADER_SECRET_5521"
JUDGE_HEADER_SECRET = "judge_HEADER_SECRET_9910"
HARNESS_SECRET = "hf_HARNESS_ENV_SECRET_3377"
COMMENT_SECRET = "cm_LAUNCH_FILE_COMMENT_8888"


EVAL_TOML = f"""\
model = "Qwen/Qwen3-8B"

[client]
type = "eval"
api_key_var = "VLLM_API_KEY"

[client.headers]
CF-Access-Client-Secret = "{CONFIG_HEADER_SECRET}"

[env.solver.harness.env]
HF_TOKEN = "{HARNESS_SECRET}"
"""


@pytest.mark.slow
def test_no_secret_reaches_disk_the_platform_or_the_output(tmp_path: Path) -> None:
    launch = tmp_path / "eval.toml"
    launch.write_text(EVAL_TOML)
    config = {
        **leaky_seat(),
        "model": "Qwen/Qwen3-8B",
        "client": {**leaky_seat()["client"], "headers": {"CF-Access-Client-Secret": CONFIG_HEADER_SECRET}},
        "env": {"solver": {"harness": {"env": {"HF_TOKEN": HARNESS_SECRET}}, **leaky_seat()},
                "taskset": {"task": {"judges": [{"headers": {"Authorization": JUDGE_HEADER_SECRET}}]}}},
    }
    run_dir = tmp_path / "outputs" / "run"
    os.environ["PRIME_API_KEY"] = API_KEY  # the runner's environment holds the key
    try:
        with open_run(run_dir, name="secrets", environments=["gsm8k"], model="Qwen/Qwen3-8B",
                      config=config, config_file=str(launch), num_examples=3, rollouts_per_example=1) as run:
            run.log_episodes(leaky_episodes(run.id))
    finally:
        del os.environ["PRIME_API_KEY"]
    secrets = [API_KEY, CONFIG_HEADER_SECRET, JUDGE_HEADER_SECRET, HARNESS_SECRET,
               FAKE_HEADER_SECRET, FAKE_ENV_SECRET, *LEAKED.values()]

    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY) as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "outputs"), "--base-url", server.base_url, "--json", "-v"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)["runs"][0]
        assert (report["state"], report["pushed_now"]) == ("synced", 3)
        import httpx

        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {API_KEY}"}) as api:
            evaluation = api.get(f"/evaluations/{report['evaluation_id']}").json()
            rows = api.get(f"/evaluations/{report['evaluation_id']}/samples").json()["samples"]
    # The masked tables arrived, with their keys and the mask where the values were.
    assert evaluation["metadata"]["client"]["headers"] == {"CF-Access-Client-Secret": "***"}
    assert "config_source" not in evaluation["metadata"]
    wrapper = rows[0]["info"]["native_wrapper"]
    assert wrapper["traces"][0]["agent"]["config"]["harness"]["env"] == {"HF_TOKEN": "***"}

    places = {
        "run directory": all_bytes_under(run_dir),
        "platform database": all_bytes_under(db.parent),
        "sync output": (result.stdout + result.stderr).encode(),
    }
    for secret in secrets:
        for where, data in places.items():
            assert secret.encode() not in data, f"a secret reached the {where}"


@pytest.mark.slow
def test_no_leaked_location_reaches_the_local_platform_after_sync_local(tmp_path: Path) -> None:
    """``sync --local``: the spool, its sync state and the embedded platform's database hold
    none of the values at the locations that once leaked, yet the rows arrived."""
    # A clean launch file but for a comment: it is uploaded, without the comment.
    launch = tmp_path / "eval.toml"
    launch.write_text(f'model = "m"\n# api_key = "{COMMENT_SECRET}"\n[client]\ntype = "eval"  # {COMMENT_SECRET}\n')
    run_dir = tmp_path / "outputs" / "run"
    with open_run(run_dir, name="leaks", environments=["gsm8k"], model="m", config={"model": "m", **leaky_seat()},
                  config_file=str(launch), num_examples=3, rollouts_per_example=1) as run:
        run.log_episodes(leaky_episodes(run.id))
    db = tmp_path / "local" / "platform.db"
    result = subprocess.run(CLI + ["sync", str(tmp_path / "outputs"), "--local", "--db", str(db), "--json"],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)["runs"][0]
    assert (report["state"], report["pushed_now"]) == ("synced", 3)
    assert list(sync_state.sync_dir(run_dir).iterdir()), "sync wrote its state"
    with platform_process.running(db) as server:
        import httpx

        with httpx.Client(base_url=server.api) as api:
            evaluation = api.get(f"/evaluations/{report['evaluation_id']}").json()
            rows = api.get(f"/evaluations/{report['evaluation_id']}/samples").json()["samples"]
    assert len(rows) == 3
    assert evaluation["metadata"]["client"]["base_url"] == "https://***@vllm.internal/v1"
    assert evaluation["metadata"]["config_source"]["text"] == 'model = "m"\n[client]\ntype = "eval"\n'
    seat = rows[0]["info"]["native_wrapper"]["traces"][0]["agent"]["config"]
    assert seat["client"]["api_key"] == "***" and seat["env_vars"] == {"TOKEN": "***"}
    places = {"run directory": all_bytes_under(run_dir), "local platform database": all_bytes_under(db.parent),
              "sync output": (result.stdout + result.stderr).encode()}
    for location, secret in {**LEAKED, "a comment of the launch file": COMMENT_SECRET}.items():
        for where, data in places.items():
            assert secret.encode() not in data, f"the value at {location} reached the {where}"


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
    from support.traces_upload import upload_refused

    refused = upload_refused(_echo, base_url="http://traces.invalid", api_key="sk-live-SECRET-0123456789")
    assert "400" in str(refused) and "SECRET" not in str(refused), refused


@pytest.mark.parametrize("status", [307, 303, 301])
def test_a_redirect_whose_location_quotes_the_api_key_does_not_print_it(status: int) -> None:
    """A gateway redirects the request to a login or maintenance page and puts the request's
    key in the address (``?token=``, percent-encoded, as userinfo): the error line names
    where the redirect leads, and printed the key whole in the report, the CI log and the
    shipper's log, where an answer's body had it scrubbed."""
    from urllib.parse import quote

    import httpx

    from prime_runs_spool.errors import PlatformError
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings

    key = "sk-live/SECRET+0123456789"

    def redirect(request: httpx.Request) -> httpx.Response:
        sent = request.headers["Authorization"].removeprefix("Bearer ")
        return httpx.Response(status, headers={"Location": f"https://u:{quote(sent, safe='')}@login.example/"
                                                           f"?next=x&token={sent}"
                                                           f"&again={quote(sent, safe='')}"})

    settings = Settings(base_url="http://platform.invalid", api_key=Secret(key), team_id=None,
                        frontend_url="http://platform.invalid")
    with PlatformClient(settings, transport=httpx.MockTransport(redirect)) as client:
        with pytest.raises(PlatformError) as caught:
            client.list_evaluations(environment_name="gsm8k")
    said = str(caught.value)
    assert str(status) in said and "login.example" in said, said  # it still says where it leads
    assert "SECRET" not in said, said


def _quoted_as_json_percent_base64(sent: str) -> str:
    import base64
    import re
    import urllib.parse

    return " | ".join([sent.replace("/", "\\/"), re.sub("%..", lambda hexa: hexa[0].lower(), urllib.parse.quote(sent, safe="")),
                       base64.b64encode(sent.encode()).decode()])


#: How a refusal quotes the header, and forms of the key that must not be in what sync printed.
QUOTINGS = {
    "json-percent-base64": (_quoted_as_json_percent_base64, ("SECRET+0123", "SECRET%2B0123", "SECRET%2b0123")),
    "lower-case": (str.lower, ("secret+0123",)),
    "decimal-entities": (lambda sent: "".join(f"&#{ord(ch)};" for ch in sent), ("&#83;&#69;&#67;&#82;&#69;&#84;",)),
    "hex-entities": (lambda sent: "".join(f"&#x{ord(ch):X};" for ch in sent), ("&#x53;&#x45;&#x43;&#x52;",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("quoting", sorted(QUOTINGS))
def test_a_refusal_that_quotes_the_api_key_encoded_does_not_print_it(tmp_path: Path, quoting: str) -> None:
    """A server in front of the platform (a proxy, a gateway at a wrong base URL) refuses the
    key check with a body quoting the Authorization header as JSON (``\\/``), percent-encoded,
    base64, lower-cased or as HTML's numeric entities: the one line ``sync --follow`` prints
    holds none of these forms of the key."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from support.runs import build_run

    key = "sk-live/SECRET+0123456789=abcdef"
    quote, forms = QUOTINGS[quoting]
    if quoting == "json-percent-base64":
        # "Bearer " is 7 bytes: the key's 3rd byte starts a base64 group of the quoted header
        forms += (base64.b64encode(key[2:20].encode()).decode(),)

    class Quoting(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = quote(self.headers.get("Authorization", ""))
            self.send_response(401)
            self.end_headers()
            self.wfile.write(body.encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quoting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        build_run(tmp_path / "outputs" / "run", "quoted-key", 1)
        done = subprocess.run(CLI + ["sync", str(tmp_path / "outputs"), "--follow", "--exit-when-idle", "-v",
                                     "--base-url", f"http://127.0.0.1:{server.server_port}", "--timeout", "5"],
                              capture_output=True, text=True, timeout=60,
                              env=child_env(PRIME_API_KEY=key, HOME=str(tmp_path)))
    finally:
        server.shutdown()
    said = done.stdout + done.stderr
    assert done.returncode == 2 and "refused the API key" in said, said
    assert "***" in said, said  # the refusal's words are there, the key's forms are not
    for form in forms:
        assert form not in said, (form, said)


URL_TOKEN = "ghp_CLONE_URL_TOKEN_4646"
FAILING_EVAL = f"""
import subprocess, sys
from fixtures.episodes import make_episode
from prime_runs_spool import open_run
with open_run(sys.argv[1], name="clone-fails", model="m", environments=["gsm8k"], config={{"model": "m"}}) as run:
    run.log_episodes([make_episode(0)])
    # an environment's setup cloning a private repository with a token in its URL, failing
    subprocess.run(["git", "clone", "-q", "https://x-access-token:{URL_TOKEN}@127.0.0.1:9/o/r.git", sys.argv[2]],
                   check=True, capture_output=True, timeout=60)
"""


@pytest.mark.slow
def test_the_error_a_failed_run_is_sealed_with_carries_no_url_credential(tmp_path: Path) -> None:
    """The seal's ``error`` is the exception's message, which travels (the evaluation's
    metadata and error message): a URL's ``user:token@`` in it is masked before the disk,
    as in the config."""
    failed = subprocess.run(["python3", "-c", FAILING_EVAL, str(tmp_path / "run"), str(tmp_path / "clone")],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert failed.returncode == 1 and "CalledProcessError" in failed.stderr, failed.stderr
    from prime_runs_spool.spool.reader import iter_records

    (seal,) = [record.data for record in iter_records(tmp_path / "run") if record.type == "seal"]
    assert seal["status"] == "failed" and "https://***@127.0.0.1:9/o/r.git" in seal["error"], seal
    assert URL_TOKEN.encode() not in all_bytes_under(tmp_path / "run")
