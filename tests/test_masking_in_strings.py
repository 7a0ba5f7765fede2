"""Credentials inside a string, and after a flag in an argument list (content/mask_text.py,
docs/masking.md "Inside strings").

A config's command lines, argument lists and URLs carry credentials that no location names:
``["--api-key", "sk-..."]``, ``["--token=..."]``, ``["-H", "Authorization: Bearer ..."]``,
``https://host/v1?token=...``, an Azure SAS ``&sig=``, a GitHub token pasted into a note.
Written through the public API (``open_run``, ``Run.log_episodes``), none of them may reach a
file, nor ``prime-runs eval``'s terminal, nor the platform from a spool written under the
rules before them; a value that is no secret is left as it is.
"""

from __future__ import annotations

import json
import string
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.episodes import make_episode
from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.manifest import masked_config_values
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.runner.terminal_mask import TerminalMask
from prime_runs_spool.content.error_scrub import error_forms
from prime_runs_spool.spool.writer import SegmentWriter
from support.env import CLI, child_env
from support.files import all_bytes_under
from support.spelling import lookalike_spellings, spelled

GHP = "ghp_" + "Zq7" * 12
MASKED_TEXTS = [
    ("vllm serve --api-key sk-CMD0001 --port 8000", "vllm serve --api-key *** --port 8000"),
    ("--token=ARGEQ0002", "--token=***"),
    ("HF_TOKEN=hf_x1 python run.py", "HF_TOKEN=*** python run.py"),
    ("curl -H 'Authorization: Bearer abc123' https://h/x", "curl -H 'Authorization: ***' https://h/x"),
    ("docker run -e HF_TOKEN=abc -e MODE=fast -e PATH img", "docker run -e HF_TOKEN=*** -e MODE=*** -e PATH img"),
    ("docker run --env=MODEL_CRED=Q0003 -e=MODE=fast img", "docker run --env=MODEL_CRED=*** -e=MODE=*** img"),
    ("curl --header=\"X-Team: Bearer Q0004\" https://h/x", "curl --header=\"X-Team: ***\" https://h/x"),
    ("https://host/v1?token=Q0005&page=2", "https://host/v1?token=***&page=2"),
    ("https://a.blob.core.windows.net/c?sv=2022&sp=r&sig=S%2Fx%3D", "https://a.blob.core.windows.net/c?sv=2022&sp=r&sig=***"),
    ("https://s3/b/o?X-Amz-Credential=AK&X-Amz-Signature=f00d", "https://s3/b/o?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("https://maps/api?key=AIzaXX&api_key=k2;apiKey=k3", "https://maps/api?key=***&api_key=***;apiKey=***"),
    ("https://app/cb#access_token=t0k&state=s", "https://app/cb#access_token=***&state=s"),
    ("https://u:p@h/?code=fn", "https://***@h/?code=***"),
    (f"git clone https://github.com/o/r # with {GHP}", "git clone https://github.com/o/r # with ***"),
    ("xoxb-1234567890-abcdef", "***"),
    ("AKIAIOSFODNN7EXAMPLE", "***"),
    ("github_pat_" + "A1b2" * 10, "***"),
    ("sk-proj-" + "a1B2c3D4" * 4, "***"),
    ("hf_" + "abcdefghij" * 4, "***"),
    ("export GROQ=gsk_" + "aB3" * 18, "export GROQ=***"),
    ("r8_" + "Zy9" * 12, "***"), ("pplx-" + "q1W" * 16, "***"), ("xai-" + "K7m" * 27, "***"),
    ("nvapi-" + "a-1B" * 16, "***"), ("npm_" + "n0P" * 12, "***"), ("pypi-AgEIcHlwaS5vcmc" + "x" * 60, "***"),
    ("dckr_pat_" + "d0ck" * 7, "***"), ("dop_v1_" + "ab12" * 16, "***"), ("lsv2_pt_" + "f0" * 16 + "_" + "ab" * 5, "***"),
    ("SG." + "s" * 22 + "." + "g" * 43, "***"), ("dapi" + "0f" * 16, "***"), ("lin_api_" + "L1n0" * 10, "***"),
]
PLAIN_TEXTS = ["Qwen/Qwen3-8B", "--model m --max-tokens 512", "https://host/v1?page=2&limit=10#top", "a - b",
               "max_tokens=512 top_p=0.9", "https://pypi.org/simple", "hf_home", "sk-learn", "task-1234567890abcdefghijk",
               "-e .", "pip install -e .", "--env=PLAIN", "-e=.", "--header-file h.txt", "key_path=/etc/k", "sort_key=name",
               "https://host/search?q=token&tokens=5", "AKIAshort", "eyJhbGciOiJIUzI1NiJ9"]


@pytest.mark.parametrize(("given", "expected"), MASKED_TEXTS)
def test_a_credential_inside_a_string_is_masked_and_the_rest_kept(given: str, expected: str) -> None:
    from prime_runs_spool.content.mask_text import mask_text

    assert mask_text(given) == expected
    assert mask_text(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize("text", PLAIN_TEXTS)
def test_a_string_without_a_credential_is_left_as_it_is(text: str) -> None:
    config = {"env": {"args": {"command": text, "argv": text.split()}}}
    assert mask(config, MaskRules.defaults_for_config()) is config


_FRAGMENTS = st.sampled_from(["--api-key", "--token=", "--env=", "-e=", "--header=", "-H", "Authorization: Bearer", "-e", "HF_TOKEN=", "https://",
                              "u:p@", "?token=", "&sig=", "#", "=", " ", "'", '"', "***", "x", "ghp_" + "a" * 36,
                              "sk-" + "b" * 24, "AKIA" + "C" * 16, ";", "&", "-", "\t", "\n", "\r", "\x0b", "\u2028",
                              "sk_live_" + "a" * 16, "gho_" + "b" * 30, "xoxp-" + "1" * 10, "glpat-" + "c" * 20,
                              "AIza" + "d" * 35, "eyJ" + "e" * 10 + ".eyJ" + "f" * 10 + "." + "g" * 10,
                              "ASIA" + "H" * 16, "github_pat_" + "i" * 22, "hf_" + "j" * 30,
                              "-u", "--user", "--key", "--pass", "mysql", "-p", "sshpass", "redis-cli", "-a",
                              "docker login", "-eMODE=", "set", "config", "aws_secret_access_key", "ENV ", ":",
                              '"api_key": ', "token: ", "{", "}", "Bearer ", "Basic YTpi", "-----BEGIN PRIVATE KEY-----",
                              "-----END", "machine h password", "PWD=", "u:p@h", "hooks.slack.com/services/",
                              "gsk_" + "k" * 40, "r8_" + "r" * 30, "pplx-" + "p" * 40, "SG." + "s" * 22 + "." + "g" * 43,
                              "dapi" + "0" * 32, "npm_" + "n" * 36, "headers:\n", "  X: ", "- "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=4)), max_size=12).map("".join))
