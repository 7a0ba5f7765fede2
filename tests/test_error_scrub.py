"""An errored episode's error messages never carry what masking took out of its trace
configs (content/error_scrub.py): httpx quotes a header value it refuses (``Illegal header
value b'...\\n'``, a key pasted with its newline) and verifiers records the message in the
call's ``error`` and the ``errors`` lists, which went to disk and to the platform in clear
text. The real vf-eval doing so is in tests/test_vf_eval_e2e.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import subprocess

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.remask import remask_episode
from support import platform_process
from support.env import CLI, REPO_ROOT, child_env
from support.leaky import API_KEY
from support.files import all_bytes_under

EPISODE = json.loads((REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed" / "traces.jsonl")
                     .read_text().splitlines()[0])


def failed_on(secret: str, *, ok: bool = False) -> dict[str, Any]:
    """The fixture's episode, its client's header ``secret``, failed as httpx fails on it."""
    episode = copy.deepcopy(EPISODE)
    episode["ok"] = ok
    message = f"Illegal header value {secret.encode()!r}"
    error = {"type": "ProviderError", "message": message, "status_code": 503}
    episode["errors"] = [error]
    for trace in episode["traces"]:
        trace["agent"]["config"]["client"]["headers"] = {"CF-Access-Client-Secret": secret}
        trace["errors"] = [error]
        trace["calls"] = [{"model": "fake/model", "error": error}]
    return episode


def written(tmp_path: Path, episodes: list[dict[str, Any]]) -> bytes:
    with open_run(tmp_path / "run", name="scrub") as run:
        run.log_episodes(episodes)
    return all_bytes_under(tmp_path / "run" / "spool")


def test_a_header_value_an_error_message_quotes_is_masked_there_too(tmp_path: Path) -> None:
    secret = "cfs_PASTED_WITH_ITS_NEWLINE_0123\n"
    data = written(tmp_path, [failed_on(secret)])
    assert secret.strip().encode() not in data
    [episode] = read_run(tmp_path / "run").episodes()
    assert episode["errors"][0]["message"] == "Illegal header value b'***'"
    assert episode["traces"][0]["calls"][0]["error"]["message"] == "Illegal header value b'***'"
    assert episode["traces"][0]["agent"]["config"]["client"]["headers"] == {"CF-Access-Client-Secret": "***"}


def test_an_old_spool_is_scrubbed_when_masked_again() -> None:
    secret = "cfs_IN_A_VERSION_7_SPOOL_4567"
    again = remask_episode(failed_on(secret))
    assert secret not in json.dumps(again)
    assert again["errors"][0]["message"] == "Illegal header value b'***'"


def test_short_values_are_left_as_the_eval_wrote_them() -> None:
    short = failed_on("x-team1")  # 7 characters: every "x-team1" of every message would go
    assert remask_episode(short)["errors"] == short["errors"]


#: A header value pasted with its newline: a marker (so it is told apart from what else a
#: spool holds, its framing's digits) around any printable characters but quotes and "\\".
_SECRET = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="\\'\""),
                  min_size=0, max_size=32).map(lambda core: f"cfs_{core}_SECRET\n")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=_SECRET)
def test_no_header_value_reaches_the_disk_through_an_error_message(tmp_path_factory: Any, secret: str) -> None:
    tmp_path = tmp_path_factory.mktemp("scrub")
    data = written(tmp_path, [failed_on(secret)])
    for form in (secret.strip(), repr(secret.strip())[1:-1], repr(secret.strip().encode())[2:-1]):
        assert json.dumps(form)[1:-1].encode() not in data


def test_a_runs_error_line_never_quotes_what_masking_took_out_of_its_config(tmp_path: Path) -> None:
    """A seal's error travels (the evaluation's metadata and error message): an eval that
    failed on its client's header quoted it there in clear text."""
    secret = "cfs_RUN_LEVEL_HEADER_SECRET_89\n"
    run = open_run(tmp_path / "run", name="scrub", config={"client": {"headers": {"X-Gateway-Key": secret}}})
    run.abort(RuntimeError(f"Illegal header value {secret.encode()!r}"))
    assert secret.strip().encode() not in all_bytes_under(tmp_path / "run" / "spool")
    spool = read_run(tmp_path / "run")
    [seal] = [record.data for record in spool.records() if record.type == "seal"]
    assert (spool.status, seal["error"]) == ("failed", "RuntimeError: Illegal header value b'***'")



