"""Where each run stands, in Debian's chromium: written, and synced where, from real syncs.

``prime-runs sync --local`` (the real local platform, embedded) ships one run whole and
another before it was resumed; the viewer must show each destination's figures as the
sync state files hold them: the platform, the store, episodes acknowledged, pending, the
evaluation's link. A state file is data: a ``javascript:`` URL or markup in it stays text.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool.sync.state import CHECKSUM_KEY, SyncState, sync_dir
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource
from support.env import CLI, child_env
from support.runs import RunBuilder
from support.viewer_runs import FIXTURE_OUTPUTS

pytestmark = pytest.mark.slow  # three real syncs for the module

HOSTILE_URL = "javascript:window.__viewer_xss = 8"
HOSTILE_PLATFORM = "<img src=x onerror=\"window.__viewer_xss = 9\">"


def _sync(path: Path, db: Path) -> None:
    done = subprocess.run(CLI + ["sync", str(path), "--local", "--db", str(db)], capture_output=True, text=True,
                          env=child_env(), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("standing")
    out, db = work / "outputs", work / "platform.db"
    shutil.copytree(FIXTURE_OUTPUTS / "gsm8k-completed", out / "synced")
    shutil.copytree(FIXTURE_OUTPUTS / "gsm8k-failed", out / "never-synced")
    _sync(out / "synced", db)
    # synced after its first 3 episodes (the writer died), then resumed with 2 more
    resumed = RunBuilder(out / "resumed", "resumed")
    resumed.open_segment()
    resumed.add(3, size=0)
    resumed.abandon()
    _sync(out / "resumed", db)
    resumed.open_segment()
    resumed.add(2, size=0)
    resumed.seal("completed")
    # a copy of the synced run whose state file says hostile things
    shutil.copytree(out / "synced", out / "hostile")
    (state_path,) = sync_dir(out / "hostile").glob("*.json")
    state = json.loads(state_path.read_text())
    state["viewer_url"] = HOSTILE_URL
    state["destination"]["base_url"] = HOSTILE_PLATFORM
    del state[CHECKSUM_KEY]  # written again whole, as whoever planted it would: its checksum holds
    state_path.write_bytes(SyncState.from_json(json.dumps(state).encode()).to_json())
    return out


@pytest.fixture(scope="module")
def viewer(outputs):
    with EmbeddedServer(create_viewer_app(SpoolSource([outputs]))) as server:
        yield server.base_url


def test_the_runs_page_says_what_went_where(page, viewer, outputs):
    page.goto(viewer + "/")
    synced = page.locator('tr[data-run="synced"] td.synced')
    synced.wait_for()
    assert synced.inner_text().startswith("6 of 6 to samples table · finalized")
    assert synced.locator("div").get_attribute("data-platform") == f"local platform ({outputs.parent / 'platform.db'})"
    assert synced.locator("a").get_attribute("href").startswith("http://127.0.0.1:")
    assert page.locator('tr[data-run="resumed"] td.synced').inner_text().startswith("3 of 5 to samples table")
    assert page.locator('tr[data-run="never-synced"] td.synced').inner_text() == "not synced"


def test_a_run_page_shows_written_and_synced_from_the_state_files(page, viewer, outputs):
    page.goto(viewer + "/run?run=resumed")
    standing = page.locator("section.standing")
    assert standing.locator("table.written").inner_text() == "written\t5 episodes in 2 segments, sealed completed"
    row = standing.locator("table.synced-to tbody tr")
    assert row.count() == 1
    state = json.loads(next(sync_dir(outputs / "resumed").glob("*.json")).read_text())
    assert row.locator("td.acknowledged").inner_text() == str(state["episodes_pushed"]) == "3"
    assert row.locator("td.pending").inner_text() == "2"
    assert "crashed" in row.inner_text()  # the end the platform was last told of
    assert row.locator("a.evaluation").inner_text() == state["evaluation_id"]
    assert row.locator("a.evaluation").get_attribute("href") == state["viewer_url"]
    page.goto(viewer + "/run?run=never-synced")
    assert "Not synced anywhere yet" in page.locator("section.standing").inner_text()
    assert page.locator("section.standing table.written").inner_text().endswith("sealed failed")


def test_a_hostile_state_file_stays_text(page, viewer):
    page.goto(viewer + "/run?run=hostile")
    row = page.locator("section.standing table.synced-to tbody tr")
    assert HOSTILE_PLATFORM in row.inner_text()
    assert row.locator("a").count() == 0  # a javascript: URL is never a link
    page.goto(viewer + "/")
    assert page.locator('tr[data-run="hostile"] td.synced a').count() == 0
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main img, main script").count() == 0