def test_masking_a_string_twice_changes_nothing(text: str) -> None:
    """What sync, mirror and the viewer rely on: a masked record masked again is the same."""
    from prime_runs_spool.content.mask_text import mask_text

    once = mask_text(text)
    assert mask_text(once) == once


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=4)), max_size=12).map("".join))
def test_the_quick_test_passes_no_string_a_rule_would_change(text: str) -> None:
    """``mask_text`` looks at most strings with a few substring tests only: what it passes must
    be what the full rules leave alone."""
    from prime_runs_spool.content import mask_text as module

    quick = module._masked(text)
    assert module.mask_text(text) == quick and module.mask_text(text) == quick  # computed, then from the cache
    saved = module._maybe
    module._maybe = lambda _text: True
    try:
        assert module._masked(text) == quick
    finally:
        module._maybe = saved


def test_an_argument_list_loses_what_follows_a_secret_flag() -> None:
    from prime_runs_spool.content.mask_text import masked_arguments

    given = ["--api-key", "sk-1", "--model", "m", "-H", "Authorization: Bearer x", "-H", "X-Team: 7", "-e",
             "HF_TOKEN=t", "-e", "PLAIN", "--hf_token", 1234, "--token", MASK, "--password", {"value": "p"},
             "--secret", ["s"], "--verbose"]
    assert masked_arguments(given) == {1: MASK, 5: "Authorization: ***", 7: "X-Team: ***", 9: "HF_TOKEN=***",
                                       13: MASK, 17: MASK, 19: MASK}
    assert masked_arguments(["--model", "--api-key", "k", "--seed", "5"]) == {2: MASK}
    assert masked_arguments(["--model", "m", 5, None]) is None
    assert masked_arguments(["--model", {"a": 1}, "--token", None]) is None  # a plain flag's table stays; null is no secret


SECRET = "Zq8s3cretVALUE77"  # no provider's shape: only the rules by position can find it


def spooled(folder: Path, config: dict[str, Any], seat: dict[str, Any]) -> bytes:
    """Every byte a run writes whose config is ``config`` and whose one episode's first trace
    config holds ``seat``'s entries: through ``open_run`` and ``Run.log_episodes``, as a
    user's eval writes them."""
    episode = make_episode(0, run_id="r")
    episode["traces"][0]["agent"]["config"].update(seat)
    run = open_run(folder, name="r", model="m", config=config)
    run.log_episodes([episode])
    run.finish()
    return all_bytes_under(folder)


@pytest.mark.parametrize(("where", "value"), [
    # Docker's own --env=NAME=value spelling, in a command line and as one element of a list
    ("a command line", f"docker run --rm --env=MODEL_CRED={SECRET} vllm/vllm-openai"),
    ("an argument list", ["docker", "run", f"--env=MODEL_CRED={SECRET}", "vllm/vllm-openai"]),
    ("a header with =", f"curl --header='X-Team: {SECRET}' https://h/x"),
    # the element after a secret-named flag goes whole, whatever it is
    ("a table after a secret flag", ["serve", "--api-key", {"value": SECRET}]),
    ("a list after a secret flag", ["serve", "--api-key", [SECRET]]),
])
def test_a_value_after_env_equals_or_a_table_after_a_secret_flag_reaches_no_file(tmp_path: Path, where: str,
                                                                                 value: Any) -> None:
    raw = spooled(tmp_path / "run", {"model": "m", "env": {"id": "e", "sandbox": {"command": value}}},
                  {"sandbox_command": value})
    assert SECRET.encode() not in raw, f"{where}: {value!r} reached the spool in clear"


# -- the property: a real run, through the public API ---------------------------------------------

SECRET_ALPHABET = string.ascii_letters + string.digits + "._~%"
secret_values = st.text(SECRET_ALPHABET, min_size=8, max_size=16).map(lambda s: f"SECRET{s}")
#: Flag and query names that hold a credential, drawn as people write them.
_SECRET_WORDS = st.sampled_from([["api", "key"], ["token"], ["password"], ["hf", "token"], ["access", "token"],
                                 ["client", "secret"], ["github", "pat"], ["private", "key"], ["passwd"],
                                 ["auth", "token"], ["secret"], ["webhook", "url"]])
_QUERY_ONLY = st.sampled_from(["sig", "key", "code", "auth", "signature", "X-Amz-Signature", "X-Goog-Signature"])
_PLAIN_FLAGS = st.sampled_from(["--model", "--port", "--max-tokens", "-n", "--seed", "--tokenizer", "--api-key-var"])
_PLAIN_QUERY = st.sampled_from(["page", "limit", "q", "model", "tokens", "max_tokens", "key_id", "token_budget"])
plain_words = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=10)


@st.composite
def styled(draw: Any) -> str:
    """A secret-shaped name, snake, kebab, UPPER or camelCase (how flags and query keys are written)."""
    words = draw(_SECRET_WORDS)
    style = draw(st.sampled_from(["_", "-", "upper", "camel"]))
    if style == "upper":
        return "_".join(words).upper()
    if style == "camel":
        return words[0] + "".join(word.capitalize() for word in words[1:])
    return style.join(words)


class Drawn:
    """Strings and lists as given, as they must read back, and the secrets put in them."""

    def __init__(self) -> None:
        self.secrets: list[str] = []

    def secret(self, draw: Any) -> str:
        value = draw(secret_values)
        self.secrets.append(value)
        return value


