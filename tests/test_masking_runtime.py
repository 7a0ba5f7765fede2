"""A trace's runtime record (``traces[*].agent.runtime``) is masked by location as its config is.

verifiers writes the box a rollout ran in beside the seat's resolved config (its id, image,
workdir, limits); a runtime record is also where a producer writes the box's environment,
command line, API base URL or headers. Written through ``Run.log_episodes`` (as an eval's
episodes are), none of those reach a file, nor the platform (samples and Prime Traces),
nor does a spool written before the rule carry them there; the rest of the record stays.
"""

from __future__ import annotations

import copy
import json
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prime_traces import TracesClient

from fixtures.episodes import make_episode
from prime_runs_spool import open_run, read_run
from prime_runs_spool.errors import RecordNotSerializableError
from prime_runs_spool.content.mask_fragments import mask_for_writing
from prime_runs_spool.content.mask_locations import MASK, MASKING_VERSION
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.spool.writer import SegmentWriter
from support import platform_process
from support.env import CLI, child_env
from support.files import all_bytes_under
from support.leaky import API_KEY

#: A value at each place a runtime record can hold a credential (no provider's shape: only the
#: locations, names and rules inside strings can find them).
SECRETS = {
    "env, lower case": "RtEnvLower0001xyz",
    "env, upper case": "RtEnvUpper0002xyz",
    "env as a list": "RtEnvList0003xyz",
    "api_key": "RtApiKey0004xyz",
    "base_url userinfo": "RtUserinfo0005xyz",
    "headers": "RtHeader0006xyz",
    "command line flag": "RtCommand0007xyz",
    "argument list": "RtArgs0008xyz",
    "secret-named key": "RtRegistry0009xyz",
}
#: What verifiers 0.4.0 writes there (a Docker runtime's record), none of it a credential.
PLAIN = {"id": "vf-5c1e9a7b0d2f", "borrowed": False, "allow": ["*"], "block": [], "type": "docker",
         "image": "python:3.11-slim", "workdir": "/app", "cpu": 2, "memory": "4g"}


def leaky_runtime(box: str = PLAIN["id"]) -> dict[str, Any]:
    """A runtime record holding :data:`SECRETS`, the box's id ``box``."""
    return {**PLAIN, "id": box,
            "env": {"hf_home_token_file": SECRETS["env, lower case"], "HF_TOKEN": SECRETS["env, upper case"]},
            "sandbox": {"environment": [f"WANDB_API_KEY={SECRETS['env as a list']}"]},
            "api_key": SECRETS["api_key"],
            "api_base_url": f"https://svc:{SECRETS['base_url userinfo']}@gw.internal/v1",
            "headers": {"X-Team": SECRETS["headers"]},
            "start_command": f"vllm serve m --api-key {SECRETS['command line flag']} --port 8000",
            "args": ["--token", SECRETS["argument list"]],
            "registry_password": SECRETS["secret-named key"]}


def episodes(count: int, *, run_id: str = "r", boxes: bool = True) -> list[dict[str, Any]]:
    """``count`` episodes of two traces each holding :func:`leaky_runtime`: each rollout in a
    box of its own (``boxes``), as verifiers runs them, or all in one."""
    out = []
    for number in range(count):
        episode = make_episode(number, run_id=run_id, salt=run_id, traces=2)
        for t, trace in enumerate(episode["traces"]):
            trace["agent"]["runtime"] = leaky_runtime(f"vf-{number:08x}{t:04x}" if boxes else PLAIN["id"])
        out.append(episode)
    return out


@pytest.mark.parametrize("boxes", [True, False], ids=["a box per rollout", "one box for all"])
def test_a_runtime_record_reaches_no_file_and_keeps_what_is_no_credential(tmp_path: Path, boxes: bool) -> None:
    """Through ``Run.log_episodes``, one episode at a time and several in one call (the memo
    answers from a record's second sighting on): no secret on disk; the keys stay, each value
    at a credential location ``***``, and what verifiers writes there is read back as it was."""
    given = episodes(6, boxes=boxes)
    with open_run(tmp_path / "run", name="runtime", model="m") as run:
        for episode in given[:3]:
            run.log_episodes([episode])
        run.log_episodes(given[3:])
    data = all_bytes_under(tmp_path / "run")
    assert [where for where, secret in SECRETS.items() if secret.encode() in data] == []
    read = list(read_run(tmp_path / "run").episodes())
    assert len(read) == 6
    for before, after in zip(given, read):
        for trace_before, trace in zip(before["traces"], after["traces"]):
            runtime = trace["agent"]["runtime"]
            assert {key: runtime[key] for key in PLAIN} == {key: trace_before["agent"]["runtime"][key] for key in PLAIN}
            assert runtime["env"] == {"hf_home_token_file": MASK, "HF_TOKEN": MASK}
            assert runtime["sandbox"] == {"environment": [MASK]}
            assert (runtime["api_key"], runtime["headers"], runtime["registry_password"]) == (MASK, {"X-Team": MASK}, MASK)
            assert runtime["api_base_url"] == "https://***@gw.internal/v1"
            assert runtime["start_command"] == "vllm serve m --api-key *** --port 8000"
            assert runtime["args"] == ["--token", MASK]