@pytest.mark.parametrize("where", ["userinfo", "authorization"])
def test_the_password_or_token_a_message_quotes_alone_is_masked_there_too(tmp_path: Path, where: str) -> None:
    """A URL's userinfo is taken out as ``user:password`` and an ``Authorization`` value as
    ``Bearer TOKEN``; a message quoting the password or the token alone (a database's
    'password authentication failed', the token sent on as a query) kept it, in an episode's
    errors and in a run's error line. Cleared as the whole is, the rest of the message kept."""
    secret = "Pw0rdOnlyQuoted9f3a"
    episode = copy.deepcopy(EPISODE)
    episode["ok"] = False
    message = f"upstream refused credential {secret} (retrying)"
    episode["errors"] = [{"type": "ProviderError", "message": message}]
    for trace in episode["traces"]:
        client = trace["agent"]["config"]["client"]
        if where == "userinfo":
            client["base_url"] = f"https://svc:{secret}@gw.internal/v1"
        else:
            client["headers"] = {"Authorization": f"Bearer {secret}"}
    data = written(tmp_path, [episode])
    assert secret.encode() not in data
    [read] = read_run(tmp_path / "run").episodes()
    assert read["errors"][0]["message"] == "upstream refused credential *** (retrying)"
    config = {"client": {"base_url": f"https://svc:{secret}@gw.internal/v1"} if where == "userinfo"
              else {"headers": {"Authorization": f"Bearer {secret}"}}}
    run = open_run(tmp_path / "failed", name="scrub", config=config)
    run.abort(RuntimeError(message))
    assert secret.encode() not in all_bytes_under(tmp_path / "failed" / "spool")
    [seal] = [record.data for record in read_run(tmp_path / "failed").records() if record.type == "seal"]
    assert seal["error"] == "RuntimeError: upstream refused credential *** (retrying)"