@st.composite
def argument_lists(draw: Any, drawn: Drawn, tables: bool = True) -> tuple[list[Any], list[Any]]:
    """An argument list with secrets after flags named like secrets (alone and with ``=``),
    after ``-H`` and ``-e``, between flags that are no secret and their plain values."""
    given: list[Any] = []
    expected: list[Any] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["flag", "equals", "header", "env", "env=", "plain"] + ["table"] * tables))
        dashes = draw(st.sampled_from(["--", "-"]))
        if kind == "flag":
            secret = drawn.secret(draw)
            given += [dashes + draw(styled()), secret]
            expected += [given[-2], MASK]
        elif kind == "equals":
            name = dashes + draw(styled())
            given.append(f"{name}={drawn.secret(draw)}")
            expected.append(f"{name}={MASK}")
        elif kind == "header":
            header = draw(st.sampled_from(["Authorization", "X-Api-Key", "X-Team", "cf-access-client-secret"]))
            given += [draw(st.sampled_from(["-H", "--header"])), f"{header}: Bearer {drawn.secret(draw)}"]
            expected += [given[-2], f"{header}: {MASK}"]
        elif kind == "env":
            name = draw(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True))
            given += [draw(st.sampled_from(["-e", "--env"])), f"{name}={drawn.secret(draw)}"]
            expected += [given[-2], f"{name}={MASK}"]
        elif kind == "env=":
            name = draw(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True))
            flag = draw(st.sampled_from(["-e", "--env"]))
            given.append(f"{flag}={name}={drawn.secret(draw)}")
            expected.append(f"{flag}={name}={MASK}")
        elif kind == "table":
            secret = drawn.secret(draw)
            given += [dashes + draw(styled()), draw(st.sampled_from([{"value": secret}, [secret], {"k": [secret]}]))]
            expected += [given[-2], MASK]
        else:
            pair = [draw(_PLAIN_FLAGS), draw(st.one_of(plain_words, st.integers(0, 9999)))]
            given += pair
            expected += pair
    return given, expected


@st.composite
def urls(draw: Any, drawn: Drawn) -> tuple[str, str]:
    """A URL whose query holds secrets under names that say so, between plain parameters."""
    given = expected = f"https://{draw(plain_words)}.example/v1"
    separator = "?"
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            name = draw(st.one_of(styled(), _QUERY_ONLY.flatmap(lambda n: spelled(n) if "-" not in n else st.just(n))))
            secret = drawn.secret(draw)
            given += f"{separator}{name}={secret}"
            expected += f"{separator}{name}={MASK}"
        else:
            pair = f"{separator}{draw(_PLAIN_QUERY)}={draw(plain_words)}"
            given += pair
            expected += pair
        separator = draw(st.sampled_from(["&", "&", ";"]))
    return given, expected


@st.composite
def commands(draw: Any, drawn: Drawn) -> tuple[str, str]:
    """A command line: the argument list's words, joined by spaces (a value with no blank)."""
    given, expected = draw(argument_lists(drawn, tables=False))  # a table printed into a string is no argument
    if any(isinstance(item, str) and " " in item for item in given):  # a header line: quoted, as a shell wants it
        given = [f"'{item}'" if isinstance(item, str) and " " in item else item for item in given]
        expected = [f"'{item}'" if isinstance(item, str) and " " in item else item for item in expected]
    return "vllm serve " + " ".join(map(str, given)), "vllm serve " + " ".join(map(str, expected))


@st.composite
def shaped(draw: Any, drawn: Drawn) -> tuple[str, str]:
    """A note holding a token written the way its provider writes them."""
    body = draw(st.text(string.ascii_letters + string.digits, min_size=40, max_size=44))
    token = draw(st.sampled_from([f"ghp_{body}", f"github_pat_{body}", f"sk-proj-{body}", f"hf_{body}",
                                  f"xoxb-{body}", f"glpat-{body}", "AKIA" + body[:16].upper()]))
    drawn.secrets.append(token)
    return f"clone with {token} then run", f"clone with {MASK} then run"


