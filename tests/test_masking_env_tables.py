"""Inline credentials under names the word rules missed, and environment tables by their
other names: ``*_json`` (a service account's JSON), ``*_pem`` (a private key), and ``env``,
``envs``, ``environment`` tables of environment variables, masked without masking a
verifiers config's ``env`` (the environment's own config) or an environment's id."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.content.mask_locations import MASK, is_secret_name
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.spool.scan import read_run
from support.files import all_bytes_under

INLINE_SECRET_NAMES = ["GOOGLE_APPLICATION_CREDENTIALS_JSON", "service_account_json", "serviceAccountJson",
                       "gcp_credentials_json", "private_key_pem", "PRIVATE_KEY_PEM", "tls_key_pem", "ssh_key_pem",
                       "client_cert_pem", "pem", "api_key_json", "SERVICE_ACCOUNT_JSON"]
PLAIN_NAMES = ["dataset_json", "schema_json", "tokens_json", "service_account", "output_json", "pem_path",
               "env", "environment", "envs", "json", "token_json_path"]


def test_inline_credential_names_are_secret_shaped() -> None:
    assert [name for name in INLINE_SECRET_NAMES if not is_secret_name(name)] == []
    assert [name for name in PLAIN_NAMES if is_secret_name(name)] == []


_ENV_TABLE = st.sampled_from(["env", "envs", "environment", "environment_variables"])
_ENV_VAR = st.sampled_from(["HF_TOKEN", "WANDB_KEY", "DB_URL", "OPENAI_BASE", "X1", "GH_PAT"])
_PLAIN_KEY = st.sampled_from(["sandbox", "docker", "args", "tools", "runner"])


@st.composite
def env_tables(draw: Any) -> tuple[dict, list[str]]:
    """A verifiers-shaped config (its ``env`` the environment's config, an ``environment``
    id) with environment-variable tables under their other names at random depths."""
    config: dict = {"model": "m", "environment": "gsm8k-env-id", "envs": ["gsm8k", "math"],
                    "env": {"id": "agentic-judge", "taskset": {"id": "gsm8k", "args": {"split": "test"}}}}
    secrets = []
    for n in range(draw(st.integers(1, 3))):
        node = config["env"] if draw(st.booleans()) else config
        for _ in range(draw(st.integers(0, 3))):
            node = node.setdefault(draw(_PLAIN_KEY), {})
            if not isinstance(node, dict):
                break
        else:
            secret = f"SECRETENV{n}{draw(st.text('abcdef0123', min_size=6, max_size=6))}"
            table = node.setdefault(draw(_ENV_TABLE), {})
            if isinstance(table, dict):
                table[draw(_ENV_VAR)] = draw(st.sampled_from([secret, [secret], {"v": secret}]))
                secrets.append(secret)
    return config, secrets


def _kept(config: dict, masked: dict) -> None:
    """What is not an environment-variable table stays as it was."""
    assert masked["environment"] == "gsm8k-env-id" and masked["envs"] == ["gsm8k", "math"]
    assert masked["env"]["id"] == "agentic-judge"
    assert masked["env"]["taskset"] == config["env"]["taskset"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env_tables(), st.sampled_from(INLINE_SECRET_NAMES))
def test_env_tables_and_inline_credentials_are_masked_and_nothing_else(case: Any, name: str) -> None:
    config, secrets = case
    config = {**config, "env": {**config["env"], "args": {name: '{"private_key": "SECRETINLINE"}'}}}
    snapshot = copy.deepcopy(config)
    masked = mask(config, MaskRules.defaults_for_config())
    written = json.dumps(masked)
    assert "SECRET" not in written, written
    assert masked["env"]["args"][name] == MASK
    _kept(config, masked)
    assert config == snapshot
    episode = {"id": "e", "traces": [{"agent": {"config": config}}], "info": config}
    masked_episode = mask(episode, MaskRules.defaults_for_episode())
    assert "SECRET" not in json.dumps(masked_episode["traces"])
    assert masked_episode["info"] == snapshot  # the eval's data


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env_tables(), env_tables())
def test_env_tables_never_reach_the_disk_through_a_run(case: Any, seat_case: Any) -> None:
    (config, secrets), (seat_config, seat_secrets) = case, seat_case
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        with open_run(run_dir, name="envs", config=config) as run:
            episodes = []
            for number in range(3):
                episode = make_episode(number, run_id="envs")
                episode["traces"][0]["agent"]["config"]["sandbox"] = seat_config
                episode["traces"][0]["agent"]["config"]["service_account_json"] = '{"private_key": "SECRETSA"}'
                episodes.append(episode)
            run.log_episodes(episodes)
            run.finish()
        on_disk = all_bytes_under(run_dir)
        assert b"SECRET" not in on_disk
        spool = read_run(run_dir)
        _kept(config, spool.manifest["config"])
        for episode in spool.episodes():
            _kept(seat_config, episode["traces"][0]["agent"]["config"]["sandbox"])


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["env", "environment"]), st.sampled_from(["docker", "kubernetes"]),
       st.lists(st.tuples(_ENV_VAR, st.text("abcdef0123", min_size=6, max_size=6)), min_size=1, max_size=3),
       st.lists(_PLAIN_KEY, max_size=3))
def test_an_environment_table_given_as_a_list_is_masked(name: str, style: str, pairs: list, where: list) -> None:
    """Docker's and Compose's ``["HF_TOKEN=..."]``, Kubernetes' ``[{name, value}]``: every
    entry goes (a list under ``envs`` is one of ids, and stays)."""
    entries = [f"{var}=SECRETLIST{value}" if style == "docker" else {"name": var, "value": f"SECRETLIST{value}"}
               for var, value in pairs]
    config: dict = {"model": "m", "envs": ["gsm8k", "math"], "env": {"id": "agentic-judge"}}
    node = config
    for key in ["sandbox", *where]:  # (the root's ``env`` is the environment's config)
        node = node.setdefault(key, {})
    node[name] = entries
    masked = mask(config, MaskRules.defaults_for_config())
    assert "SECRETLIST" not in json.dumps(masked)
    assert masked["envs"] == ["gsm8k", "math"] and masked["env"]["id"] == "agentic-judge"
    episode = {"id": "e", "traces": [{"agent": {"config": config}}]}
    assert "SECRETLIST" not in json.dumps(mask(episode, MaskRules.defaults_for_episode()))
