"""A URL's userinfo is masked where a key holds it, not only a value.

A key is written to the spool as surely as its value: a table keyed by URL (a mirror list,
per-endpoint options) with ``https://user:token@host`` as a key carried the token to disk.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.content.mask_fragments import mask_for_writing
from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.content.set_tables import find_set_tables
from prime_runs_spool.spool.scan import read_run
from support.files import all_bytes_under

_SECRET = st.text("ABCDEFGHKLMNP0123456789", min_size=6, max_size=10).map(lambda s: "SECRETK" + s)
_PLAIN_KEY = st.sampled_from(["client", "mirrors", "endpoints", "args", "opts", "0"])
_PLAIN_LEAF = st.one_of(st.integers(0, 9), st.none(), st.sampled_from(["plain", "https://host/v1"]))


@st.composite
def url_keyed(draw: Any) -> tuple[dict, list[str], list[str]]:
    """A config with URLs carrying userinfo used as keys at random depths (their values
    plain, None or a further table); the secrets put there and the masked keys expected."""
    root: dict = {"model": "m"}
    secrets, masked_keys = [], []
    for _ in range(draw(st.integers(1, 3))):
        node = root
        for _ in range(draw(st.integers(0, 3))):
            node = node.setdefault(draw(_PLAIN_KEY), {})
            if not isinstance(node, dict):
                break
        else:
            secret = draw(_SECRET)
            host = draw(st.sampled_from(["api.example", "10.0.0.1:8000", "h"]))
            user = draw(st.sampled_from(["", "user:", "x-token:"]))
            tail = draw(st.sampled_from(["", "/v1", "/simple?x=1"]))
            key = f"{draw(st.sampled_from(['https', 'git+ssh', 'redis']))}://{user}{secret}@{host}{tail}"
            node[key] = draw(st.one_of(_PLAIN_LEAF, st.just({"weight": 1})))
            secrets.append(secret)
            masked_keys.append(key.replace(user + secret, MASK))
    return root, secrets, masked_keys


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(url_keyed())
def test_a_url_key_loses_its_userinfo_in_a_config_and_an_episode(case: Any) -> None:
    config, secrets, masked_keys = case
    snapshot = copy.deepcopy(config)
    config_rules, episode_rules = MaskRules.defaults_for_config(), MaskRules.defaults_for_episode()
    episode = {"id": "e", "traces": [{"agent": {"config": config}}], "info": {"kept": config}}
    for _ in range(3):  # walked, then answered by the memo (plans and fragments)
        for out in (mask(config, config_rules), mask(config, config_rules, memo=False),
                    mask(episode, episode_rules)["traces"],
                    orjson.loads(orjson.dumps(mask_for_writing(episode, episode_rules)))["traces"]):
            written = orjson.dumps(out).decode()
            assert not any(secret in written for secret in secrets), written
            assert all(json.dumps(key)[1:-1] in written for key in masked_keys), written
    assert config == snapshot  # never mutated
    assert mask(episode, episode_rules)["info"] == {"kept": snapshot}  # the eval's data, as it was
    named = find_set_tables(config, config_rules)
    assert named and not any(secret in " ".join(named) for secret in secrets)
    assert mask(mask(config, config_rules), config_rules) == mask(config, config_rules)  # twice: no change


@pytest.mark.slow
def test_a_url_key_never_reaches_the_disk_or_the_log_through_a_run(tmp_path: Path, caplog: Any) -> None:
    token = "ghp_KEYTOKEN_0123456789"
    config = {"model": "m", "env": {"args": {"mirrors": {f"https://bot:{token}@git.example/org/repo.git": 1}}}}
    launch = tmp_path / "eval.json"
    launch.write_text(json.dumps(config), encoding="utf-8")
    episodes = []
    for number in range(3):  # one seat config, seen again and again: the memo's fragments write it
        episode = make_episode(number, run_id="keys")
        episode["traces"][0]["agent"]["config"]["env_args"] = {f"https://{token}@pypi.example/simple": None}
        episodes.append(episode)
    with caplog.at_level(logging.INFO, logger="prime_runs_spool"):
        with open_run(tmp_path / "run", name="keys", config=config, config_file=launch) as run:
            run.log_episodes(episodes)
            run.finish()
    raw = all_bytes_under(tmp_path / "run")
    assert token.encode() not in raw and token not in caplog.text
    spool = read_run(tmp_path / "run")
    assert "config_source" not in spool.manifest
    assert spool.manifest["config"]["env"]["args"]["mirrors"] == {"https://***@git.example/org/repo.git": 1}
    assert [e["traces"][0]["agent"]["config"]["env_args"] for e in spool.episodes()] == \
        [{"https://***@pypi.example/simple": None}] * 3


def test_a_repeated_url_key_is_named_without_its_userinfo(tmp_path: Path, caplog: Any) -> None:
    launch = tmp_path / "eval.json"
    launch.write_text('{"m": {"https://u:sk-REPEATED1@h/": 1, "https://u:sk-REPEATED1@h/": 2}}', encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="prime_runs_spool"):
        open_run(tmp_path / "run", name="n", config_file=launch).finish()
    assert "twice in one object" in caplog.text and "sk-REPEATED1" not in caplog.text
    assert b"sk-REPEATED1" not in all_bytes_under(tmp_path / "run")


@pytest.mark.slow
def test_a_spool_of_version_3_with_url_keys_reaches_the_platform_masked(tmp_path: Path) -> None:
    """Version 3 left keys alone: sync masks its config and episodes again (content/remask.py)."""
    from prime_runs_spool.spool.writer import SegmentWriter
    from support import platform_process
    from test_remask_e2e import old_manifest

    token = "ghp_OLDKEYTOKEN_98765"
    manifest = {**old_manifest("old-keys"), "masking_version": 3,
                "config": {"model": "m", "mirrors": {f"https://bot:{token}@git.example/r.git": 1}}}
    manifest.pop("config_source")
    writer = SegmentWriter.create(tmp_path / "runs" / "old", "old-keys")
    writer.append("manifest", manifest)
    items = []
    for number in range(2):
        episode = make_episode(number, run_id="old-keys")
        episode["traces"][0]["agent"]["config"]["index"] = {f"https://{token}@pypi.example/simple": "on"}
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    writer.append_many(items)
    writer.seal("completed")
    assert token.encode() in all_bytes_under(tmp_path / "runs")
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    report, evaluation, said = platform_process.synced_evaluation(tmp_path / "runs", db)
    assert (report["state"], report["pushed_now"]) == ("synced", 2), report
    assert evaluation["metadata"]["mirrors"] == {"https://***@git.example/r.git": 1}
    assert token.encode() not in all_bytes_under(db.parent) and token not in said