@st.composite
def free_args(draw: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A free-form table (an environment's arguments, a sandbox's command) holding each kind."""
    drawn = Drawn()
    given: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    for number in range(draw(st.integers(1, 5))):
        key = f"k{number}_{draw(st.sampled_from(['args', 'cmd', 'extra_args', 'command', 'url', 'note']))}"
        given[key], expected[key] = draw(st.one_of(argument_lists(drawn), urls(drawn), commands(drawn), shaped(drawn)))
    plain = {"model": draw(plain_words), "args": ["--model", draw(plain_words)], "url": "https://h/x?page=2"}
    return {**plain, **given}, {**plain, **expected}, drawn.secrets


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=free_args(), seat_case=free_args())
def test_no_secret_in_an_argument_list_or_a_url_reaches_any_file_or_the_terminal(tmp_path_factory, case,
                                                                                  seat_case) -> None:
    args, expected_args, secrets = case
    seat, expected_seat, seat_secrets = seat_case
    tmp = tmp_path_factory.mktemp("run")
    config = {"model": "m", "env": {"id": "e", "args": args, "sandbox": {"command": args}}}
    raw = spooled(tmp / "run", config, {"env_args": seat})
    for secret in secrets + seat_secrets:
        assert secret.encode() not in raw
    spool = read_run(tmp / "run")
    assert spool.manifest["config"]["env"]["args"] == expected_args
    assert spool.manifest["config"]["env"]["sandbox"]["command"] == expected_args
    (written,) = spool.episodes()
    assert written["traces"][0]["agent"]["config"]["env_args"] == expected_seat
    # what ``prime-runs eval`` prints passes through the terminal mask made from the config
    terminal = TerminalMask()
    terminal.add(error_forms(masked_config_values(config)))
    printed = terminal.clear(json.dumps(config) + "\n" + " ".join(map(str, args.values())))
    assert [secret for secret in secrets if secret in printed] == []


def test_the_terminal_of_prime_runs_eval_masks_a_query_and_a_flag_from_the_launch_file(tmp_path: Path) -> None:
    launch = tmp_path / "eval.toml"
    launch.write_text('model = "m"\n[client]\nbase_url = "https://h/v1?api_key=LAUNCHQUERY0001"\n'
                      '[env.args]\nextra_args = ["--hf-token", "LAUNCHFLAG0002"]\n')
    terminal = TerminalMask()
    terminal.add_launch_file(str(launch))
    assert terminal.clear("GET https://h/v1?api_key=LAUNCHQUERY0001 with LAUNCHFLAG0002") == \
        f"GET https://h/v1?api_key={MASK} with {MASK}"


@pytest.mark.slow
def test_an_older_spool_holding_them_reaches_the_platform_masked(tmp_path: Path) -> None:
    """Spools written under the rules before these (``masking_version`` 10: no rule inside
    strings; 11: none for ``--env=NAME=value`` nor a table after a secret flag; 12: none for
    curl's ``-u``, a tool's ``-p``, JSON in a string or a PEM block; 13: none for ``docker
    login -p``, ``aws configure set`` nor a ``{name, value}`` pair; 14: none for a YAML block
    nor a Groq key; 15: none for a list printed into a string nor ``wandb login``; 16: none
    for ``vault login`` nor an XML ``<password>``; 18: none for a ``.pgpass`` line, an ODBC
    ``}}``, ``mongosh -p``, ``sqlcmd -P`` nor ``ngrok authtoken``) are masked again by sync
    before their metadata and their rows leave."""
    secrets = ["OLDFLAG0001xyz", "OLDQUERY0002xyz", "OLDHEADER0003xyz", "OLDPAT0004xyz", GHP]
    strings = {"extra_args": ["--api-key", secrets[0], "-H", f"Authorization: Bearer {secrets[2]}"],
               "url": f"https://h/v1?token={secrets[1]}", "github_pat": secrets[3], "note": f"use {GHP}"}
    newer = ["OLDENV0005xyz", "OLDTABLE0006xyz"]
    newer_strings = {"command": f"docker run --env=MODEL_CRED={newer[0]} img",
                     "extra_args": ["--token", {"value": newer[1]}]}
    formats = ["OLDUSER0007xyz", "OLDJSON0008xyz", "OLDPEM0009xyz", "OLDMYSQL0010xyz"]
    format_strings = {"command": f"curl -u alice:{formats[0]} https://h/x && mysql -uroot -p{formats[3]} app",
                      "judge": f'{{"api_key": "{formats[1]}"}}',
                      "key": f"-----BEGIN PRIVATE KEY-----\n{formats[2]}\n-----END PRIVATE KEY-----"}
    tools = ["OLDLOGIN0011xyz", "OLDAWS0012xyz", "OLDPAIR0013xyz"]
    tool_strings = {"command": f"docker login -u me -p {tools[0]} ghcr.io",
                    "setup": ["aws", "configure", "set", "aws_secret_access_key", tools[1]],
                    "extra_env": [{"name": "HF_TOKEN", "value": tools[2]}]}
    shapes = ["OLDYAML0014xyz", "gsk_" + "OLDGROQ0015" * 4]
    shape_strings = {"judge": f"client:\n  api_keys:\n  - {shapes[0]}\n", "note": f"key {shapes[1]}"}
    printed = ["OLDPRINTED0016xyz", "OLDWANDB0017xyz"]
    printed_strings = {"args": f"['--api-key', '{printed[0]}']", "setup": f"wandb login {printed[1]}"}
    logins = ["OLDVAULT0018xyz", "OLDXML0019xyz"]
    login_strings = {"setup": f"vault login {logins[0]}", "maven": f"<password>{logins[1]}</password>"}
    pgpass = ["OLDPGPASS0020xyz", "OLDODBC0021xyz", "OLDMONGO0022xyz", "OLDSQLCMD0023xyz", "OLDNGROK0024xyz"]
    pgpass_strings = {"setup": f"echo 'db:5432:app:u:{pgpass[0]}' > ~/.pgpass; mongosh -u a -p {pgpass[2]}",
                      "odbc": f"Server=db;PWD={{x}}}};{pgpass[1]}}};", "sql": f"sqlcmd -U sa -P {pgpass[3]}",
                      "tunnel": ["ngrok", "authtoken", pgpass[4]]}
    for run_id, version, args in (("old-strings", 10, strings), ("old-env-equals", 11, newer_strings),
                                  ("old-formats", 12, format_strings), ("old-tools", 13, tool_strings),
                                  ("old-shapes", 14, shape_strings), ("old-printed", 15, printed_strings),
                                  ("old-logins", 16, login_strings), ("old-pgpass", 18, pgpass_strings)):
        writer = SegmentWriter.create(tmp_path / "runs" / run_id, run_id)
        writer.append("manifest", {"run_id": run_id, "name": run_id, "environments": ["e"], "model": "m",
                                   "framework": "verifiers", "format_version": 1, "masking_version": version,
                                   "config": {"model": "m", "env": {"args": args}}})
        episode = make_episode(0, run_id=run_id)
        episode["traces"][0]["agent"]["config"]["env_args"] = args
        writer.append("episode", episode, meta={"episode_id": episode["id"], "rollout_number": 0})
        writer.seal("completed")
    secrets += newer + formats + tools + shapes + printed + logins + pgpass
    assert all(secret.encode() in all_bytes_under(tmp_path / "runs") for secret in secrets)
    db = tmp_path / "platform.db"
    result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--json"],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert [run["state"] for run in json.loads(result.stdout)["runs"]] == ["synced"] * 8, result.stdout
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("platform.db*"))
    assert [secret for secret in secrets if secret.encode() in stored + result.stdout.encode()] == []
    assert b"--api-key" in stored and b"token=***" in stored  # what was set still shows


# -- a password after curl's -u, --key, --pass, a tool's own flag; -e stuck; a table after -H/-e -------

PW = "Zq9pw0rdVALUE31"  # no provider's shape: only the rules by position and format can find it
BASIC = "Basic " + __import__("base64").b64encode(f"alice:{PW}".encode()).decode()

FLAG_CASES = [
    ("curl -u", f"curl -u alice:{PW} https://h/x"),
    ("curl --user", f"curl --user 'alice:{PW}' https://h/x"),
    ("curl --user=", f"curl --user=alice:{PW} https://h/x"),
    ("curl -u stuck", f"curl -ualice:{PW} https://h/x"),
    ("curl -u in a list", ["curl", "-u", f"alice:{PW}", "https://h/x"]),
    ("--key", f"tool --key {PW}"),
    ("--key in a list", ["tool", "--key", PW]),
    ("--pass", f"curl --cert c.pem --pass {PW} https://h/x"),
    ("--auth", ["http", "--auth", f"alice:{PW}", "h/x"]),
    ("--key=", f"tool --key={PW}"),
    ("mysql -p stuck", f"mysql -h db -uroot -p{PW} app"),
    ("mysql -p stuck in a list", ["/usr/bin/mysqldump", "--verbose", f"-p{PW}", "app"]),
    ("sshpass -p", f"sshpass -p '{PW}' ssh u@h"),
    ("sshpass -p in a list", ["sshpass", "-p", PW, "ssh", "u@h"]),
    ("redis-cli -a", f"redis-cli -h r -a {PW} ping"),
    ("-eNAME=value stuck", f"docker run -eMODEL_CRED={PW} img"),
    ("-eNAME=value stuck in a list", ["docker", "run", f"-eMODE={PW}", "img"]),
    ("-e with a lower-case name", f"docker run -e mode={PW} img"),
    ("-e lower in a list", ["docker", "run", "-e", f"mode={PW}", "img"]),
    ("a JSON table after -H", f"""curl -H '{{"X-Team": "{PW}"}}' https://h/x"""),
    ("a JSON table after -e", ["run", "-e", f'{{"MODE": "{PW}"}}']),
    ("a table after -H in a list", ["curl", "-H", {"X-Team": PW}]),
    ("a table after -e in a list", ["docker", "run", "-e", {"MODE": PW, "N": None}]),
    ("docker login -p", f"docker login -u me -p {PW} ghcr.io && docker run -p 8080:80 img"),
    ("podman login -p in a list", ["/usr/bin/podman", "login", "-p", PW, "quay.io"]),
    ("openssl -passin", f"openssl pkcs12 -in k.p12 -passin pass:{PW}"),
    ("kubectl --from-literal", f"kubectl create secret generic s --from-literal=db-pass={PW}"),
    ("aws configure set", f"aws configure set aws_secret_access_key {PW}"),
    ("aws configure set in a list", ["aws", "configure", "set", "aws_secret_access_key", PW]),
    ("npm config set", f"npm config set //registry.npmjs.org/:_authToken {PW}"),
    ("an .npmrc line", f"//registry.npmjs.org/:_authToken={PW}"),
    ("PowerShell's $env:", f'$env:HF_TOKEN="{PW}"; python run.py'),
    ("wandb login", f"wandb login {PW} && python train.py"),
    ("wandb login in a list", ["wandb", "login", "--relogin", PW]),
    ("vault login", f"vault login {PW}"),
    ("az login -p", ["az", "login", "-u", "me@example.com", "-p", PW]),
    ("a list printed into a string", f"['--model', 'm', '--api-key', '{PW}']"),
    ("a JSON list in a string", f'["curl", "-u", "alice:{PW}", "https://h/x"]'),
]

