"""``prime-runs view``'s port and ``--open``, as a real process.

The default port is the same every time (a bookmark keeps working); when it is taken, the
next free one is used rather than failing; an explicit ``--port`` is that port or a usage
error. ``--open`` starts the user's browser (``$BROWSER``: here a script that records the
URL it was given and fetches it, as a browser would) once the server answers.
"""

from __future__ import annotations

import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from prime_runs_spool.viewer.server import DEFAULT_VIEW_PORT, VIEW_PORT_TRIES

from support import platform_process
from support.env import CLI, REPO_ROOT, child_env
from support.odd_files import odd_tree  # noqa: F401 (a fixture)

FIXTURES = REPO_ROOT / "fixtures" / "outputs"


def _start(*args: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(CLI + ["view", str(FIXTURES), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(**env))
    return proc, platform_process.first_line(proc)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    assert proc.wait(15) == 0, proc.stderr.read()
    return proc.stderr.read()


def _holding(port: int) -> socket.socket | None:
    """A socket listening on ``port`` (None when someone else already holds it)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(1)
    except OSError:
        sock.close()
        return None
    return sock


@pytest.mark.slow
def test_the_default_port_is_stable_and_a_taken_one_falls_back():
    # Another test run on this machine (full runs side by side) may hold the port a moment:
    # wait for it, or the viewer may get it once that run lets go, though "taken" here.
    deadline = time.monotonic() + 20
    while (held := _holding(DEFAULT_VIEW_PORT)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        proc, url = _start()
        try:
            port = urlsplit(url).port
            lowest = DEFAULT_VIEW_PORT + 1 if held is not None else DEFAULT_VIEW_PORT
            assert port in range(lowest, DEFAULT_VIEW_PORT + VIEW_PORT_TRIES)
        finally:
            _stop(proc)
    finally:
        if held is not None:
            held.close()
    if held is not None:  # it was free a moment ago: the default is what a user gets
        for _ in range(5):  # unless another test run here took it between the release and the start
            proc, url = _start()
            _stop(proc)
            if url == f"http://127.0.0.1:{DEFAULT_VIEW_PORT}/":
                break
            time.sleep(1)
        assert url == f"http://127.0.0.1:{DEFAULT_VIEW_PORT}/"


@pytest.mark.slow
def test_an_explicit_port_that_is_taken_is_a_usage_error():
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    try:
        port = held.getsockname()[1]
        done = subprocess.run(CLI + ["view", str(FIXTURES), "--port", str(port)], capture_output=True, text=True,
                              env=child_env(), timeout=60)
    finally:
        held.close()
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}" in done.stderr


@pytest.mark.slow
def test_open_starts_the_browser_on_the_viewer(tmp_path):
    seen = tmp_path / "browser-saw"
    browser = tmp_path / "browser"
    browser.write_text(f"#!{sys.executable}\n"
                       "import sys, urllib.request\n"
                       "url = sys.argv[1]\n"
                       "status = urllib.request.urlopen(url, timeout=10).status\n"
                       f"open({str(seen)!r}, 'w').write(url + ' ' + str(status))\n")
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    proc, url = _start("--port", "0", "--open", BROWSER=str(browser))
    try:
        deadline = time.monotonic() + 30
        while not seen.exists() or not seen.read_text():
            assert time.monotonic() < deadline, "the browser was not started"
            time.sleep(0.05)
        assert seen.read_text() == f"{url} 200"
    finally:
        _stop(proc)


@pytest.mark.slow
def test_open_without_any_browser_says_so_and_keeps_serving(tmp_path):
    proc, url = _start("--port", "0", "--open", BROWSER=str(tmp_path / "no-such-browser"), PATH=str(tmp_path),
                       DISPLAY="", WAYLAND_DISPLAY="")
    import httpx

    try:
        assert httpx.get(url, timeout=10).status_code == 200
    finally:
        err = _stop(proc)
    assert f"no browser could be opened; open {url}" in err


@pytest.mark.slow
def test_the_viewer_lists_and_opens_a_run_whose_folder_name_is_not_utf8(odd_tree: Path) -> None:
    """The run's key went into the page's links as it was: urlencode raised, and the list
    of runs (every run's, not only this one's) answered 500."""
    proc = subprocess.Popen(CLI + ["view", str(odd_tree)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        url = platform_process.first_line(proc).rstrip("/")
        with httpx.Client(base_url=url, timeout=30) as client:
            index = client.get("/")
            assert index.status_code == 200, index.text[-500:]
            assert "/run?run=plain" in index.text
            page = client.get("/run", params={"run": "run-\\xff\\xfe"})
            assert page.status_code == 200
            assert client.get("/episode", params={"run": "run-\\xff\\xfe", "n": 1}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.slow
def test_a_run_deleted_while_the_viewer_serves_leaves_every_page_answering(tmp_path: Path) -> None:
    """Its spool then held no segment, and the page's standing of the run asked for the last
    one: the list of runs (every run's) and the run's page answered 500, with a traceback in
    the log, until the viewer was restarted; and the run stayed listed as it was."""
    from support.runs import build_run

    for name in ("kept", "deleted"):
        build_run(tmp_path / "runs" / name, f"viewer-{name}", 2)
    proc = subprocess.Popen(CLI + ["view", str(tmp_path / "runs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        url = platform_process.first_line(proc).rstrip("/")
        with httpx.Client(base_url=url, timeout=30) as client:
            assert "/run?run=deleted" in client.get("/").text
            shutil.rmtree(tmp_path / "runs" / "deleted")
            pages = [client.get("/run", params={"run": "deleted"}), client.get("/")]  # before and after a rescan
            time.sleep(1.0)  # sources.RESCAN_INTERVAL
            index = client.get("/")
            assert [page.status_code in (200, 404) for page in pages] == [True, True], pages
            assert index.status_code == 200
            assert "/run?run=kept" in index.text and "/run?run=deleted" not in index.text
    finally:
        proc.terminate()
        proc.wait(15)
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.parametrize("damage", ["spool folder made a file", "segment made a symbolic link loop"])
def test_a_run_whose_files_cannot_be_read_since_answers_in_one_line_not_a_500(tmp_path: Path, damage: str) -> None:
    """A run's files changed under the viewer so that reading them raises an ``OSError``
    (``NotADirectoryError``, ``ELOOP``), not the reader's own error: its pages answered 500
    Internal Server Error with a traceback in the log, until the next rescan at best; now
    the run's pages say what cannot be read, and every other run's pages answer as before."""
    from starlette.testclient import TestClient

    from prime_runs_spool.spool.layout import list_segments
    from prime_runs_spool.viewer.app import create_viewer_app
    from prime_runs_spool.viewer.sources import SpoolSource
    from support.runs import build_run

    for name in ("kept", "damaged"):
        build_run(tmp_path / "runs" / name, f"viewer-{name}", 3)
    client = TestClient(create_viewer_app(SpoolSource([tmp_path / "runs"])), base_url="http://127.0.0.1")
    pages = ["/run?run=damaged", "/episode?run=damaged&n=1", "/group?run=damaged&example=0",
             "/pair?a=damaged&b=kept&example=0", "/run?run=damaged&fragment=1"]
    assert [client.get(page).status_code for page in pages] == [200] * len(pages)
    damaged = tmp_path / "runs" / "damaged"
    if damage == "spool folder made a file":
        shutil.rmtree(damaged / "spool")
        (damaged / "spool").write_bytes(b"")
    else:
        segment = list_segments(damaged)[0][1]
        segment.unlink()
        segment.symlink_to(segment.name)
    for page in pages:
        answer = client.get(page)
        assert answer.status_code in (200, 404, 500), page
        assert answer.status_code == 200 or "Cannot read this run" in answer.text or "Not found" in answer.text, page
    assert client.get("/run?run=kept").status_code == 200
    assert client.get("/").status_code == 200


@pytest.mark.slow
def test_a_run_deleted_and_written_again_at_its_path_is_read_afresh(tmp_path: Path) -> None:
    """An eval run again into the same folder (rm -r, then the same command): its spool
    folder may even get the old one's inode back. The run's index read on from where the
    old spool ended: the page showed the old run's 3 episodes and called the new run
    'corrupt' (bytes that were checksummed have changed) until the viewer was restarted."""
    from starlette.testclient import TestClient

    from prime_runs_spool.viewer.app import create_viewer_app
    from prime_runs_spool.viewer.sources import RESCAN_INTERVAL, SpoolSource
    from support.runs import build_run

    build_run(tmp_path / "runs" / "x", "first-run", 3)
    client = TestClient(create_viewer_app(SpoolSource([tmp_path / "runs"])), base_url="http://127.0.0.1")

    def listed() -> str:
        runs = client.get("/").text
        row = runs[runs.index('data-run="x"'):]
        return row[:row.index("</tr>")]

    assert client.get("/run?run=x").status_code == 200
    assert '<td class="num episodes">3</td>' in listed()
    shutil.rmtree(tmp_path / "runs" / "x")
    build_run(tmp_path / "runs" / "x", "second-run", 7)
    time.sleep(RESCAN_INTERVAL)
    row = listed()
    assert '<td class="num episodes">7</td>' in row and 'data-status="completed"' in row, row
    page = client.get("/run?run=x").text
    assert "corrupt" not in page and "episode?run=x&amp;n=7" in page


@pytest.mark.parametrize("when", ["before the viewer started", "while it serves"])
def test_a_run_whose_segments_were_deleted_is_listed_as_one_that_cannot_be_read(tmp_path: Path, when: str) -> None:
    """A cleanup that deleted a run's ``*.jsonl`` (its durable mark and sync state left):
    ``status`` names the run and why (layout.SegmentsGoneError); the viewer passed over it
    in silence, listed no more, as a folder holding no run. It is listed, its status
    ``error``, and its page says why it cannot be read; the other run is shown as before."""
    from starlette.testclient import TestClient

    from prime_runs_spool.spool.layout import segment_path
    from prime_runs_spool.viewer.app import create_viewer_app
    from prime_runs_spool.viewer.sources import RESCAN_INTERVAL, SpoolSource
    from support.runs import build_run

    gone = build_run(tmp_path / "runs" / "gone", "viewer-segments-deleted", 3)
    build_run(tmp_path / "runs" / "kept", "viewer-segments-kept", 2)
    if when == "before the viewer started":
        segment_path(gone.run_dir, 1).unlink()
    client = TestClient(create_viewer_app(SpoolSource([tmp_path / "runs"])), base_url="http://127.0.0.1")
    if when == "while it serves":
        assert 'data-run="gone"' in client.get("/").text
        segment_path(gone.run_dir, 1).unlink()
        time.sleep(RESCAN_INTERVAL)
    runs = client.get("/").text
    assert 'data-run="kept"' in runs and 'data-run="gone"' in runs, runs
    row = runs[runs.index('data-run="gone"'):]
    assert 'data-status="error"' in row[:row.index("</tr>")], row[:row.index("</tr>")]
    page = client.get("/run?run=gone")
    assert page.status_code == 200 and "no segment left beside the durable mark" in page.text, page.text
