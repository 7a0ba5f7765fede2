"""The viewer's figures over numbers at the edge of the float range.

A foreign producer's episodes may hold any finite number: a reward of ``1e308`` beside one
of ``-1e308`` (a sentinel, a bug), a trace that started at ``-1e308`` and ended at ``1e308``.
Each is a float, but their difference, sum or square is not: a histogram bin's width was
``inf``, ``int(nan)`` raised, and the run's page, its plots and the across-runs page of
every run under the paths answered 500 Internal Server Error, a traceback in the log.
"""

from __future__ import annotations

import json
import math
import re
import sys
from html import unescape
from pathlib import Path

from starlette.testclient import TestClient

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.viewer.app import create_viewer_app
from prime_runs_spool.viewer.sources import SpoolSource

LARGEST = sys.float_info.max


def _edge_episode(number: int) -> dict:
    """Rewards and a metric spread over the whole float range (11 distinct values, so the
    histogram bins them), and a duration that overflows."""
    episode = make_episode(number, size=0, run_id="edge", salt="edge")
    value = LARGEST * ((number - 5) / 5)  # -LARGEST to LARGEST
    trace = episode["traces"][0]
    trace["rewards"] = {"correct": {"score": value, "weight": 1.0}}
    trace["metrics"] = {"turns": value}
    trace["timing"] = {"start": -1e308, "end": 1e308}
    return episode


def _wide_episode(number: int) -> dict:
    """A reward of 1e200 or -1e200: their mean is 0, their squares overflow."""
    episode = make_episode(number, size=0, run_id="wide", salt="wide")
    episode["traces"][0]["rewards"] = {"correct": {"score": 1e200 if number % 2 else -1e200, "weight": 1.0}}
    return episode


def _strict(text: str) -> object:
    """JSON as a browser's JSON.parse reads it: no Infinity, no NaN."""
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is no JSON a browser parses")
    return json.loads(text, parse_constant=refuse)


def test_numbers_at_the_edge_of_the_float_range_leave_every_page_answering(tmp_path: Path) -> None:
    for name, episodes in (("edge", [_edge_episode(n) for n in range(11)]), ("wide", [_wide_episode(n) for n in range(4)]),
                           ("good", [make_episode(n, size=0, run_id="good", salt="good") for n in range(4)])):
        with open_run(tmp_path / name, name=name, environments=["env"], model="m", run_id=name, mode="offline") as run:
            run.log_episodes(episodes)
    client = TestClient(create_viewer_app(SpoolSource([tmp_path])), base_url="http://127.0.0.1",
                        raise_server_exceptions=False)
    pages = ["/", "/run?run=edge", "/run?run=edge&sort=duration", "/plots?run=edge", "/across",
             "/across?metric=turns", "/compare?a=good&b=edge", "/episode?run=edge&n=1"]
    answers = {page: client.get(page) for page in pages}
    assert {page: answer.status_code for page, answer in answers.items()} == dict.fromkeys(pages, 200)
    across = answers["/across"].text
    assert all(f'data-run="{name}"' in across for name in ("good", "edge", "wide"))
    data = _strict(unescape(re.search(r'data-across="([^"]*)"', across).group(1)))
    assert all(math.isfinite(x) for key in ("means", "lows", "highs") for x in data[key])  # type: ignore[index]
    for plot in re.findall(r'data-plot="([^"]*)"', answers["/plots?run=edge"].text):
        _strict(unescape(plot))


def test_a_mean_an_interval_and_bins_of_floats_that_overflow_are_the_same_figures_rounded() -> None:
    from prime_runs_spool.viewer.spans import EqualBins, interval, mean

    assert mean([LARGEST, LARGEST]) == LARGEST
    assert mean([1.0, 2.0, 4.0]) == 7.0 / 3
    low, high = interval([LARGEST, -LARGEST], 0.0, 1.96)
    assert (low, high) == (-LARGEST, LARGEST)  # beyond the floats: bounded to them
    assert interval([1.0, 3.0], 2.0, 1.0) == (1.0, 3.0)
    bins = EqualBins(-LARGEST, LARGEST, 10)
    assert [bins.index(x) for x in (-LARGEST, -1e307, 0.0, LARGEST)] == [0, 4, 5, 9]
    assert bins.edge(0) == -LARGEST and bins.edge(5) == 0.0 and math.isfinite(bins.edge(10))
    plain = EqualBins(0.0, 1.0, 10)
    assert (plain.index(0.3), plain.edge(3)) == (int(0.3 / 0.1), 0.1 * 3)  # as before, where it fits
