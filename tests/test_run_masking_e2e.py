"""Masking, end to end, as a property: no secret byte reaches any file of a run.

Hypothesis builds eval configs and episodes with random secret values at every
credential location (docs/masking.md) and random keys and values everywhere
else, writes a whole run through the public API, then reads the raw bytes of every file
under the run directory. Every secret must be absent; every other value must read back
unchanged. The launch file (outside the run directory) holds the same secrets, so
``config_source`` must be left out too.
"""

from __future__ import annotations

import copy
import json
import logging
import string
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.mask_locations import MASK
from support.files import all_bytes_under
from support.spelling import spelled

# Secrets are marked by a prefix no other generated text can contain ("-" is used nowhere
# else), so a byte search cannot be fooled by a coincidence. Non-ASCII letters check that
# the UTF-8 bytes, not just ASCII, stay out.
SECRET_ALPHABET = string.ascii_letters + string.digits + "éßж"
secrets = st.text(SECRET_ALPHABET, min_size=6, max_size=16).map(lambda s: f"sk-{s}")
table_keys = st.text(string.ascii_letters + string.digits + "_-.", min_size=1, max_size=10)
tables = st.dictionaries(table_keys, secrets, min_size=1, max_size=3)

# Keys "elsewhere" start with k_: they can never spell a credential location by accident.
plain_keys = st.from_regex(r"k_[a-z0-9]{1,6}", fullmatch=True)
plain_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(string.ascii_letters + string.digits + " ", max_size=12),
)
plain_values = st.recursive(
    plain_leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_keys, inner, max_size=3),
    max_leaves=6,
)
extras = st.dictionaries(plain_keys, plain_values, max_size=3)
seat_names = st.sampled_from(["agent", "solver", "judge", "assistant", "user", "critic"])


class Built:
    """A value as given, the value expected back (credentials masked), and its secrets."""

    def __init__(self) -> None:
        self.secrets: list[str] = []

    def table(self, draw: Any) -> tuple[dict[str, str], dict[str, str]]:
        given_table = draw(tables)
        self.secrets.extend(given_table.values())
        return given_table, {key: MASK for key in given_table}


def _with_extras(draw: Any, given_part: dict[str, Any], expected_part: dict[str, Any]) -> None:
    more = draw(extras)
    given_part.update(more)
    expected_part.update(copy.deepcopy(more))


@st.composite
def seat_configs(draw: Any, built: Built) -> tuple[dict[str, Any], dict[str, Any]]:
    """A seat's config with a secret at every kind of location an OpenAI-compatible client
    config uses: its client's headers (as a table or as one string), extra and default
    headers, API key and the userinfo of its base URL; its harness env; its env_vars;
    and the per-request ``sampling_args.extra_headers``. Plus anything else."""
    env, env_masked = built.table(draw)
    extra, extra_masked = built.table(draw)
    default, default_masked = built.table(draw)
    request, request_masked = built.table(draw)
    env_vars, env_vars_masked = built.table(draw)
    if draw(st.booleans()):
        headers, headers_masked = built.table(draw)
    else:  # headers given as one string
        value = draw(secrets)
        built.secrets.append(value)
        headers, headers_masked = f"Authorization: Bearer {value}", MASK
    api_key, user, password = draw(secrets), draw(secrets), draw(secrets)
    built.secrets.extend([api_key, user, password])
    # Every location's name in a random spelling (Headers, EXTRA-HEADERS, envVars): matched alike.
    name = {location: draw(spelled(location)) for location in
            ("headers", "api_key", "extra_headers", "default_headers", "harness", "env", "env_vars")}
    request_name = draw(spelled("extra_headers"))
    given_seat = {
        "client": {name["headers"]: headers, "api_key_var": "PRIME_API_KEY", name["api_key"]: api_key,
                   "base_url": f"https://{user}:{password}@vllm.example:8000/v1",
                   name["extra_headers"]: extra, name["default_headers"]: default},
        name["harness"]: {"id": "bash", name["env"]: env}, name["env_vars"]: env_vars,
        "sampling_args": {"temperature": 0.5, request_name: request},
    }
    expected_seat = {
        "client": {name["headers"]: headers_masked, "api_key_var": "PRIME_API_KEY", name["api_key"]: MASK,
                   "base_url": f"https://{MASK}@vllm.example:8000/v1",
                   name["extra_headers"]: extra_masked, name["default_headers"]: default_masked},
        name["harness"]: {"id": "bash", name["env"]: env_masked}, name["env_vars"]: env_vars_masked,
        "sampling_args": {"temperature": 0.5, request_name: request_masked},
    }
    _with_extras(draw, given_seat, expected_seat)
    return given_seat, expected_seat


