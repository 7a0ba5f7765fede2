"""Eval outputs with no spool in the viewer: listed, browsable, read-only, never written.

``prime-runs view`` runs as a real process over a copy of the real verifiers 0.4.0 outputs
in fixtures/eval_outputs (and the older metadata.json + results.jsonl layout), and Debian's
chromium looks at what it serves.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from support import platform_process
from support.env import CLI, REPO_ROOT, child_env
from support.viewer_runs import SCRIPT_PROMPT, script_episode

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"
#: A header value verifiers wrote into every episode unmasked (fixtures/make_eval_outputs.py).
HEADER_SECRET = "fake-header-secret-NOT-REAL-7f3a9c"


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain") / "outputs"
    shutil.copytree(EVAL_OUTPUTS, out)
    hostile = out / "hostile"
    hostile.mkdir()
    episodes = [script_episode(n) for n in range(2)]
    for episode in episodes:  # a metric name and an error that are markup too
        episode["traces"][0]["metrics"] = {"<img src=x onerror=\"window.__viewer_xss = 5\">": 1.0}
    (hostile / "traces.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in episodes))
    return out


@pytest.fixture(scope="module")
def viewer(outputs):
    before = _tree(outputs)
    proc = subprocess.Popen(CLI + ["view", str(outputs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(PRIME_RUNS_STATE_DIR=""))
    url = platform_process.first_line(proc).rstrip("/")
    yield url
    proc.terminate()
    assert proc.wait(15) == 0, proc.stderr.read()
    assert _tree(outputs) == before  # read-only: nothing written, nothing touched


@pytest.mark.slow
def test_plain_outputs_are_listed_not_spooled_with_the_command_that_spools_them(page, viewer, outputs):
    page.goto(viewer + "/")
    for name in ("vf040-completed", "vf040-cancelled", "vf040-killed", "vf040-torn", "vf040-corrupt", "v0-completed"):
        row = page.locator(f'tr[data-run="{name}"]')
        row.wait_for(timeout=10_000)
        assert row.locator("[data-status]").get_attribute("data-status") == "not spooled", name
        assert row.locator(".fix code").inner_text() == f"prime-runs import {outputs / name}"
    assert "No runs found" not in page.content()
    completed = page.locator('tr[data-run="vf040-completed"]')
    assert completed.locator("td.episodes").inner_text() == "4"
    assert "fake/tiny-model" in completed.inner_text() and "tiny_taskset" in completed.inner_text()


@pytest.mark.slow
def test_a_plain_run_opens_with_its_samples_and_episodes_masked(page, viewer, outputs):
    page.goto(viewer + "/run?run=vf040-completed")
    assert page.locator("#match-count .total").inner_text() == "4"
    assert f"prime-runs import {outputs / 'vf040-completed'}" in page.locator(".not-spooled").inner_text()
    page.locator('tr.sample[data-n="1"] a.episode-link').click()
    page.wait_for_url(re.compile(r"/episode\?run=vf040-completed&n=1"))
    assert "The answer is 4." in page.locator('li[data-role="assistant"]').first.inner_text()
    assert HEADER_SECRET not in page.content()  # verifiers wrote it unmasked; the page masks it
    page.goto(viewer + "/run?run=vf040-completed")
    assert HEADER_SECRET not in page.content()
    # the older layout, and a damaged file shown up to its damage, with the reason
    page.goto(viewer + "/run?run=v0-completed")
    assert page.locator("#match-count .total").inner_text() == "4"
    page.goto(viewer + "/run?run=vf040-corrupt")
    assert "line 3 is not an episode" in page.locator("p.problem").inner_text()
    assert page.locator("tr.sample").count() == 2


@pytest.mark.slow
def test_hostile_plain_outputs_stay_text(page, viewer):
    page.goto(viewer + "/")
    page.locator('tr[data-run="hostile"]').wait_for()
    page.goto(viewer + "/run?run=hostile")
    assert "onerror" in page.locator("table.samples-table thead").inner_text()  # the metric name, as text
    page.goto(viewer + "/plots?run=hostile")
    assert "onerror" in page.locator('section[data-plot-key^="metric:"] h2').inner_text()
    page.locator('section[data-plot-key^="metric:"] canvas[data-drawn="1"]').wait_for()
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main img").count() == 0
    page.goto(viewer + "/episode?run=hostile&n=1")
    assert page.locator('li[data-role="user"] pre.content').first.inner_text() == SCRIPT_PROMPT
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


@pytest.mark.slow
def test_an_import_turns_the_plain_entry_into_its_spool(browser, tmp_path):
    outputs = tmp_path / "outputs"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", outputs / "run")
    proc = subprocess.Popen(CLI + ["view", str(outputs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(PRIME_RUNS_STATE_DIR=""))
    try:
        url = platform_process.first_line(proc).rstrip("/")
        page = browser.new_page()
        page.goto(url + "/")
        status = page.locator('tr[data-run="run"] [data-status]')
        assert status.get_attribute("data-status") == "not spooled"
        done = subprocess.run(CLI + ["import", str(outputs / "run")], capture_output=True, text=True,
                              env=child_env(PRIME_RUNS_STATE_DIR=""), timeout=120)
        assert done.returncode == 0, done.stderr
        page.wait_for_function(
            "() => { const s = document.querySelector('tr[data-run=\"run\"] [data-status]');"
            " return s && s.dataset.status === 'completed'; }", timeout=10_000)
        assert page.locator("tr[data-run]").count() == 1
        assert page.locator('tr[data-run="run"] .fix').count() == 0
        page.close()
    finally:
        proc.terminate()
        assert proc.wait(15) == 0, proc.stderr.read()


@pytest.mark.slow
def test_the_export_carries_plain_runs(browser, outputs, tmp_path):
    out = tmp_path / "export"
    done = subprocess.run(CLI + ["view", str(outputs), "--export", str(out)], capture_output=True, text=True,
                          env=child_env(PRIME_RUNS_STATE_DIR=""), timeout=120)
    assert done.returncode == 0, done.stderr
    page = browser.new_page()
    page.goto((out / "index.html").resolve().as_uri())
    row = page.locator('tr[data-run="vf040-completed"]')
    assert row.locator("[data-status]").get_attribute("data-status") == "not spooled"
    row.locator("a.run-link").click()
    page.locator('tr.sample[data-n="2"] a.episode-link').click()
    assert page.locator("li.turn").count() >= 2
    assert all(HEADER_SECRET.encode() not in p.read_bytes() for p in out.rglob("*.html"))
    page.close()


@pytest.mark.slow
def test_a_path_with_nothing_still_says_no_runs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.Popen(CLI + ["view", str(empty)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(PRIME_RUNS_STATE_DIR=""))
    try:
        url = platform_process.first_line(proc).rstrip("/")
        import httpx

        deadline = time.monotonic() + 10
        while True:
            body = httpx.get(url + "/", timeout=10).text
            if "No runs found yet" in body or time.monotonic() > deadline:
                break
        assert "No runs found yet" in body
    finally:
        proc.terminate()
        assert proc.wait(15) == 0, proc.stderr.read()
    assert os.listdir(empty) == []