@pytest.mark.slow  # the command line five times
def test_an_old_spools_errors_quoting_its_credentials_reach_no_sync_export_mirror_or_page(tmp_path: Path) -> None:
    """A spool written before errors were cleared (``masking_version`` 0): its run's error
    line quoting the config's key went to the platform (the evaluation's error and
    metadata), an export's runs row and a mirror's copy (which says today's version, so a
    sync of the store trusts it), its episode's error quoting the trace's header to the
    export's rows and the viewer's table: sync, export, mirror and the viewer masked only the
    configs again, and the error lines by their URLs. Each is now cleared of what today's
    masking takes out of the config and the traces, the rest of the message kept."""
    from prime_runs_spool.spool.writer import SegmentWriter

    key, header = "OldSpoolKey0001abcdef", "cfs_OLD_SPOOL_HEADER_0002abcdef"
    run = tmp_path / "runs" / "old"
    writer = SegmentWriter.create(run, "old-errors")
    writer.append("manifest", {"run_id": "old-errors", "name": "old-errors", "environments": ["gsm8k"], "model": "m",
                               "framework": "verifiers", "format_version": 1, "masking_version": 0,
                               "config": {"client": {"api_key": key}}})
    episode = failed_on(header)
    writer.append("episode", episode, meta={"episode_id": episode["id"], "rollout_number": 0})
    writer.seal("failed", error=f"RuntimeError: the platform refused {key}")
    assert key.encode() in all_bytes_under(run) and header.encode() in all_bytes_under(run)
    db = tmp_path / "platform.db"
    done = [subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, env=child_env(), cwd=tmp_path)
            for args in (["sync", str(tmp_path / "runs"), "--local", "--db", str(db)],
                         ["export", str(tmp_path / "runs"), "-o", str(tmp_path / "episodes.jsonl")],
                         ["export", str(tmp_path / "runs"), "--runs", "-o", str(tmp_path / "runs.jsonl")],
                         ["view", str(tmp_path / "runs"), "--export", str(tmp_path / "site")],
                         ["mirror", str(tmp_path / "runs"), (tmp_path / "store").as_uri(), "--once"])]
    assert [result.returncode for result in done] == [0, 0, 0, 0, 0], [r.stdout + r.stderr for r in done]
    places = {"platform": b"".join(path.read_bytes() for path in tmp_path.glob("platform.db*")),
              "episodes": (tmp_path / "episodes.jsonl").read_bytes(), "runs": (tmp_path / "runs.jsonl").read_bytes(),
              "pages": all_bytes_under(tmp_path / "site"), "mirror": all_bytes_under(tmp_path / "store"),
              "output": "".join(result.stdout + result.stderr for result in done).encode()}
    assert [(where, name) for where, data in places.items() for name, secret in (("key", key), ("header", header))
            if secret.encode() in data] == []
    assert json.loads(places["runs"])["error"] == "RuntimeError: the platform refused ***"
    assert json.loads(places["episodes"])["error"] == "ProviderError: Illegal header value b'***'"


#: Where an episode carries error text (docs/masking.md): its own ``errors``, a trace's
#: ``errors``, a model call's ``error``.
_ERROR_FIELDS = st.sampled_from(["episode.errors", "trace.errors", "call.error"])


def retried_on(secret: str, field: str) -> dict[str, Any]:
    """The fixture's episode, ``ok``, its client's header ``secret``, one model call of which
    failed on it as httpx fails (retried, the retry passing): the message only in ``field``."""
    episode = copy.deepcopy(EPISODE)
    episode["ok"] = True
    error = {"type": "ProviderError", "message": f"Illegal header value {secret.encode()!r}"}
    for trace in episode["traces"]:
        trace["agent"]["config"]["client"]["headers"] = {"CF-Access-Client-Secret": secret}
        if field == "call.error":  # the failed attempt, before the call that passed
            trace["calls"] = [{"model": "fake/model", "error": error}, *trace["calls"]]
        trace["errors"] = [error] if field == "trace.errors" else []
    episode["errors"] = [error] if field == "episode.errors" else []
    return episode


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=_SECRET, field=_ERROR_FIELDS)
def test_an_ok_episodes_retried_call_error_never_carries_a_header_value(tmp_path_factory: Any, secret: str,
                                                                         field: str) -> None:
    """At append and when an older spool is masked again, an ``ok`` episode's error text is
    cleared as an errored one's is: a call that failed on the header and was retried."""
    episode = retried_on(secret, field)
    tmp_path = tmp_path_factory.mktemp("scrub-ok")
    data = written(tmp_path, [episode])
    again = json.dumps(remask_episode(episode)).encode()
    for form in (secret.strip(), repr(secret.strip())[1:-1], repr(secret.strip().encode())[2:-1]):
        quoted = json.dumps(form)[1:-1].encode()
        assert quoted not in data and quoted not in again, (field, form)
    [read] = read_run(tmp_path / "run").episodes()
    assert "Illegal header value b'***'" in json.dumps(read)  # the message stays, the value goes
    assert read["ok"] is True