def test_an_error_quoting_a_runtime_secret_is_cleared_of_it(tmp_path: Path) -> None:
    """An errored episode whose message quotes what masking took out of a runtime record (a
    box's start command failing on its key) keeps the message, without the key."""
    episode = episodes(1)[0]
    message = f"sandbox start failed: {episode['traces'][0]['agent']['runtime']['start_command']}"
    episode["ok"] = False
    episode["errors"] = [{"type": "SandboxError", "message": message}]
    with open_run(tmp_path / "run", name="runtime-error", model="m") as run:
        run.log_episodes([episode])
    assert SECRETS["command line flag"].encode() not in all_bytes_under(tmp_path / "run")
    [read] = read_run(tmp_path / "run").episodes()
    assert read["errors"][0]["message"] == "sandbox start failed: vllm serve m --api-key *** --port 8000"


def old_spool(folder: Path, run_id: str) -> None:
    """A spool written under the rules before runtime records were masked (``masking_version``
    17): its episodes' runtime records in clear text."""
    writer = SegmentWriter.create(folder, run_id)
    writer.append("manifest", {"run_id": run_id, "name": run_id, "environments": ["gsm8k"], "model": "m",
                               "framework": "verifiers", "format_version": 1, "masking_version": 17,
                               "config": {"model": "m"}})
    for number, episode in enumerate(episodes(2, run_id=run_id)):
        writer.append("episode", episode, meta={"episode_id": episode["id"], "rollout_number": number})
    writer.seal("completed")


@pytest.mark.slow
def test_no_runtime_secret_reaches_the_platform_new_spool_or_old(tmp_path: Path) -> None:
    """A run written through ``Run.log_episodes`` and a spool of version 17 holding the same
    records in clear, synced to the real platform process as samples and to Prime Traces: no
    secret in its database or in the output; the documents hold the masked runtime record."""
    assert MASKING_VERSION > 17
    runs = tmp_path / "runs"
    with open_run(runs / "new", name="runtime-new", environments=["gsm8k"], model="m") as run:
        run.log_episodes(episodes(2, run_id=run.id))
    old_spool(runs / "old", "old-runtime")
    assert SECRETS["api_key"].encode() in all_bytes_under(runs / "old")
    shutil.copytree(runs, tmp_path / "runs-traces")
    db = tmp_path / "samples.db"
    samples = subprocess.run(CLI + ["sync", str(runs), "--local", "--db", str(db), "--json"],
                             capture_output=True, text=True, timeout=120, env=child_env())
    assert samples.returncode == 0, samples.stdout + samples.stderr
    assert [run["state"] for run in json.loads(samples.stdout)["runs"]] == ["synced"] * 2, samples.stdout
    traces_db = tmp_path / "platform" / "platform.db"
    traces_db.parent.mkdir()
    with platform_process.running(traces_db, "--token", API_KEY, "--traces") as server:
        pushed = subprocess.run(
            CLI + ["sync", str(tmp_path / "runs-traces"), "--base-url", server.base_url, "--to", "traces", "--json"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        reports = json.loads(pushed.stdout)["runs"]
        assert [report["state"] for report in reports] == ["synced"] * 2, pushed.stdout
        documents = []
        with TracesClient(api_key=API_KEY, base_url=server.base_url) as client:
            for report in reports:
                for member in client.list(run_id=report["evaluation_id"], limit=100).items:
                    documents.append(json.loads(client.get_raw(member.trace_id)))
    assert len(documents) == 8  # two runs of two episodes of two traces
    for document in documents:
        runtime = document["agent"]["runtime"]
        assert (runtime["image"], runtime["env"], runtime["api_key"]) == (PLAIN["image"], {"hf_home_token_file": MASK,
                                                                                             "HF_TOKEN": MASK}, MASK)
    places = {"samples database": b"".join(path.read_bytes() for path in tmp_path.glob("samples.db*")),
              "traces database": all_bytes_under(traces_db.parent),
              "output": (samples.stdout + samples.stderr + pushed.stdout + pushed.stderr).encode()}
    assert [(where, name) for where, data in places.items() for name, secret in SECRETS.items()
            if secret.encode() in data] == []


# -- the writer's memo knows a runtime record without its box id -------------------------------

_RUNTIME_VALUE = st.sampled_from([None, float("nan"), 1, 1.0, True, "1", MASK, "sk-" + "a1" * 12, ["*"], ("*",), [],
                                  {"HF_TOKEN": "x"}, "https://u:pw@h/v1", "--api-key k"])
_RUNTIME_KEY = st.sampled_from(["image", "env", "api_key", "allow", "start_command", "cpu", "value", "name"])
_BOX_ID = st.one_of(st.sampled_from(["vf-5c1e9a7b0d2f", "vf-0000", "sk-" + "b2" * 12, "https://u:pw@box/x",
                                     "AKIA" + "A" * 16, "--token t", "", MASK]),
                    st.text("abcdef0123456789-", max_size=16), st.integers(0, 3), st.none())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.dictionaries(_RUNTIME_KEY, _RUNTIME_VALUE, max_size=4), _BOX_ID, st.integers(1, 3)),
                min_size=1, max_size=6))
