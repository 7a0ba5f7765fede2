"""Full-text search and the table's filters, in Debian's chromium, over real spools.

A run whose tool calls and tool outputs hold a word nothing else holds, in known episodes:
the search finds exactly those (whether the word is in a message, a tool call's arguments
or a tool's output), shows the passage with the word marked, and the episode page opens
with it highlighted. The index lives in this user's cache (``XDG_CACHE_HOME``), 0600, and
nothing is written beside the spools. Filters on stop reason, error kind and a metric's
range are in the URL. Markup in a tool output stays text in the snippet and the highlight.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest

from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.search import SearchIndex
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource
from support.episodes import episode_with_word
from support.viewer_runs import FIXTURE_OUTPUTS

WORD = "zebraquartz"
HOSTILE = f"<script>window.__viewer_xss = 10</script> {WORD} <img src=x onerror=\"window.__viewer_xss = 11\">"
#: Episode number -> where the word is: a message, a tool call's arguments, a tool's output.
PLANTED = {2: "message", 5: "call", 7: "output"}


def _episode(n: int) -> dict:
    return episode_with_word(n, "search", WORD, HOSTILE, PLANTED.get(n + 1))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("search") / "outputs"
    shutil.copytree(FIXTURE_OUTPUTS / "gsm8k-completed", out / "gsm8k-completed")
    writer = SegmentWriter.create(out / "search", "search")
    writer.append("manifest", {"run_id": "search", "name": "search", "environments": ["gsm8k"], "model": "m"})
    writer.append_many([("episode", _episode(n), {"episode_id": f"e{n}", "rollout_number": 1}) for n in range(8)])
    writer.seal("completed")
    return out


@pytest.fixture(scope="module")
def viewer(outputs):
    files = sorted(p for p in outputs.rglob("*"))
    with EmbeddedServer(create_viewer_app(SpoolSource([outputs]))) as server:
        yield server.base_url
    assert sorted(p for p in outputs.rglob("*")) == files  # nothing written beside the spools


def _shown(page) -> list[int]:
    return [int(n) for n in page.locator("tr.sample").evaluate_all("els => els.map(e => e.dataset.n)")]


@pytest.mark.slow
def test_full_text_search_finds_messages_tool_calls_and_tool_output(page, viewer):
    page.goto(viewer + "/run?run=search")
    page.locator('input[name="text"]').fill(WORD.upper())  # case does not matter
    page.locator("form.filters button").click()
    page.wait_for_url(re.compile(r"text=ZEBRAQUARTZ"))
    assert _shown(page) == sorted(PLANTED)
    assert page.locator("#match-count .total").inner_text() == str(len(PLANTED))
    for n in PLANTED:
        assert page.locator(f'tr.sample[data-n="{n}"] .hit mark').inner_text().lower() == WORD
    # the index is in the user's cache (conftest gives each test its own), private
    cache = Path(os.environ["XDG_CACHE_HOME"])
    (index,) = (cache / "prime-runs" / "viewer-search").glob("*.sqlite3")
    assert stat.S_IMODE(index.stat().st_mode) == 0o600
    assert stat.S_IMODE(index.parent.stat().st_mode) == 0o700


def test_a_hit_opens_its_episode_with_the_words_highlighted(page, viewer):
    page.goto(viewer + f"/run?run=search&text={WORD}")
    page.locator('tr.sample[data-n="5"] a.episode-link').click()
    page.wait_for_url(re.compile(r"/episode\?run=search&n=5&hl="))
    marks = page.locator("section.trace mark").all_inner_texts()
    assert marks == [WORD]
    assert WORD in page.locator(".tool-call pre").first.inner_text()


@pytest.mark.slow
def test_markup_in_a_tool_output_stays_text_in_the_snippet_and_the_highlight(page, viewer):
    page.goto(viewer + f"/run?run=search&text={WORD}")
    assert "<script>" in page.locator('tr.sample[data-n="7"] .hit').inner_text()
    page.goto(viewer + f"/episode?run=search&n=7&hl={WORD}")
    tool = page.locator('li[data-role="tool"] pre.content')
    assert tool.inner_text() == HOSTILE
    assert tool.locator("mark").inner_text() == WORD
    assert page.evaluate("window.__viewer_xss") is None
    assert page.locator("main script, main img").count() == 0


@pytest.mark.slow
def test_stop_error_kind_and_metric_filters_are_in_the_url(page, viewer):
    page.goto(viewer + "/run?run=gsm8k-completed")
    page.locator('select[name="ekind"]').select_option("not ok")
    page.locator("form.filters button").click()
    page.wait_for_url(re.compile(r"ekind=not\+ok"))
    assert _shown(page) == [6]
    page.goto(viewer + "/run?run=gsm8k-completed")
    page.locator('select[name="metric"]').select_option("judge/solved")
    page.locator('input[name="mmin"]').fill("1")
    page.locator("form.filters button").click()
    page.wait_for_url(re.compile(r"mmin=1"))
    by_metric = _shown(page)
    column = page.locator("table.samples-table thead th").all_inner_texts().index("judge/solved")
    values = [row.locator("td").nth(column).inner_text() for row in page.locator("tr.sample").all()]
    assert by_metric and set(values) == {"1"}
    url = page.url
    page.goto(url)  # the URL is the whole view
    assert _shown(page) == by_metric
    stop = page.locator('tr.sample[data-n="1"] td').nth(-3).inner_text()
    page.goto(viewer + f"/run?run=gsm8k-completed&stop={stop}")
    assert set(page.locator("tr.sample").evaluate_all("els => els.map(e => e.children[e.children.length - 3]"
                                                      ".innerText)")) == {stop}


def test_the_index_resumes_where_it_stopped_and_follows_a_growing_spool(tmp_path):
    run_dir = tmp_path / "growing"
    writer = SegmentWriter.create(run_dir, "growing")
    writer.append_many([("episode", _episode(n), {"episode_id": f"g{n}", "rollout_number": 1}) for n in range(3)])
    run = SpoolSource([tmp_path]).get("growing")
    run.refresh(5)
    assert run.search().hits(WORD) == {2}
    writer.append_many([("episode", _episode(n), {"episode_id": f"g{n}", "rollout_number": 1}) for n in range(3, 8)])
    deadline = time.monotonic() + 10
    while len(run.rows) < 8:  # the row index reads what the writer's durable mark covers
        assert time.monotonic() < deadline, len(run.rows)
        time.sleep(0.05)
        run.refresh(5)
    assert run.search().hits(WORD) == set(PLANTED)
    writer.seal("completed")
    again = SpoolSource([tmp_path]).get("growing")  # a new viewer: the cache's index is reused
    again.refresh(5)
    assert SearchIndex(again, f"spool|{run_dir.resolve()}|").count == 8


@pytest.mark.slow
def test_no_index_is_made_for_a_run_nobody_searches(page, viewer):
    page.goto(viewer + "/run?run=gsm8k-completed&stop=x")
    page.goto(viewer + "/episode?run=gsm8k-completed&n=1")
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "prime-runs" / "viewer-search"
    assert not cache.exists() or list(cache.glob("*.sqlite3")) == []


def test_the_index_file_is_made_private_and_never_through_a_link_or_into_a_fifo(tmp_path: Path) -> None:
    """The index file was opened on its own: a FIFO where it goes made every page wait on
    ``open`` forever (the run's lock held); now the search is left out at once. A link
    there is not followed, its target untouched; a new index is 0600 in a 0700 folder."""
    import threading

    from prime_runs_spool.viewer.search import index_path

    fresh = SearchIndex(None, "fresh")
    assert stat.S_IMODE(fresh.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(fresh.path.parent.stat().st_mode) == 0o700
    victim = tmp_path / "victim"
    victim.write_bytes(b"the user's own file\n")
    index_path("linked").symlink_to(victim)
    with pytest.raises(OSError):
        SearchIndex(None, "linked")
    assert victim.read_bytes() == b"the user's own file\n"
    os.mkfifo(index_path("fifo"))
    failed: list[BaseException] = []

    def open_index() -> None:
        try:
            SearchIndex(None, "fifo")
        except BaseException as exc:
            failed.append(exc)

    opener = threading.Thread(target=open_index, daemon=True)
    opener.start()
    opener.join(20)
    if opener.is_alive():  # free the blocked open, so the test ends
        os.close(os.open(index_path("fifo"), os.O_RDONLY | os.O_NONBLOCK))
        opener.join(5)
        pytest.fail("opening the search index waited on a FIFO")
    assert [type(exc) for exc in failed] == [OSError] and "not a regular file" in str(failed[0])



@pytest.mark.parametrize(("text", "found"), [("zebraquartz_script", {7}), ("echo_ZEBRAQUARTZ!", {5}),
                                             ("mentions-zebraquartz_once", {2}), ("zebraquartz _", set(PLANTED))])
def test_words_the_index_cuts_apart_find_the_episodes_holding_each(outputs, text, found):
    """A word ``\\w+`` keeps whole (``snake_case``) but the index's tokenizer cuts in two was
    sent as a phrase, which an index without positions refuses: every search holding ``_``
    answered 500. It is cut as the index cuts text, and finds the episodes holding each part."""
    from starlette.testclient import TestClient

    run = SpoolSource([outputs]).get("search")
    run.refresh(5)
    assert run.search().hits(text) == found
    client = TestClient(create_viewer_app(SpoolSource([outputs])), base_url="http://127.0.0.1")
    page = client.get("/run", params={"run": "search", "text": text})
    assert page.status_code == 200
    assert {int(n) for n in re.findall(r'<tr class="sample[^"]*" data-n="(\d+)"', page.text)} == found


def test_the_background_indexing_stopping_is_one_logged_line(tmp_path, caplog, monkeypatch):
    """Whatever stops the search's background thread (a cache disk that filled) is one line
    on stderr, not a thread's traceback; the next search tries again."""
    writer = SegmentWriter.create(tmp_path / "r", "r")
    writer.append_many([("episode", _episode(n), {"episode_id": f"r{n}", "rollout_number": 1}) for n in range(3)])
    run = SpoolSource([tmp_path]).get("r")
    run.refresh(5)
    search = run.search()

    def full(rows):
        raise OSError(28, "No space left on device")
        yield

    monkeypatch.setattr(run, "records", full)
    search.catch_up_in_background()
    search._catcher.join(10)
    assert [record.getMessage() for record in caplog.records] == [
        "prime-runs: the search index of r stopped at episode 0: [Errno 28] No space left on device"]


def test_episodes_the_index_could_not_read_are_read_again_once_readable(tmp_path, monkeypatch):
    """An episode the search index could not read (its segment unreadable then, made
    readable since) was indexed empty for good: no search found it until the index was
    reset. It is read again at a search, at most every ``RETRY_INTERVAL`` seconds (a run
    whose segment stays unreadable costs one reading of those episodes that often, not one
    a search), and found once readable; the count the page gives goes down with it."""
    import prime_runs_spool.viewer.search as search_module
    from prime_runs_spool.errors import SpoolError

    writer = SegmentWriter.create(tmp_path / "r", "r")
    writer.append_many([("episode", _episode(n), {"episode_id": f"r{n}", "rollout_number": 1}) for n in range(3)])
    writer.seal("completed")
    run = SpoolSource([tmp_path]).get("r")
    run.refresh(5)
    readable, asked = run.records, []

    def unreadable(rows):
        asked.extend(row.number for row in rows)
        for row in rows:
            yield row, SpoolError(f"episode {row.number} cannot be read: Permission denied")

    class Clock:  # the search module's time, moved on by the test
        later = 0.0

        @classmethod
        def monotonic(cls) -> float:
            return time.monotonic() + cls.later

    monkeypatch.setattr(search_module, "time", Clock)
    monkeypatch.setattr(run, "records", unreadable)
    search = run.search()
    for _ in range(4):
        assert search.hits(WORD) == set()
    assert (search.count, search.unread) == (3, 3) and "Permission denied" in search.unread_error
    assert sorted(asked) == [1, 1, 2, 2, 3, 3], asked  # indexed, then read again once, not at every search

    Clock.later = 3600.0
    monkeypatch.setattr(run, "records", readable)
    assert search.hits(WORD) == {2}
    assert (search.count, search.unread, search.unread_error) == (3, 0, None)
    again = SearchIndex(run, f"spool|{(tmp_path / 'r').resolve()}|")  # kept in the index file
    assert (again.count, again.unread) == (3, 0) and again.hits(WORD) == {2}
