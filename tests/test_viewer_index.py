"""The viewer's index and pages without a browser: incremental, bounded, masked, and the
local platform's dashboard over its own evaluations."""

from __future__ import annotations

import re
import shutil
import tracemalloc
from pathlib import Path

import httpx
from hypothesis import given, settings, strategies as st
import pytest

from fixtures.episodes import FAKE_HEADER_SECRET
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.v0 import build_samples
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.viewer.app import create_viewer_app, wait_indexed
from prime_runs_spool.viewer.index import SpoolIndex
from prime_runs_spool.viewer.query import TableQuery, table_page
from prime_runs_spool.viewer.server import EmbeddedServer
from prime_runs_spool.viewer.sources import SpoolSource

from support.runs import RunBuilder
from support.viewer_runs import FIXTURE_OUTPUTS, spool_of_episodes


def test_the_index_reads_only_what_was_appended(tmp_path):
    builder = RunBuilder(tmp_path / "run", "grow")
    builder.open_segment()
    builder.add(5, size=0)
    index = SpoolIndex("run", tmp_path / "run")
    wait_indexed(index, 10)
    first = list(index.rows)
    assert len(first) == 5 and index.live
    builder.add(3, size=0)
    index._refreshed_at = -1.0  # noqa: SLF001 - skip the poll throttle
    wait_indexed(index, 10)
    assert len(index.rows) == 8
    assert all(a is b for a, b in zip(first, index.rows))  # earlier rows were not rebuilt
    builder.seal()
    index._refreshed_at = -1.0  # noqa: SLF001
    wait_indexed(index, 10)
    assert index.status == read_run(tmp_path / "run").status and not index.live


def test_a_first_look_at_a_big_run_does_not_wait_for_the_whole_spool(tmp_path):
    builder = RunBuilder(tmp_path / "run", "big")
    builder.open_segment()
    for _ in range(4):
        builder.add(500, size=0)
    builder.seal()
    index = SpoolIndex("run", tmp_path / "run")
    index.refresh(budget=0.0)
    assert index.behind and 50 <= len(index.rows) < 2000
    page = table_page(index, TableQuery())
    assert [row.number for row in page.rows] == list(range(1, len(page.rows) + 1))
    wait_indexed(index, 30)
    assert not index.behind and len(index.rows) == 2000


def test_the_index_holds_rows_not_records(tmp_path):
    builder = RunBuilder(tmp_path / "run", "large")
    builder.open_segment()
    builder.add(30, size=300_000)  # 9 MB of episodes
    builder.seal()
    index = SpoolIndex("run", tmp_path / "run")
    tracemalloc.start()
    try:
        wait_indexed(index, 30)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index.rows) == 30
    assert held < 1_000_000, held  # what stays after indexing: rows and prompts, not the 9 MB


def test_the_statuses_of_the_example_runs_agree_with_the_reader(tmp_path):
    source = SpoolSource([FIXTURE_OUTPUTS])
    runs = source.runs()
    assert len(runs) == 6
    for run in runs:
        wait_indexed(run, 10)
        spool = read_run(run.run_dir)
        assert run.status == spool.status, run.key
        assert len(run.rows) == spool.episodes_count, run.key


def test_a_secret_in_a_foreign_manifest_is_masked_again(tmp_path):
    writer = SegmentWriter.create(tmp_path / "run", "foreign")
    writer.append("manifest", {"run_id": "foreign", "name": "foreign", "model": "m", "environments": ["e"],
                               "config": {"client": {"headers": {"X-Secret": FAKE_HEADER_SECRET}}}})
    writer.seal("completed")
    with EmbeddedServer(create_viewer_app(SpoolSource([tmp_path]))) as server:
        page = httpx.get(server.base_url + "/run", params={"run": "run"})
    assert page.status_code == 200 and "X-Secret" in page.text
    assert FAKE_HEADER_SECRET not in page.text


