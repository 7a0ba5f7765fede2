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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.remask import remask_episode
from support.env import REPO_ROOT
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


def test_short_values_and_ok_episodes_are_left_as_the_eval_wrote_them(tmp_path: Path) -> None:
    short = failed_on("x-team1")  # 7 characters: every "x-team1" of every message would go
    assert remask_episode(short)["errors"] == short["errors"]
    passed = failed_on("cfs_RETRIED_AND_PASSED_0123", ok=True)
    assert remask_episode(passed)["errors"] == passed["errors"]


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
