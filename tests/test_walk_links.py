"""A symbolic link to a run folder kept elsewhere is not followed by the walks of `sync`,
`verify`, `status`, `import`, `export` and `view` (docs/cli.md, "Symbolic links below the
paths"), and each
command says so, once a link, on stderr: a user who links runs into ./outputs must not
read "all synced" while they never travel. A link into the tree (verifiers' own
`logs/latest`, an alias of a run already there) names nothing the walk misses, and stays
quiet. Real files, the real command line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from prime_runs_spool.importer.paths import find_eval_outputs
from prime_runs_spool.spool.layout import find_runs

from support.cli import local_sync, run_cli
from support.env import REPO_ROOT
from support.runs import build_run

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def skipped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "skipped symbolic link" in line]


def linked_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """outputs/ holding a run and verifiers' outputs (with their `logs/latest` link), an
    alias into itself, and a link to a folder of runs kept elsewhere; returns (outputs, the
    link, its target)."""
    outputs = tmp_path / "outputs"
    build_run(outputs / "here", "run-here", 2)
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", outputs / "vf-here", symlinks=True)
    assert (outputs / "vf-here" / "logs" / "latest").is_symlink()
    os.symlink(outputs / "here", outputs / "alias-of-here")  # into the tree: reached anyway
    elsewhere = tmp_path / "kept-elsewhere"
    build_run(elsewhere / "there", "run-there", 3)
    link = outputs / "linked"
    os.symlink(elsewhere, link)
    return outputs, link, elsewhere


@pytest.mark.parametrize("command", [["status"], ["verify"], ["status", "--json"], ["verify", "--json"]])
def test_status_and_verify_name_a_link_out_of_the_tree_once_and_keep_their_exit_code(tmp_path: Path,
                                                                                      command: list[str]) -> None:
    outputs, link, elsewhere = linked_tree(tmp_path)
    result = run_cli(*command, str(outputs))
    assert result.returncode == 0, (command, result.stderr)
    assert "Traceback" not in result.stderr
    lines = skipped_lines(result.stderr)
    assert lines == [f"prime-runs: skipped symbolic link {link} -> {elsewhere.resolve()}: links are not "
                     f"followed; give {elsewhere.resolve()} as a path itself to include what it holds"], command
    assert "run-there" not in result.stdout and "latest" not in result.stderr and "alias" not in result.stderr


def test_import_names_linked_eval_outputs_it_did_not_import(tmp_path: Path) -> None:
    """verifiers' outputs kept elsewhere and linked in: `prime-runs import` imports what is in
    the tree and names the link, exit 0."""
    outputs = tmp_path / "outputs"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", outputs / "vf-here", symlinks=True)
    elsewhere = tmp_path / "vf-elsewhere"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", elsewhere, symlinks=True)
    os.symlink(elsewhere, outputs / "vf-linked")
    result = run_cli("import", str(outputs))
    assert result.returncode == 0, result.stderr
    assert skipped_lines(result.stderr) == [
        f"prime-runs: skipped symbolic link {outputs / 'vf-linked'} -> {elsewhere.resolve()}: links are not "
        f"followed; give {elsewhere.resolve()} as a path itself to include what it holds"]
    assert (outputs / "vf-here" / "spool").is_dir() and not (elsewhere / "spool").exists()


def test_the_link_is_quiet_once_its_target_is_among_the_paths(tmp_path: Path) -> None:
    outputs, _, elsewhere = linked_tree(tmp_path)
    for command in (["status"], ["verify"]):
        result = run_cli(*command, str(outputs), str(elsewhere))
        assert result.returncode == 0, result.stderr
        assert skipped_lines(result.stderr) == []
        assert "run-there" in result.stdout or "there" in result.stdout


def test_a_link_to_a_folder_that_holds_no_run_of_the_tree_is_named_even_when_nothing_else_is_found(
        tmp_path: Path) -> None:
    """outputs/ holding only the link: the command still fails as "nothing found" (exit 1), and
    says why: the runs are behind a link it did not follow."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    elsewhere = tmp_path / "runs"
    build_run(elsewhere / "r", "only-linked", 1)
    os.symlink(elsewhere / "r", outputs / "r")
    result = run_cli("status", str(outputs))
    assert result.returncode == 1
    assert skipped_lines(result.stderr) == [
        f"prime-runs: skipped symbolic link {outputs / 'r'} -> {(elsewhere / 'r').resolve()}: links are not "
        f"followed; give {(elsewhere / 'r').resolve()} as a path itself to include what it holds"]