@pytest.mark.slow
def test_an_ok_episodes_error_reaches_neither_the_spool_nor_the_platform(tmp_path: Path) -> None:
    """End to end: a run of ok episodes, each with a call that failed on its header and was
    retried, written and synced to the real local platform: no byte of the spool, the
    platform's database or the sync's output holds the header's value."""
    secret = "cfs_RETRIED_CALL_HEADER_SECRET_7\n"
    episodes = []
    for index, field in enumerate(["episode.errors", "trace.errors", "call.error"]):
        episode = retried_on(secret, field)
        episode["id"] = f"retried-{index}"
        episodes.append(episode)
    with open_run(tmp_path / "runs" / "run", name="scrub-ok") as run:
        run.log_episodes(episodes)
    assert secret.strip().encode() not in all_bytes_under(tmp_path / "runs")
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY) as server:
        result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--base-url", server.base_url, "--json"],
                                capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        assert result.returncode == 0, result.stdout + result.stderr
        (report,) = json.loads(result.stdout)["runs"]
        assert (report["state"], report["pushed_now"]) == ("synced", 3), report
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {API_KEY}"}) as api:
            rows = api.get(f"/evaluations/{report['evaluation_id']}/samples").json()["samples"]
    assert len(rows) == 3 and "Illegal header value b'***'" in json.dumps(rows)  # the messages arrived
    assert secret.strip().encode() not in all_bytes_under(db.parent)
    assert secret.strip() not in result.stdout + result.stderr


def test_a_runs_ok_episodes_without_error_text_are_neither_masked_plainly_nor_walked(tmp_path: Path,
                                                                                    monkeypatch: Any) -> None:
    """An ``ok`` episode holding no error text, the common case, costs no plain masking and
    no walk (each cost about as much as the rest of the append: 5.2x ``orjson.dumps`` an
    episode, against 2); an episode holding some is masked plainly once and walked once,
    and the forms its messages are searched for, which depend only on the trace configs
    (they repeat in every episode of a run), are read once for a set of configs."""
    from prime_runs_spool.content import error_scrub
    from prime_runs_spool.runner import admission

    counts = {"mask": 0, "scrub": 0, "forms": 0}
    real = {"mask": admission.mask, "scrub": admission.scrub_errors, "forms": error_scrub.episode_error_forms}

    def counted(name: str) -> Any:
        def call(*args: Any) -> Any:
            counts[name] += 1
            return real[name](*args)
        return call

    monkeypatch.setattr(admission, "mask", counted("mask"))
    monkeypatch.setattr(admission, "scrub_errors", counted("scrub"))
    monkeypatch.setattr(error_scrub, "episode_error_forms", counted("forms"))
    secret = "sk-live-0123456789abcdef"
    clean = []
    for n in range(20):
        episode = retried_on(secret, "episode.errors")
        episode["id"], episode["errors"] = f"clean-{n}", []
        clean.append(episode)
    data = written(tmp_path, clean)
    assert secret.encode() not in data
    assert counts == {"mask": 0, "scrub": 0, "forms": 0}, counts
    # and episodes holding error text are walked (the messages cleared), the forms read once
    dirty = []
    for n, field in enumerate(["call.error", "trace.errors", "episode.errors"]):
        episode = retried_on(secret, field)
        episode["id"] = f"dirty-{n}"
        dirty.append(episode)
    data = written(tmp_path / "dirty", dirty)
    assert secret.encode() not in data and data.count(b"Illegal header value b'***'") >= 3
    assert counts == {"mask": 3, "scrub": 3, "forms": 1}, counts


#: What an error field holds when it holds no message: absent, null, empty.
_EMPTY_ERRORS = st.sampled_from(["absent", None, "", {}, []])


def _set(container: dict[str, Any], key: str, value: Any) -> None:
    if value == "absent":
        container.pop(key, None)
    else:
        container[key] = value


