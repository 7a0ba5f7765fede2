"""Full-text search over eval outputs with no spool (a verifiers ``traces.jsonl``), in
Debian's chromium: the same FTS5 index as a spool's, built from the file's lines, in this
user's cache and never in the outputs folder, which stays untouched. A resume that rewrites
the file empties the index and builds it again, in the viewer that saw it and in the next.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import orjson
import pytest

from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource
from support.episodes import episode_with_word

WORD = "wombatquill"
HOSTILE = f"<script>window.__viewer_xss = 40</script> {WORD} <img src=x onerror=\"window.__viewer_xss = 41\">"
#: Episode number -> where the word is: a message, a tool call's arguments, a tool's output.
PLANTED = {2: "message", 5: "call", 7: "output"}


def _episode(n: int, planted: dict[int, str] = PLANTED) -> dict:
    return episode_with_word(n, "plain", WORD, HOSTILE, planted.get(n + 1))


def _write_outputs(folder: Path, episodes: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "traces.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in episodes))


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain-search") / "outputs"
    _write_outputs(out / "plain", [_episode(n) for n in range(8)])
    return out


@pytest.fixture(scope="module")
def viewer(outputs):
    before = _tree(outputs)
    with EmbeddedServer(create_viewer_app(SpoolSource([outputs]))) as server:
        yield server.base_url
    assert _tree(outputs) == before  # nothing written in the outputs folder, nothing touched


def _shown(page) -> list[int]:
    return [int(n) for n in page.locator("tr.sample").evaluate_all("els => els.map(e => e.dataset.n)")]


@pytest.mark.slow
def test_plain_outputs_are_searched_like_a_spool(page, viewer):
    page.goto(viewer + "/run?run=plain")
    assert page.locator("h1 .status").inner_text() == "not spooled"
    page.locator('input[name="text"]').fill(WORD.upper())
    page.locator("form.filters button").click()
    page.wait_for_url(re.compile(r"text=WOMBATQUILL"))
    assert _shown(page) == sorted(PLANTED)
    for n in PLANTED:
        assert page.locator(f'tr.sample[data-n="{n}"] .hit mark').inner_text().lower() == WORD
    assert "<script>" in page.locator('tr.sample[data-n="7"] .hit').inner_text()
    # the index is in the user's cache (conftest gives each test its own), private
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "prime-runs" / "viewer-search"
    (index,) = cache.glob("*.sqlite3")
    assert stat.S_IMODE(index.stat().st_mode) == 0o600 and stat.S_IMODE(cache.stat().st_mode) == 0o700
    # a hit opens its episode with the word highlighted, the markup around it as text
    page.locator('tr.sample[data-n="7"] a.episode-link').click()
    page.wait_for_url(re.compile(r"/episode\?run=plain&n=7&hl="))
    tool = page.locator('li[data-role="tool"] pre.content')
    assert tool.inner_text() == HOSTILE and tool.locator("mark").inner_text() == WORD
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


def test_a_rewritten_file_is_indexed_again_in_this_viewer_and_the_next(tmp_path):
    folder = tmp_path / "outputs" / "resumed"
    _write_outputs(folder, [_episode(n) for n in range(8)])
    run = SpoolSource([tmp_path / "outputs"]).get("resumed")
    run.refresh(5)
    assert run.search().hits(WORD) == set(PLANTED)
    # a resume rewrites the file: fewer episodes, the word elsewhere
    time.sleep(0.01)
    _write_outputs(folder, [_episode(n, {1: "message"}) for n in range(3)])
    run._refreshed_at = -1.0  # noqa: SLF001 - skip the poll throttle
    run.refresh(5)
    assert len(run.rows) == 3
    assert run.search().hits(WORD) == {1}
    # a new viewer over the same file reuses the index; over a file changed since, builds it again
    again = SpoolSource([tmp_path / "outputs"]).get("resumed")
    again.refresh(5)
    assert again.search().count == 3 and again.search().hits(WORD) == {1}
    time.sleep(0.01)
    _write_outputs(folder, [_episode(n, {3: "output"}) for n in range(3)])
    third = SpoolSource([tmp_path / "outputs"]).get("resumed")
    third.refresh(5)
    assert third.search().hits(WORD) == {3}
    assert len(list((Path(os.environ["XDG_CACHE_HOME"]) / "prime-runs" / "viewer-search").glob("*.sqlite3"))) == 1