def test_each_walker_tells_of_a_link_out_of_its_paths_once_and_of_none_into_them(tmp_path: Path) -> None:
    """The library's walks, for any caller: the runs walk and the eval outputs walk."""
    outputs, link, elsewhere = linked_tree(tmp_path)
    linked_outputs = tmp_path / "vf-elsewhere"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", linked_outputs / "run", symlinks=True)
    os.symlink(linked_outputs, outputs / "vf-linked")
    told: list[tuple[Path, Path]] = []
    runs = list(find_runs([outputs, outputs / "here"], on_link=lambda *pair: told.append(pair)))
    assert runs == [outputs / "here"]
    assert told == [(link, elsewhere.resolve()), (outputs / "vf-linked", linked_outputs.resolve())]
    told.clear()
    assert list(find_eval_outputs([outputs], on_link=lambda *pair: told.append(pair))) == [outputs / "vf-here"]
    assert told == [(link, elsewhere.resolve()), (outputs / "vf-linked", linked_outputs.resolve())]
    told.clear()
    list(find_runs([outputs, elsewhere], on_link=lambda *pair: told.append(pair)))
    assert told == [(outputs / "vf-linked", linked_outputs.resolve())]


@pytest.mark.slow
def test_sync_names_the_link_once_ships_only_the_tree_and_keeps_exit_zero(tmp_path: Path) -> None:
    outputs, link, elsewhere = linked_tree(tmp_path)
    db = tmp_path / "local.db"
    result = local_sync(outputs, db)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert len(skipped_lines(result.stderr)) == 1
    assert str(link) in skipped_lines(result.stderr)[0]
    report = json.loads(result.stdout)
    assert "run-there" not in result.stdout
    assert {"run-here"} <= {run.get("local_run_id") for run in report["runs"]}, report
    again = local_sync(outputs, db, str(elsewhere))  # what the line says to do
    assert again.returncode == 0, again.stderr
    assert skipped_lines(again.stderr) == []
    assert "run-there" in again.stdout


@pytest.mark.slow
def test_a_follower_names_the_link_once(tmp_path: Path) -> None:
    outputs, link, elsewhere = linked_tree(tmp_path)
    result = run_cli("sync", str(outputs), "--local", "--db", str(tmp_path / "local.db"), "--to", "samples",
                     "--follow", "--exit-when-idle", "--poll-interval", "0.2")
    assert result.returncode == 0, result.stderr
    assert skipped_lines(result.stderr) == [
        f"prime-runs: skipped symbolic link {link} -> {elsewhere.resolve()}: links are not followed; give "
        f"{elsewhere.resolve()} as a path itself to include what it holds"]
    assert "run-there" not in result.stdout


def runs_and_a_link(tmp_path: Path) -> tuple[Path, Path, Path]:
    """outputs/ holding one run (2 episodes) and a link to a folder of runs kept elsewhere (one
    run, 3 episodes): (outputs, the link, its target)."""
    outputs = tmp_path / "outputs"
    build_run(outputs / "here", "run-here", 2)
    elsewhere = tmp_path / "kept-elsewhere"
    build_run(elsewhere / "there", "run-there", 3)
    os.symlink(elsewhere, outputs / "linked")
    return outputs, outputs / "linked", elsewhere


def the_line(link: Path, target: Path) -> str:
    return (f"prime-runs: skipped symbolic link {link} -> {target.resolve()}: links are not followed; give "
            f"{target.resolve()} as a path itself to include what it holds")


def test_export_names_the_link_once_exports_only_the_tree_and_keeps_exit_zero(tmp_path: Path) -> None:
    outputs, link, elsewhere = runs_and_a_link(tmp_path)
    table = tmp_path / "episodes.jsonl"
    result = run_cli("export", str(outputs), "-o", str(table))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert skipped_lines(result.stderr) == [the_line(link, elsewhere)]
    assert {json.loads(line)["run_id"] for line in table.read_text().splitlines()} == {"run-here"}
    again = run_cli("export", str(outputs), str(elsewhere), "-o", str(table))  # what the line says to do
    assert again.returncode == 0 and skipped_lines(again.stderr) == [], again.stderr
    assert {json.loads(line)["run_id"] for line in table.read_text().splitlines()} == {"run-here", "run-there"}


@pytest.mark.slow
def test_view_export_names_the_link_once_and_keeps_exit_zero(tmp_path: Path) -> None:
    outputs, link, elsewhere = runs_and_a_link(tmp_path)
    result = run_cli("view", "--export", str(tmp_path / "site"), str(outputs))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert skipped_lines(result.stderr) == [the_line(link, elsewhere)]
    pages = " ".join(page.read_text() for page in (tmp_path / "site").rglob("*.html"))
    assert "run-here" in pages and "run-there" not in pages


@pytest.mark.slow
def test_a_served_viewer_names_the_link_at_start_up(tmp_path: Path) -> None:
    """Said once the URL is printed, before any page is asked for, and once only."""
    import select
    import signal
    import subprocess
    import time

    from support.children import reaped
    from support.env import CLI, child_env

    outputs, link, elsewhere = runs_and_a_link(tmp_path)
    proc = subprocess.Popen(CLI + ["view", str(outputs), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    with reaped(proc):
        assert proc.stdout.readline().startswith("http://127.0.0.1:")
        said, deadline = "", time.monotonic() + 60
        while "skipped symbolic link" not in said and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                said += proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, said + rest
    assert skipped_lines(said + rest) == [the_line(link, elsewhere)], said + rest
