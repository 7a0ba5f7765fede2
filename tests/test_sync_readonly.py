"""A spool on a read-only source (a CI artifact mounted read-only) syncs with ``--state-dir``,
its sync lock and state kept there, the source never written; without it, one error line
naming the flag. Read-only is decided as for plain eval outputs (importer/places.py), for
root too: a real read-only bind mount where the machine allows one, else ``chattr +i``
(which binds root), else the test is skipped; and a folder whose mode says read-only."""

from __future__ import annotations

import html
import json
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prime_runs_spool.viewer.app import wait_indexed
from prime_runs_spool.viewer.sources import SpoolSource
from support.cli import run_cli as cli
from support import platform_process
from support.env import CLI, child_env
from support.runs import RunBuilder, build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, run_sync, server, sync_cmd  # noqa: F401
from test_import_readonly import snapshot


def _run(*argv: str) -> bool:
    return shutil.which(argv[0]) is not None and subprocess.run(list(argv), capture_output=True).returncode == 0


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(where the runs are written, the same folder read-only): a read-only bind mount of
    it, else the folder itself made immutable after the test wrote it."""
    source, mount = tmp_path / "source", tmp_path / "mounted"
    source.mkdir()
    mount.mkdir()
    made: list[str] = []

    def freeze() -> None:
        if _run("mount", "--bind", str(source), str(mount)):
            if _run("mount", "-o", "remount,bind,ro", str(mount)):
                made.append("mount")
                return
            _run("umount", str(mount))
        everything = [source, *source.rglob("*")]
        if _run("chattr", "+i", *map(str, everything)):
            made.append("chattr")
            mount.rmdir()
            mount.symlink_to(source)
            return
        pytest.skip("neither a read-only bind mount nor chattr +i is possible here")

    yield source, mount, freeze  # type: ignore[misc]
    if "mount" in made:
        _run("umount", str(mount))
    if "chattr" in made:
        _run("chattr", "-R", "-i", str(source))


@pytest.mark.slow
def test_a_read_only_spool_syncs_with_state_dir_and_says_the_flag_without(read_only, tmp_path: Path,
                                                                          server, api) -> None:
    source, mount, freeze = read_only
    builder = build_run(source / "run", "readonly-spool", 5)
    freeze()
    before = snapshot(mount)
    refused = run_sync(server.base_url, str(mount), "--json")
    assert refused.returncode == 1, refused.stderr
    report = json.loads(refused.stdout)["runs"][0]
    assert report["state"] == "error" and "--state-dir" in report["error"], report
    state_dir = tmp_path / "state"
    for expected in ("synced", "up_to_date"):
        done = run_sync(server.base_url, str(mount), "--json", "--state-dir", str(state_dir))
        assert done.returncode == 0, done.stderr + done.stdout
        assert json.loads(done.stdout)["runs"][0]["state"] == expected
    assert snapshot(mount) == before, "the read-only source was written"
    assert list(state_dir.glob("spools/*/spool/sync/*.json")), "the state is kept under --state-dir"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_spool_synced_then_archived_read_only_carries_on_from_its_state(read_only, tmp_path: Path,
                                                                         server, api) -> None:
    source, mount, freeze = read_only
    builder = build_run(source / "run", "readonly-archived", 4)
    first = run_sync(server.base_url, str(source))
    assert first.returncode == 0, first.stderr
    freeze()
    again = run_sync(server.base_url, str(mount), "--json", "--state-dir", str(tmp_path / "state"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["runs"][0]["state"] == "up_to_date"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_a_spool_folder_whose_mode_says_read_only_is_not_written_even_by_root(tmp_path: Path, server, api) -> None:
    builder = build_run(tmp_path / "outputs" / "run", "readonly-mode", 3)
    spool = tmp_path / "outputs" / "run" / "spool"
    for path in sorted([spool, *spool.rglob("*")], reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        before = snapshot(tmp_path / "outputs")
        refused = run_sync(server.base_url, str(tmp_path / "outputs"))
        assert refused.returncode == 1
        assert "is read-only" in refused.stdout and "--state-dir" in refused.stdout, refused.stdout
        done = run_sync(server.base_url, str(tmp_path / "outputs"), "--state-dir", str(tmp_path / "state"))
        assert done.returncode == 0, done.stderr + done.stdout
        assert snapshot(tmp_path / "outputs") == before
        assert_exactly_once(api, builder)
    finally:
        for path in [spool, *spool.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def _read_only_by_mode(spool: Path) -> None:
    """The spool folder's mode says read-only (root may still write: the writer of a live
    run does, as a writer on another machine would behind a read-only mount)."""
    spool.chmod(0o555)


def test_follow_of_a_read_only_spool_says_the_flag_without_state_dir(tmp_path: Path, server, api) -> None:
    """As a plain sync: the run's one error line names --state-dir; the folder is not
    written; --exit-when-idle ends there with exit 1."""
    build_run(tmp_path / "outputs" / "run", "readonly-follow-refused", 2)
    spool = tmp_path / "outputs" / "run" / "spool"
    _read_only_by_mode(spool)
    try:
        before = snapshot(tmp_path / "outputs")
        refused = run_sync(server.base_url, str(tmp_path / "outputs"), "--follow", "--exit-when-idle", "--json")
        assert refused.returncode == 1, refused.stderr
        [report] = [json.loads(line) for line in refused.stdout.splitlines()]
        assert report["state"] == "error" and "is read-only" in report["error"] and "--state-dir" in report["error"]
        assert snapshot(tmp_path / "outputs") == before
    finally:
        spool.chmod(0o755)


def test_follow_of_a_live_read_only_spool_keeps_its_lock_and_state_under_state_dir(tmp_path: Path, server,
                                                                                  api) -> None:
    """A live run on a read-only spool folder, followed with --state-dir: its episodes are
    pushed as they come and the run finished at its seal, exactly once; the lock and the
    state live under the state directory, never in the spool folder."""
    builder = RunBuilder(tmp_path / "outputs" / "run", "readonly-follow-live")
    builder.open_segment()
    builder.add(2)
    spool = tmp_path / "outputs" / "run" / "spool"
    _read_only_by_mode(spool)
    state_dir = tmp_path / "state"
    follower = subprocess.Popen(sync_cmd(server.base_url, str(tmp_path / "outputs"), "--follow", "--exit-when-idle",
                                         "--json", "--state-dir", str(state_dir)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=child_env(PRIME_API_KEY=TOKEN, HOME=str(tmp_path)))
    watchdog = threading.Timer(90, follower.kill)
    watchdog.start()
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline() or "{}")
        assert (first.get("state"), first.get("pushed_total")) == ("live", 2), first
        builder.add(3)
        builder.seal()
        out, err = follower.communicate(timeout=90)
    finally:
        watchdog.cancel()
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
        spool.chmod(0o755)
    assert follower.returncode == 0, err
    assert [json.loads(line)["state"] for line in out.splitlines()][-1] == "synced", out
    assert not (spool / "sync").exists() and not (spool / "sync.lock").exists(), "the read-only spool was written"
    assert list(state_dir.glob("spools/*/spool/sync/*.json")), "the state is kept under --state-dir"
    assert_exactly_once(api, builder)


@pytest.mark.slow
def test_status_and_the_viewer_with_state_dir_show_what_the_syncs_from_there_pushed(tmp_path: Path, server,
                                                                                    api) -> None:
    """``status --state-dir DIR`` (and ``view --state-dir DIR``) read a read-only spool's
    states where its sync keeps them:
    a run synced only from there is not "not synced anywhere yet", and a run synced before it
    was made read-only, then grown and synced from there, counts what the later sync pushed
    (the states left beside the spool are stale once DIR holds one of the same name)."""
    state_dir = tmp_path / "state"
    fresh = build_run(tmp_path / "outputs" / "fresh", "readonly-status-fresh", 3)
    archived = RunBuilder(tmp_path / "outputs" / "archived", "readonly-status-archived")
    archived.open_segment()
    archived.add(2)
    first = run_sync(server.base_url, str(tmp_path / "outputs" / "archived"))
    assert first.returncode == 0, first.stderr
    for run_dir in (fresh.run_dir, archived.run_dir):
        _read_only_by_mode(run_dir / "spool")
    archived.add(3)  # root's writer still writes: a writer elsewhere behind a read-only mount
    archived.seal()
    done = run_sync(server.base_url, str(tmp_path / "outputs"), "--state-dir", str(state_dir))
    assert done.returncode == 0, done.stderr + done.stdout

    shown = cli("status", "--json", "--state-dir", str(state_dir), str(tmp_path / "outputs"))
    assert shown.returncode == 0, shown.stderr
    runs = {Path(run["path"]).name: run for run in json.loads(shown.stdout)["runs"]}
    for name, builder in (("fresh", fresh), ("archived", archived)):
        [destination] = runs[name]["destinations"]
        assert destination["episodes_pushed"] == builder.count and destination["pending"] == 0, destination
        assert destination["finalized"], destination
    text = cli("status", "--state-dir", str(state_dir), str(tmp_path / "outputs")).stdout
    assert "not synced anywhere yet" not in text, text
    source = SpoolSource([tmp_path / "outputs"], state_dir)
    for run in source.runs():
        wait_indexed(run, 10)
        [synced] = run.standing().synced
        assert (synced.episodes, synced.pending, synced.finalized) == (run.standing().episodes, 0, True), synced
    assert_exactly_once(api, fresh)
    assert_exactly_once(api, archived)


@pytest.mark.slow
def test_mirror_of_a_read_only_spool_says_its_note_cannot_be_left_and_uploads_nothing(read_only, tmp_path: Path) -> None:
    """The mirror leaves its note in the spool folder before a run's first upload (it is what
    keeps a sync of the folder and one of the store apart); on a read-only folder it cannot,
    so nothing is uploaded and the run's line says why and what to do, not the name of the
    temporary file the note would have been written through."""
    source, mount, freeze = read_only
    build_run(source / "run", "readonly-mirror", 2)
    freeze()
    before = snapshot(mount)
    store = tmp_path / "store"
    done = cli("mirror", str(mount), f"file://{store}", "--once", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout.splitlines()[0])
    assert report["uploaded"] == [] and not list(store.rglob("*.jsonl")), report
    assert report["error"].startswith(f"{mount / 'run' / 'spool'}: cannot leave the mirror's note there ("), report
    assert report["error"].endswith("make the folder writable, or mirror a writable copy of the run folder"), report
    assert snapshot(mount) == before, "the read-only source was written"


def test_the_viewer_offers_a_read_only_spool_the_sync_that_keeps_its_state_where_it_reads(tmp_path: Path, server,
                                                                                         api) -> None:
    """``view --state-dir DIR`` of a read-only spool never synced: the page's command, run as
    printed (pointed at the test platform), ships the run, and the page then shows it synced;
    the bare ``prime-runs sync RUN`` it offered was refused, asking for the flag."""
    state_dir = tmp_path / "state"
    builder = build_run(tmp_path / "outputs" / "archived", "readonly-viewer-advice", 2)
    _read_only_by_mode(builder.run_dir / "spool")
    proc = subprocess.Popen([*CLI, "view", str(tmp_path / "outputs"), "--state-dir", str(state_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        url = platform_process.first_line(proc).rstrip("/")
        page = httpx.get(url + "/run", params={"run": "archived"}, timeout=30).text
        offered = re.search(r"Not synced anywhere yet: <code>(.*?)</code>", page)
        assert offered, page[-2000:]
        words = shlex.split(html.unescape(offered.group(1)))
        assert words[:2] == ["prime-runs", "sync"] and "--state-dir" in words, words
        done = subprocess.run(sync_cmd(server.base_url, *words[2:]), capture_output=True, text=True, timeout=120,
                              env=child_env(PRIME_API_KEY=TOKEN))
        assert done.returncode == 0, done.stdout + done.stderr
        assert_exactly_once(api, builder)
        page = httpx.get(url + "/run", params={"run": "archived"}, timeout=30).text
        assert "Not synced anywhere yet" not in page
    finally:
        proc.terminate()
        proc.wait(15)
