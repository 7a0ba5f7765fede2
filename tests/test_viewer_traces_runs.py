"""The local platform's Prime Traces runs on its dashboard, in a real browser, against a real
``prime-runs platform serve --traces`` process: a run synced ``--to traces`` is listed and
opens like one synced to the samples table, and a run uploaded to Prime Traces by another
client (no evaluation names it) is listed beside them and opens too, its hostile prompt text.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Iterator

import pytest
from prime_traces import LineFormat, TracesClient

from prime_runs_spool.platform_api.traces import encode_line, stamp_run
from support import platform_process
from support.browser import screenshot
from support.sync_e2e import run_sync
from support.viewer_runs import FIXTURE_OUTPUTS, SCRIPT_PROMPT, script_episode

pytestmark = pytest.mark.slow  # a platform process and two real syncs for the module

#: The runs another client uploads to Prime Traces, with no evaluation; the second's id is markup.
OTHER_RUN = "uploaded-by-hand"
HOSTILE_RUN = '<img src=x onerror="window.__viewer_xss = 50">'


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("traces-dashboard")
    for name, to in (("gsm8k-completed", "traces"), ("gsm8k-resumed", "samples")):
        shutil.copytree(FIXTURE_OUTPUTS / name, root / to / name)
    with platform_process.running(root / "platform.db", "--traces") as proc:
        evaluations = {}
        for to in ("traces", "samples"):
            done = run_sync(proc.base_url, str(root / to), "--to", to, "--json", key="any")
            assert done.returncode == 0, done.stderr
            (report,) = json.loads(done.stdout)["runs"]
            assert (report["store"], report["pushed_now"]) == (to, 6)
            evaluations[to] = report["evaluation_id"]
        with TracesClient(api_key="any", base_url=proc.base_url) as traces:
            for run_id in (OTHER_RUN, HOSTILE_RUN):
                episodes = [script_episode(n) for n in range(2)]
                for n, episode in enumerate(episodes):  # ids of their own: one id is one episode
                    episode["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{n}"))
                lines = [encode_line(stamp_run(episode, run_id)) for episode in episodes]
                traces.upload_lines(lines, line_format=LineFormat.EPISODE)
        yield {"url": proc.base_url, **evaluations}


@pytest.fixture(scope="module")
def viewer(platform) -> str:
    return platform["url"] + "/dashboard"


def _row(page, key: str):
    return page.locator(f'tr[data-run="{key}"]')


def test_prime_traces_runs_are_listed_beside_the_evaluations_and_open(page, viewer, platform, tmp_path):
    page.goto(viewer + "/")
    traces, samples, other = _row(page, platform["traces"]), _row(page, platform["samples"]), \
        _row(page, f"traces:{OTHER_RUN}")
    for row in (traces, samples, other):
        row.wait_for()
    assert traces.locator("[data-store]").get_attribute("data-store") == "Prime Traces"
    assert samples.locator("[data-store]").get_attribute("data-store") == "samples table"
    assert other.locator("[data-store]").get_attribute("data-store") == "Prime Traces"
    assert other.locator("[data-status]").get_attribute("data-status") == "uploaded"
    assert "no evaluation names" in page.locator('dd[data-meaning="uploaded"]').inner_text()
    hostile = page.locator("tr[data-run]").filter(has_text="onerror")
    assert hostile.locator("a.run-link").inner_text() == HOSTILE_RUN  # a run id that is markup stays text
    assert page.evaluate("window.__viewer_xss") is None and page.locator("main img").count() == 0
    page.wait_for_function(  # the episode counts come from Prime Traces, read in the background
        "key => document.querySelector(`tr[data-run=\"${key}\"] td.episodes`).innerText === '6'",
        arg=platform["traces"], timeout=10_000)
    screenshot(page, "viewer-dashboard.png", tmp_path)
    # the run synced --to traces opens: its table, then an episode's transcript
    traces.locator("a.run-link").click()
    page.wait_for_url(re.compile(r"/dashboard/run\?run="))
    assert page.locator("#match-count .total").inner_text() == "6"
    page.locator('tr.sample[data-n="1"] a.episode-link').click()
    roles = page.locator("section.trace").first.locator("li.turn").evaluate_all("els => els.map(e => e.dataset.role)")
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    # the run with no evaluation opens the same way, its <script> prompt shown as text
    page.goto(viewer + "/")
    _row(page, f"traces:{OTHER_RUN}").locator("a.run-link").click()
    page.wait_for_url(re.compile(r"/dashboard/run\?run=traces"))
    assert page.locator("#match-count .total").inner_text() == "2"
    page.locator('tr.sample[data-n="1"] a.episode-link').click()
    assert page.locator('section.trace li[data-role="user"] pre.content').first.inner_text() == SCRIPT_PROMPT
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


def test_an_unknown_prime_traces_run_is_a_404_page(page, viewer):
    response = page.goto(viewer + "/run?run=traces:no-such-run")
    assert response.status == 404 and "no-such-run" in page.locator("p.problem").inner_text()


def test_a_prime_traces_run_and_a_samples_run_compare_side_by_side(page, viewer, platform):
    page.goto(viewer + f"/compare?a={platform['traces']}&b={platform['samples']}")
    assert page.locator("section.compare-summary td.paired").inner_text() == "4"
    page.locator('table.compare tr[data-example="0"] a.pair-link').click()
    page.wait_for_url(re.compile(r"/dashboard/pair\?"))
    # one from Prime Traces, one from its sample row: the same episode's turns, every trace's
    turns = [page.locator(f'section.side[data-side="{side}"] li.turn').evaluate_all(
        "els => els.map(e => e.dataset.role + ': ' + e.innerText)") for side in ("a", "b")]
    assert turns[0] == turns[1] and [t.split(":")[0] for t in turns[0][:5]] == [
        "system", "user", "assistant", "tool", "assistant"]
