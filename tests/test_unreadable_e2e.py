"""One unreadable directory among runs: every command reports the others and names it.

Permissions are real: a directory at mode 000. Root reads through mode bits, so when the
tests run as root each command runs without the two capabilities that let it
(``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, dropped with ``setpriv``); that is exactly
what root meets on an NFS export with root squashing or a FUSE mount it does not own. A
FIFO named like a segment needs no such help: it stops root as surely as anyone (an
``open`` of it blocks until a writer comes, i.e. forever).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.env import CLI, REPO_ROOT, child_env
from support.eval_outputs import spooled_as_eval, vf040_outputs
from support.runs import build_run
from support.unprivileged import AS_UNPRIVILEGED, SKIP_REASON

pytestmark = pytest.mark.skipif(AS_UNPRIVILEGED is None, reason=SKIP_REASON)


def command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_UNPRIVILEGED, *CLI, *args], capture_output=True, text=True,
                          env=child_env(), timeout=timeout)


@pytest.fixture
def tree(tmp_path: Path):
    """Five runs: two readable, one at mode 000, one whose spool/ is at 000, one with a
    segment at 000, one with a FIFO where its second segment should be."""
    root = tmp_path / "outputs"
    for name in ("a-good", "b-dir", "c-spool", "d-segment", "e-fifo", "f-good"):
        build_run(root / name, f"unreadable-{name}", 3)
    os.mkfifo(root / "e-fifo" / "spool" / "seg-000002.jsonl")
    blocked = [root / "b-dir", root / "c-spool" / "spool", root / "d-segment" / "spool" / "seg-000001.jsonl"]
    for path in blocked:
        path.chmod(0)
    yield root
    for path in blocked:
        path.chmod(0o700)


def assert_no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "internal error" not in done.stdout + done.stderr, done.stderr


@pytest.mark.slow
def test_sync_pushes_the_readable_runs_names_the_others_and_exits_1(tree: Path, tmp_path: Path) -> None:
    done = command("sync", str(tree), "--local", "--db", str(tmp_path / "local.db"), "--json", timeout=120)
    assert_no_traceback(done)
    assert done.returncode == 1, done.stderr
    reports = {Path(r["path"]).name: r for r in json.loads(done.stdout)["runs"]}
    assert reports["a-good"]["state"] == reports["f-good"]["state"] == "synced"
    assert reports["a-good"]["pushed_now"] == reports["f-good"]["pushed_now"] == 3
    for name, culprit, why in [("b-dir", "b-dir", "Permission denied"),
                               ("c-spool", "c-spool/spool", "Permission denied"),
                               ("d-segment", "d-segment/spool/seg-000001.jsonl", "Permission denied"),
                               ("e-fifo", "e-fifo/spool/seg-000002.jsonl", "not a regular file")]:
        assert reports[name]["state"] == "error", reports[name]
        assert f"{tree / culprit}: " in reports[name]["error"] and why in reports[name]["error"], reports[name]
    # Human output too: one line per run, the unreadable ones named with the reason.
    text = command("sync", str(tree), "--local", "--db", str(tmp_path / "local.db"), timeout=120)
    assert_no_traceback(text)
    assert text.returncode == 1
    assert f"{tree / 'b-dir'}: cannot be read (Permission denied)" in text.stdout


@pytest.mark.slow
def test_status_reports_every_run_and_names_the_unreadable_ones(tree: Path) -> None:
    done = command("status", str(tree), "--json")
    assert_no_traceback(done)
    assert done.returncode == 0, done.stderr
    runs = {Path(r["path"]).name: r for r in json.loads(done.stdout)["runs"]}
    assert set(runs) == {"a-good", "b-dir", "c-spool", "d-segment", "e-fifo", "f-good"}
    assert runs["a-good"]["state"] == runs["f-good"]["state"] == "completed"
    assert runs["a-good"]["episodes"] == 3
    for name in ("b-dir", "c-spool", "d-segment", "e-fifo"):
        assert runs[name]["state"] == "error" and "cannot be read" in runs[name]["error"], runs[name]
    text = command("status", str(tree))
    assert_no_traceback(text)
    assert f"{tree / 'c-spool' / 'spool'}: cannot be read (Permission denied)" in text.stdout


def test_verify_checks_every_readable_run_and_fails_naming_the_unreadable(tree: Path) -> None:
    done = command("verify", str(tree), "--json")
    assert_no_traceback(done)
    assert done.returncode == 1, done.stderr
    runs = {Path(r["run_dir"]).name: r for r in json.loads(done.stdout)["runs"]}
    assert runs["a-good"]["ok"] and runs["f-good"]["ok"] and runs["a-good"]["status"] == "completed"
    for name in ("b-dir", "c-spool", "d-segment", "e-fifo"):
        assert not runs[name]["ok"] and "cannot be read" in runs[name]["error"], runs[name]
    assert done.stderr.strip().count("\n") == 0 and "4 of 6 runs failed verification" in done.stderr
    # Given the unreadable directory itself: named, not "no such file", not a crash.
    alone = command("verify", str(tree / "b-dir"))
    assert_no_traceback(alone)
    assert alone.returncode == 1 and "Permission denied" in alone.stdout + alone.stderr


@pytest.mark.slow
def test_follow_syncs_the_readable_runs_and_names_the_unreadable_once(tree: Path, tmp_path: Path) -> None:
    done = command("sync", "--follow", "--exit-when-idle", str(tree), "--local", "--db", str(tmp_path / "local.db"),
                   "--json", timeout=120)
    assert_no_traceback(done)
    assert done.returncode == 1, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    final = {Path(e["path"]).name: e["state"] for e in events}
    assert final["a-good"] == final["f-good"] == "synced"
    assert [e["path"] for e in events].count(str(tree / "b-dir")) == 1
    assert final["b-dir"] == final["c-spool"] == final["d-segment"] == final["e-fifo"] == "error"


@pytest.mark.slow
def test_eval_outputs_whose_spool_folder_cannot_be_read_are_named_in_their_place(tmp_path: Path) -> None:
    """The eval wrote its spool beside traces.jsonl (a run another user ran: its spool folder
    0700, theirs). Each command that looks at whether the spool and traces.jsonl agree, or
    whether the outputs have a spool, names the folder in the run's line as for a bare spool."""
    root = tmp_path / "outputs"
    vf040_outputs(root / "theirs", 3)
    spooled_as_eval(root / "theirs")
    build_run(root / "mine", "unreadable-mine", 2)
    spool = root / "theirs" / "spool"
    spool.chmod(0)
    try:
        status = command("status", str(root), "--json")
        verify = command("verify", str(root))
        synced = command("sync", str(root), "--local", "--db", str(tmp_path / "local.db"), "--json", timeout=120)
        export = command("export", str(root), "-o", str(tmp_path / "table.csv"))
    finally:
        spool.chmod(0o700)
    for done in (status, verify, synced, export):
        assert_no_traceback(done)
    assert status.returncode == 0, status.stderr
    runs = {Path(r["path"]).name: r for r in json.loads(status.stdout)["runs"]}
    assert runs["theirs"]["state"] == "error" and f"{spool}: cannot be read (Permission denied)" in runs["theirs"]["error"]
    assert runs["mine"]["state"] == "completed"
    assert verify.returncode == 1 and f"UNREADABLE: {spool}: cannot be read" in verify.stdout, verify.stderr
    assert synced.returncode == 1, synced.stderr
    reports = {Path(r["path"]).name: r for r in json.loads(synced.stdout)["runs"]}
    assert reports["mine"]["state"] == "synced" and reports["theirs"]["state"] == "error", reports
    assert f"{spool}: cannot be read" in reports["theirs"]["error"]
    # The readable run exported, the other named as unreadable (not the table as unwritable).
    assert export.returncode == 1 and f"{spool}: cannot be read (Permission denied)" in export.stderr, export.stderr
    assert "cannot be written" not in export.stderr
    assert "unreadable-mine" in (tmp_path / "table.csv").read_text()


