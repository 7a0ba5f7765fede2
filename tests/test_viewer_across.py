"""Across runs in a real browser: each run's mean reward, or the mean of any metric picked
on the page, with a 95% interval, grouped by model or environment; a hostile metric name
stays text; the export carries every metric's page and draws it offline.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource
from support.browser import screenshot
from support.env import CLI, child_env

HOSTILE_METRIC = '<img src=x onerror="window.__viewer_xss = 30">'
#: run name: (model, environment, each episode's accuracy; None: the run has no such metric)
RUNS = {
    "alpha": ("model-x", "env1", [0.0, 1.0, 1.0, 1.0]),
    "beta": ("model-y", "env1", [1.0, 1.0, 1.0]),
    "gamma": ("model-x", "env2", None),
}


def _episode(run: str, number: int, accuracy: float | None) -> dict:
    episode = make_episode(number, size=0, run_id=run, salt=run)
    if accuracy is not None:
        episode["traces"][0]["metrics"] = {"accuracy": accuracy, HOSTILE_METRIC: float(number)}
    return episode


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("across") / "runs"
    for name, (model, environment, accuracies) in RUNS.items():
        with open_run(root / name, name=name, environments=[environment], model=model, run_id=name,
                      mode="offline") as run:
            run.log_episodes([_episode(name, n, a) for n, a in enumerate(accuracies or [None, None])])
    return root


@pytest.fixture(scope="module")
def viewer(runs):
    with EmbeddedServer(create_viewer_app(SpoolSource([runs]))) as server:
        yield server.base_url


def _table(page) -> dict[str, tuple[str, str]]:
    rows = page.locator("table.across-table tbody tr")
    return {row.get_attribute("data-run"): (row.locator("td.mean").inner_text(), row.locator("td").nth(4).inner_text())
            for row in rows.all()}


@pytest.mark.slow
def test_a_metric_picked_on_the_page_is_plotted_per_run_with_its_interval(page, viewer, tmp_path):
    page.goto(viewer + "/plots?run=alpha")
    page.locator('section[data-plot-key="metric:accuracy"] a.across-link').click()  # from the run's plots
    page.wait_for_url(re.compile(r"/across\?metric=accuracy"))
    assert page.locator("nav.metrics .active").inner_text() == "accuracy"
    # gamma has no accuracy: left out; alpha 0.75 ± 1.96 * 0.5 / 2, beta 1 ± 0
    assert _table(page) == {"alpha": ("0.75", "0.26 – 1.24"), "beta": ("1", "1 – 1")}
    canvas = page.locator("canvas[data-across]")
    canvas.wait_for()
    assert canvas.get_attribute("data-drawn") == "2"
    assert canvas.evaluate("c => Chart.getChart(c).options.scales.y.title.text") == "mean accuracy"
    screenshot(page, "viewer-across.png", tmp_path)
    assert page.locator("table.across-table td.group").all_inner_texts() == ["model-x", "model-y"]
    # grouped by environment, the metric stays picked
    page.locator('a.group-by[data-group="environment"]').click()
    page.wait_for_url(re.compile(r"group=environment"))
    assert "metric=accuracy" in page.url
    assert page.locator("table.across-table td.group").all_inner_texts() == ["env1", "env1"]
    # back to the reward: every run, gamma too
    page.locator('nav.metrics a[data-metric="reward"]').click()
    page.wait_for_url(lambda url: "metric=" not in url)
    assert set(_table(page)) == {"alpha", "beta", "gamma"}
    assert page.locator("canvas[data-across]").evaluate("c => Chart.getChart(c).options.scales.y.title.text") \
        == "mean reward"


@pytest.mark.slow
def test_a_hostile_metric_name_stays_text(page, viewer):
    page.goto(viewer + "/across")
    page.locator("nav.metrics a.metric-pick").filter(has_text="onerror").click()
    page.wait_for_url(re.compile(r"metric="))
    assert page.locator("nav.metrics .active").inner_text() == HOSTILE_METRIC
    assert page.locator("h1 .value").inner_text() == HOSTILE_METRIC
    assert _table(page)["alpha"][0] == "1.5"  # episodes 0..3
    page.locator("canvas[data-across][data-drawn]").wait_for()
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main img, main script").count() == 0


@pytest.mark.slow
def test_the_export_carries_each_metrics_page_and_draws_it_offline(browser, runs, tmp_path):
    out = tmp_path / "export"
    done = subprocess.run(CLI + ["view", str(runs), "--export", str(out)], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    context = browser.new_context(offline=True)
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto((out / "index.html").resolve().as_uri())
    page.locator("a.across-link").click()
    page.locator('nav.metrics a[data-metric="accuracy"]').click()
    page.locator("canvas[data-across][data-drawn]").wait_for()
    assert _table(page) == {"alpha": ("0.75", "0.26 – 1.24"), "beta": ("1", "1 – 1")}
    page.locator('a.group-by[data-group="environment"]').click()
    assert page.locator("nav.metrics .active").inner_text() == "accuracy"
    assert page.locator("table.across-table td.group").all_inner_texts() == ["env1", "env1"]
    context.close()
    assert requested and all(url.startswith("file://") for url in requested), requested


def test_a_run_whose_model_is_not_a_string_is_grouped_beside_the_others(tmp_path):
    """A foreign manifest's model may be a number or a table (``open_run`` refuses both now;
    an older one wrote ``model=123``): sorted against the others' strings, the page answered
    500 for every run."""
    from starlette.testclient import TestClient

    from prime_runs_spool.spool.writer import SegmentWriter
    from support.runs import manifest_for

    for name, model in (("named", "model-x"), ("numbered", 123), ("tabled", {"id": "m", "rev": [1]})):
        writer = SegmentWriter.create(tmp_path / name, name)
        writer.append("manifest", {**manifest_for(name, name=name, environment="env1"), "model": model})
        episode = _episode(name, 0, 1.0)
        writer.append("episode", episode, {"episode_id": episode["id"], "rollout_number": 1})
        writer.seal("completed")
    client = TestClient(create_viewer_app(SpoolSource([tmp_path])), base_url="http://127.0.0.1")
    for group in ("model", "environment"):
        page = client.get("/across", params={"group": group})
        assert page.status_code == 200, group
        assert sorted(re.findall(r'<tr data-run="([^"]+)"', page.text)) == ["named", "numbered", "tabled"]
    assert "123" in client.get("/", params={"sort": "model"}).text
