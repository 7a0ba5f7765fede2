"""A credential location's name matches in any spelling: ``Headers``, ``HEADERS``,
``extraHeaders``, ``Env_Vars``, ``API-KEY`` hold secrets as surely as their lower-case
forms (docs/masking.md, "Where credentials sit").

Each case writes a real run through the public API (``open_run`` with the config and its
launch file, ``Run.log_episodes`` with the same seat config in a trace) and reads every
byte of the run folder: the secret is absent. Then what follows masking: the terminal of
``prime-runs eval`` and an episode's error messages.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from prime_runs_spool import open_run, read_run
from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.runner.terminal_mask import MaskedStream, TerminalMask
from support.files import all_bytes_under

SECRET = "sk-SPELLED-0123456789"

#: Each location as a user may spell it, with a secret under it. Entries of the tables are
#: named plainly (``X-Team``, ``MY_DIR``), so no name rule can mask them: only the location.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("Headers", {"client": {"Headers": {"X-Team": SECRET}}}),
    ("HEADERS", {"client": {"HEADERS": {"X-Team": SECRET}}}),
    ("Headers as one string", {"client": {"Headers": f"X-Team: {SECRET}"}}),
    ("Extra-Headers", {"client": {"Extra-Headers": {"X-Team": SECRET}}}),
    ("extraHeaders", {"sampling_args": {"extraHeaders": {"X-Team": SECRET}}}),
    ("DEFAULT_HEADERS", {"client": {"DEFAULT_HEADERS": {"X-Team": SECRET}}}),
    ("defaultHeaders", {"client": {"defaultHeaders": {"X-Team": SECRET}}}),
    ("Default_Query", {"client": {"Default_Query": {"key": SECRET}}}),
    ("EXTRA_QUERY", {"client": {"EXTRA_QUERY": {"key": SECRET}}}),
    ("Harness.Env", {"Harness": {"Env": {"MY_DIR": SECRET}}}),
    ("HARNESS.ENV", {"HARNESS": {"ENV": {"my_dir": SECRET}}}),
    ("Runtime.ENV", {"Runtime": {"ENV": {"MY_DIR": SECRET}}}),
    ("Env_Vars", {"Env_Vars": {"MY_DIR": SECRET}}),
    ("envVars", {"envVars": {"MY_DIR": SECRET}}),
    ("ENVIRONMENT_VARIABLES", {"ENVIRONMENT_VARIABLES": {"MY_DIR": SECRET}}),
    ("ENV table", {"sandbox": {"ENV": {"MY_DIR": SECRET}}}),
    ("Envs table", {"sandbox": {"Envs": {"MY_DIR": SECRET}}}),
    ("Environment table", {"sandbox": {"Environment": {"MY_DIR": SECRET}}}),
    ("ENV list", {"sandbox": {"ENV": [f"MY_DIR={SECRET}"]}}),
    ("Environment list", {"sandbox": {"Environment": [{"name": "MY_DIR", "value": SECRET}]}}),
    ("API_KEY", {"client": {"API_KEY": SECRET}}),
    ("Api-Key", {"client": {"Api-Key": SECRET}}),
    ("AUTH_TOKEN", {"client": {"AUTH_TOKEN": SECRET}}),
    ("AzureAdToken", {"client": {"AzureAdToken": SECRET}}),
]


@pytest.mark.parametrize("seat", [config for _, config in CASES], ids=[name for name, _ in CASES])
def test_a_secret_under_any_spelling_of_a_location_never_reaches_the_spool(tmp_path: Path, seat: dict) -> None:
    config = {"model": "m", **seat, "env": {"solver": seat}}
    launch = tmp_path / "eval.json"
    launch.write_text(json.dumps(config), encoding="utf-8")
    run_dir = tmp_path / "outputs" / "run"
    with open_run(run_dir, name="spelled", config=config, config_file=launch) as run:
        run.log_episodes([{"id": "e1", "ok": True, "traces": [{"agent": {"config": seat}}]}])
    assert SECRET.encode() not in all_bytes_under(run_dir)
    spool = read_run(run_dir)
    assert "config_source" not in spool.manifest  # the launch file sets a credential location
    assert MASK in json.dumps(spool.manifest["config"]) and MASK in json.dumps(list(spool.episodes()))


def test_a_toml_launch_file_with_a_capitalized_headers_table_stays_home(tmp_path: Path) -> None:
    launch = tmp_path / "eval.toml"
    launch.write_text(f'model = "m"\n[client.Headers]\nX-Team = "{SECRET}"\n', encoding="utf-8")
    with open_run(tmp_path / "run", name="toml", config_file=launch) as run:
        run.log_episodes([{"id": "e1", "ok": True}])
    assert SECRET.encode() not in all_bytes_under(tmp_path / "run")
    assert "config_source" not in read_run(tmp_path / "run").manifest


def test_an_error_message_quoting_a_value_of_a_capitalized_table_is_cleared(tmp_path: Path) -> None:
    """Error scrubbing takes the values masking found: it follows the spellings."""
    seat = {"client": {"HEADERS": {"X-Team": SECRET + "\n"}}}
    quoted = f"Illegal header value b'{SECRET}\\n'"
    episode = {"id": "e1", "ok": False, "errors": [quoted],
               "traces": [{"agent": {"config": seat}, "errors": [quoted]}]}
    with open_run(tmp_path / "run", name="err") as run:
        run.log_episodes([episode])
    assert SECRET.encode() not in all_bytes_under(tmp_path / "run")
    (written,) = read_run(tmp_path / "run").episodes()
    assert written["errors"] == [f"Illegal header value b'{MASK}'"]


def test_the_terminal_of_an_eval_masks_a_value_of_a_capitalized_table(tmp_path: Path) -> None:
    """The terminal mask takes the values masking found in the launch file: it follows too."""
    launch = tmp_path / "eval.toml"
    launch.write_text(f'model = "m"\n[client.Headers]\nX-Team = "{SECRET}"\n', encoding="utf-8")
    mask = TerminalMask()
    mask.add_launch_file(str(launch))
    out = io.StringIO()
    MaskedStream(out, mask).write(f'{{"headers": {{"X-Team": "{SECRET}"}}}}\n')
    assert SECRET not in out.getvalue() and MASK in out.getvalue()
