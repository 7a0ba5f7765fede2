"""The viewer's pages as rendered HTML, without a server: whatever an episode holds is text.

A property test over arbitrary prompt, answer and tool-call text: parsed back, the page
holds exactly the text given, and no element the viewer did not put there.
"""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from fixtures.episodes import FAKE_ENV_SECRET, FAKE_HEADER_SECRET, make_episode
from prime_runs_spool.viewer.index import RunIndex
from prime_runs_spool.viewer.pages import Pages
from prime_runs_spool.viewer.render import Links
from prime_runs_spool.viewer.rows import row_of_episode
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.viewer.sources import Source, SpoolSource

from support.env import CLI, child_env
from support.viewer_runs import spool_of_episodes


class MemoryRun(RunIndex):
    """A run held in memory: the pages' view of a run, without a spool under it."""

    def __init__(self, records: list[Any]) -> None:
        super().__init__("mem")
        self.records = records
        for number, record in enumerate(records, 1):
            self._add(*row_of_episode(number, number - 1, record, 1))
        self.behind = False

    status = "completed"
    summary: dict[str, Any] = {}

    def record(self, row):
        return self.records[row.where]

    def _read(self, deadline: float) -> None:
        pass


class MemorySource(Source):
    def __init__(self, run: MemoryRun) -> None:
        super().__init__()
        self._runs = {run.key: run}

    def runs(self):
        return list(self._runs.values())


class Elements(HTMLParser):
    """Every start tag, and the text inside each <pre class="... content"> in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.contents: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "pre" and "content" in (dict(attrs).get("class") or ""):
            self._in = ""

    def handle_endtag(self, tag):
        if tag == "pre" and self._in is not None:
            self.contents.append(self._in)
            self._in = None

    def handle_data(self, data):
        if self._in is not None:
            self._in += data


def _page_for(prompt: str, answer: str) -> str:
    episode = make_episode(0, size=0)
    trace = episode["traces"][0]
    trace["task"]["data"]["prompt"] = prompt
    trace["nodes"][0]["message"]["content"] = prompt
    trace["nodes"][1]["message"]["content"] = answer
    run = MemoryRun([episode])
    return Pages(MemorySource(run), Links()).episode({"run": "mem", "n": "1"})


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), min_size=1, max_size=80)
_markup = st.sampled_from(["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "</pre><b>x</b>",
                           "&lt;script&gt;", "{{ 7*7 }}", "\"'><svg onload=alert(1)>", "<!--", "]]>"])


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(_text | _markup, min_size=1, max_size=4).map("".join),
       answer=st.lists(_text | _markup, min_size=1, max_size=4).map("".join))
def test_whatever_an_episode_holds_is_shown_as_text(prompt, answer):
    html = _page_for(prompt, answer)
    empty = _page_for("plain", "plain")
    parsed, baseline = Elements(), Elements()
    parsed.feed(html)
    baseline.feed(empty)
    assert parsed.tags == baseline.tags  # no element came from the episode
    assert parsed.contents[:2] == [prompt, answer]


def test_an_episode_page_masks_a_foreign_producers_secret(tmp_path):
    """A spool written around the runner (no masking on the way in) still shows no secret."""
    episode = make_episode(0, size=0)  # credentials at the masked locations, unmasked
    writer = SegmentWriter.create(tmp_path / "run", "foreign")
    writer.append("episode", episode)
    writer.seal("completed")
    source = SpoolSource([tmp_path])
    html = Pages(source, Links()).episode({"run": "run", "n": "1"})
    assert "CF-Access-Client-Secret" in html and "HF_TOKEN" in html  # the keys stay, the values go
    assert FAKE_HEADER_SECRET not in html and FAKE_ENV_SECRET not in html


@pytest.mark.slow
def test_view_usage_errors_are_one_line(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for argv in (["view", str(tmp_path / "missing")], ["view", str(tmp_path), "--export", str(tmp_path / "a-file")]):
        done = subprocess.run(CLI + argv, capture_output=True, text=True, env=child_env(), timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def _reference_episodes() -> list[dict]:
    import json

    from support.env import REPO_ROOT
    from prime_runs_spool.spool.scan import read_run

    reference = REPO_ROOT / "fixtures" / "reference"
    episodes = [json.loads((reference / "episode_example.json").read_text(encoding="utf-8"))]
    with open(reference / "projection" / "episodes.jsonl", encoding="utf-8") as handle:
        episodes += [json.loads(line) for line in handle if line.strip()]
    for run in ("gsm8k-completed", "gsm8k-resumed"):
        episodes += list(read_run(REPO_ROOT / "fixtures" / "outputs" / run).episodes())
    return episodes


def test_a_row_means_what_the_platforms_v0_row_means():
    """Each table column agrees with the v0 row sync would upload for the same episode, so the
    viewer over a spool and the dashboard over the synced evaluation show the same table."""
    from prime_runs_spool.platform_api.v0 import project_episode
    from prime_runs_spool.viewer.rows import row_of_sample

    checked = 0
    for episode in _reference_episodes():
        if not episode.get("traces"):
            continue
        mine, _ = row_of_episode(1, None, episode, 1)
        sample = project_episode(episode, 1)[0]
        theirs, _ = row_of_sample(1, None, sample)
        for column in ("example_id", "rollout", "reward", "metrics", "truncated", "stop", "tokens", "duration"):
            assert getattr(mine, column) == getattr(theirs, column), (column, episode.get("id"))
        assert (mine.error is None) == (theirs.error is None) or episode.get("ok") is not True
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize(("where", "value"), [
    (("traces",), 5), (("traces", 0, "nodes"), 5), (("traces", 0, "calls"), True), (("traces", 0, "rewards"), [1]),
    (("traces", 0, "metrics"), [1, 2]), (("traces", 0, "metrics"), "s"), (("traces", 0, "errors"), 5),
])
def test_an_episode_of_another_shape_shows_its_page(tmp_path: Path, where: tuple, value: object) -> None:
    """trace_views took every field for the type verifiers writes: "internal server error"
    (and a traceback in the viewer's log) for the page of a foreign producer's episode."""
    from fixtures.episodes import make_episode
    from prime_runs_spool.viewer.pages import Pages
    from prime_runs_spool.viewer.render import Links
    from prime_runs_spool.viewer.sources import SpoolSource

    episode = make_episode(0, size=50)
    holder: object = episode
    for step in where[:-1]:
        holder = holder[step]  # type: ignore[index]
    holder[where[-1]] = value  # type: ignore[index]
    pages = Pages(SpoolSource([spool_of_episodes(tmp_path, [episode, make_episode(1, size=50)])]), Links())
    assert "<html" in pages.episode({"run": "odd", "n": "1"}).lower()
    assert "<html" in pages.run({"run": "odd"}, "/run?run=odd&fragment=1").lower()
