"""Masking by a key's name, where the config is free-form (docs/masking.md, "Secrets by name").

An environment's arguments have no schema: ``judge_api_key``, ``hf_token``, ``db_password``
or ``aws_secret_access_key`` there are secrets only by their names. Whatever the depth,
they must not reach the disk (a real run through ``open_run``), nor the platform from a
spool written before the rule (sync masks it again), while names that only mention a
secret (``api_key_var``, ``max_tokens``) keep their values.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import orjson
import pytest

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.content.mask_locations import MASK, is_secret_name
from prime_runs_spool.content.masking import MaskRules
from prime_runs_spool.content.set_tables import find_set_tables
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.spool.writer import SegmentWriter
from support import platform_process
from support.files import all_bytes_under
from support.spelling import lookalike_spellings

SECRET_NAMES = ["password", "hf_token", "judge_api_key", "aws_secret_access_key", "HF_TOKEN", "apiKey",
                "X-Api-Key", "client_secret", "db_password", "credentials", "secretAccessKey", "githubtoken",
                "openaiapikey", "private_key", "connection_string", "AccountKey", "sas_token", "access_token",
                "Authorization", "passwd", "password2", "wandb.api_key", "slack-webhook-secret",
                # plurals: a list or table of them (keys rotated, a secrets table)
                "api_keys", "OPENAI_API_KEYS", "judgeApiKeys", "secrets", "client_secrets", "passwords",
                "access_keys", "private_keys", "passphrases", "cookies", "apikeys", "openaiapikeys",
                # tokens, plural, after a word that says they are credentials
                "access_tokens", "HF_TOKENS", "refreshTokens", "api_tokens", "auth_tokens", "github_tokens",
                # a personal access token after what it is for; a webhook's URL; a JWT
                "github_pat", "GH_PAT", "AZURE_DEVOPS_PAT", "gitlabPat", "webhook_url", "slackWebhookUrl",
                "DISCORD_WEBHOOK", "id_jwt", "pgpass", "PGPASS"]
#: Names that say something about a secret, or count tokens, but do not hold one.
PLAIN_NAMES = ["max_tokens", "api_key_var", "tokenizer", "token_budget", "secret_name", "password_file",
               "sort_key", "key", "num_tokens", "api_key_env", "tokens", "answer_key", "forward_env", "model",
               "keys", "sort_keys", "primary_keys", "max_tokens_per_call", "secret_names", "max_new_tokens",
               "special_tokens", "stop_tokens", "prompt_tokens", "completion_tokens", "reasoning_tokens",
               "total_tokens", "extra_tokens", "pat", "file_pat", "webhook_id", "webhook_events", "pgpass_file",
               "PGPASSFILE"]


def test_which_names_are_secret_shaped() -> None:
    assert [name for name in SECRET_NAMES if not is_secret_name(name)] == []
    assert [name for name in PLAIN_NAMES if is_secret_name(name)] == []


_PREFIX = st.sampled_from(["", "judge", "hf", "aws", "db", "openai", "my", "prod", "sandbox", "upstream"])
_BASE = st.sampled_from([["password"], ["token"], ["secret"], ["api", "key"], ["access", "key"],
                         ["secret", "access", "key"], ["private", "key"], ["credentials"], ["passwd"],
                         ["client", "secret"], ["auth", "token"], ["access", "token"], ["passphrase"],
                         ["api", "keys"], ["secrets"], ["passwords"], ["access", "keys"], ["access", "tokens"],
                         ["auth", "tokens"]])


@st.composite
def secret_names(draw: Any) -> str:
    """A secret-shaped name as people write them: snake, kebab, dotted, UPPER or camelCase."""
    words = [w for w in [draw(_PREFIX)] if w] + draw(_BASE)
    style = draw(st.sampled_from(["_", "-", ".", "upper", "camel"]))
    if style == "upper":
        return "_".join(words).upper()
    if style == "camel":
        return words[0] + "".join(word.capitalize() for word in words[1:])
    return style.join(words)


_PLAIN_KEY = st.sampled_from(["id", "args", "dataset", "split", "judge", "options", "nested", "max_tokens",
                              "api_key_var", "tokenizer", "seed"])
_PLAIN_LEAF = st.one_of(st.integers(0, 99), st.sampled_from(["gsm8k", "train", "VISIBLE_VALUE"]))


@st.composite
def env_args(draw: Any) -> tuple[dict, list[str]]:
    """Free-form environment arguments with secrets under secret-shaped names at random depths
    (in tables and in lists), and the secret values put there."""
    root: dict = {name: draw(_PLAIN_LEAF) for name in draw(st.lists(_PLAIN_KEY, unique=True, max_size=3))}
    secrets: list[str] = []
    for n in range(draw(st.integers(1, 4))):
        node: Any = root
        for _ in range(draw(st.integers(0, 4))):
            key = draw(_PLAIN_KEY)
            if draw(st.booleans()):
                child = node.setdefault(key, [])
                if not isinstance(child, list):
                    child = node[key] = []
                child.append({})
                node = child[-1]
            else:
                child = node.setdefault(key, {})
                if not isinstance(child, dict):
                    child = node[key] = {}
                node = child
        secret = f"SECRET-{n}-{draw(st.text('abcdef0123456789', min_size=8, max_size=8))}"
        value = draw(st.sampled_from(["plain", "table", "list"]))
        node[draw(secret_names())] = {"inner": secret} if value == "table" else [secret] if value == "list" else secret
        secrets.append(secret)
    return root, secrets


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=env_args(), seat_case=env_args())
def test_a_secret_shaped_key_at_any_depth_of_env_args_never_reaches_the_disk(case, seat_case) -> None:
    args, secrets = case
    seat_args, seat_secrets = seat_case
    config = {"model": "m", "max_tokens": 512, "client": {"api_key_var": "PRIME_API_KEY"},
              "env": {"id": "agentic-judge", "taskset": {"id": "gsm8k", "args": args}}}
    episode = make_episode(0, run_id="by-name")
    episode["traces"][0]["agent"]["config"]["env_args"] = seat_args
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        with open_run(run_dir, name="by-name", environments=["gsm8k"], config=config) as run:
            run.log_episodes([episode])
            on_disk = all_bytes_under(run_dir)  # acknowledged: durable, and masked already
            run.finish()
        for secret in secrets + seat_secrets:
            assert secret.encode() not in on_disk, secret
        manifest = read_run(run_dir).manifest
        # what only names a secret, or counts tokens, is kept as it was
        assert manifest["config"]["max_tokens"] == 512
        assert manifest["config"]["client"]["api_key_var"] == "PRIME_API_KEY"
        assert b"VISIBLE_VALUE" in on_disk or b"VISIBLE_VALUE" not in json.dumps([args, seat_args]).encode()


def test_a_launch_file_setting_a_secret_by_name_is_left_out() -> None:
    text = '[env.taskset]\nid = "gsm8k"\njudge_api_key = "sk-judge"\nmax_tokens = 10\n'
    assert find_set_tables(tomllib.loads(text), MaskRules.defaults_for_config()) == ["env.taskset.judge_api_key"]


@pytest.mark.slow
def test_a_spool_written_before_the_names_rule_reaches_the_platform_masked(tmp_path: Path) -> None:
    """Its manifest says masking version 1 (locations only): sync masks its config and its
    episodes again by today's rules (content/remask.py), and leaves the spool as it was."""
    from test_remask_e2e import old_manifest

    secret, seat_secret = "sk-OLD-JUDGE-KEY-1234", "hf_OLD_SEAT_TOKEN_5678"
    manifest = {**old_manifest("old-names"), "masking_version": 1,
                "config": {"model": "m", "env": {"taskset": {"args": {"judge_api_key": secret, "split": "test"}}}}}
    manifest.pop("config_source")
    run_dir = tmp_path / "runs" / "old"
    writer = SegmentWriter.create(run_dir, "old-names")
    writer.append("manifest", manifest)
    items = []
    for number in range(3):  # episodes as that version wrote them: a seat's env args in clear text
        episode = make_episode(number, run_id="old-names")
        episode["traces"][0]["agent"]["config"]["env_args"] = {"hf_token": seat_secret}
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    writer.append_many(items)
    writer.seal("completed")
    written = all_bytes_under(run_dir)
    spool_files = [path for _, path in list_segments(run_dir)]
    assert secret.encode() in written and seat_secret.encode() in written
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    report, evaluation, said = platform_process.synced_evaluation(tmp_path / "runs", db)
    assert (report["state"], report["pushed_now"]) == ("synced", 3), report
    assert evaluation["metadata"]["env"]["taskset"]["args"] == {"judge_api_key": MASK, "split": "test"}
    assert secret.encode() not in all_bytes_under(db.parent) and secret not in said
    assert seat_secret.encode() not in all_bytes_under(db.parent)
    assert all(path.read_bytes() in written for path in spool_files)  # the user's spool, as it was