FORMAT_CASES = [
    ("JSON in a string", f'{{"api_key": "{PW}", "model": "m"}}'),
    ("JSON in a JSON string", f'{{"judge": "{{\\"client_secret\\": \\"{PW}\\"}}"}}'),
    ("a dict printed", f"{{'hf_token': '{PW}', 'n': 3}}"),
    ("a table under a secret name in JSON", f'{{"credentials": {{"user": "u", "pw": "{PW}"}}}}'),
    ("a headers table in JSON", f'{{"headers": {{"X-Team": "{PW}"}}, "model": "m"}}'),
    ("TOML in a string", f'[judge]\napi_key = "{PW}"\nmodel = "m"'),
    ("YAML in a string", f"judge:\n  token: {PW}\n  model: m"),
    ("a YAML list under a secret name", f"judge:\n  api_keys:\n  - {PW}\n  - k2\n  model: m"),
    ("a YAML headers table", f"client:\n  headers:\n    X-Team: {PW}\n  model: m"),
    ("a Cookie header", f"Cookie: theme=dark; session={PW}"),
    ("an XML element", f"<settings><server><id>r</id><password>{PW}</password></server></settings>"),
    ("a SAS outside a URL", f"BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig={PW}"),
    ("a base64 secret by its name", {"HF_TOKEN_B64": PW, "gcp_credentials_base64": PW}),
    ("a header line", f"X-Api-Key: {PW}"),
    ("a header line in a list", ["Accept: text/plain", f"Authorization: Bearer {PW}"]),
    ("Bearer alone", f"Bearer {PW}"),
    ("Basic alone", BASIC),
    ("a PEM private key", f"-----BEGIN PRIVATE KEY-----\nMIIE{PW}\nAAAA\n-----END PRIVATE KEY-----\n"),
    ("a PEM key cut short", f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl{PW}"),
    ("a .netrc line", f"machine api.example.com login alice password {PW}"),
    ("an ODBC string", f"Driver={{ODBC Driver 18}};Server=db;UID=u;PWD={PW};"),
    ("a userinfo without a scheme", f"--redis {PW[:4]}:{PW}@redis.internal:6379"),
    ("a Dockerfile's ENV", f"FROM python:3.11\nENV MODE fast\nENV GH_TOKEN {PW}\nRUN pip install x"),
    ("a Slack webhook", f"https://hooks.slack.com/services/T0/B0/{PW}"),
    ("a header as a pair", [["Accept", "text/plain"], ["X-Api-Key", PW]]),
    ("a variable as {name, value}", [{"name": "MODE", "value": "fast"}, {"name": "HF_TOKEN", "value": PW}]),
]


@pytest.mark.parametrize(("where", "value"), FLAG_CASES + FORMAT_CASES, ids=[c[0] for c in FLAG_CASES + FORMAT_CASES])
def test_a_password_in_a_string_or_a_list_reaches_no_file(tmp_path: Path, where: str, value: Any) -> None:
    """Each written as a user writes it, into an environment's arguments, a sandbox's command
    and a seat's resolved config, through ``open_run`` and ``Run.log_episodes``."""
    raw = spooled(tmp_path / "run", {"model": "m", "env": {"id": "e", "args": {"setup": value}, "sandbox": {"command": value}}},
                  {"sandbox_command": value})
    assert PW.encode() not in raw and BASIC.encode() not in raw, f"{where}: {value!r} reached the spool in clear"
    assert b"--verbose" in raw or b'"model"' in raw  # the rest is still there


def test_a_model_provider_or_registry_key_in_a_note_reaches_no_file(tmp_path: Path) -> None:
    """Keys pasted into free text (a note, a command), found by the shape each is issued in."""
    shaped_keys = [given for given, expected in MASKED_TEXTS if expected == MASK]
    note = "keys: " + " and ".join(shaped_keys)
    raw = spooled(tmp_path / "run", {"model": "m", "env": {"id": "e", "args": {"note": note, "argv": ["run", *shaped_keys]}}},
                  {"note": note})
    assert [key for key in shaped_keys if key.encode() in raw] == []


# What these rules leave alone: a port, a plugin, mkdir's -p, Docker's user:group, prose, an image's digest.
PLAIN_FORMATS = ["docker run -p 8080:80 -p 9000 img", "mkdir -p /tmp/x && cd /tmp/x", "python -m pytest -p no:randomly",
                 "docker run -u 1000:1000 img", "mysql -p app", "gcc -pthread -O2 x.c", "Basic arithmetic, level: 2",
                 "key: value", "sort_key: name", "time: 10:30", "git@github.com:o/r.git", "nginx:1.25@sha256:0f3a",
                 "PWD=/home/u python x.py", '{"model": "m", "max_tokens": 512, "api_key_var": "KEY"}',
                 "machine learning with a default login", "Bearer bonds, issued", "-----BEGIN CERTIFICATE-----\nMIIB\n",
                 "user@host:/path", "docker run -e .", "-epochs=3"]


@pytest.mark.parametrize("text", PLAIN_FORMATS)
def test_a_port_a_plugin_or_prose_is_left_as_it_is(text: str) -> None:
    config = {"env": {"args": {"command": text, "argv": text.split()}}}
    assert mask(config, MaskRules.defaults_for_config()) is config


# -- properties: every secret of each shape is found; a plain sentence is left --------------------

_PW_ALPHABET = string.ascii_letters + string.digits + "!#$%()*+-./<>?[]^_{|}~"
#: A digit in each, which no name or user drawn beside it has: found in the output, it was not masked.
passwords = st.builds(lambda first, middle, digit: first + middle + digit,  # (YAML: no indicator first)
                      st.sampled_from(string.ascii_letters + string.digits), st.text(_PW_ALPHABET, min_size=6, max_size=18),
                      st.sampled_from(string.digits)).filter(lambda s: MASK not in s)
letters = st.text(string.ascii_lowercase, min_size=1, max_size=10)


@st.composite
def secret_in_a_format(draw: Any) -> tuple[Any, str]:
    """A password written in one of the shapes above, its names in random styles."""
    secret = draw(passwords)
    name = draw(styled())
    user = draw(letters)  # a user by name (``-u 1000:1000`` is Docker's uid:gid, left)
    quote = draw(st.sampled_from(["'", '"']))
    in_xml = secret.replace("<", "x").replace("&", "x")  # XML text holds neither raw (it writes &lt; and &amp;)
    shapes = [
        f"curl -u {quote}{user}:{secret}{quote} https://h", f"curl --user={quote}{user}:{secret}{quote}",
        ["curl", draw(st.sampled_from(["-u", "--user"])), f"{user}:{secret}"],
        f"tool {draw(st.sampled_from(['--key', '--pass', '-pw', '--auth']))} {quote}{secret}{quote}",
        f"{draw(st.sampled_from(['mysql', 'mysqldump', 'mariadb', 'sshpass']))} -u {user} -p{quote}{secret}{quote} db",
        ["mysql", "-u", user, f"-p{secret}"], ["sshpass", "-p", secret, "ssh"], ["redis-cli", "-a", secret],
        f"docker run -e{draw(st.from_regex(r'[A-Z][A-Z0-9_]{0,8}', fullmatch=True))}={quote}{secret}{quote} img",
        json.dumps({name: secret, "model": user}), json.dumps({"outer": json.dumps({name: secret})}),
        repr({name: secret}), f"{name}: {quote}{secret}{quote}", f"{name} = {json.dumps(secret)}",
        f"{draw(st.sampled_from(['headers', 'extraHeaders', 'env_vars']))}: {json.dumps({user: secret})}",
        ["-H", {user: secret}], ["-e", {user.upper(): secret}], f"-H '{json.dumps({user: secret})}'",
        f"-----BEGIN {draw(st.sampled_from(['', 'RSA ', 'EC ', 'ENCRYPTED ', 'OPENSSH ']))}PRIVATE KEY-----\n{secret}\n"
        "-----END PRIVATE KEY-----",
        f"machine h.example login {user} password {secret}", f"Server=db;UID={user};Pwd={secret};",
        f"Bearer {secret}", f"docker login -u {user} -p {quote}{secret}{quote}", ["podman", "login", f"-p{secret}"],
        f"openssl rsa -passin pass:{secret}", f"aws configure set {name} {quote}{secret}{quote}",
        ["npm", "config", "set", f"//r.example/:{name}", secret], f"//r.example/:{name}={secret}",
        f"ENV {name} {secret}", [name, secret], [{"name": name, "value": secret}],
        f"kubectl create secret generic s --from-literal={user}={quote}{secret}{quote}",
        f"judge:\n  {name}:\n    - {secret}\n  model: m", f"headers:\n  {user}: {secret}\nmodel: m",
        f"wandb login {secret}", f"vault login {secret}", f"az login -u {user} -p {quote}{secret}{quote}",
        f"<cfg><{name}>{in_xml}</{name}></cfg>", repr(["--model", user, f"--{name}", secret]), json.dumps(["-u", f"{user}:{secret}"]),
        {f"{name}_{draw(st.sampled_from(['b64', 'B64', 'base64', 'json_b64']))}": secret},
    ]
    shape = draw(st.sampled_from(shapes))
    return shape, in_xml if isinstance(shape, str) and shape.startswith("<cfg>") else secret


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret_in_a_format())
def test_a_password_in_each_format_is_masked_whatever_it_is(case: tuple[Any, str]) -> None:
    value, secret = case
    config = {"env": {"args": {"v": value}}}
    masked = mask(config, MaskRules.defaults_for_config())
    assert secret not in json.dumps(masked), (value, masked)
    assert mask(masked, MaskRules.defaults_for_config()) == masked  # masking twice changes nothing


