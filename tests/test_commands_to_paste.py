"""The commands our messages hand a user to run next are shell-quoted: pasted into a shell,
they run as printed, whatever the folder's name. ``ship it with: prime-runs sync out
dir/ü/tïny run`` split into four paths (exit 2, "no such file or directory"), as did the
import, resume, mirror and ``chmod`` commands for a folder with a space or a quote."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.fake_chat_server import FakeChatServer
from fixtures.vf_launch import launch_file_text
from support.env import CLI, VF040, child_env
from support.odd_files import ODD_NAME, odd_tree  # noqa: F401 (a fixture)
from support.runs import RunBuilder
from support.vf_eval import KEY_VAR, eval_cmd, eval_env

ODD = "out dir/it's ü"


def _run_as_pasted(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` as a shell runs it, ``prime-runs`` being this checkout's command line."""
    assert command.startswith("prime-runs "), command
    return subprocess.run(["sh", "-c", shlex.join(CLI) + command.removeprefix("prime-runs")], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env)


def test_the_import_command_verify_suggests_runs_as_printed(tmp_path: Path) -> None:
    shutil.copytree(VF040, tmp_path / ODD)
    verify = subprocess.run(CLI + ["verify", "out dir"], cwd=tmp_path, capture_output=True, text=True,
                            env=child_env(), timeout=60)
    assert verify.returncode == 0, verify.stderr
    (line,) = [line for line in verify.stdout.splitlines() if "not spooled" in line]
    command = line.split("(run: ", 1)[1].removesuffix(")")
    assert command == "prime-runs import 'out dir/it'\"'\"'s ü'", command
    imported = _run_as_pasted(command, tmp_path, child_env())
    assert imported.returncode == 0, imported.stderr
    assert (tmp_path / ODD / "spool").is_dir()


@pytest.mark.slow
def test_the_sync_command_an_eval_prints_runs_as_printed(tmp_path: Path) -> None:
    with FakeChatServer() as chat:
        (tmp_path / "eval.toml").write_text(launch_file_text(
            run_name="tiny run", base_url=chat.base_url, model="fake/model", rollouts=1, max_concurrent=4,
            key_var=KEY_VAR, header_name="X-Header", header_secret="not-a-secret", limit=1, output_dir=ODD))
        ran = subprocess.run(eval_cmd("@", "eval.toml", "--no-rich"), cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env=eval_env())
    assert ran.returncode == 0, ran.stderr[-3000:]
    (line,) = [line for line in ran.stderr.splitlines() if "ship it with: " in line]
    command = line.split("ship it with: ", 1)[1]
    assert command == "prime-runs sync 'out dir/it'\"'\"'s ü/tiny run'", command
    synced = _run_as_pasted(command + f" --local --db {shlex.quote(str(tmp_path / 'local.db'))}", tmp_path,
                            child_env())
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.startswith("synced "), synced.stdout


def test_the_sync_command_the_viewer_shows_for_a_run_never_synced_runs_as_printed(tmp_path: Path) -> None:
    import html
    import re

    from support.runs import build_run

    build_run(tmp_path / ODD / "r", "paste-from-viewer", 2)
    exported = subprocess.run(CLI + ["view", "--export", str(tmp_path / "site"), ODD], cwd=tmp_path,
                              capture_output=True, text=True, env=child_env(), timeout=120)
    assert exported.returncode == 0, exported.stderr
    shown = {html.unescape(found) for page in (tmp_path / "site").rglob("*.html")
             for found in re.findall(r"<code>(prime-runs sync [^<]*)</code>", page.read_text())}
    assert shown == {"prime-runs sync 'out dir/it'\"'\"'s ü/r'"}, shown
    synced = _run_as_pasted(shown.pop() + f" --local --db {shlex.quote(str(tmp_path / 'local.db'))}", tmp_path,
                            child_env())
    assert synced.returncode == 0 and synced.stdout.startswith("synced "), synced.stdout + synced.stderr


@pytest.mark.slow
def test_the_command_a_stopped_follower_prints_carries_on_where_it_synced(tmp_path: Path) -> None:
    """``sync --follow --local --db DB --to traces`` stopped by SIGINT with a run live: the
    command its last line hands on, pasted, syncs the rest of the run into the same database
    and sink. It said ``run prime-runs sync again``, which pasted went to the default platform
    (no key: exit 2), not to the database the follower wrote."""
    builder = RunBuilder(tmp_path / ODD / "run", "follow-paste")
    builder.open_segment()
    builder.add(2)
    env = child_env(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    follow = subprocess.Popen(CLI + ["sync", ODD, "--follow", "--local", "--db", str(tmp_path / "a db.db"),
                                     "--to", "traces", "--state-dir", str(tmp_path / "state")],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert follow.stdout is not None
    for line in follow.stdout:
        if line.startswith("live "):
            break
    follow.send_signal(signal.SIGINT)
    _, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    last = err.strip().splitlines()[-1]
    command = last[last.index("prime-runs sync "):]
    builder.add(1)
    builder.seal()
    synced = _run_as_pasted(command + " --json", tmp_path, env)
    assert synced.returncode == 0, (command, synced.stderr)
    (report,) = json.loads(synced.stdout)["runs"]
    assert (report["state"], report["store"], report["pushed_total"]) == ("synced", "traces", 3), (command, report)


def test_a_command_a_line_suggests_names_a_folder_whose_name_is_not_utf8_as_pasted_back(odd_tree: Path) -> None:
    """verify's ``chmod -R go= SPOOL`` for a spool others may read, under a folder whose name
    is not UTF-8: the name's odd bytes went to the terminal raw, and, pasted back (a
    replacement character by then), the command named another folder. Now the word is
    ``$'...'`` with ``\\xNN`` escapes, which bash and zsh read as the real path."""
    spool = odd_tree / ODD_NAME / "spool"
    spool.chmod(0o755)
    result = subprocess.run(CLI + ["verify", str(odd_tree)], capture_output=True, env=child_env(), timeout=120)
    said = (result.stdout + result.stderr).decode("utf-8")  # every line valid UTF-8: nothing raw
    (line,) = [line for line in said.splitlines() if "chmod -R go=" in line and ODD_NAME[:4] in line]
    word = line.split("chmod -R go= ", 1)[1].split(" (prime-runs sync", 1)[0]
    pasted = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, timeout=30)
    assert pasted.stdout == os.fsencode(spool), (word, pasted.stdout)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=12).filter(lambda name: b"\0" not in name), min_size=1, max_size=3))
def test_any_file_name_a_suggested_command_quotes_is_read_back_by_bash_as_its_bytes(names: list[bytes]) -> None:
    """Every word of a suggested command goes through ``files.shell_word``: a UTF-8 name as
    ``shlex.quote`` quotes it (``sh`` reads it too), any other as ``$'...'``; bash reads each
    back as the name's bytes, and the words printed are ASCII or valid UTF-8."""
    from prime_runs_spool.files import shell_line

    words = [os.fsdecode(name) for name in names]
    line = shell_line(words)
    line.encode("utf-8")  # printable on any terminal: no lone surrogate left
    said = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True, timeout=30)
    assert said.stdout.split(b"\0")[:-1] == names, line