@dataclasses.dataclass
class _ClientArgs:
    """A producer's own client settings, a dataclass: orjson writes it natively, as a mapping."""

    api_key: str
    headers: dict
    base_url: str
    _cached: str = "_PRIVATE_NOT_WRITTEN"


def test_a_dataclass_in_a_trace_config_is_masked_like_the_mapping_it_is_written_as(tmp_path: Path) -> None:
    """orjson writes a dataclass as a mapping of its public fields, so masking looks inside it
    too: its secrets reach neither the disk, the first time nor once the config is memoized."""
    secrets = ["sk-DATACLASS-KEY-1234", "hdr-DATACLASS-5678", "pw-URL-9012"]
    run_dir = tmp_path / "run"
    with open_run(run_dir, name="dataclass", environments=["gsm8k"]) as run:
        for number in range(4):  # the same config again: from the memo's second sighting on
            episode = make_episode(number, run_id="dataclass")
            config = episode["traces"][0]["agent"]["config"]
            config["client"] = _ClientArgs(secrets[0], {"X-Team": secrets[1]}, f"https://u:{secrets[2]}@host/v1")
            config["seat"] = _ClientArgs(secrets[0], {}, "https://host/v1")  # and one level deeper
            run.log_episodes([episode])
        on_disk = all_bytes_under(run_dir)
        run.finish()
    for secret in secrets:
        assert secret.encode() not in on_disk, secret
    assert b"_PRIVATE_NOT_WRITTEN" not in on_disk
    assert b'"base_url":"https://***@host/v1"' in on_disk