def test_unknown_runs_and_episodes_are_a_clear_404(tmp_path):
    shutil.copytree(FIXTURE_OUTPUTS / "gsm8k-completed", tmp_path / "gsm8k-completed")
    with EmbeddedServer(create_viewer_app(SpoolSource([tmp_path]))) as server:
        for path, params in [("/run", {"run": "nope"}), ("/episode", {"run": "gsm8k-completed", "n": "99"}),
                             ("/episode", {"run": "gsm8k-completed", "n": "x"}), ("/run", {}),
                             ("/group", {"run": "gsm8k-completed", "example": "77"})]:
            r = httpx.get(server.base_url + path, params=params)
            assert r.status_code == 404 and "Traceback" not in r.text, (path, params)
            assert "content-security-policy" in r.headers


def test_the_dashboard_is_the_viewer_over_the_platforms_evaluations(tmp_path):
    records = list(read_run(FIXTURE_OUTPUTS / "gsm8k-completed").episodes())
    with EmbeddedPlatform(tmp_path / "p.db") as platform:
        api = f"{platform.base_url}/api/v1"
        env = httpx.post(f"{api}/environmentshub/resolve", json={"name": "gsm8k"}).json()["data"]["id"]
        evaluation = httpx.post(f"{api}/evaluations/", json={
            "name": "synced-run", "model_name": "Qwen/Qwen3-8B", "environments": [{"id": env}]}).json()
        rows = build_samples(records, evaluation_id=evaluation["evaluation_id"])
        assert httpx.post(f"{api}/evaluations/{evaluation['evaluation_id']}/samples",
                          json={"samples": rows}).status_code == 200
        with httpx.Client(follow_redirects=True) as browser:
            runs = browser.get(platform.base_url + "/dashboard/")
            assert "synced-run" in runs.text and 'data-status="running"' in runs.text
            page = browser.get(evaluation["viewer_url"])
            assert page.status_code == 200 and '<b class="total">6</b> samples' in page.text
            assert "/dashboard/episode?run=" in page.text and "/dashboard/static/viewer.css" in page.text
            episode = browser.get(platform.base_url + "/dashboard/episode",
                                  params={"run": evaluation["evaluation_id"], "n": 1})
            roles = re.findall(r'data-role="(\w+)"', episode.text)
            assert roles[:5] == ["system", "user", "assistant", "tool", "assistant"]


_floats = st.none() | st.floats(allow_nan=False, allow_infinity=False, width=32)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(sort=st.sampled_from(["n", "reward", "tokens", "metric:judge/solved", "example"]), desc=st.booleans(),
       page=st.integers(1, 10_000), rmin=_floats, rmax=_floats, rlt=_floats, errors=st.booleans(),
       truncated=st.booleans(), q=st.text(max_size=30).map(str.strip), example=st.none() | st.text(min_size=1, max_size=8))
def test_a_view_survives_its_own_url(sort, desc, page, rmin, rmax, rlt, errors, truncated, q, example):
    view = TableQuery(sort=sort, desc=desc, page=page, rmin=rmin, rmax=rmax, rlt=rlt, errors=errors,
                      truncated=truncated, q=q, example=example)
    assert TableQuery.from_params(view.params()) == view


def test_an_odd_record_is_a_row_and_never_stops_the_index(tmp_path):
    writer = SegmentWriter.create(tmp_path / "run", "odd")
    writer.append("manifest", {"run_id": "odd", "name": "odd"})
    writer.append_many([("episode", {"id": "a", "traces": ["not a trace"]}, None),
                        ("episode", ["not", "a", "record"], None),
                        ("episode", {"id": "b", "ok": True, "traces": [{"task": {"data": {"idx": 3}}}]}, None)])
    writer.seal("completed")
    with EmbeddedServer(create_viewer_app(SpoolSource([tmp_path]))) as server:
        page = httpx.get(server.base_url + "/run", params={"run": "run"})
        assert page.status_code == 200 and '<b class="total">3</b>' in page.text
        for n in (1, 2, 3):
            assert httpx.get(server.base_url + "/episode", params={"run": "run", "n": n}).status_code == 200
        assert httpx.get(server.base_url + "/group", params={"run": "run", "example": "3"}).status_code == 200