@pytest.mark.slow
def test_a_path_holding_only_a_folder_that_cannot_be_read_is_not_said_to_hold_nothing(tmp_path: Path) -> None:
    """Under the path, one run folder another user's (mode 000 here). Every command named it
    and then said 'PATH: nothing found: neither a spool nor eval outputs ... under it', and
    status exited 1 for it; import named nothing at all: the folder was passed over in
    silence, 'nothing found' its only line."""
    root = tmp_path / "outputs"
    vf040_outputs(root / "theirs", 2)
    (root / "theirs").chmod(0)
    try:
        done = {name: command(*args) for name, args in {
            "status": ["status", str(root)], "verify": ["verify", str(root)], "import": ["import", str(root)],
            "sync": ["sync", str(root), "--local", "--db", str(tmp_path / "local.db")],
            "export": ["export", str(root), "-o", str(tmp_path / "table.csv")]}.items()}
    finally:
        (root / "theirs").chmod(0o755)
    named = f"{root / 'theirs'}: cannot be read (Permission denied)"
    for name, result in done.items():
        assert_no_traceback(result)
        said = result.stdout + result.stderr
        assert "nothing found" not in said and "nothing to import" not in said, (name, said)
        assert named in said, (name, said)
        assert result.returncode == (0 if name == "status" else 1), (name, said)
    assert done["import"].stderr.endswith(f"{named}: eval outputs in it, if any, were not imported\n")