class _Seat(enum.Enum):
    """An enum whose value is a mapping: orjson writes the mapping."""

    OWNER = {"api_key": "sk-ENUM-KEY-4321", "headers": {"Authorization": "Bearer ENUM-HDR-8765"}}


def test_an_enum_or_a_fragment_in_a_trace_config_is_masked_as_what_it_is_written_as(tmp_path: Path) -> None:
    """orjson writes an ``Enum`` member as its value and an ``orjson.Fragment`` as its bytes:
    masking reads both as written, so their secrets never reach the disk, neither the first
    time nor once the config is memoized."""
    secrets = ["sk-ENUM-KEY-4321", "ENUM-HDR-8765", "sk-FRAGMENT-2468"]
    run_dir = tmp_path / "run"
    with open_run(run_dir, name="written-as", environments=["gsm8k"]) as run:
        for number in range(4):
            episode = make_episode(number, run_id="written-as")
            config = episode["traces"][0]["agent"]["config"]
            config["seat"] = _Seat.OWNER
            config["extra"] = orjson.Fragment(b'{"api_key": "sk-FRAGMENT-2468", "tries": [1, 2]}')
            run.log_episodes([episode])
        on_disk = all_bytes_under(run_dir)
        run.finish()
    for secret in secrets:
        assert secret.encode() not in on_disk, secret
    assert b'"tries":[1,2]' in on_disk

def test_the_masking_docs_name_todays_version_and_what_it_added() -> None:
    """docs/masking.md says which MASKING_VERSION is today's and what each number added; two
    rules landing at once raise it twice, and the page must follow the code."""
    import re

    from prime_runs_spool.content.mask_locations import MASKING_VERSION
    from support.env import REPO_ROOT

    page = (REPO_ROOT / "docs" / "masking.md").read_text()
    [today] = re.findall(r"`MASKING_VERSION` in `content/mask_locations.py`, `(\d+)` today", page)
    assert int(today) == MASKING_VERSION
    assert f"`{MASKING_VERSION}` " in page.split(" today: ", 1)[1].split(") and", 1)[0]


# -- a name in lookalike letters; a {name, value} pair in any mapping ---------------------