@pytest.mark.slow
def test_the_dashboard_lists_a_run_that_went_to_prime_traces(tmp_path):
    """A run synced ``--to traces`` has no sample rows: the dashboard lists its episodes from
    the platform's Prime Traces store instead, and an episode page shows its transcript."""
    import json
    import subprocess

    from support.env import CLI, child_env

    outputs = tmp_path / "outputs"
    shutil.copytree(FIXTURE_OUTPUTS / "gsm8k-completed", outputs / "gsm8k-completed")
    db = tmp_path / "p.db"
    result = subprocess.run(CLI + ["sync", str(outputs), "--local", "--db", str(db), "--to", "traces", "--json"],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    assert (report["store"], report["pushed_now"]) == ("traces", 6)
    with EmbeddedPlatform(db, traces=True) as platform, httpx.Client(follow_redirects=True) as browser:
        page = browser.get(platform.base_url + "/dashboard/run", params={"run": report["evaluation_id"]})
        assert page.status_code == 200 and '<b class="total">6</b> samples' in page.text, page.text[:2000]
        episode = browser.get(platform.base_url + "/dashboard/episode",
                              params={"run": report["evaluation_id"], "n": 1})
        roles = re.findall(r'data-role="(\w+)"', episode.text)
        assert roles[:5] == ["system", "user", "assistant", "tool", "assistant"]
        assert FAKE_HEADER_SECRET not in page.text + episode.text


def test_a_writer_killed_with_its_last_mark_unpublished_has_its_last_episodes_read(tmp_path):
    """Lines go into the padding (the file does not grow) and the durable mark is written at
    most every 10 ms: a writer killed within that time of its last append changes neither
    the file's size nor its mark. Its death must still make the index read on: the episode
    was durable, and read_run shows it (and calls the run crashed, not torn)."""
    builder = RunBuilder(tmp_path / "run", "killed-owed")
    writer = builder.open_segment()
    builder.add(2, size=0)
    index = SpoolIndex("run", tmp_path / "run")
    wait_indexed(index, 10)
    assert len(index.rows) == 2 and index.live
    # The next marks stay unwritten (as if owed when it died). Not by a far due time: the
    # process's one publisher thread would sleep on it, holding up every other writer's mark.
    unpublished, writer._file.mark = writer._file.mark, None  # noqa: SLF001
    writer.append_many([("episode", {"id": "last", "n": 3})])
    writer._file.guard.lock.release()  # noqa: SLF001 - killed: the kernel drops its lock, leaves the file as it is
    spool = read_run(tmp_path / "run")
    assert (spool.status, spool.episodes_count) == ("crashed", 3)
    index._refreshed_at = -1.0  # noqa: SLF001 - skip the poll throttle
    wait_indexed(index, 10)
    assert (index.status, len(index.rows)) == ("crashed", 3)
    writer.close()
    unpublished.close()


def test_an_example_id_that_is_not_a_plain_value_does_not_take_the_runs_pages_down(tmp_path: Path) -> None:
    """The index keys search text by example id: an idx of [1] raised "unhashable type" in
    the middle of indexing, so the run's list (and every page of it) answered 500."""
    from fixtures.episodes import make_episode
    from prime_runs_spool.viewer.pages import Pages
    from prime_runs_spool.viewer.render import Links
    from prime_runs_spool.viewer.sources import SpoolSource

    odd = make_episode(0, size=50)
    odd["traces"][0]["task"]["data"]["idx"] = [1]
    for trace in odd["traces"]:
        trace["task"]["data"]["idx"] = {"split": "test", "n": 1}
    source = SpoolSource([spool_of_episodes(tmp_path, [make_episode(1, size=50), odd, make_episode(2, size=50)])])
    pages = Pages(source, Links())
    html = pages.run({"run": "odd"}, "/run?run=odd&fragment=1")
    run = source.get("odd")
    assert len(run.rows) == 3, html[-300:]
    group = pages.group({"run": "odd", "example": str({"split": "test", "n": 1})})
    assert "odd-shapes" in group or "split" in group