def test_a_runtime_record_is_written_as_a_fresh_walk_writes_it_whatever_its_id(sequence) -> None:
    """Runtime records drawn where equality and the serialization cannot tell values apart
    (1, 1.0 and True; None and NaN; a tuple and a list), each seen one to three times with a new
    box id (a token, a URL, a number, none at all): each is written byte for byte as a fresh
    walk writes it, whether the memo, a kept record or the walk answered; and masked by
    ``mask`` (sync's, the viewer's) as a fresh walk masks it."""
    rules = MaskRules.defaults_for_episode()
    box = 0
    for fields, box_id, times in sequence:
        for _ in range(times):
            box += 1
            runtime = {"id": box_id if not isinstance(box_id, str) or box_id[:3] != "vf-" else f"{box_id}{box}",
                       **copy.deepcopy(fields)}
            episode = {"id": "e", "traces": [{"agent": {"config": {"model": "m"}, "runtime": runtime}},
                                             {"agent": {"config": {"model": "m"}, "runtime": copy.deepcopy(runtime)}}]}
            before = repr(episode)
            walked = mask(episode, rules, memo=False)
            assert orjson.dumps(mask_for_writing(episode, rules)) == orjson.dumps(walked)
            assert repr(mask(episode, rules)) == repr(walked)  # sync's and the viewer's call
            assert repr(episode) == before


class _Ambiguous:
    """A value whose ``==`` raises, as an array's truth value does (numpy: 'ambiguous')."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("The truth value of an array with more than one element is ambiguous")

    __hash__ = None  # type: ignore[assignment]


def test_a_runtime_record_whose_comparison_raises_is_refused_as_unwritable_not_with_a_traceback(tmp_path: Path) -> None:
    """A runtime record holding an array where the records kept held a list: compared with
    them, ``==`` raised the array's ValueError out of ``log_episodes`` (and of ``mask``); it is
    a miss, so the record is walked and refused in one line naming the field, as it is with
    no record kept."""
    rules = MaskRules.defaults_for_episode()
    records = [{"id": f"vf-{number:08x}", "allow": [1, 2], "api_key": "RtKey"} for number in range(3)]
    records.append({"id": "vf-0000000a", "allow": _Ambiguous(), "api_key": "RtKey"})
    for record in records:
        episode = {"id": "e", "traces": [{"agent": {"config": {"model": "m"}, "runtime": record}}]}
        masked = mask(episode, rules)["traces"][0]["agent"]["runtime"]
        assert masked["api_key"] == MASK and masked["allow"] is record["allow"]
    with open_run(tmp_path / "run", name="ambiguous", model="m") as run:
        for number, record in enumerate(records):
            episode = make_episode(number, traces=1)
            episode["traces"][0]["agent"]["runtime"] = record
            if number < 3:
                run.log_episodes([episode])
                continue
            with pytest.raises(RecordNotSerializableError, match=r"traces\[0\]\.agent\.runtime\.allow"):
                run.log_episodes([episode])


def test_the_records_kept_to_know_a_runtime_record_by_are_bounded_as_the_memos_plans_are() -> None:
    """The memo knows a runtime record but for its box id by the last 8 records kept whole;
    a record of any size was kept (a box's file list, a long environment): 8 copies of a
    record of a few MB stayed in memory for the run's life. Like the memo's plans, one whose
    serialization is over 64 KiB is not kept (walked each time, as the memo walks such a
    config), and is masked the same."""
    import gc
    import tracemalloc

    rules = MaskRules.defaults_for_episode()

    def episode(number: int) -> dict[str, Any]:
        runtime = {**leaky_runtime(f"vf-{number:08x}"), "started": number,
                   "files": [f"/app/src/{'deep/' * 60}module_{i}.py" for i in range(300)]}
        return {"id": f"e{number}", "traces": [{"agent": {"config": {"model": "m"}, "runtime": runtime}}]}

    # the rules' routes and automaton made before measuring; the file names are longer than the
    # strings mask_text keeps (256 characters), so that cache holds none of them either way
    mask_for_writing(episode(0), rules)
    written = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for number in range(1, 7):
            written.append(hashlib.sha256(orjson.dumps(mask_for_writing(episode(number), rules))).digest())
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 200_000, f"{kept:,} bytes kept after masking 6 records of ~90 KB each"
    for number, digest in enumerate(written, 1):
        walked = orjson.dumps(mask(episode(number), rules, memo=False))
        assert digest == hashlib.sha256(walked).digest()
        assert SECRETS["api_key"].encode() not in walked