@pytest.mark.slow
def test_view_shows_every_run_and_names_the_unreadable_ones_in_their_rows(tree: Path) -> None:
    """A segment that cannot be read (another user's, a resume by someone else) raised out of
    the run's index as it was read: the runs page and the across-runs page, which read every
    run, answered "Cannot read this run" (500) for all of them, the good ones unreachable."""
    import httpx

    from support import platform_process

    proc = subprocess.Popen([*AS_UNPRIVILEGED, *CLI, "view", str(tree), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        url = platform_process.first_line(proc).rstrip("/")
        with httpx.Client(base_url=url, timeout=30) as client:
            pages = {page: client.get(page) for page in ("/", "/across", "/run?run=a-good", "/run?run=d-segment")}
    finally:
        proc.terminate()
        proc.wait(15)
    assert {page: answer.status_code for page, answer in pages.items()} == dict.fromkeys(pages, 200)
    runs = pages["/"].text
    assert 'data-run="a-good"' in runs and 'data-run="f-good"' in runs
    row = runs[runs.index('data-run="d-segment"'):]
    row = row[:row.index("</tr>")]
    assert 'data-status="error"' in row and "seg-000001.jsonl: cannot be read (Permission denied)" in row, row
    assert "cannot be read (Permission denied)" in pages["/run?run=d-segment"].text
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.slow
def test_view_export_writes_every_run_and_names_the_unreadable_ones(tree: Path, tmp_path: Path) -> None:
    """It stopped at the first segment it could not read, 'view --export: ...seg-000001.jsonl:
    cannot be written (Permission denied)', exit 2, the site's pages unwritten."""
    done = command("view", str(tree), "--export", str(tmp_path / "site"), timeout=120)
    assert_no_traceback(done)
    assert "cannot be written" not in done.stderr
    assert done.returncode == 1, done.stderr
    assert f"{tree / 'd-segment' / 'spool' / 'seg-000001.jsonl'}: cannot be read (Permission denied)" in done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "episode-a-good-3.html").exists() and (tmp_path / "site" / "episode-f-good-3.html").exists()


SEARCH_AFTER_A_SEGMENT_WENT_UNREADABLE = """
import sys
from pathlib import Path
from starlette.testclient import TestClient
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.sources import SpoolSource
from support.episodes import episode_with_word

root = Path(sys.argv[1])
writer = SegmentWriter.create(root / "r", "r")
writer.append_many([("episode", episode_with_word(n, "r", "zebraquartz", "x", "message" if n == 2 else None),
                     {"episode_id": f"e{n}", "rollout_number": 1}) for n in range(5)])
writer.seal("completed")
source = SpoolSource([root])
run = source.get("r")
run.refresh(5)  # the rows are indexed; then the segment is made unreadable
(root / "r" / "spool" / "seg-000001.jsonl").chmod(0)
search = run.search()
search.catch_up_in_background()
search._catcher.join(30)
page = TestClient(create_viewer_app(source), base_url="http://127.0.0.1").get("/run?run=r&text=zebraquartz")
print(page.status_code, search.count, search.unread)
print(" ".join(page.text.split()))
"""


@pytest.mark.slow
def test_view_search_names_episodes_it_could_not_read_and_keeps_serving(tmp_path: Path) -> None:
    """A segment made unreadable after its rows were indexed: the search's background thread
    read it with only a spool error caught, and died with a traceback on stderr (the page's
    own search then failed the same way); now the episodes are indexed empty, counted, and
    the page says how many the search cannot find and why."""
    root = tmp_path / "outputs"
    env = child_env()
    env["PYTHONPATH"] += os.pathsep + str(REPO_ROOT / "tests")  # support.episodes
    try:
        done = subprocess.run([*AS_UNPRIVILEGED, sys.executable, "-c", SEARCH_AFTER_A_SEGMENT_WENT_UNREADABLE,
                               str(root)], capture_output=True, text=True, env=env, timeout=60)
    finally:
        (root / "r" / "spool" / "seg-000001.jsonl").chmod(0o600)
    assert_no_traceback(done)
    status, count, unread = done.stdout.splitlines()[0].split()
    assert (status, count, unread) == ("200", "5", "5"), done.stdout
    assert ("5 episodes could not be read when indexed, so the search cannot find them (the first: episode 1 "
            "cannot be read: Permission denied:") in done.stdout
