"""The manifest: identity, masked config, v0 keys, and each config_source rule."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, Field

from prime_runs_spool._version import __version__
from prime_runs_spool.spool.format import FORMAT_VERSION
from prime_runs_spool.content.manifest import MAX_CONFIG_SOURCE_BYTES, build_manifest
from prime_runs_spool.platform_api.v0 import v0_metadata
from prime_runs_spool.content.mask_locations import MASK

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reference"
SECRET = "SECRETVALUE0123456789"
CLEAN_TOML = b'model = "m"\n\n[client]\nbase_url = "http://x"\nheaders = {}\n\n[env.solver.harness]\nid = "bash"\n'


def _build(config: Any = None, config_file: Any = None, **overrides: Any) -> tuple[dict, list[str]]:
    args: dict[str, Any] = dict(
        run_id="run-1", name="gsm8k-test", environments=["gsm8k"], model="Qwen/Qwen3-8B",
        framework="verifiers", config=config if config is not None else {},
        config_file=config_file, num_examples=20, rollouts_per_example=3,
        created_at=dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
    )
    args.update(overrides)
    return build_manifest(**args)


def test_identity_fields() -> None:
    manifest, warnings = _build()
    assert warnings == []
    assert {k: manifest[k] for k in ("run_id", "name", "environments", "model", "framework")} == {
        "run_id": "run-1", "name": "gsm8k-test", "environments": ["gsm8k"],
        "model": "Qwen/Qwen3-8B", "framework": "verifiers",
    }
    assert manifest["created_at"] == "2025-01-02T03:04:05Z"
    assert manifest["package_version"] == __version__
    assert manifest["format_version"] == FORMAT_VERSION
    assert "config_source" not in manifest


def test_created_at_defaults_to_now_utc() -> None:
    manifest, _ = _build(created_at=None)
    when = dt.datetime.fromisoformat(manifest["created_at"].replace("Z", "+00:00"))
    assert manifest["created_at"].endswith("Z")
    assert abs((dt.datetime.now(dt.timezone.utc) - when).total_seconds()) < 60


class Headers(BaseModel):
    type: str = "eval"
    base_url: str = "http://default"
    headers: dict[str, str] = Field(default_factory=dict)


class Config(BaseModel):
    model: str = "default-model"
    num_examples: int = 5
    rollouts_per_example: int = 1
    client: Headers = Field(default_factory=Headers)
    max_concurrent: int = 32


def test_pydantic_config_dumps_set_fields_masks_and_keeps_v0_keys() -> None:
    config = Config(client=Headers(headers={"Authorization": f"Bearer {SECRET}"}))
    manifest, _ = _build(config, num_examples=None, rollouts_per_example=None)
    assert manifest["config"] == {
        "client": {"headers": {"Authorization": MASK}},
        "model": "Qwen/Qwen3-8B",  # the explicit argument
        "num_examples": -1,  # unknown
        "rollouts_per_example": 1,  # exclude_unset dropped it; the v0 default
    }
    assert SECRET.encode() not in orjson.dumps(manifest)


def test_explicit_v0_arguments_win_over_the_config() -> None:
    config = {"model": "other", "num_examples": 99, "rollouts_per_example": 7, "num_tasks": 20}
    manifest, _ = _build(config, num_examples=20, rollouts_per_example=3)
    assert manifest["config"] == {"model": "Qwen/Qwen3-8B", "num_examples": 20,
                                  "rollouts_per_example": 3, "num_tasks": 20}
    kept, _ = _build(config, num_examples=None, rollouts_per_example=None)
    assert (kept["config"]["num_examples"], kept["config"]["rollouts_per_example"]) == (99, 7)


def test_mapping_config_is_copied_not_aliased_and_made_json() -> None:
    config = {"client": {"headers": {"X": SECRET}}, "path": Path("/tmp/x"), "tags": ("a", "b")}
    manifest, _ = _build(config)
    assert config["client"]["headers"]["X"] == SECRET  # the caller's object is untouched
    assert manifest["config"]["client"]["headers"] == {"X": MASK}
    assert manifest["config"]["path"] == "/tmp/x" and manifest["config"]["tags"] == ["a", "b"]


def test_extra_rules_mask_a_producers_own_locations() -> None:
    manifest, _ = _build({"auth": {"token": SECRET}}, extra_rules=["auth.token"])
    assert manifest["config"]["auth"] == {"token": MASK}


def test_clean_file_without_comments_kept_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_bytes(CLEAN_TOML.replace(b"\n", b"\r\n"))
    manifest, warnings = _build(config_file=str(path))
    assert warnings == []
    assert manifest["config_source"] == {
        "format": "toml", "text": CLEAN_TOML.replace(b"\n", b"\r\n").decode(), "filename": "eval.toml",
    }
    json_path = tmp_path / "eval.json"
    json_path.write_text('{"model": "m", "client": {"headers": {}}}\n', encoding="utf-8")
    manifest, warnings = _build(config_file=json_path)
    assert warnings == [] and manifest["config_source"]["format"] == "json"
    assert manifest["config_source"]["text"] == json_path.read_text(encoding="utf-8")


TABLE_CASES = {
    "client.headers": '[client.headers]\nX-Key = "{s}"\n',
    "env.solver.client.headers": '[env.solver.client.headers]\nX-Key = "{s}"\n',
    "env.taskset.task.judges[1].headers": (
        '[[env.taskset.task.judges]]\nmodel = "a"\n\n[[env.taskset.task.judges]]\nmodel = "b"\n'
        'headers = {{ Authorization = "{s}" }}\n'
    ),
    "env.user.harness.env": '[env.user.harness.env]\nTOKEN = "{s}"\n',
}


@pytest.mark.parametrize("table", sorted(TABLE_CASES))
def test_file_with_a_credential_table_is_left_out_naming_the_table(tmp_path: Path, table: str) -> None:
    path = tmp_path / "eval.toml"
    base = CLEAN_TOML.decode().replace("headers = {}\n", "")  # so the table may be declared
    path.write_text(base + TABLE_CASES[table].format(s=SECRET), encoding="utf-8")
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest
    assert len(warnings) == 1 and table in warnings[0] and "eval.toml" in warnings[0]
    assert SECRET not in warnings[0] and SECRET.encode() not in orjson.dumps(manifest)


def test_reference_example_and_a_resumed_full_dump_are_left_out(tmp_path: Path) -> None:
    manifest, warnings = _build(config_file=FIXTURES / "eval_example.toml")
    assert "config_source" not in manifest
    assert "client.headers" in warnings[0] and "env.solver.harness.env" in warnings[0]
    assert "EXAMPLE" not in warnings[0]
    dump = tmp_path / "eval.json"  # a resumed run's configs/eval.json: a full dump
    dump.write_text(json.dumps({"client": {"headers": {}}, "env": {"solver": {"harness": {"env": {"K": SECRET}}}}}))
    manifest, warnings = _build(config_file=dump)
    assert "config_source" not in manifest and "env.solver.harness.env" in warnings[0]


def test_unreadable_file(tmp_path: Path) -> None:
    manifest, warnings = _build(config_file=tmp_path / "missing.toml")
    assert "config_source" not in manifest and "cannot be read" in warnings[0]
    manifest, warnings = _build(config_file=tmp_path)  # a directory
    assert "config_source" not in manifest and "cannot be read" in warnings[0]


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_bytes(b'model = "caf\xe9"\n')
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest and "not UTF-8" in warnings[0]


def test_file_over_256_kib(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    line = b"# padding\n"
    path.write_bytes(line * (MAX_CONFIG_SOURCE_BYTES // len(line)) + b"x = 12345\n")
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest and "over 256 KiB" in warnings[0]
    path.write_bytes(b'x = "' + b"a" * (MAX_CONFIG_SOURCE_BYTES - 7) + b'"\n')  # exactly the limit: kept
    manifest, warnings = _build(config_file=path)
    assert warnings == [] and len(manifest["config_source"]["text"]) == MAX_CONFIG_SOURCE_BYTES


@pytest.mark.parametrize("name,text,kind", [
    ("eval.toml", f'model = "m"\n[client.headers\nX = "{SECRET}"\n', "TOML"),
    ("eval.json", f'{{"client": {{"headers": {{"X": "{SECRET}"}}}}', "JSON"),
])
def test_unparsable_file(tmp_path: Path, name: str, text: str, kind: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest
    assert f"does not parse as {kind}" in warnings[0] and SECRET not in warnings[0]


def test_yaml_cannot_be_checked_so_it_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "eval.yaml"
    path.write_text("model: m\n", encoding="utf-8")
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest and "cannot be checked" in warnings[0]


def test_v0_metadata(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_bytes(CLEAN_TOML)
    config = {"client": {"headers": {"X": SECRET}}, "num_tasks": 20}
    manifest, _ = _build(config, config_file=path)
    metadata = v0_metadata(manifest)
    assert metadata == {
        "client": {"headers": {"X": MASK}}, "num_tasks": 20, "model": "Qwen/Qwen3-8B",
        "num_examples": 20, "rollouts_per_example": 3,
        "config_source": manifest["config_source"], "local_run_id": "run-1",
    }
    manifest, _ = _build({}, num_examples=None)
    assert v0_metadata(manifest) == {"model": "Qwen/Qwen3-8B", "num_examples": -1,
                                     "rollouts_per_example": 3, "local_run_id": "run-1"}


def test_the_api_key_never_enters_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_API_KEY", SECRET)
    path = tmp_path / "eval.toml"
    path.write_text('api_key_var = "PRIME_API_KEY"\n', encoding="utf-8")
    config = {"client": {"api_key_var": "PRIME_API_KEY", "headers": {"Authorization": SECRET}}}
    manifest, warnings = _build(config, config_file=path)
    blob = orjson.dumps([manifest, v0_metadata(manifest), warnings])
    assert SECRET.encode() not in blob
    assert manifest["config"]["client"]["api_key_var"] == "PRIME_API_KEY"
    assert os.environ["PRIME_API_KEY"] == SECRET


COMMENTED_TOML = """\
# launched with: eval @ eval.toml   (my key is sk-COMMENTSECRET1, do not share)
model = "m"    # token: sk-COMMENTSECRET2
url = "https://host/#not-a-comment"  \t# sk-COMMENTSECRET3
quote = 'a "# literal'
[client]
  # headers were {Authorization = "Bearer sk-COMMENTSECRET4"}
