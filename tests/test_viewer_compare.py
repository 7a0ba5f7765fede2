"""Comparing two runs in a real browser: one example's transcripts of A and B side by side,
and the config diff of their manifests (masked as stored). Hostile content in a prompt, an
answer, a config key or value stays text on both pages, and the static export carries them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from prime_runs_spool import open_run
from support.browser import screenshot
from support.env import CLI, child_env
from support.viewer_runs import SCRIPT_PROMPT, build_outputs, script_episode
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource

HOSTILE_VALUE = '<img src=x onerror="window.__viewer_xss = 20"><script>window.__viewer_xss = 21</script>'
HOSTILE_KEY = '<script>window.__viewer_xss = 22</script>'
SECRET = "sk-EXAMPLE_NOT_A_REAL_KEY_0123456789"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    out = build_outputs(tmp_path_factory.mktemp("compare"))
    # Two runs of script-prompt's examples whose configs differ in a hostile value and key,
    # and which both hold a credential the manifest must keep masked.
    for name, temperature in (("hostile-a", 0.2), ("hostile-b", 0.7)):
        config = {"sampling": {"temperature": temperature}, "note": HOSTILE_VALUE if name == "hostile-b" else "plain",
                  "client": {"api_key": SECRET}, **({HOSTILE_KEY: 1} if name == "hostile-b" else {})}
        with open_run(out / name, name=name, environments=["xss"], model="m", run_id=name, mode="offline",
                      config=config) as run:
            run.log_episodes([script_episode(n) for n in range(2)])
    return out


@pytest.fixture(scope="module")
def viewer(outputs):
    with EmbeddedServer(create_viewer_app(SpoolSource([outputs]))) as server:
        yield server.base_url


def _side_texts(page, side: str) -> list[str]:
    return page.locator(f'section.side[data-side="{side}"] li[data-role="assistant"] pre.content').all_inner_texts()


@pytest.mark.slow
def test_a_compare_row_opens_both_runs_transcripts_of_its_example_side_by_side(page, viewer, tmp_path):
    page.goto(viewer + "/compare?a=gsm8k-completed&b=gsm8k-rerun")
    screenshot(page, "viewer-compare.png", tmp_path)
    page.locator('table.compare tr[data-example="1"] a.pair-link').click()
    page.wait_for_url(re.compile(r"/pair\?a=gsm8k-completed&b=gsm8k-rerun&example=1"))
    a, b = page.locator('section.side[data-side="a"]'), page.locator('section.side[data-side="b"]')
    assert "gsm8k-completed" in a.locator("h2").inner_text() and "gsm8k-rerun" in b.locator("h2").inner_text()
    # the two columns sit next to each other, not one under the other
    box_a, box_b = a.bounding_box(), b.bounding_box()
    assert box_b["x"] >= box_a["x"] + box_a["width"] - 1 and abs(box_a["y"] - box_b["y"]) < 2
    for side in (a, b):
        assert side.locator("li.turn").evaluate_all("els => els.map(e => e.dataset.role)")[:2] == ["user", "assistant"]
    assert page.locator("section.prompt pre").inner_text()  # the example's prompt above both
    # the rerun flipped every score: A's and B's rewards of one example differ by one
    reward_a, reward_b = (float(s.locator("p.meta b.reward").inner_text()) for s in (a, b))
    assert abs(reward_a - reward_b) == 1
    screenshot(page, "viewer-pair.png", tmp_path)
    # A holds two rollouts of example 1: the second is one click away, B stays as it was
    assert a.locator("nav.rollouts a").count() == 1
    first_a = _side_texts(page, "a")
    b_before = _side_texts(page, "b")
    a.locator("nav.rollouts a").click()
    page.wait_for_url(re.compile(r"ra=2"))
    assert _side_texts(page, "a") != first_a and _side_texts(page, "b") == b_before
    # the column is that episode's transcript: the same turns its own page shows
    shown = _side_texts(page, "a")
    page.locator('section.side[data-side="a"] a.episode-link').click()
    page.wait_for_url(re.compile(r"/episode\?run=gsm8k-completed&n="))
    assert page.locator('section.trace li[data-role="assistant"] pre.content').all_inner_texts()[:len(shown)] == shown
    # an example only one run has: the other column says so
    page.goto(viewer + "/pair?a=gsm8k-completed&b=gsm8k-rerun&example=3")
    assert "no rollout of example 3" in page.locator('section.side[data-side="b"]').inner_text()
    assert page.locator('section.side[data-side="a"] li.turn').count() >= 2


def test_hostile_prompts_and_answers_stay_text_side_by_side(page, viewer):
    page.goto(viewer + "/compare?a=script-prompt&b=hostile-b")
    page.locator("table.compare a.pair-link").first.click()
    page.wait_for_url(re.compile(r"/pair\?"))
    assert page.locator("section.prompt pre").inner_text() == SCRIPT_PROMPT
    for side in ("a", "b"):
        assert page.locator(f'section.side[data-side="{side}"] li[data-role="user"] pre.content').inner_text() \
            == SCRIPT_PROMPT
        assert _side_texts(page, side) == ["</pre><script>window.__viewer_xss = 3</script>4"]
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


def test_the_config_diff_shows_only_what_differs_masked_as_stored(page, viewer):
    page.goto(viewer + "/compare?a=hostile-a&b=hostile-b")
    section = page.locator("section.config-diff")
    differing = section.locator("table.differing tbody tr")
    keys = differing.evaluate_all("els => els.map(e => e.dataset.key)")
    assert set(keys) == {"config.sampling.temperature", "config.note", f"config.{HOSTILE_KEY}"}
    temperature = section.locator('table.differing tr[data-key="config.sampling.temperature"]')
    assert (temperature.locator("td.a").inner_text(), temperature.locator("td.b").inner_text()) == ("0.2", "0.7")
    note = section.locator('table.differing tr[data-key="config.note"]')
    assert note.locator("td.b").inner_text() == HOSTILE_VALUE  # shown as text, never run
    assert section.locator(f'table.differing tr[data-key="config.{HOSTILE_KEY}"] td.a').inner_text() == "(absent)"
    assert section.locator(".differ-count").inner_text() == "3"
    # every key, the same ones too, behind the toggle; the credential masked on both sides
    everything = section.locator("details.config-all")
    assert not everything.locator("table").is_visible()
    everything.locator("summary").click()
    key_row = everything.locator('tr[data-key="config.client.api_key"]')
    assert key_row.get_attribute("class") == "same"
    assert (key_row.locator("td.a").inner_text(), key_row.locator("td.b").inner_text()) == ("***", "***")
    assert SECRET not in page.content()
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0
    # two runs with the same settings say so
    page.goto(viewer + "/compare?a=hostile-a&b=hostile-a")
    assert "hold the same settings" in page.locator("section.config-diff").inner_text()


@pytest.mark.slow
def test_the_export_carries_compare_side_by_side_and_the_config_diff(browser, outputs, tmp_path):
    subset = tmp_path / "runs"
    subset.mkdir()
    for name in ("hostile-a", "hostile-b"):
        subprocess.run(["cp", "-a", str(outputs / name), str(subset / name)], check=True)
    out = tmp_path / "export"
    done = subprocess.run(CLI + ["view", str(subset), "--export", str(out)], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    context = browser.new_context(offline=True)  # no network at all
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto((out / "index.html").resolve().as_uri())
    page.locator("section.comparisons a.compare-link").click()  # hostile-a, then hostile-b
    assert page.locator("section.config-diff .differ-count").inner_text() == "3"
    assert page.locator("nav.tabs").count() == 0  # the tabs need the server
    page.locator("table.compare a.pair-link").first.click()
    assert page.locator("section.side").count() == 2
    assert _side_texts(page, "a") == _side_texts(page, "b") == ["</pre><script>window.__viewer_xss = 3</script>4"]
    assert page.evaluate("window.__viewer_xss") is None
    assert SECRET not in "".join(p.read_text() for p in out.glob("*.html"))
    context.close()
    assert requested and all(url.startswith("file://") for url in requested), requested
