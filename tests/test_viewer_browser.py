"""The viewer in a real browser (system chromium via Playwright) against a real server.

One browser and one viewer server for the module (``prime-runs view``'s app, uvicorn on a
loopback port) over a temporary copy of fixtures/outputs plus a corrupt run, a run whose
prompt is a ``<script>``, an abandoned run and, in one test, a live writer process.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from support.browser import screenshot
from support.env import CLI, child_env
from support.viewer_runs import EXPECTED_STATUSES, SCRIPT_PROMPT, build_outputs, start_live_writer
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    return build_outputs(tmp_path_factory.mktemp("viewer"))


@pytest.fixture(scope="module")
def viewer(outputs):
    with EmbeddedServer(create_viewer_app(SpoolSource([outputs]))) as server:
        yield server.base_url


def _status_of(page, key: str) -> str:
    return page.locator(f'tr[data-run="{key}"] [data-status]').get_attribute("data-status")


@pytest.mark.slow
def test_runs_page_lists_every_run_with_its_status(page, viewer, tmp_path):
    page.goto(viewer + "/")
    for key, status in EXPECTED_STATUSES.items():
        row = page.locator(f'tr[data-run="{key}"]')
        row.wait_for()
        assert _status_of(page, key) == status, key
    completed = page.locator('tr[data-run="gsm8k-completed"]')
    assert completed.locator("td.episodes").inner_text() == "6"
    assert "Qwen/Qwen3-8B" in completed.inner_text() and "gsm8k" in completed.inner_text()
    assert "2026-01-15 12:00:00Z" in completed.inner_text()
    assert "0.5" in completed.inner_text()  # the seal's avg_reward
    screenshot(page, "viewer-runs.png", tmp_path)


@pytest.mark.slow
def test_clicking_a_run_shows_its_table_with_the_right_count(page, viewer, tmp_path):
    page.goto(viewer + "/")
    page.locator('tr[data-run="gsm8k-resumed"] a.run-link').click()
    page.wait_for_url(re.compile(r"/run\?run=gsm8k-resumed"))
    assert page.locator("#match-count .total").inner_text() == "6"
    assert page.locator("tr.sample").count() == 6
    # the masked manifest and config are on the page, and no credential that was masked
    page.goto(viewer + "/run?run=judge-credentials")
    body = page.content()
    assert "***" in body and "cfs_EXAMPLE_NOT_A_REAL_SECRET" not in body and "hf_EXAMPLE_NOT_A_REAL_TOKEN" not in body
    page.goto(viewer + "/run?run=gsm8k-completed")
    screenshot(page, "viewer-run.png", tmp_path)


def test_a_histogram_bin_filters_the_table(page, viewer):
    page.goto(viewer + "/run?run=gsm8k-completed")
    bins = page.locator("a.bin")
    assert bins.count() == 2  # rewards 0 and 1 in the fixture
    zero = bins.nth(0)
    count = int(zero.locator(".count").inner_text())
    zero.click()
    page.wait_for_url(re.compile(r"rmin=0"))
    assert page.locator("#match-count .total").inner_text() == str(count)
    rewards = page.locator("tr.sample td.reward").all_inner_texts()
    assert len(rewards) == count and set(rewards) == {"0"}
    assert page.locator("a.bin.active").count() == 1


@pytest.mark.slow
def test_sort_and_filters_are_server_side_and_in_the_url(page, viewer):
    page.goto(viewer + "/run?run=gsm8k-completed")
    page.locator('th a[data-sort="reward"]').click()
    page.wait_for_url(re.compile(r"sort=reward"))
    page.locator('th a[data-sort="reward"]').click()
    page.wait_for_url(re.compile(r"desc=1"))
    rewards = [float(r) for r in page.locator("tr.sample td.reward").all_inner_texts()]
    assert rewards == sorted(rewards, reverse=True)
    page.locator('input[name="errors"]').check()
    page.locator("form.filters button").click()
    page.wait_for_url(re.compile(r"errors=1"))
    assert page.locator("#match-count .total").inner_text() == "1"  # the fixture's one failing episode
    page.goto(viewer + "/run?run=gsm8k-completed&q=janet")
    assert int(page.locator("#match-count .total").inner_text()) >= 1


def test_each_row_shows_its_prompt_and_answer_and_expands_in_place(page, viewer):
    page.goto(viewer + "/run?run=gsm8k-completed")
    first = page.locator('tr.sample[data-n="1"]')
    assert first.locator("td.prompt").inner_text().startswith("Answer the math word problem")
    answer = first.locator("td.answer details")
    assert "#### 18" in answer.locator("summary").inner_text()
    assert not answer.locator("pre").is_visible()
    answer.locator("summary").click()  # in place: same page, the whole answer under the row's start
    assert answer.locator("pre").is_visible()
    assert answer.locator("pre").inner_text().startswith("She has 16 - 3 - 4 = 9 eggs left")
    assert page.url.endswith("/run?run=gsm8k-completed")
    # hostile prompts and answers stay text in the row too
    page.goto(viewer + "/run?run=script-prompt")
    row = page.locator('tr.sample[data-n="1"]')
    assert row.locator("td.prompt").inner_text() == " ".join(SCRIPT_PROMPT.split())
    row.locator("td.answer summary").click()
    assert row.locator("td.answer pre").inner_text() == "</pre><script>window.__viewer_xss = 3</script>4"
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


def test_an_episode_shows_its_transcript(page, viewer, tmp_path):
    page.goto(viewer + "/run?run=gsm8k-completed")
    page.locator('tr.sample[data-n="1"] a.episode-link').click()
    page.wait_for_url(re.compile(r"/episode\?run=gsm8k-completed&n=1"))
    roles = page.locator("section.trace").first.locator("li.turn").evaluate_all(
        "els => els.map(e => e.dataset.role)")
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    first = page.locator("section.trace").first
    assert "Janet" in first.locator('li[data-role="user"]').inner_text()
    assert "tool call bash" in first.locator(".tool-call").first.inner_text().lower()
    assert "16 eggs, eats 3" in first.locator(".reasoning").first.inner_text()  # reasoning content
    assert "#### 18" in first.inner_text()
    assert "reward judge" in first.inner_text() and "prompt" in first.inner_text().lower()
    assert page.locator("details.raw pre").count() == 1
    screenshot(page, "viewer-episode.png", tmp_path)


def test_group_view_shows_all_rollouts_of_an_example(page, viewer):
    page.goto(viewer + "/group?run=gsm8k-completed&example=1")
    assert page.locator("article.rollout").count() == 2  # 6 episodes over 4 examples: idx 0, 1 twice


def test_a_deep_link_reopens_the_same_view(page, viewer):
    page.goto(viewer + "/run?run=gsm8k-completed")
    page.locator('th a[data-sort="reward"]').click()
    page.wait_for_url(re.compile(r"sort=reward"))
    page.locator("a.bin").nth(1).click()
    page.wait_for_url(re.compile(r"rmin=1"))
    url = page.url
    shown = page.locator("tr.sample").evaluate_all("els => els.map(e => e.dataset.n)")
    other = page.context.new_page()
    other.goto(url)
    assert other.locator("tr.sample").evaluate_all("els => els.map(e => e.dataset.n)") == shown
    assert other.locator("a.bin.active").count() == 1
    assert other.locator("th.sorted a").get_attribute("data-sort") == "reward"
    other.close()


@pytest.mark.slow
def test_compare_lists_the_regressed_examples(page, viewer):
    # gsm8k-rerun is gsm8k-completed's examples 0-2 with every score flipped
    page.goto(viewer + "/")
    page.locator('select[name="a"]').select_option("gsm8k-completed")
    page.locator('select[name="b"]').select_option("gsm8k-rerun")
    page.locator("form.compare-pick button").click()
    page.wait_for_url(re.compile(r"/compare\?"))
    page.locator('a[data-show="regressed"]').click()
    page.wait_for_url(re.compile(r"show=regressed"))
    rows = page.locator("table.compare tbody tr")
    assert sorted(rows.evaluate_all("els => els.map(e => e.dataset.example)")) == ["0", "2"]
    assert set(rows.evaluate_all("els => els.map(e => e.className)")) == {"cmp-regressed"}
    assert rows.first.locator("td.delta").inner_text() == "-1"
    page.locator('a[data-show="improved"]').click()
    page.wait_for_url(re.compile(r"show=improved"))
    assert rows.evaluate_all("els => els.map(e => e.dataset.example)") == ["1"]
    page.locator('a[data-show="only"]').click()
    page.wait_for_url(re.compile(r"show=only"))
    assert rows.evaluate_all("els => els.map(e => e.dataset.example)") == ["3"]


@pytest.mark.slow
def test_the_script_prompt_stays_text(page, viewer):
    page.goto(viewer + "/episode?run=script-prompt&n=1")
    user = page.locator('section.trace li[data-role="user"] pre.content').first
    assert user.inner_text() == SCRIPT_PROMPT
    assert "<script>window.__viewer_xss = 3</script>4" in page.locator('li[data-role="assistant"]').first.inner_text()
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0
    page.goto(viewer + "/group?run=script-prompt&example=0")
    page.goto(viewer + "/run?run=script-prompt&q=" + "%3Cscript%3E")
    assert page.locator("#match-count .total").inner_text() == "2"
    assert page.locator('input[name="q"]').input_value() == "<script>"
    assert page.evaluate("window.__viewer_xss") is None


@pytest.mark.slow
def test_a_live_run_appears_and_grows_while_a_writer_appends(page, viewer, outputs, tmp_path):
    page.goto(viewer + "/")
    page.locator('tr[data-run="gsm8k-completed"]').wait_for()
    gate = tmp_path / "seal-now"
    writer = start_live_writer(outputs / "live-run", count=200, pause=0.25, gate=gate)
    try:
        row = page.locator('tr[data-run="live-run"]')
        row.wait_for(timeout=10_000)  # appears without a reload
        page.wait_for_function(
            "() => { const s = document.querySelector('tr[data-run=\"live-run\"] [data-status]');"
            " return s && s.dataset.status === 'live'; }", timeout=10_000)
        first = int(row.locator("td.episodes").inner_text())
        page.wait_for_function(
            f"() => parseInt(document.querySelector('tr[data-run=\"live-run\"] td.episodes').innerText) > {first}",
            timeout=10_000)
        # the run page grows too, on its own
        page.goto(viewer + "/run?run=live-run")
        shown = int(page.locator("#match-count .total").inner_text())
        page.wait_for_function(
            f"() => parseInt(document.querySelector('#match-count .total').innerText) > {shown}", timeout=10_000)
        gate.touch()
        out, _ = writer.communicate(timeout=30)
        assert writer.returncode == 0
        logged = int(out.split()[-1])
        page.goto(viewer + "/")
        page.wait_for_function(
            "() => document.querySelector('tr[data-run=\"live-run\"] [data-status]').dataset.status !== 'live'",
            timeout=10_000)
        assert _status_of(page, "live-run") == EXPECTED_STATUSES["gsm8k-completed"]
        assert page.locator('tr[data-run="live-run"] td.episodes').inner_text() == str(logged)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


@pytest.mark.slow
def test_export_opens_from_disk(browser, outputs, tmp_path):
    subset = tmp_path / "runs"
    subset.mkdir()
    for name in ("gsm8k-completed", "script-prompt"):
        shutil.copytree(outputs / name, subset / name)
    out = tmp_path / "export"
    done = subprocess.run(CLI + ["view", str(subset), "--export", str(out)], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    index = out / "index.html"
    assert done.stdout.strip() == index.resolve().as_uri()
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in out.rglob("*") if p.is_file())
    context = browser.new_context(offline=True)  # no network at all
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(index.resolve().as_uri())
    assert page.locator('tr[data-run="gsm8k-completed"] [data-status]').get_attribute("data-status") == "completed"
    page.locator('tr[data-run="gsm8k-completed"] a.run-link').click()
    assert page.locator("#match-count .total").inner_text() == "6"
    assert page.locator("tr.sample").count() == 6
    assert page.evaluate("getComputedStyle(document.querySelector('table.grid th')).fontWeight") == "600"  # css loaded
    assert "#### 18" in page.locator('tr.sample[data-n="1"] td.answer summary').inner_text()
    page.goto((out / "across-model.html").resolve().as_uri())
    page.locator("canvas[data-across][data-drawn]").wait_for()
    page.goto((out / "index.html").resolve().as_uri())
    page.locator('tr[data-run="gsm8k-completed"] a.run-link').click()
    page.locator("a.plots-link").click()  # the plots, drawn offline by the vendored library
    page.locator('section[data-plot-key="reward"] canvas[data-drawn="2"]').wait_for()
    page.go_back()
    page.locator('tr.sample[data-n="1"] a.episode-link').click()
    assert page.locator("section.trace").first.locator("li.turn").count() == 5
    page.go_back()
    page.locator('tr.sample[data-n="2"] td:nth-child(2) a').click()  # the group of example 1
    assert page.locator("article.rollout").count() == 2
    page.goto((out / "index.html").resolve().as_uri())
    page.locator('tr[data-run="script-prompt"] a.run-link').click()
    page.locator('tr.sample[data-n="1"] a.episode-link').click()
    assert page.locator('li[data-role="user"] pre.content').first.inner_text() == SCRIPT_PROMPT
    assert page.evaluate("window.__viewer_xss") is None
    context.close()
    assert requested and all(url.startswith("file://") for url in requested), requested


def test_the_runs_list_sorts_and_filters_in_the_url(page, viewer):
    page.goto(viewer + "/")
    page.locator('tr[data-run="gsm8k-completed"]').wait_for()
    page.locator('th a[data-sort="episodes"]').click()
    page.wait_for_url(re.compile(r"sort=episodes"))
    page.locator('th a[data-sort="episodes"]').click()
    page.wait_for_url(re.compile(r"desc=1"))
    counts = [int(c) for c in page.locator("tr[data-run] td.episodes").all_inner_texts()]
    assert counts == sorted(counts, reverse=True) and len(counts) >= len(EXPECTED_STATUSES)
    page.locator('select[name="status"]').select_option("completed")
    page.locator("form.runs-filter button").click()
    page.wait_for_url(re.compile(r"status=completed"))
    statuses = page.locator("tr[data-run] [data-status]").evaluate_all("els => els.map(e => e.dataset.status)")
    assert set(statuses) == {"completed"}
    assert len(statuses) >= sum(1 for s in EXPECTED_STATUSES.values() if s == "completed")  # + the live test's
    assert "sort=episodes" in page.url  # the sort survives the filter
    page.goto(viewer + "/?q=TORN")
    assert page.locator("tr[data-run]").evaluate_all("els => els.map(e => e.dataset.run)") == ["gsm8k-crashed-torn"]
    page.goto(viewer + "/?q=%3Cscript%3Ewindow.__viewer_xss%3D12%3C%2Fscript%3E")
    assert "No run matches this filter" in page.locator("#runs").inner_text()
    assert page.locator('input[name="q"]').input_value() == "<script>window.__viewer_xss=12</script>"
    assert page.evaluate("window.__viewer_xss") is None


def test_the_plots_page_draws_each_distribution_with_axes_and_a_reward_bar_filters(page, viewer, tmp_path):
    page.goto(viewer + "/run?run=gsm8k-completed")
    page.locator("a.plots-link").click()
    page.wait_for_url(re.compile(r"/plots\?run=gsm8k-completed"))
    keys = page.locator("section.plot").evaluate_all("els => els.map(e => e.dataset.plotKey)")
    assert keys[0] == "reward" and {"examples", "tokens", "duration"} <= set(keys)
    assert any(key.startswith("metric:") for key in keys)
    for canvas in page.locator("canvas[data-plot]").all():  # drawn by the vendored Chart.js
        canvas.wait_for()
        plot = canvas.evaluate("c => JSON.parse(c.dataset.plot)")
        assert canvas.get_attribute("data-drawn") == str(len(plot["labels"]))
    reward = page.locator('section[data-plot-key="reward"] canvas')
    assert reward.evaluate("c => JSON.parse(c.dataset.plot).counts") == [3, 3]
    axes = reward.evaluate("c => { const ch = Chart.getChart(c); return [ch.options.scales.x.title.text,"
                           " ch.options.scales.y.title.text]; }")
    assert axes == ["reward", "episodes"]
    note = page.locator('section[data-plot-key="examples"] .plot-note').inner_text()
    assert note.startswith("4 examples") and "pass@k" in note
    screenshot(page, "viewer-plots.png", tmp_path)
    x, y = reward.evaluate("c => { const bar = Chart.getChart(c).getDatasetMeta(0).data[1]; return [bar.x, bar.y + 5]; }")
    box = reward.bounding_box()
    page.mouse.click(box["x"] + x, box["y"] + y)
    page.wait_for_url(re.compile(r"/run\?run=gsm8k-completed.*rmin=1"))
    assert set(page.locator("tr.sample td.reward").all_inner_texts()) == {"1"}


def test_compare_summarises_b_against_a_and_shows_each_examples_prompt(page, viewer):
    page.goto(viewer + "/compare?a=gsm8k-completed&b=gsm8k-rerun")
    rows = page.locator("table.compare tbody tr")
    paired = [r for r in rows.all() if r.get_attribute("class") != "cmp-only"]
    deltas = [float(r.locator("td.delta").inner_text()) for r in paired]
    summary = page.locator("section.compare-summary")
    assert summary.locator("td.paired").inner_text() == str(len(paired)) == "3"
    mean = float(summary.locator("td.mean-delta b").inner_text())
    assert abs(mean - sum(deltas) / len(deltas)) < 1e-3
    assert [summary.locator(f".{k}").inner_text() for k in ("wins", "losses", "ties")] == [
        str(sum(d > 0 for d in deltas)), str(sum(d < 0 for d in deltas)), str(sum(d == 0 for d in deltas))]
    low, high = (float(x) for x in summary.locator(".ci").inner_text().strip("[]").split(", "))
    assert min(deltas) <= low <= mean <= high <= max(deltas)
    assert "Janet" in rows.first.locator("td.prompt").inner_text()
    page.goto(viewer + "/compare?a=script-prompt&b=script-prompt")
    assert page.locator("table.compare td.prompt").first.inner_text() == " ".join(SCRIPT_PROMPT.split())
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


def test_reward_across_runs_with_intervals_grouped_by_model_or_environment(page, viewer):
    page.goto(viewer + "/")
    page.locator("a.across-link").click()
    page.wait_for_url(re.compile(r"/across"))
    rows = page.locator("table.across-table tbody tr")
    canvas = page.locator("canvas[data-across]")
    canvas.wait_for()
    assert canvas.get_attribute("data-drawn") == str(rows.count())
    groups = rows.locator("td.group").all_inner_texts()
    assert groups == sorted(groups) and {"Qwen/Qwen3-8B", "m"} <= set(groups)
    completed = page.locator('table.across-table tr[data-run="gsm8k-completed"]')
    assert completed.locator("td.mean").inner_text() == "0.5"
    low, high = (float(x) for x in completed.locator("td").nth(4).inner_text().split(" – "))
    assert low < 0.5 < high
    page.locator('a.group-by[data-group="environment"]').click()
    page.wait_for_url(re.compile(r"group=environment"))
    assert {"gsm8k", "xss"} <= set(page.locator("table.across-table td.group").all_inner_texts())
    assert page.evaluate("window.__viewer_xss") is None
