"""The command line's conventions, run as a user runs it: ``-o/--output json`` as the prime
CLI spells it (``--json`` kept), an Examples section in each command's help, ``verify``
defaulting to ``.`` like the others, counts in good English, and the local platform's
database in the user's data folder, shared by ``sync --local`` and ``platform serve``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest

from support.env import CLI, REPO_ROOT, VF040, child_env
from support.runs import build_run
from support.unprivileged import AS_UNPRIVILEGED, SKIP_REASON
from support.cli import last_line, run_cli
from support.odd_files import ODD_NAME, odd_tree  # noqa: F401 (a fixture)


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=child_env(**env))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("conventions") / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "outputs", root)
    build_run(root / "one-episode", "one-episode", 1)
    return root


def test_verify_defaults_to_the_current_folder(outputs: Path) -> None:
    done = cli("verify", cwd=outputs)
    assert done.returncode == 0, done.stderr
    assert "one-episode" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("command", [["status"], ["verify"], ["sync", "--dry-run"]])
def test_dash_o_json_is_the_json_report(outputs: Path, command: list[str]) -> None:
    by_flag = cli(*command, str(outputs), "--json", HOME=str(outputs.parent))
    by_output = cli(*command, str(outputs), "-o", "json", HOME=str(outputs.parent))
    table = cli(*command, str(outputs), "--output", "table", HOME=str(outputs.parent))
    assert by_output.returncode == by_flag.returncode, by_output.stderr
    assert json.loads(by_output.stdout).keys() == json.loads(by_flag.stdout).keys()
    assert not table.stdout.lstrip().startswith("{")


def test_mirror_dash_o_json_is_its_json_lines(tmp_path: Path) -> None:
    """``mirror`` takes ``-o/--output`` as the others do: ``-o json`` prints the JSON line
    per run that ``--json`` prints, ``--output table`` the lines a person reads. Each into
    a store of its own (file://), so each pass has everything to upload. Runs written as
    today masks (the fixtures' older spools are not mirrored: tests/test_mirror_masking.py)."""
    from support.runs import build_run

    outputs = tmp_path / "outputs"
    for number in range(3):
        build_run(outputs / f"run-{number}", f"conventions-{number}", 2)
    runs: dict[str, list[str]] = {}
    for name, flags in (("flag", ["--json"]), ("output", ["-o", "json"]), ("table", ["--output", "table"])):
        done = cli("mirror", str(outputs), f"file://{tmp_path / name}", "--once", *flags)
        assert done.returncode == 0, done.stderr
        runs[name] = done.stdout.splitlines()
    assert len(runs["output"]) == len(runs["flag"]) == len(runs["table"]) > 0
    by_flag, by_output = ([json.loads(line) for line in runs[name]] for name in ("flag", "output"))
    assert [set(r) for r in by_output] == [set(r) for r in by_flag]
    assert sorted(r["path"] for r in by_output) == sorted(r["path"] for r in by_flag)
    assert all(line.startswith("uploaded ") for line in runs["table"]), runs["table"]


def test_status_counts_in_good_english(outputs: Path) -> None:
    done = cli("status", str(outputs / "one-episode"))
    assert "1 episode in 1 segment" in done.stdout, done.stdout
    assert "1 episodes" not in done.stdout and "segment(s)" not in done.stdout


def test_verify_counts_in_good_english(outputs: Path) -> None:
    """``verify`` said "1 segment(s), 3 records, 1 episodes" and "1 run(s) verified"."""
    done = cli("verify", str(outputs / "one-episode"))
    assert done.returncode == 0, done.stderr
    assert "1 segment, 3 records, 1 episode\n" in done.stdout, done.stdout
    assert "ok: 1 run verified" in done.stdout, done.stdout
    assert not re.search(r"\b1 (episodes|records|runs)\b|\((s|es)\)", done.stdout), done.stdout


def test_import_counts_in_good_english(tmp_path: Path) -> None:
    """``import`` said "N episode(s) added"."""
    shutil.copytree(VF040, tmp_path / "run")
    done = cli("import", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert re.search(r"imported +\S+: \d+ episodes added, \d+ in the spool", done.stdout), done.stdout
    assert "(s)" not in done.stdout.splitlines()[0], done.stdout



def test_export_counts_in_good_english(outputs: Path, tmp_path: Path) -> None:
    """``export`` said "exported 1 row(s) from 1 run(s)"."""
    done = cli("export", str(outputs / "one-episode"), "-o", str(tmp_path / "rows.jsonl"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"exported 1 row from 1 run to "), done.stdout


#: A count spelled "run(s)", "file(s) or folder(s)" in a message: never, a count says which.
HEDGED_PLURAL = re.compile(r"[a-z]\((s|es)\)")


def test_no_message_hedges_a_plural() -> None:
    """Every string the package and its command line print counts with prime_runs_spool/plural.py
    ("1 run", "6 runs"); "interrupted: 0 run(s) done" and "N of M run(s)" were left over.
    Docstrings and comments are not read (only what may be printed), nor "http(s)"."""
    import ast

    hedged = []
    for path in sorted([*(REPO_ROOT / "prime_runs_spool").rglob("*.py"), *(REPO_ROOT / "commands").glob("*.py")]):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                for found in HEDGED_PLURAL.finditer(node.value.replace("http(s)", "")):
                    hedged.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {node.value[max(0, found.start() - 20):found.end()]!r}")
    assert hedged == []


def test_no_message_spells_its_own_plural() -> None:
    """A count's word is plural.py's to choose: an ``"" if n == 1 else "s"`` (or "is"/"are",
    "it"/"them") written beside a message is a second spelling of that rule, one that
    drifts (a noun whose plural is not its singular and an "s")."""
    import ast

    pairs = ({"", "s"}, {"", "es"}, {"is", "are"}, {"was", "were"}, {"it", "them"}, {"y", "ies"})
    spelled = []
    for path in sorted([*(REPO_ROOT / "prime_runs_spool").rglob("*.py"), *(REPO_ROOT / "commands").glob("*.py")]):
        if path.name == "plural.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.IfExp) and isinstance(node.body, ast.Constant)
                    and isinstance(node.orelse, ast.Constant) and {node.body.value, node.orelse.value} in pairs):
                spelled.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert spelled == [], "count with prime_runs_spool/plural.py"


def test_counts_say_one_or_many() -> None:
    from prime_runs_spool.plural import count, episodes, plural

    assert [count(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert count(1, "file or folder", "files or folders") == "1 file or folder"
    assert count(3, "file or folder", "files or folders") == "3 files or folders"
    assert [plural(n, "is", "are") for n in (1, 2)] == ["is", "are"]
    assert [episodes(n) for n in (1, 5)] == ["1 episode", "5 episodes"]


@pytest.mark.slow
def test_a_launch_file_left_out_for_its_credentials_is_a_note_not_a_warning(tmp_path: Path) -> None:
    """The eval logs it as info; import (and the sync that imports) printed it as a warning
    for every run, though nothing is wrong: the masking did its job."""
    for command in (["import"], ["sync", "--local", "--db", str(tmp_path / "platform.db")]):
        shutil.copytree(VF040, tmp_path / command[0])
        done = cli(*command, str(tmp_path / command[0]), HOME=str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert "  note: config_source left out: eval.toml sets the credential table" in done.stdout, done.stdout
        assert "warning" not in done.stdout.lower(), done.stdout


@pytest.mark.parametrize("command", [["sync"], ["verify"], ["status"], ["import"], ["view"], ["mirror"],
                                     ["export"], ["platform", "serve"], ["eval"], ["ci-script"]])
def test_each_command_has_examples_in_its_help(command: list[str]) -> None:
    """``eval --help`` prints its own text (the command's docstring is never shown)."""
    done = cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Examples:" in done.stdout and f"prime-runs {' '.join(command)} " in done.stdout.split("Examples:")[1]


@pytest.mark.parametrize("command", [[], ["sync"], ["verify"], ["status"], ["import"], ["view"], ["mirror"],
                                     ["export"], ["platform"], ["platform", "serve"], ["eval"], ["ci-script"]])
def test_each_help_ends_with_a_link_to_the_docs_that_opens(command: list[str]) -> None:
    """Help named ``docs/sync.md``, a path in a checkout the user may not have (and not in the
    current folder): now every help ends with a ``file://`` link, whole on its line, to a page
    that exists, and names no other page by a relative path."""
    done = cli(*command, "--help", cwd=Path("/"))
    assert done.returncode == 0, done.stderr
    last = done.stdout.rstrip().splitlines()[-1].strip()
    assert last.startswith("file://") and last.endswith("/cli.md"), done.stdout
    assert Path(urllib.parse.urlparse(last).path).is_file(), last
    before_the_link = done.stdout.rstrip().rsplit("\n", 1)[0]  # a checkout's path may hold "-docs/"
    assert not re.search(r"(?<![/\w])docs/\w", before_the_link), done.stdout


def test_sync_names_a_path_that_does_not_exist_before_asking_for_a_key(tmp_path: Path) -> None:
    """With no key and a mistyped path, sync said only "no API key": the user set one up and
    ran it again, to learn then that the path was wrong."""
    done = cli("sync", str(tmp_path / "outptus"), HOME=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"prime-runs: {tmp_path / 'outptus'}: no such file or directory", done.stderr


def test_a_dry_run_says_would_push_not_pushed(tmp_path: Path) -> None:
    """``sync --dry-run`` said "pushed 6 (total 0)" for samples it never sent."""
    build_run(tmp_path / "runs" / "r", "dry-run-words", 3)
    done = cli("sync", str(tmp_path / "runs"), "--dry-run", HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("dry_run ") and "would push 3 (0 pushed before)" in line, line
    assert " pushed 3" not in line, line


@pytest.mark.slow
def test_a_json_sync_of_an_empty_artifact_names_the_path_in_its_report(tmp_path: Path) -> None:
    """A CI step reading the JSON report of an artifact unpacked to the wrong path got
    ``{"runs": [], "ok": false}``: no word of why; verify's and import's name the path."""
    (tmp_path / "artifact").mkdir()
    build_run(tmp_path / "outputs" / "r", "json-empty-artifact", 1)
    done = cli("sync", str(tmp_path / "artifact"), str(tmp_path / "outputs"), "--dry-run", "-o", "json",
               HOME=str(tmp_path))
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["paths_without_runs"] == [str(tmp_path / "artifact")], report
    assert [run["state"] for run in report["runs"]] == ["dry_run"]
    allowed = cli("sync", str(tmp_path / "artifact"), "--dry-run", "-o", "json", "--allow-empty", HOME=str(tmp_path))
    assert allowed.returncode == 0 and json.loads(allowed.stdout)["paths_without_runs"] == [str(tmp_path / "artifact")]


def test_a_json_status_of_an_empty_artifact_names_the_path_in_its_report(tmp_path: Path) -> None:
    """status exits 1 for a path with nothing under it, and its JSON report said
    ``{"runs": [], "not_spooled": []}``: no word of why, where verify's, import's and sync's
    name the path."""
    (tmp_path / "artifact").mkdir()
    build_run(tmp_path / "outputs" / "r", "json-status-empty-artifact", 1)
    done = cli("status", str(tmp_path / "artifact"), str(tmp_path / "outputs"), "-o", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["paths_without_runs"] == [str(tmp_path / "artifact")], report
    assert [run["run_id"] for run in report["runs"]] == ["json-status-empty-artifact"]


def test_sync_help_says_where_the_key_comes_from() -> None:
    text = " ".join(cli("sync", "--help").stdout.split())
    assert "PRIME_API_KEY" in text and "~/.prime/config.json" in text


@pytest.mark.slow
def test_the_local_platforms_database_is_in_the_data_folder_and_shared(tmp_path: Path) -> None:
    build_run(tmp_path / "runs" / "r", "local-db-place", 2)
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    env = {"HOME": str(home), "XDG_DATA_HOME": str(data)}
    done = cli("sync", str(tmp_path / "runs"), "--local", **env)
    assert done.returncode == 0, done.stderr
    database = data / "prime-runs" / "local-platform.db"
    assert database.is_file()
    assert not (home / ".prime").exists()
    served = subprocess.Popen(CLI + ["platform", "serve", "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env(**env))
    try:
        base = served.stdout.readline().strip()
        import httpx

        page = httpx.get(f"{base}/api/v1/evaluations/", timeout=30).json()
        assert page["total"] == 1, page  # what sync --local wrote, served by default
    finally:
        served.terminate()
        served.wait(30)


@pytest.mark.skipif(AS_UNPRIVILEGED is None, reason=SKIP_REASON)
@pytest.mark.slow
def test_a_home_that_cannot_be_written_is_one_line_saying_what_to_give_instead(tmp_path: Path) -> None:
    """A user whose HOME cannot be written (a service account's, a read-only home in a
    container): the default database's folder cannot be made. Each command says which
    folder, why, and what to give instead; it said only 'cannot create DIR: Permission denied'."""
    build_run(tmp_path / "runs" / "r", "home-not-writable", 2)
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    env = child_env(HOME=str(home))
    for name in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "PRIME_RUNS_LOCAL_DB"):
        env.pop(name, None)

    def as_user(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AS_UNPRIVILEGED, *CLI, *args], capture_output=True, text=True, timeout=120, env=env)

    folder = home / ".local" / "share" / "prime-runs"
    said = (f"prime-runs: cannot create {folder} for the default database: Permission denied; give --db FILE in a "
            "folder you can write (or set PRIME_RUNS_LOCAL_DB=FILE)\n")
    for done in (as_user("sync", str(tmp_path / "runs"), "--local"), as_user("platform", "serve", "--port", "0")):
        assert (done.returncode, done.stderr) == (2, said), done.stderr
    # Given a database, the copy lock's folder in the cache is the next thing HOME refuses: named too.
    done = as_user("sync", str(tmp_path / "runs"), "--local", "--db", str(tmp_path / "local.db"))
    assert done.returncode == 1 and "set XDG_CACHE_HOME to a writable folder" in done.stdout, done.stdout
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = as_user("sync", str(tmp_path / "runs"), "--local", "--db", str(tmp_path / "local.db"))
    assert done.returncode == 0 and done.stdout.startswith("synced"), done.stdout + done.stderr


@pytest.mark.slow
def test_sync_follow_local_says_how_to_open_its_links(tmp_path: Path) -> None:
    """``sync --local`` ends with the command that serves what it wrote (its links name
    that port); ``--follow --local`` printed the links and never that line."""
    build_run(tmp_path / "runs" / "r", "follow-local-browse", 2)
    db = tmp_path / "platform.db"
    done = cli("sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--follow", "--exit-when-idle",
               HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"browse with: prime-runs platform serve --db {db} --port 8765" in done.stdout.splitlines(), done.stdout
    assert "http://127.0.0.1:8765/dashboard/evaluations/" in done.stdout, done.stdout


@pytest.mark.parametrize("command", ["verify", "status"])
def test_a_json_report_names_a_folder_whose_name_is_not_utf8(odd_tree: Path, command: str) -> None:
    """orjson refuses the surrogates such a name decodes to: `--json` ended in a traceback
    and the report of every other run was lost with it."""
    result = run_cli(command, "--json", str(odd_tree))
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(result.stdout)
    paths = sorted(run.get("run_dir") or run.get("path") for run in document["runs"])
    assert paths == [f"{odd_tree}/plain", f"{odd_tree}/run-\\xff\\xfe"], paths
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_json_import_and_sync_report_name_a_folder_whose_name_is_not_utf8(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    shutil.copytree(VF040, root / ODD_NAME)
    imported = run_cli("import", "--json", str(root))
    assert "Traceback" not in imported.stderr, imported.stderr
    assert [r["state"] for r in json.loads(imported.stdout)["imports"]] == ["imported"]
    synced = run_cli("sync", "--local", "--db", str(tmp_path / "local.db"), "--json", str(root))
    assert "Traceback" not in synced.stderr, synced.stderr
    document = json.loads(synced.stdout)
    assert [r["state"] for r in document["runs"]] == ["synced"], document
    assert document["runs"][0]["path"].endswith("run-\\xff\\xfe")


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet"])
def test_an_export_of_runs_names_a_folder_whose_name_is_not_utf8(odd_tree: Path, tmp_path: Path, suffix: str) -> None:
    """The runs table's ``path`` held the name's surrogates, which no file format writes:
    'prime-runs: internal error: UnicodeEncodeError' (TypeError for JSON lines, Arrow's for
    Parquet), no file, and the other runs' rows lost with it."""
    out = tmp_path / f"runs.{suffix}"
    done = run_cli("export", str(odd_tree), "--runs", "-o", str(out))
    assert done.returncode == 0 and "internal error" not in done.stderr, done.stderr
    import duckdb

    paths = sorted(row[0] for row in duckdb.sql(f"select path from '{out}'").fetchall())
    assert paths == [f"{odd_tree}/plain", f"{odd_tree}/run-\\xff\\xfe"], paths


@pytest.mark.slow
def test_a_resync_once_the_files_settled_keeps_going_past_a_folder_whose_name_is_not_utf8(tmp_path: Path) -> None:
    """The caches of runs (and eval outputs) found up to date keep each by its path, and
    orjson refused the surrogates of such a name: once the files had settled, every later
    sync ended in 'prime-runs: internal error: TypeError: str is not valid UTF-8', exit 1,
    and with plain vf-eval outputs there, before anything was pushed, for every run."""
    root = tmp_path / "outputs"
    build_run(root / ODD_NAME, "odd-spooled", 2)
    shutil.copytree(VF040, root / os.fsdecode(b"vf-\xff"))
    db, env = str(tmp_path / "local.db"), {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = run_cli("sync", "--local", "--db", db, str(root), **env)
    assert first.returncode == 0, first.stderr
    build_run(root / "later", "later-plain", 1)  # a run to push after the settling
    time.sleep(2.2)  # sync/unchanged.py's SETTLED: only files quiet that long are kept
    for _ in range(2):  # the first keeps what it found up to date, the second is answered from it
        again = run_cli("sync", "--local", "--db", db, str(root), **env)
        assert again.returncode == 0 and "internal error" not in again.stderr, again.stderr
    assert [line.split()[0] for line in again.stdout.splitlines()[:3]] == ["up_to_date"] * 3, again.stdout


def test_a_base_url_with_a_password_is_a_usage_error_that_does_not_show_it(tmp_path: Path) -> None:
    """It was taken: httpx sent the userinfo as Basic auth in place of the API key (401), and
    a platform that took it would have had the password written into the state file's
    destination."""
    build_run(tmp_path / "runs" / "r", "userinfo-url", 1)
    result = run_cli("sync", str(tmp_path / "runs"), "--base-url", "http://someone:pw-s3cret@127.0.0.1:9",
                  "--max-attempts", "1", PRIME_API_KEY="key")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "pw-s3cret" not in result.stdout + result.stderr
    assert "user:password@" in result.stderr.strip().splitlines()[-1]
    assert not list((tmp_path / "runs" / "r" / "spool").glob("sync/*.json"))


@pytest.mark.parametrize("key", ["sk-bad\r\nX-Injected: yes", "sk-bad key", "sk-bad-\u00e9"])
def test_an_api_key_no_header_can_carry_is_a_usage_error_that_does_not_show_it(tmp_path: Path, key: str) -> None:
    """httpx failed on every request with it, which sync took for a lost answer ("no answer
    (LocalProtocolError)": retried, fences waited out) or an internal error."""
    build_run(tmp_path / "runs" / "r", "bad-key", 1)
    result = run_cli("sync", str(tmp_path / "runs"), "--base-url", "http://127.0.0.1:9", "--max-attempts", "1",
                  PRIME_API_KEY=key)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "sk-bad" not in result.stdout + result.stderr
    assert "PRIME_API_KEY" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "env", "source"), [
    ([], {"PRIME_TEAM_ID": "team-1\nx"}, "PRIME_TEAM_ID"),
    (["--team", "team 1"], {}, "--team"),
])
def test_a_team_id_no_header_can_carry_is_a_usage_error(tmp_path: Path, argv: list[str], env: dict[str, str],
                                                        source: str) -> None:
    """The team goes in Prime Traces' X-Prime-Team-ID header: a team id with a line break (a
    CI secret pasted with it) or a space failed every upload as 'no answer
    (LocalProtocolError)', in doubt, retried for 90 s, then exit 1 with the evaluation made.
    One line naming where it came from, exit 2, before anything is written."""
    build_run(tmp_path / "runs" / "r", "bad-team", 1)
    result = run_cli("sync", str(tmp_path / "runs"), "--base-url", "http://127.0.0.1:9", "--max-attempts", "1",
                     *argv, PRIME_API_KEY="key", **env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"prime-runs: the team id ({source}) holds a character an HTTP header cannot carry"), line
    assert not (tmp_path / "runs" / "r" / "spool" / "sync").exists()


def test_a_team_id_pasted_with_its_line_feed_is_used_without_it() -> None:
    from prime_runs_spool.platform_api.settings import load_settings

    settings = load_settings(env={"PRIME_TEAM_ID": "team-1\n", "HOME": "/nonexistent"})
    assert settings.team_id == "team-1"


def test_an_api_key_pasted_with_its_line_feed_is_used_without_it() -> None:
    from prime_runs_spool.platform_api.settings import load_settings

    settings = load_settings(env={"PRIME_API_KEY": "sk-good\n", "HOME": "/nonexistent"})
    assert settings.api_key is not None and settings.api_key.reveal() == "sk-good"


@pytest.mark.parametrize(("argv", "env"), [
    (["--request-lifetime", "nan"], {}),        # NaN passes FloatRange: every fence ended at once
    ([], {"PRIME_RUNS_REQUEST_LIFETIME": "nan"}),
    (["--timeout", "inf"], {}),                 # internal error: OverflowError
    (["--timeout", "nan"], {}),
    (["--backoff-cap", "nan"], {}),
])
@pytest.mark.parametrize("entry", ["prime-runs", "shipper"])
def test_seconds_that_are_not_finite_are_a_usage_error(tmp_path: Path, argv: list[str], env: dict[str, str],
                                                       entry: str) -> None:
    import sys

    build_run(tmp_path / "runs" / "r", "nan-seconds", 1)
    command = CLI + ["sync"] if entry == "prime-runs" else [sys.executable, "-m", "prime_runs_spool.sync"]
    result = subprocess.run(command + [str(tmp_path / "runs"), "--base-url", "http://127.0.0.1:9",
                                       "--max-attempts", "1", *argv],
                            capture_output=True, text=True, timeout=30, env=child_env(PRIME_API_KEY="key", **env))
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "finite" in result.stderr


@pytest.mark.parametrize(("argv", "env", "said"), [
    (["--request-lifetime", "abc"], {}, "'--request-lifetime': 'abc' is not a number of seconds (e.g. 600 or 2.5)"),
    ([], {"PRIME_RUNS_REQUEST_LIFETIME": "abc"},
     "'--request-lifetime': 'abc' is not a number of seconds (e.g. 600 or 2.5) (from PRIME_RUNS_REQUEST_LIFETIME)"),
    (["--copy-wait", ""], {}, "'--copy-wait': '' is not a number of seconds (e.g. 600 or 2.5)"),
    (["--request-lifetime", "-1"], {}, "'--request-lifetime': -1 is below the least allowed, 0.1 s"),
    # A lifetime of 0 let no request that is not idempotent go (each one counted too old
    # before its last byte): a pass retried that for 80 s, and left the next sync a request
    # in doubt to wait out for the default lifetime, 600 s.
    (["--request-lifetime", "0"], {}, "'--request-lifetime': 0 is below the least allowed, 0.1 s"),
    ([], {"PRIME_RUNS_REQUEST_LIFETIME": "0"},
     "'--request-lifetime': 0 is below the least allowed, 0.1 s (from PRIME_RUNS_REQUEST_LIFETIME)"),
    (["--retry-for", "soon"], {}, "'--retry-for': 'soon' is not a duration (90, 90s, 5m, 1h)"),
    ([], {"PRIME_RUNS_SYNC_TO": "elsewhere"},
     "'--to': 'elsewhere' is not one of 'traces', 'samples', 'auto' (from PRIME_RUNS_SYNC_TO)"),
])
@pytest.mark.parametrize("entry", ["prime-runs", "shipper"])
def test_a_value_that_is_no_number_of_seconds_is_refused_in_one_line_that_reads_right(
        tmp_path: Path, argv: list[str], env: dict[str, str], said: str, entry: str) -> None:
    """click's own words were "'abc' is not a valid seconds." (and, from an environment
    variable, a period before the variable's name): a number of seconds is asked for in
    words, with an example, and the line has no stray period."""
    import sys

    command = CLI + ["sync"] if entry == "prime-runs" else [sys.executable, "-m", "prime_runs_spool.sync"]
    result = subprocess.run(command + [str(tmp_path), "--base-url", "http://127.0.0.1:9", *argv], capture_output=True,
                            text=True, timeout=30, env=child_env(PRIME_API_KEY="key", **env))
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    (line,) = result.stderr.splitlines()
    assert line.lower().startswith(f"prime-runs: invalid value for {said}".lower()), line
    assert "valid seconds" not in line and ". (" not in line and not line.endswith("."), line

@pytest.mark.slow
@pytest.mark.parametrize("command", [["status"], ["import"], ["sync", "--local", "--db", "{db}"]])
def test_the_other_commands_given_a_fifo_say_it_is_not_a_file_or_folder(tmp_path: Path, command: list[str]) -> None:
    os.mkfifo(tmp_path / "pipe")
    argv = [a.replace("{db}", str(tmp_path / "local.db")) for a in command]
    result = run_cli(*argv, str(tmp_path / "pipe"), timeout=30)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "it is a FIFO, not a regular file or folder" in last_line(result), result.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_mirror_interval_from_the_environment_is_checked_like_the_option(tmp_path: Path, value: str) -> None:
    """It was float(env) unchecked: NaN or a negative one made Event.wait return at once (a
    pass after pass, a listing each, as fast as the store answered), inf ended the mirror in
    an OverflowError traceback after its first pass."""
    build_run(tmp_path / "runs" / "r", "mirror-interval", 1)
    result = run_cli("mirror", "--once", str(tmp_path / "runs"), f"memory:///{uuid.uuid4().hex}", timeout=30,
                  PRIME_RUNS_MIRROR_INTERVAL=value)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "PRIME_RUNS_MIRROR_INTERVAL" in last_line(result), result.stderr


@pytest.mark.parametrize("command", [["verify"], ["status"], ["import"]])
def test_an_unexpected_error_in_any_command_is_one_line_not_a_traceback(tmp_path: Path, command: list[str],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Only `sync` turned a bug into one line; every other command printed the traceback."""
    import sys

    from commands import cli
    from prime_runs_spool.importer import paths as importer_paths
    from prime_runs_spool.spool import layout

    build_run(tmp_path / "runs" / "r", "unexpected", 1)

    def broken(*args: object, **kwargs: object):  # noqa: ANN202
        raise RuntimeError("a bug met on the way")

    monkeypatch.setattr(layout, "each_once", broken)
    monkeypatch.setattr(importer_paths, "each_once", broken)
    monkeypatch.setattr(sys, "argv", ["prime-runs", *command, str(tmp_path / "runs")])
    monkeypatch.delenv("PRIME_RUNS_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("prime-runs: internal error: RuntimeError: a bug met on the way "
                                            "(set PRIME_RUNS_TRACEBACK=1 for the traceback)")
    monkeypatch.setenv("PRIME_RUNS_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli.main()


#: Each command given a path that does not exist (after it, whatever else it needs).
WITH_A_MISSING_PATH = {"verify": [], "status": [], "sync": ["--dry-run"], "import": [], "view": [],
                       "export": ["-o", "{tmp}/rows.csv"], "mirror": ["file://{tmp}/mirror", "--once"]}
#: Each command given an option value (or an option, or a command) click refuses.
WITH_A_BAD_OPTION = {"sync": ["--to", "bogus"], "verify": ["-o", "yaml"], "status": ["--jsn"],
                     "import": ["--state-dir"], "export": ["--format", "xml", "-o", "x"], "mirror": ["--interval", "soon"],
                     "view": ["--port", "-5"], "platform serve": ["--port", "abc"], "platform": ["nosuch"], "": ["nosuch"],
                     "ci-script": ["--nosuch"]}


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed: on stderr, nothing on stdout, no traceback."""
    assert done.stdout == "" and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n"), done.stderr
    return done.stderr.rstrip("\n")


@pytest.mark.parametrize("command", sorted(WITH_A_MISSING_PATH))
def test_a_missing_path_is_one_line_with_the_one_prefix_and_exit_2(command: str, tmp_path: Path) -> None:
    """``verify`` said "path does not exist: P", the others "P: no such file or directory"."""
    missing = tmp_path / "no-such-folder"
    rest = [arg.format(tmp=tmp_path) for arg in WITH_A_MISSING_PATH[command]]
    done = cli(command, str(missing), *rest, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert one_error_line(done) == f"prime-runs: {missing}: no such file or directory"


@pytest.mark.parametrize("command", sorted(WITH_A_BAD_OPTION))
def test_a_usage_error_is_one_line_with_the_one_prefix_and_exit_2(command: str, tmp_path: Path) -> None:
    """Click printed its usage, a hint and "Error: ..." (four lines, another prefix); now one
    line that still names the fix (the command's --help)."""
    done = cli(*command.split(), *WITH_A_BAD_OPTION[command], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done)
    assert line.startswith("prime-runs: ") and line.endswith(f" {command} --help)".replace("  ", " ")), line


def test_verify_says_its_errors_with_the_one_prefix(tmp_path: Path) -> None:
    """``verify`` began its errors with "error:", every other command with "prime-runs:"."""
    done = cli("verify", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert one_error_line(done).startswith(f"prime-runs: {tmp_path}: nothing found"), done.stderr


def test_no_message_is_begun_by_hand() -> None:
    """One prefix (prime_runs_spool/errors.py, MESSAGE_PREFIX) for every command's lines on
    stderr: "error: ", "prime-runs eval: " and "prime-runs platform serve: error: " were
    three others. No string the package may print begins with one spelled out."""
    import ast

    by_hand = []
    for path in sorted([*(REPO_ROOT / "prime_runs_spool").rglob("*.py"), *(REPO_ROOT / "commands").glob("*.py")]):
        tree = ast.parse(path.read_text())
        read = {id(arg) for call in ast.walk(tree) if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("removeprefix", "startswith") for arg in call.args}  # a line read back
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in read:
                text = node.value if isinstance(node.value, str) else node.value.decode("utf-8", "replace")
                if re.match(r"\n?(prime-runs( [a-z ]+)?|error): ", text) and "MESSAGE_PREFIX =" not in path.read_text():
                    by_hand.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {text[:40]!r}")
    assert by_hand == []


@pytest.mark.parametrize("command", [["status"], ["verify"], ["import"], ["sync", "--dry-run"]], ids=" ".join)
def test_eval_outputs_in_a_folder_whose_name_is_not_utf8_with_a_state_dir(command: list[str], tmp_path: Path) -> None:
    """The state folder's key for such a source was the UTF-8 of its path, which it has not:
    "prime-runs: internal error: UnicodeEncodeError" from every command given --state-dir."""
    from prime_runs_spool.importer.places import source_key

    shutil.copytree(VF040, tmp_path / "outputs" / ODD_NAME)
    done = subprocess.run(CLI + [*command, str(tmp_path / "outputs"), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, errors="backslashreplace", timeout=120,
                          env=child_env(HOME=str(tmp_path)))
    assert done.returncode == 0 and "internal error" not in done.stderr, done.stderr
    assert "run-" in done.stdout, done.stdout
    plain = tmp_path / "plain"  # a UTF-8 name keeps the key it had: state folders made before still match
    assert source_key(plain) == hashlib.sha256(str(plain.resolve()).encode("utf-8")).hexdigest()[:16]
    assert source_key(tmp_path / ODD_NAME) != source_key(tmp_path / "run-??")  # and a name that is not has one


def test_view_export_to_a_folder_that_cannot_be_made_says_which_and_why(outputs: Path, tmp_path: Path) -> None:
    """It said "prime-runs: view --export: [Errno 20] Not a directory: '...'"; now told as the
    option's bad value, before anything is read."""
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "site"
    done = cli("view", str(outputs / "one-episode"), "--export", str(target))
    assert done.returncode == 2, done.stderr
    assert one_error_line(done).startswith(f"prime-runs: invalid value for '--export': no folder can be made at "
                                           f"'{target}': {tmp_path / 'a-file'} is a file, not a folder"), done.stderr


@pytest.mark.parametrize("value", ["", "  "])
def test_view_export_to_an_empty_value_is_bad_usage_and_writes_nothing(outputs: Path, tmp_path: Path,
                                                                        value: str) -> None:
    """``--export "$SITE"`` with the variable unset was the current folder: the pages and
    static/ written over what was there (its own index.html), 'wrote N files to .', exit 0."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "index.html").write_text("mine")
    done = cli("view", str(outputs / "one-episode"), "--export", value, cwd=work)
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_error_line(done).startswith("prime-runs: invalid value for '--export': "), done.stderr
    assert "names no folder" in done.stderr, done.stderr
    assert sorted(path.name for path in work.iterdir()) == ["index.html"] and (work / "index.html").read_text() == "mine"


@pytest.mark.parametrize(("command", "url", "hint"), [
    ("view", "file:///tmp/bucket/outputs", "prime-runs sync URL --local"),
    ("import", "s3://bucket/outputs", "sync, status, verify and export read it as it is"),
])
def test_a_store_url_given_to_a_command_of_local_folders_is_named_as_one(command: str, url: str, hint: str) -> None:
    """view and import read local folders only. A store URL given to them was folded into
    a path ('file:/tmp/...', 's3:/bucket/...') and reported as 'no such file or directory',
    which neither says what is wrong nor what to do."""
    done = cli(command, url)
    assert done.returncode == 2, done.stderr
    line = last_line(done)
    assert line.startswith("prime-runs: ") and len(done.stderr.strip().splitlines()) == 1
    assert f"{url} is a store URL, and prime-runs {command} reads local folders only; " in line
    assert hint in line and "no such file" not in line


@pytest.mark.parametrize("command", ["sync", "import", "status", "verify", "export", "view"])
def test_a_state_dir_that_is_a_file_is_bad_usage_naming_where_it_came_from(tmp_path: Path, command: str) -> None:
    """PRIME_RUNS_STATE_DIR (or --state-dir) naming a file was taken, and every run then
    failed on 'Not a directory' (sync and import: exit 1, 'N runs could not be imported')."""
    (tmp_path / "outputs").mkdir()
    shutil.copytree(VF040, tmp_path / "outputs" / "vf040-completed")
    (tmp_path / "state").write_bytes(b"")
    extra = {"sync": ["--local", "--db", str(tmp_path / "p.db")], "export": ["-o", str(tmp_path / "x.csv")]}
    done = cli(command, str(tmp_path / "outputs"), *extra.get(command, []), PRIME_RUNS_STATE_DIR=str(tmp_path / "state"),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert last_line(done).startswith(f"prime-runs: invalid value for '--state-dir': Directory '{tmp_path / 'state'}' "
                                      "is a file (from PRIME_RUNS_STATE_DIR); give a folder (made if missing)")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "outputs" / "vf040-completed" / "spool").exists()


@pytest.mark.parametrize("command", ["sync", "import"])
@pytest.mark.parametrize("kind", ["device", "fifo", "empty", "blanks", "below a file", "dangling link",
                                  "below a dangling link", "link loop", "below a link loop"])
def test_a_state_dir_that_is_no_folder_or_empty_is_bad_usage(tmp_path: Path, command: str, kind: str) -> None:
    """``--state-dir /dev/null`` (or a FIFO) passed the check a file gets, and every run's
    import then failed on 'Not a directory (/dev/null/imports)', exit 1; ``--state-dir ""``
    (a CI variable left unset, ``--state-dir "$STATE"``) was the current folder, and the
    imported spools landed in an ``imports/`` folder there; ``--state-dir "  "`` made a
    folder named by two blanks and imported there. A path below a file, through a symbolic
    link to nothing (a disk not mounted) or a loop of them failed each import on its own
    ('Not a directory', 'No such file or directory (state/imports)'), exit 1. All are
    refused before anything is written, one line naming what is in the way, exit 2."""
    (tmp_path / "outputs").mkdir()
    shutil.copytree(VF040, tmp_path / "outputs" / "vf040-completed")
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "not-mounted" / "state")
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    value = {"device": "/dev/null", "fifo": str(tmp_path / "pipe"), "empty": "", "blanks": "  ",
             "below a file": str(tmp_path / "afile" / "state"), "dangling link": str(tmp_path / "dangling"),
             "below a dangling link": str(tmp_path / "dangling" / "sub"), "link loop": str(tmp_path / "loop-a"),
             "below a link loop": str(tmp_path / "loop-a" / "state")}[kind]
    if kind == "fifo":
        os.mkfifo(value)
    extra = {"sync": ["--local", "--db", str(tmp_path / "p.db")]}
    done = cli(command, str(tmp_path / "outputs"), *extra.get(command, []), "--state-dir", value, cwd=work,
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    line = last_line(done)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert line.startswith("prime-runs: invalid value for '--state-dir': ") and "give a folder" in line, line
    said = {"device": "is a device, not a folder", "fifo": "is a FIFO, not a folder",
            "empty": "an empty path names no folder", "blanks": "'  ' is blanks only and names no folder",
            "below a file": f"{tmp_path / 'afile'} is a file, not a folder",
            "dangling link": f"{tmp_path / 'dangling'} is a symbolic link to {tmp_path / 'not-mounted' / 'state'}, "
                             "which does not exist",
            "below a dangling link": f"{tmp_path / 'dangling'} is a symbolic link to",
            "link loop": f"{tmp_path / 'loop-a'} is a loop of symbolic links",
            "below a link loop": f"{tmp_path / 'loop-a'} is a loop of symbolic links"}[kind]
    assert said in line, line
    assert list(work.iterdir()) == [] and not (tmp_path / "outputs" / "vf040-completed" / "spool").exists()
    assert not (tmp_path / "not-mounted").exists()


def test_sync_help_names_the_state_a_run_given_up_on_is_reported_in() -> None:
    """--retry-for's help said a run still failing 'is reported failed', a word sync reports
    for a run whose eval failed; its report says 'error' (docs/cli.md, --retry-for)."""
    import re as regex

    done = cli("sync", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    start = text.index("--retry-for DURATION")
    help_text = text[start:text.index("--follow ", start)]
    assert regex.search(r"each run still failing is reported 'error' \(its state kept", help_text), help_text


@pytest.mark.slow
def test_view_export_of_a_folder_with_no_runs_says_so_and_fails_unless_allowed(outputs: Path, tmp_path: Path) -> None:
    """It wrote an empty site and exited 0 without a word: a CI step publishing the viewer
    of an artifact that held nothing looked like one that published runs."""
    empty = tmp_path / "empty"
    (empty / "some" / "folder").mkdir(parents=True)
    site = tmp_path / "site"
    done = cli("view", str(empty), "--export", str(site))
    assert done.returncode == 1, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("prime-runs:")]
    assert len(said) == 1 and said[0].startswith(f"prime-runs: {empty}: nothing found"), done.stderr
    assert "Traceback" not in done.stderr
    mixed = cli("view", str(empty), str(outputs / "one-episode"), "--export", str(tmp_path / "mixed"))
    assert mixed.returncode == 1 and (tmp_path / "mixed" / "index.html").is_file(), mixed.stderr
    assert f"prime-runs: {empty}: nothing found" in mixed.stderr  # the other path is exported all the same
    allowed = cli("view", str(empty), "--export", str(tmp_path / "allowed"), "--allow-empty")
    assert allowed.returncode == 0 and (tmp_path / "allowed" / "index.html").is_file(), allowed.stderr


#: A folder name a hostile artifact may carry: a line feed (a forged line), a carriage
#: return and an escape sequence (erase the line).
HOSTILE_NAME = "run\nforged line\r\x1b[2Kname"


@pytest.mark.slow
def test_a_folder_name_with_control_characters_stays_on_its_run_s_line(tmp_path: Path) -> None:
    """Each run's line printed its folder's name raw: a line feed in it forged a line of its
    own, a carriage return or an escape sequence drove the terminal. The name is shown with
    those characters escaped, on the run's one line, by every command that lists runs."""
    root = tmp_path / "outputs"
    build_run(root / HOSTILE_NAME, "hostile-name", 2)
    shutil.copytree(VF040, root / f"plain-{HOSTILE_NAME}")
    escaped = "run\\nforged line\\r\\x1b[2Kname"
    for command in (["import"], ["status"], ["verify"], ["sync", "--local", "--db", str(tmp_path / "local.db")]):
        result = cli(*command, str(root), HOME=str(tmp_path))
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        shown = result.stdout + result.stderr
        assert not {"\r", "\x1b"} & set(shown), (command, shown)
        assert not [line for line in shown.splitlines() if line.startswith("forged line")], (command, shown)
        assert escaped in result.stdout, (command, result.stdout)


@pytest.mark.slow
def test_eval_outputs_without_a_spool_named_oddly_stay_on_one_line_with_a_command_that_pastes_back(
        tmp_path: Path) -> None:
    """The line that names eval outputs without a spool, with the import to run (status,
    export, mirror, sync --no-import), printed the folder's name raw: a line feed forged a
    line, an escape sequence drove the terminal, a name that is not UTF-8 came out as its
    raw byte or as '\\udcfe'. The name is escaped like a run's, and the import it suggests
    is bash's $'...', which pastes back as the folder (in plain quotes, the escaped line
    feed was a backslash and an n)."""
    root = tmp_path / "outputs"
    for name in (HOSTILE_NAME, ODD_NAME):
        shutil.copytree(VF040, root / name)
    for command in (["status"], ["export", "-o", str(tmp_path / "table.csv")],
                    ["mirror", "--once", (tmp_path / "store").as_uri()],
                    ["sync", "--no-import", "--local", "--db", str(tmp_path / "local.db")]):
        done = subprocess.run(CLI + [command[0], str(root), *command[1:]], capture_output=True, timeout=120,
                              env=child_env(HOME=str(tmp_path)))
        said = (done.stdout + done.stderr).decode("utf-8")  # nothing raw: every line valid UTF-8
        assert "Traceback" not in said and not {"\r", "\x1b"} & set(said), (command, said)
        assert not [line for line in said.splitlines() if line.startswith("forged line")], (command, said)
        words = [line.split("prime-runs import ", 1)[1] for line in said.splitlines() if "prime-runs import " in line]
        assert len(words) == 2, (command, said)
        for word in words:
            word = re.match(r"\$?'[^']*'", word).group(0)
            pasted = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, timeout=30).stdout
            assert pasted in (os.fsencode(root / HOSTILE_NAME), os.fsencode(root / ODD_NAME)), (command, word)


@pytest.mark.slow
def test_ctrl_c_of_a_command_without_a_handler_of_its_own_is_exit_130_in_the_one_voice(tmp_path: Path) -> None:
    """Ctrl-C of ``export`` (as of ``verify``, ``status``...) ended as click's "Aborted!",
    exit 1, unlike sync and import (130, one ``prime-runs:`` line). It is 130 with
    ``prime-runs: interrupted``, and the export leaves no file, not even its temporary one."""
    import signal
    import time

    build_run(tmp_path / "outputs" / "big", "ctrl-c-export", 4000, size=3000)
    out = tmp_path / "table" / "x.csv"
    out.parent.mkdir()
    export = subprocess.Popen(CLI + ["export", str(tmp_path / "outputs"), "-o", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env())
    deadline = time.monotonic() + 60
    while not list(out.parent.iterdir()):  # its temporary file: the table is being written
        assert export.poll() is None and time.monotonic() < deadline, export.communicate()
        time.sleep(0.005)
    export.send_signal(signal.SIGINT)
    _, err = export.communicate(timeout=60)
    assert export.returncode == 130, err
    assert err.strip().splitlines()[-1] == "prime-runs: interrupted", err
    assert "Aborted" not in err and "Traceback" not in err, err
    assert list(out.parent.iterdir()) == []


#: ``python -m commands`` (what ``prime-runs`` runs) with a Ctrl-C landing while the command
#: line's own modules are still being imported: the first import of click raises it.
CTRL_C_AT_START = """
import runpy, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["prime-runs", "status", "."]
runpy.run_module("commands", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_the_command_line_starts_is_exit_130_in_the_one_voice(tmp_path: Path) -> None:
    """A Ctrl-C pressed right after Enter lands while the command line is imported (click, the
    commands' option types: a few tenths of a second), before any handler exists: it ended in
    a ``KeyboardInterrupt`` traceback. Now ``prime-runs: interrupted``, exit 130."""
    done = subprocess.run([*CLI[:1], "-c", CTRL_C_AT_START], capture_output=True, text=True, timeout=60,
                          env=child_env(), cwd=tmp_path)
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    assert (done.returncode, done.stderr) == (130, "\nprime-runs: interrupted\n"), done.stderr


@pytest.mark.slow
def test_sync_never_says_no_runs_found_beside_runs_it_could_not_import(tmp_path: Path) -> None:
    """A read-only artifact synced without ``--state-dir``: each run's line says it could not be
    imported and why; "no runs found" beside those lines would tell a user the path was empty
    (and send them looking for a wrong path) when the runs are there."""
    artifact = tmp_path / "artifact"
    shutil.copytree(VF040, artifact / "run")
    for folder, _, files in os.walk(artifact):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    try:
        done = cli("sync", str(artifact), "--local", "--db", str(tmp_path / "platform.db"),
                   HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    finally:
        for folder, _, _ in os.walk(artifact):
            os.chmod(folder, 0o755)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "is read-only" in done.stdout and "--state-dir" in done.stdout, done.stdout
    assert "no runs found" not in done.stdout, done.stdout
    assert "could not be imported" in last_line(done), done.stderr


def test_each_synopsis_in_the_docs_names_exactly_the_options_its_command_takes() -> None:
    """docs/cli.md's synopsis of a command (``    prime-runs CMD [...]``, with its continuation
    lines) is where a user looks for an option: each option the command takes appears there
    in one of its spellings, and every option written there is one the command takes (an
    option renamed or dropped in the code would leave the docs offering a flag that fails)."""
    import click

    from commands.cli import cli as group

    lines = (REPO_ROOT / "docs" / "cli.md").read_text().splitlines()
    context = click.Context(group)

    def leaves(parent: click.Group, path: list[str]):
        for name in parent.list_commands(context):
            command = parent.get_command(context, name)
            if isinstance(command, click.Group):
                yield from leaves(command, path + [name])
            else:
                yield path + [name], command

    checked = 0
    for path, command in leaves(group, []):
        head = "    prime-runs " + " ".join(path)
        starts = [i for i, line in enumerate(lines) if line == head or line.startswith(head + " ")]
        assert starts, f"docs/cli.md has no synopsis line for prime-runs {' '.join(path)}"
        block, i = [lines[starts[0]]], starts[0] + 1
        while i < len(lines) and lines[i].startswith("        ") and lines[i].lstrip().startswith("["):
            block.append(lines[i])
            i += 1
        written = set(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", " ".join(block)))
        spellings = [set(p.opts + p.secondary_opts) for p in command.params
                     if isinstance(p, click.Option) and not p.hidden and "--help" not in p.opts]
        known = set().union(*spellings) if spellings else set()
        assert written <= known, f"prime-runs {' '.join(path)}: docs/cli.md offers {sorted(written - known)}"
        missing = [sorted(names) for names in spellings if not names & written]
        assert not missing, f"prime-runs {' '.join(path)}: docs/cli.md's synopsis lacks {missing}"
        checked += 1
    assert checked >= 9  # every command, platform serve included


@pytest.mark.parametrize(("command", "said"), [
    ("sync", "130 after SIGINT or SIGTERM (0 once --follow follows)"),
    ("status", "2 when a path does not exist or a store URL cannot be listed"),
    ("mirror", "or the store cannot be listed"),
])
def test_each_help_gives_the_exit_codes_docs_cli_md_gives(command: str, said: str) -> None:
    """The exit sentences of these helps left out a case docs/cli.md's tables give: sync
    --follow stopped by SIGINT exits 0, not 130; status of a store that cannot be listed
    exits 2; mirror exits 1 when its store cannot be listed. A CI job reading the help
    took those exits for something else."""
    done = cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert said in " ".join(done.stdout.split()), done.stdout


@pytest.mark.parametrize("text", ['{"api_key": "sk-in-the-file-77", "base_url": "http://127.0.0.1:9",}',
                                  '["sk-in-the-file-77"]'])
def test_a_config_file_that_cannot_be_read_is_said_not_passed_over(tmp_path: Path, text: str) -> None:
    """~/.prime/config.json with a trailing comma (the prime CLI's settings, edited by hand)
    was passed over in silence: 'no API key: set PRIME_API_KEY, else api_key in
    ~/.prime/config.json' of a file that holds one, and with the key in the environment its
    base_url and team_id were dropped, so the sync went to the public platform instead. One
    line naming the file and what is wrong with it (never its content), exit 2."""
    build_run(tmp_path / "runs" / "r", "bad-config", 1)
    config = tmp_path / "home" / ".prime" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    for env in ({}, {"PRIME_API_KEY": "key"}):
        result = run_cli("sync", str(tmp_path / "runs"), HOME=str(tmp_path / "home"), **env)
        assert result.returncode == 2, (result.stdout, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"prime-runs: {config} cannot be read as settings ("), line
        assert "sk-in-the-file" not in line and "no API key" not in line, line
        assert not (tmp_path / "runs" / "r" / "spool" / "sync").exists()



@pytest.mark.parametrize("tag", ["", "  ", "team\nalpha", "team\x1b[31m"], ids=["empty", "blanks", "line break", "escape"])
def test_a_tag_that_is_blank_or_holds_a_control_character_is_bad_usage(tmp_path: Path, tag: str) -> None:
    """``--tag "$UNSET"`` (or a tag with a line break pasted in) was added to every
    evaluation the sync created, as it was. One line, exit 2, before anything is written."""
    build_run(tmp_path / "runs" / "r", "tagged", 1)
    done = cli("sync", str(tmp_path / "runs"), "--local", "--db", str(tmp_path / "p.db"), "--tag", "ok", "--tag", tag)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last_line(done).startswith(f"prime-runs: invalid value for '--tag': {tag!r} "), done.stderr
    assert not (tmp_path / "p.db").exists() and not (tmp_path / "runs" / "r" / "spool" / "sync").exists()


@pytest.mark.parametrize("name", ["", "  ", "replay\nof May", "replay\x1b[31m"], ids=["empty", "blanks", "line break",
                                                                                 "escape"])
def test_a_replay_name_that_is_blank_or_holds_a_control_character_is_bad_usage(tmp_path: Path, name: str) -> None:
    """``--replay --name "$UNSET"`` was passed over for the manifest's name without a word;
    a name of blanks, or with a line break or an escape sequence, named every evaluation
    the replay created so. One line, exit 2, before anything is written, as for ``--tag``."""
    build_run(tmp_path / "runs" / "r", "named", 1)
    done = cli("sync", str(tmp_path / "runs"), "--local", "--db", str(tmp_path / "p.db"), "--replay", "--name", name)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last_line(done).startswith("prime-runs: invalid value for '--name': "), done.stderr
    assert not (tmp_path / "p.db").exists() and not (tmp_path / "runs" / "r" / "spool" / "sync").exists()


@pytest.mark.slow
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED", "buffered"])
def test_an_output_cut_short_by_a_disk_that_fills_is_said_as_that(tmp_path: Path, unbuffered: str) -> None:
    """A disk with room for the first part of a JSON report only: with PYTHONUNBUFFERED (a CI
    image's habit) the text stream dropped what the file did not take, and the sync exited 0
    over a cut report, without a word; buffered, it said so but the interpreter's last flush
    failed again, 'Exception ignored in: <_io.TextIOWrapper name='<stdout>'...>', exit 120."""
    from support.mounts import tmpfs

    for n in range(8):
        build_run(tmp_path / "runs" / f"a-run-with-a-long-enough-name-{n:02d}", f"cut-output-{n}", 1)
    with tmpfs(tmp_path / "small", "size=8k") as small:
        (small / "filler").write_bytes(b"\0" * 4096)  # one page of the two left
        with open(small / "report.json", "w") as report:
            done = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--json"], stdout=report,
                                  stderr=subprocess.PIPE, text=True, timeout=120,
                                  env=child_env(PYTHONUNBUFFERED=unbuffered, HOME=str(tmp_path),
                                                XDG_DATA_HOME=str(tmp_path / "d"), XDG_CACHE_HOME=str(tmp_path / "c")))
        written = (small / "report.json").stat().st_size
    assert written == 4096, f"the report fits: {written} bytes"  # the test's premise: it was cut
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("prime-runs: cannot write this command's output (No space left on device): "), line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("command", [["status"], ["sync", "--local", "--json"], ["export", "-o", "table.csv"],
                                     ["ci-script"]],
                         ids=" ".join)
def test_an_output_that_cannot_be_written_is_said_as_that_not_an_internal_error(tmp_path: Path,
                                                                                command: list[str]) -> None:
    """The report a sync or a CI job writes to a full disk (``> report.json``, $SYNC_REPORT):
    it said 'internal error: OSError: [Errno 28] No space left on device' (set
    PRIME_RUNS_TRACEBACK=1...), after the sync had pushed and saved everything."""
    build_run(tmp_path / "runs" / "r", "full-output", 2)
    args = [arg if arg != "table.csv" else str(tmp_path / arg) for arg in command]
    paths = [] if command == ["ci-script"] else [str(tmp_path / "runs")]  # ci-script: 120, 'Exception ignored in'
    with open("/dev/full", "w") as full:
        done = subprocess.run(CLI + [args[0], *paths, *args[1:]], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=child_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"),
                                                                    XDG_CACHE_HOME=str(tmp_path / "c")))
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("prime-runs: cannot write this command's output (No space left on device): "), line
    if command[0] == "sync":  # what it did is kept: the run is synced
        again = cli("sync", str(tmp_path / "runs"), "--local", HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"),
                    XDG_CACHE_HOME=str(tmp_path / "c"))
        assert again.returncode == 0 and again.stdout.startswith("up_to_date"), again.stdout + again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [["status"], ["sync", "--local", "--json"], ["ci-script"], ["view", "--export"],
                                     ["mirror"]], ids=" ".join)
def test_a_closed_standard_output_is_said_and_nothing_is_done(tmp_path: Path, command: list[str]) -> None:
    """Standard output closed (``>&-``, a service manager's or a parent's closed descriptor):
    status exited 0 having printed nothing anywhere, a sync's report was lost the same way,
    and sync --local, view, mirror and ci-script ended in 'internal error: ValueError: Unable
    to configure formatter' or 'AttributeError: 'NoneType' object has no attribute ...'. It is
    one line before anything is done, exit 2 (a sync pushes nothing, its state unwritten)."""
    build_run(tmp_path / "runs" / "r", "closed-output", 2)
    args = {"view": ["view", str(tmp_path / "runs"), "--export", str(tmp_path / "site")],
            "mirror": ["mirror", str(tmp_path / "runs"), f"file://{tmp_path / 'bucket'}", "--once"],
            "ci-script": ["ci-script"]}.get(command[0], [command[0], str(tmp_path / "runs"), *command[1:]])
    done = subprocess.run(CLI + args, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: os.close(1),
                          env=child_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"),
                                        XDG_CACHE_HOME=str(tmp_path / "c")))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("prime-runs: standard output is closed"), line
    assert not (tmp_path / "runs" / "r" / "spool" / "sync").exists()  # nothing pushed, no state
    assert not (tmp_path / "site").exists() and not (tmp_path / "bucket").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", [["sync", "", "--local"], ["status", ""], ["verify", ""], ["import", ""], ["view", ""],
                                     ["export", "", "-o", "table.csv"], ["mirror", "", "bucket"], ["sync", " ", "--local"]],
                         ids=lambda command: " ".join(map(repr, command)))
def test_an_empty_path_is_refused_not_read_as_the_working_directory(tmp_path: Path, command: list[str]) -> None:
    """``prime-runs sync "$OUTPUTS"`` with the variable unset or empty: ``""`` was read as
    ``.``, and every run under the working directory was synced (imported, exported,
    mirrored, served), where ``--state-dir ""`` and ``-o ""`` are refused. One line, exit 2,
    nothing read or written."""
    build_run(tmp_path / "r", "empty-path", 1)
    args = [str(tmp_path / "out" / arg) if arg == "table.csv" else f"file://{tmp_path / 'bucket'}" if arg == "bucket"
            else arg for arg in command]
    done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          env=child_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"),
                                        XDG_CACHE_HOME=str(tmp_path / "c")))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "names no folder (an unset variable?)" in line and done.stdout == "", line
    assert not (tmp_path / "r" / "spool" / "sync").exists() and not (tmp_path / "bucket").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", [["mirror", "runs", "file://"], ["mirror", "runs", "file:///"],
                                     ["sync", "file://", "--local"], ["status", "s3://"], ["verify", "gs://"]],
                         ids=" ".join)
def test_a_store_url_that_names_no_bucket_or_folder_is_refused(tmp_path: Path, command: list[str]) -> None:
    """``prime-runs mirror outputs "file://$BUCKET_DIR"`` with the variable unset: ``file://``
    is the whole file system, which the mirror (or a sync, a status) listed, /proc included,
    until it failed on a loop there ('cannot list: ... File system loop found', exit 1)."""
    build_run(tmp_path / "runs" / "r", "no-bucket", 1)
    args = [str(tmp_path / arg) if arg == "runs" else arg for arg in command]
    done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=child_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"),
                                        XDG_CACHE_HOME=str(tmp_path / "c")))
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"prime-runs: {command[2] if command[0] == 'mirror' else command[1]}: a store URL names "
                           "a bucket"), line


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exported", "no such folder", "no such path"])
def test_a_path_given_with_a_line_feed_or_an_escape_is_told_on_one_line(tmp_path: Path, case: str) -> None:
    """A name given on the command line with a line feed or an ESC in it (``-o "$NAME"`` read
    from a file with its newline): 'exported N rows ... to' and a usage error quoting it were
    split in two lines, an ESC sequence sent to the terminal. Run folders' names were escaped
    already; these are the user's own arguments, escaped the same way."""
    build_run(tmp_path / "runs" / "r", "odd-argument", 1)
    odd = "x\n\x1b[31mred"
    args = {"exported": ["export", str(tmp_path / "runs"), "-o", str(tmp_path / f"{odd}.csv")],
            "no such folder": ["export", str(tmp_path / "runs"), "-o", str(tmp_path / odd / "t.csv")],
            "no such path": ["status", str(tmp_path / odd)]}[case]
    done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=child_env(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "c")))
    said = (done.stdout + done.stderr).strip()
    assert len(said.splitlines()) == 1 and "\x1b" not in said, said
    assert "x\\n\\x1b[31mred" in said, said


@pytest.mark.slow
@pytest.mark.parametrize("closed", [(2,), (0, 2)], ids=["stderr", "stdin and stderr"])
def test_a_closed_standard_error_keeps_the_documented_exit_codes(tmp_path: Path, closed: tuple[int, ...]) -> None:
    """Standard error closed (``2>&-``): a usage error's line went to the closed descriptor,
    click's write failed ('Bad file descriptor') and the command ended as an internal error,
    exit 1 in place of 2. Its lines are dropped, as ``2>/dev/null`` drops them; the exit codes
    are the documented ones, and a sync still does its work."""
    build_run(tmp_path / "runs" / "r", "closed-stderr", 1)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(CLI + list(args), stdout=subprocess.PIPE, text=True, timeout=120,
                              preexec_fn=lambda: [os.close(fd) for fd in closed],
                              env=child_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"),
                                            XDG_CACHE_HOME=str(tmp_path / "c")))

    assert run("status", str(tmp_path / "missing")).returncode == 2
    synced = run("sync", str(tmp_path / "runs"), "--local")
    assert synced.returncode == 0 and synced.stdout.startswith("synced"), synced.stdout


@pytest.mark.slow
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_an_output_encoding_that_cannot_hold_a_name_escapes_it(tmp_path: Path, as_json: bool) -> None:
    """A Latin-1 terminal (``PYTHONIOENCODING=latin-1``) and a run named ``名前-😀``: status
    and its --json report ended in 'internal error: UnicodeEncodeError', exit 1. What the
    encoding cannot hold is written as JSON escapes it (a surrogate pair beyond the BMP), so
    the report reads back as the same name."""
    from fixtures.episodes import make_episode
    from prime_runs_spool import open_run

    name = "naïve-名前-😀"
    with open_run(tmp_path / "runs" / "r", name=name, model="m", environments=["gsm8k"], config={"model": "m"}) as run:
        run.log_episodes([make_episode(0, run_id=run.id)])
    done = subprocess.run(CLI + ["status", str(tmp_path / "runs"), *(["--json"] if as_json else [])],
                          capture_output=True, timeout=120,
                          env=child_env(PYTHONIOENCODING="latin-1", HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    said = done.stdout.decode("latin-1")
    if as_json:
        assert [run["name"] for run in json.loads(said)["runs"]] == [name]
    else:
        assert "naïve-\\u540d\\u524d-\\ud83d\\ude00" in said, said