base_url = "http://x" # sk-COMMENTSECRET5
note = \"\"\"
# a line of a string, not a comment
\\"\"\" still # the string \"\"\"\"  # sk-COMMENTSECRET6
lit = \'\'\'# also kept\'\'\'
"""

UNCOMMENTED_TOML = """\
model = "m"
url = "https://host/#not-a-comment"
quote = 'a "# literal'
[client]
base_url = "http://x"
note = \"\"\"
# a line of a string, not a comment
\\"\"\" still # the string \"\"\"\"
lit = \'\'\'# also kept\'\'\'
"""


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_toml_files_comments_never_travel(tmp_path: Path, newline: str) -> None:
    """config_source is the file with its comments dropped: a secret in a comment is not in
    the parse, so nothing else could have checked it. Every other byte is kept."""
    path = tmp_path / "eval.toml"
    path.write_bytes(COMMENTED_TOML.replace("\n", newline).encode())
    manifest, warnings = _build(config_file=path)
    assert warnings == []
    text = manifest["config_source"]["text"]
    assert "COMMENTSECRET" not in text
    assert text == UNCOMMENTED_TOML.replace("\n", newline)
    import tomllib

    assert tomllib.loads(text) == tomllib.loads(COMMENTED_TOML)


def test_a_json_file_repeating_a_key_is_left_out(tmp_path: Path) -> None:
    """json keeps the last of two equal keys, so the first would travel unchecked."""
    path = tmp_path / "eval.json"
    path.write_text('{"client": {"headers": {"X": "%s"}}, "client": {}}' % SECRET, encoding="utf-8")
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest
    assert warnings == ["config_source left out: eval.json gives the key client twice in one object"]


@pytest.mark.parametrize("where", ["client.api_key", "client.base_url"])
def test_a_file_with_a_key_or_a_url_credential_is_left_out_naming_it(tmp_path: Path, where: str) -> None:
    path = tmp_path / "eval.toml"
    value = SECRET if where == "client.api_key" else f"https://u:{SECRET}@host/v1"
    path.write_text(f'[client]\n{where.split(".")[1]} = "{value}"\n', encoding="utf-8")
    manifest, warnings = _build(config_file=path)
    assert "config_source" not in manifest and where in warnings[0] and SECRET not in warnings[0]