@st.composite
def cases(draw: Any) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    built = Built()
    headers, headers_masked = built.table(draw)
    config: dict[str, Any] = {"client": {"headers": headers}, "env": {}}
    expected: dict[str, Any] = {"client": {"headers": headers_masked}, "env": {}}
    for seat in draw(st.lists(seat_names, min_size=1, max_size=3, unique=True)):
        config["env"][seat], expected["env"][seat] = draw(seat_configs(built))
    judges = [built.table(draw) for _ in range(draw(st.integers(1, 2)))]
    config["env"]["taskset"] = {"id": "gsm8k", "task": {"judges": [{"headers": g} for g, _ in judges]}}
    expected["env"]["taskset"] = {"id": "gsm8k", "task": {"judges": [{"headers": m} for _, m in judges]}}
    _with_extras(draw, config, expected)

    episodes, expected_episodes = [], []
    for number in range(draw(st.integers(1, 3))):
        traces, expected_traces = [], []
        for _ in range(draw(st.integers(1, 2))):
            seat_given, seat_expected = draw(seat_configs(built))
            trace = {"agent": {"trainable": True}, "task": {"data": {"idx": number}}}
            expected_trace = copy.deepcopy(trace)
            trace["agent"]["config"], expected_trace["agent"]["config"] = seat_given, seat_expected
            _with_extras(draw, trace, expected_trace)
            traces.append(trace)
            expected_traces.append(expected_trace)
        episode = {"id": f"ep{number}", "ok": True, "traces": traces}
        expected_episode = {"id": f"ep{number}", "ok": True, "traces": expected_traces}
        _with_extras(draw, episode, expected_episode)
        episodes.append(episode)
        expected_episodes.append(expected_episode)
    return config, expected, episodes, expected_episodes, built.secrets


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_secret_reaches_any_file_and_everything_else_survives(case: Any) -> None:
    config, expected_config, episodes, expected_episodes, secret_values = case
    with tempfile.TemporaryDirectory() as tmp:
        launch_file = Path(tmp) / "eval.json"
        launch_file.write_text(json.dumps(config), encoding="utf-8")
        run_dir = Path(tmp) / "outputs" / "run"
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger = logging.getLogger("prime_runs_spool")
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)  # the left-out launch file is an info note, not a warning
        try:
            run = open_run(run_dir, name="prop", model="m", config=config, config_file=launch_file,
                           num_examples=3, rollouts_per_example=1)
            run.log_episodes(episodes)
            run.finish()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)

        raw = all_bytes_under(run_dir)
        logged = "\n".join(record.getMessage() for record in records)
        for secret in secret_values:
            assert secret.encode("utf-8") not in raw
            assert secret not in logged
        assert "sets the credential table" in logged

        spool = read_run(run_dir)
        assert spool.status == "completed"
        assert "config_source" not in spool.manifest
        recorded = dict(spool.manifest["config"])
        assert (recorded.pop("model"), recorded.pop("num_examples"), recorded.pop("rollouts_per_example")) == ("m", 3, 1)
        assert recorded == expected_config
        assert list(spool.episodes()) == expected_episodes
        # The caller's objects are never modified by masking.
        assert all(secret in json.dumps(config, ensure_ascii=False) + json.dumps(episodes, ensure_ascii=False)
                   for secret in secret_values)


def test_the_property_would_catch_an_unmasked_location(tmp_path: Path) -> None:
    """The byte check is real: a secret outside the rules (neither at a location nor under
    a secret-shaped name) does reach the spool."""
    run = open_run(tmp_path, name="n", config={"client": {"note": "sk-NOTATABLE"}})
    run.finish()
    assert b"sk-NOTATABLE" in all_bytes_under(tmp_path)


@pytest.mark.parametrize("where", ["config", "episode"])
def test_producer_rules_mask_their_own_locations(tmp_path: Path, where: str) -> None:
    value = {"auth": {"token": "sk-PRODUCER"}}
    run = open_run(tmp_path, name="n", config=value if where == "config" else None, mask_rules=["**.auth.token"])
    if where == "episode":
        run.log_episodes([{"id": "a", "ok": True, **value}])
    run.finish()
    assert b"sk-PRODUCER" not in all_bytes_under(tmp_path)


def test_a_credential_in_a_launch_file_comment_never_reaches_the_spool(tmp_path: Path) -> None:
    """The launch file travels as config_source, but its comments do not: nothing checked them."""
    launch = tmp_path / "eval.toml"
    launch.write_text('# PRIME_API_KEY=sk-IN_A_COMMENT_123\nmodel = "m"  # or sk-AFTER_A_VALUE_456\n'
                      '[client]\nbase_url = "https://api.example/v1#frag"\n', encoding="utf-8")
    run = open_run(tmp_path / "run", name="n", config_file=launch)
    run.finish()
    raw = all_bytes_under(tmp_path / "run")
    assert b"sk-IN_A_COMMENT_123" not in raw and b"sk-AFTER_A_VALUE_456" not in raw
    source = read_run(tmp_path / "run").manifest["config_source"]
    assert source["text"] == 'model = "m"\n[client]\nbase_url = "https://api.example/v1#frag"\n'
