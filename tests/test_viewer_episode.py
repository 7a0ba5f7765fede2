"""The episode page and the statuses, in Debian's chromium, over what real evals leave.

The failed episode is the real thing: verifiers 0.4.0's eval (through ``prime-runs eval``)
against a model address where nothing listens, so every model call fails and the episode
ends with no message at all, only its prompt, its failed calls and its error. Beside it,
runs of every status the viewer explains: torn and failed (fixtures/outputs), crashed (a
writer that stopped between lines) and cancelled (a sealed cancel).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from fixtures.episodes import make_episode
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource
from support.runs import RunBuilder
from support.viewer_runs import FIXTURE_OUTPUTS
from support.vf_eval import launch_file, run_dir, run_eval

pytestmark = pytest.mark.slow  # one real eval for the module

HOSTILE_TYPE = "<img src=x onerror=\"window.__viewer_xss = 6\">"
HOSTILE_MESSAGE = "<script>window.__viewer_xss = 7</script>"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("episode")
    done = run_eval(work, "@", str(launch_file(work, f"http://127.0.0.1:{_closed_port()}/v1", rollouts=1)),
                    timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = work / "outputs"
    assert run_dir(work) == out / "tiny"
    for name in ("gsm8k-crashed-torn", "gsm8k-failed"):
        shutil.copytree(FIXTURE_OUTPUTS / name, out / name)
    crashed = RunBuilder(out / "crashed", "crashed")
    crashed.open_segment()
    crashed.add(1, size=0)
    crashed.abandon()
    cancelled = RunBuilder(out / "cancelled", "cancelled")
    cancelled.open_segment()
    cancelled.add(1, size=0)
    cancelled.seal("cancelled")
    hostile = make_episode(0, size=0, run_id="hostile")
    hostile["ok"] = False
    hostile["traces"][0]["nodes"] = []
    hostile["traces"][0]["errors"] = [{"type": HOSTILE_TYPE, "message": HOSTILE_MESSAGE}]
    hostile["traces"][0]["calls"] = [{"model": HOSTILE_TYPE, "error": {"type": HOSTILE_TYPE, "message": HOSTILE_MESSAGE}}]
    writer = SegmentWriter.create(out / "hostile", "hostile")
    writer.append("episode", hostile)
    writer.seal("failed")
    return out


@pytest.fixture(scope="module")
def viewer(outputs):
    with EmbeddedServer(create_viewer_app(SpoolSource([outputs]))) as server:
        yield server.base_url


def test_a_failed_episode_shows_its_prompt_first_and_why_its_transcript_is_empty(page, viewer):
    page.goto(viewer + "/episode?run=tiny&n=1")
    headings = page.locator("main h2").all_inner_texts()
    assert headings[0] == "Prompt"
    assert page.locator("section.prompt pre").inner_text().startswith("What is") or \
        page.locator("section.prompt pre").inner_text() == "Capital of France?"
    assert page.locator("section.prompt .expected code").inner_text() in ("4", "6", "Paris")
    trace = page.locator("section.trace").first
    assert trace.locator("li.turn").count() == 0
    silence = trace.locator("p.silence").inner_text()
    assert "failed before any message was recorded" in silence
    assert "ProviderError: All connection attempts failed" in silence


def test_the_model_call_table_shows_what_the_calls_have(page, viewer):
    page.goto(viewer + "/episode?run=tiny&n=1")
    table = page.locator("section.trace table.calls").first
    assert table.locator("thead th").all_inner_texts() == ["model", "endpoint", "time", "error"]
    cells = table.locator("tbody td").all_inner_texts()
    assert cells and all(cell.strip() not in ("", "–") for cell in cells)
    assert "ProviderError: All connection attempts failed (status 503)" in table.locator("tbody tr").first.inner_text()
    # a successful episode keeps its token columns
    page.goto(viewer + "/episode?run=gsm8k-failed&n=1")
    headers = page.locator("section.trace table.calls").first.locator("thead th").all_inner_texts()
    assert {"prompt", "completion", "finish"} <= set(headers) and "error" not in headers


@pytest.mark.parametrize(("key", "status"), [("gsm8k-crashed-torn", "torn"), ("crashed", "crashed"),
                                             ("cancelled", "cancelled"), ("gsm8k-failed", "failed")])
def test_each_status_is_explained_in_one_sentence(page, viewer, key, status):
    page.goto(viewer + "/")
    page.locator(f'tr[data-run="{key}"]').wait_for()
    assert page.locator(f'tr[data-run="{key}"] [data-status]').get_attribute("data-status") == status
    legend = page.locator(f'dl.statuses dd[data-meaning="{status}"]').inner_text()
    assert legend.endswith(".") and legend.count(". ") == 0  # one sentence
    page.goto(viewer + f"/run?run={key}")
    assert page.locator("p.status-meaning").inner_text() == f"{status}: {legend}"
    page.goto(viewer + f"/episode?run={key}&n=1")
    assert page.locator("p.run-status .meaning").inner_text() == legend


def test_a_hostile_error_stays_text_where_the_transcript_would_be(page, viewer):
    page.goto(viewer + "/episode?run=hostile&n=1")
    assert HOSTILE_MESSAGE in page.locator("p.silence").inner_text()
    assert HOSTILE_TYPE in page.locator("p.silence").inner_text()
    assert HOSTILE_TYPE in page.locator("table.calls").inner_text()
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0