@st.composite
def _shaped(draw: Any, secret: str) -> dict[str, Any]:
    """The fixture's episode with 1-3 traces of 0-3 model calls, its client's header
    ``secret`` (or none), ``ok`` or not, and a message quoting the header in one place where
    verifiers records error text (the episode's ``errors``, a trace's ``errors``, a call's
    ``error``) or in none, every other such field empty; now and then a call that is not a
    mapping, or a trace's ``calls`` as a tuple."""
    message = f"Illegal header value {secret.encode()!r}"
    error = draw(st.sampled_from([message, {"type": "ProviderError", "message": message, "status_code": 503}]))
    episode = copy.deepcopy(EPISODE)
    base = episode["traces"][0]
    episode["traces"] = []
    places: list[tuple[Any, ...]] = [("episode",)]
    for t in range(draw(st.integers(1, 3))):
        trace = copy.deepcopy(base)
        if secret:
            trace["agent"]["config"]["client"]["headers"] = {"CF-Access-Client-Secret": secret}
        calls: list[Any] = []
        for c in range(draw(st.integers(0, 3))):
            if draw(st.integers(0, 15)) == 0:  # not a mapping: the walk decides
                calls.append(message)
                continue
            call: dict[str, Any] = {"model": "fake/model"}
            _set(call, "error", draw(_EMPTY_ERRORS))
            calls.append(call)
            places.append(("call", t, c))
        shape = draw(st.sampled_from(["list"] * 12 + ["absent", "none", "tuple"]))
        _set(trace, "calls", {"list": calls, "absent": "absent", "none": None, "tuple": tuple(calls)}[shape])
        _set(trace, "errors", draw(st.sampled_from(["absent", None, [], ()])))
        places.append(("trace", t))
        episode["traces"].append(trace)
    _set(episode, "errors", draw(st.sampled_from(["absent", None, []])))
    kind = draw(st.sampled_from([None, "episode", "trace", "call"]))  # each kind as often
    of_kind = [place for place in places if place[0] == kind]
    place = draw(st.sampled_from(of_kind)) if of_kind else None
    if place == ("episode",):
        episode["errors"] = [error]
    elif place is not None and place[0] == "trace":
        episode["traces"][place[1]]["errors"] = [error]
    elif place is not None:
        calls = episode["traces"][place[1]].get("calls")
        if calls:  # (not where the shape dropped the calls)
            calls[place[2]]["error"] = error
    _set(episode, "ok", draw(st.sampled_from([True] * 8 + [False, "absent"])))
    return episode


@st.composite
def _episodes(draw: Any) -> list[dict[str, Any]]:
    secret = draw(st.sampled_from(["", "cfs_PROPERTY_HEADER_SECRET_42\n", "sk-live-abcdefgh", "cfs_x\u00e9y_0123"]))
    episodes = [draw(_shaped(secret)) for _ in range(draw(st.integers(1, 6)))]
    for index, episode in enumerate(episodes):
        episode["id"] = f"shaped-{index}"
    return episodes


def _payloads(spool: Path) -> list[bytes]:
    """The payload of each episode line of a run's spool, byte for byte as on disk."""
    payloads = []
    for segment in sorted(spool.glob("*.jsonl")):
        for line in segment.read_bytes().rstrip(b"\0").splitlines():
            if line.startswith(b'{"data":') and b',"type":"episode"' in line:
                payloads.append(line[len(b'{"data":'):line.rindex(b',"seq":')])
    return payloads


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(episodes=_episodes())
def test_an_episode_is_written_as_if_every_one_were_walked(tmp_path_factory: Any, episodes: list[dict[str, Any]]) -> None:
    """An append walks an ``ok`` episode's error messages only where the shape check found
    error text where verifiers records it, and reads the forms they are searched for only
    then: the bytes on disk are those of the slow path, which masks each episode plainly and
    walks it whatever it holds (content/remask.py, as for an old spool), for episodes that
    do and do not carry error text, in any trace or call."""
    import orjson

    tmp_path = tmp_path_factory.mktemp("shaped")
    written(tmp_path, episodes)
    assert _payloads(tmp_path / "run" / "spool") == [orjson.dumps(remask_episode(e)) for e in episodes]