_VALUES = st.text(st.sampled_from("abcXYZ012-_аеорсΑΟｐ\u200b"), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(secret=lookalike_spellings(SECRET_NAMES), plain=lookalike_spellings(PLAIN_NAMES), value=_VALUES,
       memo=st.booleans())
def test_a_name_in_lookalike_letters_is_judged_as_the_name_it_looks_like(secret, plain, value, memo) -> None:
    """A key spelled with letters that only look like a secret name's (``pаssword`` with a
    Cyrillic ``а``, ``ＨＦ＿ＴＯＫＥＮ`` full width, a zero-width space inside) had its value
    written in clear: the rules compared ASCII. It is masked as the name it looks like; a
    plain name so spelled keeps its value, and neither key nor value is changed otherwise
    (the fold judges a name, it rewrites nothing)."""
    (secret_name, secret_key), (plain_name, plain_key) = secret, plain
    assert is_secret_name(secret_key) and not is_secret_name(plain_key)
    config = {"env": {"args": {secret_key: value, plain_key: value}}}
    if plain_key == secret_key:
        return
    rules = MaskRules.defaults_for_config()
    from prime_runs_spool.content.masking import mask

    for _ in range(2):  # the first sighting and the memo's
        masked = mask(config, rules, memo=memo)["env"]["args"]
        assert list(masked) == [secret_key, plain_key]  # the keys as written, in their order
        assert masked[secret_key] == MASK and masked[plain_key] == value


@settings(max_examples=100, deadline=None)
@given(spelled=lookalike_spellings(["headers", "extra_headers", "env_vars", "api_key"]), value=_VALUES)
def test_a_location_name_in_lookalike_letters_is_that_location(spelled, value) -> None:
    """``hеaders`` (Cyrillic ``е``) or ``ｅｎｖ＿ｖａｒｓ`` is the table it reads as: every entry masked."""
    from prime_runs_spool.content.masking import mask

    _, key = spelled
    masked = mask({"client": {key: {"X-Team": value}}}, MaskRules.defaults_for_config())["client"][key]
    assert masked in (MASK, {"X-Team": MASK}), masked


class _PairDict(dict):
    """A dict subclass, as a producer's config model may hand one over."""


@dataclasses.dataclass
class _Variable:
    name: str
    value: Any


class _Pair(enum.Enum):
    HF = {"name": "HF_TOKEN", "value": "PAIR-IN-AN-ENUM-0001"}


def _pair_as(kind: str, name_key: str, name: str, value: str) -> Any:
    from collections import OrderedDict

    pair = {name_key: name, "value": value}
    return {"dict": lambda: dict(pair), "subclass": lambda: _PairDict(pair), "ordered": lambda: OrderedDict(pair),
            "dataclass": lambda: _Variable(name, value),
            "fragment": lambda: orjson.Fragment(orjson.dumps(pair))}[kind]()


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["dict", "subclass", "ordered", "dataclass", "fragment"]),
       name_key=st.sampled_from(["name", "key"]), name=st.sampled_from(SECRET_NAMES + PLAIN_NAMES),
       value=st.text("abcdef0123456789", min_size=8, max_size=16).map(lambda s: "PAIR-" + s),
       where=st.sampled_from(["config", "episode"]), in_tuple=st.booleans(), memo=st.booleans(),
       sightings=st.integers(1, 3))
def test_a_name_value_pair_is_masked_in_any_mapping_it_is_written_as(kind, name_key, name, value, where, in_tuple,
                                                                      memo, sightings) -> None:
    """A ``{name, value}`` pair in a dict subclass (or an ``OrderedDict``, a dataclass, a
    fragment, an enum member: anything orjson writes as that mapping) had no name rule: only a
    plain dict's was read, so its value was written in clear wherever the walk read it (a
    first sighting, a config in a tuple or not memoized), and masked only where the memo had
    met its plain twin. It is written as the plain pair masks, every time."""
    from prime_runs_spool.content.masking import mask

    if kind == "dataclass" and name_key == "key":
        name_key = "name"
    rules = MaskRules.defaults_for_config() if where == "config" else MaskRules.defaults_for_episode()

    def placed(pair: Any) -> dict[str, Any]:
        holder = (pair,) if in_tuple else [pair]
        config = {"seat": {"extraEnv": holder}}
        return config if where == "config" else {"traces": [{"agent": {"config": config}}]}

    plain = orjson.dumps(mask(placed({name_key: name, "value": value}), MaskRules.defaults_for_config()
                              if where == "config" else MaskRules.defaults_for_episode(), memo=False))
    for _ in range(sightings):
        assert orjson.dumps(mask(placed(_pair_as(kind, name_key, name, value)), rules, memo=memo)) == plain
    assert (value.encode() in plain) is (not is_secret_name(name))
    enum_pair = orjson.dumps(mask(placed(_Pair.HF), rules, memo=memo))
    assert b"PAIR-IN-AN-ENUM" not in enum_pair