_PLAIN_VOCABULARY = ["the", "model", "answers", "each", "question", "in", "a", "sandbox", "with", "two", "tools",
                     "user", "host", "port", "run", "basic", "key", "default", "login", "machine", "level", "note",
                     "time", "score", "is", "then", "written", "to", "disk", "and", "synced", "later"]
_PUNCTUATION = st.sampled_from(["", "", "", ",", ".", ":", ";", " -", " (", ")", "\n"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.sampled_from(_PLAIN_VOCABULARY), plain_words), _PUNCTUATION), max_size=30)
       .map(lambda words: " ".join(word + mark for word, mark in words)))
def test_a_plain_sentence_is_left_as_it_is(sentence: str) -> None:
    from prime_runs_spool.content.mask_locations import is_secret_name
    from prime_runs_spool.content.mask_text import mask_text

    if any(is_secret_name(word.strip(",.:;()-")) for word in sentence.split()):
        return  # a word that names a secret: its value may go
    assert mask_text(sentence) == sentence


# -- a .pgpass line, an ODBC value in braces, more tools' password flags (MASKING_VERSION 19) -----

NEWER_CASES = [
    ("a .pgpass line written by a command", f"echo 'db.internal:5432:app:alice:{PW}' > ~/.pgpass && chmod 600 ~/.pgpass"),
    ("a .pgpass line with an escaped colon", f'printf "*:*:*:postgres:a\\\\:{PW}\\n" >> "$PGPASSFILE"'),
    ("a .pgpass line by its key's name", {"pgpass": f"db:5432:app:alice:{PW}"}),
    ("an ODBC value in braces", f"Driver={{ODBC Driver 18}};Server=db;UID=u;PWD={{a}}}};{PW} b}};Encrypt=yes"),
    ("mongosh -p", f"mongosh mongodb://db:27017/app -u admin -p {PW} --eval 'db.stats()'"),
    ("mongodump -p stuck in a list", ["/usr/bin/mongodump", "--port", "27017", "-u", "a", f"-p{PW}"]),
    ("sqlcmd -P", f"sqlcmd -S db -U sa -P '{PW}' -Q 'SELECT 1'"),
    ("bcp -P stuck", f"bcp dbo.t out t.dat -S db -U sa -P{PW} -c"),
    ("oc login -p", f"oc login https://api.cluster:6443 -u dev -p {PW}"),
    ("cf login -p in a list", ["cf", "login", "-a", "https://api.cf", "-u", "me", "-p", PW]),
    ("oras login -p", f"oras login ghcr.io -u me -p {PW}"),
    ("helm registry login -p in a list", ["helm", "registry", "login", "r.example", "-u", "me", "-p", PW]),
    ("crane auth login -p", f"crane auth login r.example -u me -p {PW}"),
    ("ngrok authtoken", f"ngrok authtoken {PW} && ngrok http 8000"),
    ("ngrok config add-authtoken in a list", ["ngrok", "config", "add-authtoken", PW]),
]


@pytest.mark.parametrize(("where", "value"), NEWER_CASES, ids=[c[0] for c in NEWER_CASES])
def test_a_pgpass_line_an_odbc_brace_or_another_tools_password_reaches_no_file(tmp_path: Path, where: str,
                                                                               value: Any) -> None:
    """Each written as a user writes it, into an environment's arguments, a sandbox's command
    and a seat's resolved config, through ``open_run`` and ``Run.log_episodes``."""
    raw = spooled(tmp_path / "run", {"model": "m", "env": {"id": "e", "args": {"setup": value}, "sandbox": {"command": value}}},
                  {"sandbox_command": value})
    assert PW.encode() not in raw, f"{where}: {value!r} reached the spool in clear"


_HOST = st.one_of(st.just("*"), st.from_regex(r"[a-z][a-z0-9\-]{0,8}(\.[a-z0-9]{1,6}){0,3}", fullmatch=True),
                  st.from_regex(r"10\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", fullmatch=True))
_PGPASS_WORD = st.text(string.ascii_letters + string.digits + "_-.*", min_size=1, max_size=8)
_ODBC_PASSWORD = st.text(_PW_ALPHABET.replace("{", "").replace("}", "") + " ;=", min_size=1, max_size=12)


@st.composite
def newer_shape(draw: Any) -> tuple[Any, str]:
    """A password in one of version 19's shapes: a ``.pgpass`` line (a colon or a backslash in
    it escaped), an ODBC value in braces (``;``, blanks and a doubled ``}`` in it), or a tool's
    own password flag (apart or stuck, in a command line or an argument list)."""
    secret = draw(passwords)
    user = draw(letters)
    pgpass_secret = secret.replace("\\", "\\\\").replace(":", "\\:")
    line = (f"{draw(_HOST)}:{draw(st.one_of(st.just('*'), st.integers(1, 65535).map(str)))}:"
            f"{draw(_PGPASS_WORD)}:{draw(_PGPASS_WORD)}:{pgpass_secret}")
    odbc = (draw(_ODBC_PASSWORD) + draw(st.sampled_from(["}};", "}}", ";", ""])) + secret.replace("{", "x").replace("}", "}}")
            + draw(_ODBC_PASSWORD))
    tool, flag = draw(st.sampled_from([("mongosh", "-p"), ("mongodump", "-p"), ("mongorestore", "-p"), ("sqlcmd", "-P"),
                                       ("bcp", "-P"), ("oc login", "-p"), ("cf login", "-p"), ("oras login", "-p"),
                                       ("helm registry login", "-p"), ("crane auth login", "-p"),
                                       ("ngrok authtoken", ""), ("ngrok config add-authtoken", "")]))
    quote = draw(st.sampled_from(["", "'", '"']))
    stuck = draw(st.booleans()) and flag != ""
    shapes = [
        f"echo '{line}' >> ~/.pgpass", f"cat > /root/.pgpass <<EOF\n{line}\nEOF", {"pgpass": line},
        f"{draw(st.sampled_from(['Driver={ODBC Driver 18};', 'Provider=MSOLEDBSQL;', '']))}Server=db;UID={user};"
        f"{draw(st.sampled_from(['PWD', 'Pwd', 'pwd', 'Password']))}={{{odbc}}};Encrypt=yes",
        f"{tool} -u {user} {flag + secret if stuck else f'{flag} {quote}{secret}{quote}'.strip()} --verbose",
        [*tool.split(), "-u", user, *([flag + secret] if stuck else [flag, secret] if flag else [secret])],
    ]
    shape = draw(st.sampled_from(shapes))
    return shape, secret


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(newer_shape())
def test_a_password_in_each_newer_shape_is_masked_whatever_it_is(case: tuple[Any, str]) -> None:
    value, secret = case
    config = {"env": {"args": {"v": value}}}
    masked = mask(config, MaskRules.defaults_for_config())
    assert secret not in json.dumps(masked), (value, masked)
    assert mask(masked, MaskRules.defaults_for_config()) == masked  # masking twice changes nothing


#: What the rules of version 19 leave alone: a port after another tool's -p, gh's git protocol, an
#: IPv6 address, five fields with a number second where no .pgpass is named, a shell's PWD.
NEWER_PLAIN = ["psql -h db -p 5432 -U u app", "pg_dump -p 5432 app", "gh auth login -p ssh", "ssh -p 2222 u@h",
               "mongod --port 27017 --dbpath /data", "sqlcmd -p", "fe80:0:0:0:0:0:0:1", "2001:db8:0:0:1",
               "user:1000:profile:name:first", "run at 10:20:30", "cd /tmp && PWD=/tmp make", "helm install -p x",
               "Server=db;Database=app;Trusted_Connection=yes", "ngrok http 8000", "crane auth get"]


@pytest.mark.parametrize("text", NEWER_PLAIN)
def test_a_port_an_address_or_a_field_list_is_left_as_it_is(text: str) -> None:
    config = {"env": {"args": {"command": text, "argv": text.split()}}}
    assert mask(config, MaskRules.defaults_for_config()) is config


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.lists(st.from_regex(r"[0-9a-f]{1,4}", fullmatch=True), min_size=5, max_size=8).map(":".join),  # IPv6
    st.lists(st.from_regex(r"[a-z][a-z0-9]{0,6}|[0-9]{1,5}", fullmatch=True), min_size=5, max_size=6).map(":".join),
    st.builds(lambda tool, port: f"{tool} -p {port}", st.sampled_from(["psql", "pg_dump", "ssh", "scp", "gh auth login",
                                                                      "docker run", "kubectl port-forward"]),
              st.integers(1, 65535))))
def test_plain_fields_and_ports_are_left_as_they_are(text: str) -> None:
    """No ``.pgpass`` named, no tool of version 19: an address, a key of fields, a port."""
    from prime_runs_spool.content.mask_text import mask_text

    assert mask_text(text) == text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text("abcdefxyz0123456789-", min_size=1, max_size=12),
                          st.sampled_from(["sk-", "xoxb-", "glpat-", "pplx-", "xai-", "nvapi-", "pypi-", "dapi", "IA",
                                           "AIza", "vf-", "-", "_", "A"]),
                          st.sampled_from(["a1B2" * 6, "0f" * 20, "Zq" * 25])), min_size=1, max_size=5).map("".join))
def test_a_box_id_is_masked_as_any_string_is(text: str) -> None:
    """A runtime record's box id, new in every rollout, is checked without the cache and, when
    it is an id as runtimes write them, by one match: always as ``mask_text`` checks a string."""
    from prime_runs_spool.content.mask_text import _masked, mask_new_text

    assert mask_new_text(text) == _masked(text)


#: Words a rule of mask_text reads, spelled in the id's characters where they can be.
_WORDS_IN_ID_CHARACTERS = ["set", "config", "login", "auth", "bearer", "basic", "user", "ssh", "http", "https", "s3",
                           "hf", "gh", "ghs", "sl", "ya29", "aiza", "ia", "dapi", "sg", "lin", "ntn", "dop", "ngrok",
                           "sk", "xo", "glsa", "env", "secret", "db", "odbc", "pwd", "azure", "sig", "vault", "wandb",
                           "az", "-", "--", "---", "=", ":", "/", "@", "k", "p", "x", "A", "_"]


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.text("abcdefghijlmnoqrstuvwyz0123456789-", max_size=40),
                 st.lists(st.one_of(st.sampled_from(_WORDS_IN_ID_CHARACTERS),
                                    st.text("abcdef0123456789-", min_size=1, max_size=12)),
                          min_size=1, max_size=8).map("".join)))
def test_an_id_the_quick_check_passes_is_a_text_no_rule_changes(text: str) -> None:
    """A box's id is passed by one search for a character outside the id's (``not_in_id``),
    not by mask_text's rules: a text it passes is one every rule leaves as it is."""
    from prime_runs_spool.content.mask_text import _masked, not_in_id

    if not_in_id(text) is None:
        assert _masked(text) == text


def test_the_ids_characters_can_spell_no_token_start_and_hold_the_ids_runtimes_write() -> None:
    """The quick check's argument: every token start mask_text looks for in a word holds a
    character no id holds; and the ids verifiers and container runtimes write pass it."""
    from prime_runs_spool.content.mask_text import _WORD_TOKEN, ID_CHARACTERS, not_in_id

    for start in _WORD_TOKEN.pattern.split("|"):
        assert set(start) - set(ID_CHARACTERS), start
    for box_id in ("vf-5c1e9a7b0d2f", "vf-solver-5c1e9a7b", "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"):
        assert not_in_id(box_id) is None


# -- a flag or a name inside a string, in lookalike letters ---------------------------------

#: How a command line's ``--`` reaches a config pasted from a document or a chat: as typed, or
#: made an em dash or an en dash by a word processor, minus signs, Unicode hyphens.
_DASHES = ["--", "\u2014", "\u2013", "\u2212\u2212", "\u2010\u2010"]


@settings(max_examples=300, deadline=None)
@given(secret=lookalike_spellings(["api-key", "hf-token", "password", "token", "auth-token"]),
       variable=lookalike_spellings(["HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD"]),
       plain=lookalike_spellings(["max-tokens", "token-budget", "api-key-var"]),
       dash=st.sampled_from(_DASHES), value=st.text("abcdef0123456789", min_size=6, max_size=12))
def test_a_flag_or_a_name_in_lookalike_letters_inside_a_string_is_masked(secret, variable, plain, dash, value) -> None:
    """A secret's flag or variable written in letters that only look like its name, inside a
    command line (``vllm serve --аpi-key ...`` with a Cyrillic ``а``, ``ＨＦ＿ＴＯＫＥＮ=...``
    full width, a zero-width space inside, ``—api-key`` where a word processor made an em dash
    of ``--``) or an argument list, had its value written in clear: the rules read a string's
    names in ASCII, where a key's name was judged as it looks since MASKING_VERSION 20. It is
    masked as the name it looks like, the string otherwise as written; a plain flag keeps its
    value."""
    (_, flag), (_, name), (_, plain_flag) = secret, variable, plain
    token, assigned, kept = "FLAGGED-" + value, "ASSIGNED-" + value, "KEPT-" + value
    config = {"command": f"vllm serve {dash}{flag} {token} {dash}{plain_flag} {kept}",
              "shell": f"{name}={assigned} python run.py",
              "argv": ["vllm", "serve", f"{dash}{flag}", token, f"{dash}{plain_flag}", kept],
              "docker": ["docker", "run", "-e", f"{name}={assigned}", "image"]}
    masked = mask(config, MaskRules.defaults_for_config())
    assert masked == {"command": f"vllm serve {dash}{flag} {MASK} {dash}{plain_flag} {kept}",
                      "shell": f"{name}={MASK} python run.py",
                      "argv": ["vllm", "serve", f"{dash}{flag}", MASK, f"{dash}{plain_flag}", kept],
                      "docker": ["docker", "run", "-e", f"{name}={MASK}", "image"]}, masked
