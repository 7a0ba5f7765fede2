"""Finding a new run's evaluation costs one small request, not a listing of the whole
environment (sync/index.py), and still sees every evaluation that exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.fake_platform import FakePlatform
from support.local_client import CountingClient, local_settings
from support.runs import build_run
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync.many import sync_paths
from prime_runs_spool.sync.options import SyncOptions
from prime_runs_spool.sync.state import sync_dir
from prime_runs_spool.sync.state import Destination

DEST = Destination(key="index-dest", base_url="http://local")


@pytest.mark.slow
def test_first_sync_of_many_new_runs_reads_a_linear_number_of_listed_evaluations(tmp_path: Path) -> None:
    runs = 40
    for n in range(runs):
        build_run(tmp_path / "runs" / f"run-{n:03d}", f"index-run-{n:03d}", 1)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with CountingClient(local_settings(platform)) as client:
            # One job: how much a lookup reads does not depend on how threads interleave.
            reports = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions(), jobs=1)
            assert [r.state for r in reports] == ["synced"] * runs
            # A listing of the whole environment per run reads 0 + 1 + ... + 39 = 780 items.
            assert client.listed <= 2 * runs, client.listed

            # Every state lost: each run must find its evaluation again, none is created twice.
            for n in range(runs):
                for path in sync_dir(tmp_path / "runs" / f"run-{n:03d}").glob("*.json"):
                    path.unlink()
            client.listed = 0
            again = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions(), jobs=4)
            assert [r.pushed_now for r in again] == [0] * runs
            assert {r.evaluation_id for r in again} == {r.evaluation_id for r in reports}
            # Four jobs: a lookup racing another run's create may read a few more, or list
            # once more; a listing per run would read 40 x 40 = 1,600.
            assert client.listed <= runs * runs // 4, client.listed
            total = client.list_evaluations(environment_name="gsm8k", skip=0, limit=1)["total"]
            assert total == runs


def _reader(items: list[dict], calls: list[tuple[int, int]]):
    def read_page(skip: int, limit: int) -> dict:
        calls.append((skip, limit))
        return {"evaluations": items[skip:skip + limit], "total": len(items)}
    return read_page


def _ours(run_id: str) -> tuple[str, None]:
    return (run_id, None)


def test_an_evaluation_created_elsewhere_after_the_first_listing_is_found_newest_first() -> None:
    items = [{"evaluation_id": f"e{n}", "metadata": {"local_run_id": f"r{n}"}} for n in range(250)][::-1]
    calls: list[tuple[int, int]] = []
    index = EvaluationIndex()
    assert index.find("gsm8k", _reader(items, calls), _ours("r3"))[0]["evaluation_id"] == "e3"
    assert len(calls) == 3  # the whole environment, once
    calls.clear()
    assert index.find("gsm8k", _reader(items, calls), _ours("r7"))[0]["evaluation_id"] == "e7"
    assert calls == [(0, 1)]  # nothing new: one item read
    items.insert(0, {"evaluation_id": "e-new", "metadata": {"local_run_id": "r-new"}})
    calls.clear()
    assert index.find("gsm8k", _reader(items, calls), _ours("r-new"))[0]["evaluation_id"] == "e-new"
    assert len(calls) <= 2


def test_evaluations_created_between_the_reads_of_a_lookup_do_not_cost_a_listing_of_everything() -> None:
    """Other jobs' creates land at the head while a lookup reads it: read again from the head
    (not from an offset, which skips them and makes the count disagree), the lookup finds
    them without listing the whole environment. With 8 jobs on 2,000 new runs the offset
    reads made most lookups list everything (7,385 listing reads)."""
    items = [{"evaluation_id": f"e{n}", "metadata": {"local_run_id": f"r{n}"}} for n in range(300)][::-1]
    index = EvaluationIndex()
    calls: list[tuple[int, int]] = []
    index.find("gsm8k", _reader(items, calls), _ours("r0"))
    created = iter(range(1000))

    def busy_reader(skip: int, limit: int) -> dict:
        """Two evaluations are created just before every read."""
        for _ in range(2):
            n = next(created)
            items.insert(0, {"evaluation_id": f"new{n}", "metadata": {"local_run_id": f"new-r{n}"}})
        calls.append((skip, limit))
        return {"evaluations": items[skip:skip + limit], "total": len(items)}

    calls.clear()
    found = index.find("gsm8k", busy_reader, _ours("new-r0"))
    assert [item["evaluation_id"] for item in found] == ["new0"]
    assert all(skip == 0 for skip, _ in calls) and len(calls) <= 6, calls  # never the whole environment


def test_whatever_the_order_a_count_that_does_not_add_up_lists_everything_again() -> None:
    # Oldest first: what is new sits at the end, where the head check does not look.
    items = [{"evaluation_id": f"e{n}", "metadata": {"local_run_id": f"r{n}"}} for n in range(120)]
    calls: list[tuple[int, int]] = []
    index = EvaluationIndex()
    assert index.find("gsm8k", _reader(items, calls), _ours("r-late")) == []
    items.append({"evaluation_id": "e-late", "metadata": {"local_run_id": "r-late"}})
    assert [i["evaluation_id"] for i in index.find("gsm8k", _reader(items, calls), _ours("r-late"))] == ["e-late"]
    # A deletion is a mismatch too: the index lists again rather than answer from memory.
    del items[0]
    assert index.find("gsm8k", _reader(items, calls), _ours("r0")) == []


@pytest.mark.slow
def test_runs_sharing_an_index_never_create_a_second_evaluation_on_an_oldest_first_platform(tmp_path: Path) -> None:
    platform = FakePlatform()
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    for n in range(12):
        build_run(tmp_path / f"run-{n:02d}", f"fake-run-{n:02d}", 2)
    with PlatformClient(settings, transport=platform.transport()) as client:
        first = sync_paths([tmp_path], client, DEST, SyncOptions(), jobs=3)
        for n in range(12):
            for path in sync_dir(tmp_path / f"run-{n:02d}").glob("*.json"):
                path.unlink()
        second = sync_paths([tmp_path], client, DEST, SyncOptions(), jobs=3)
    assert [r.state for r in first] == ["synced"] * 12
    assert [r.pushed_now for r in second] == [0] * 12
    assert len(platform.evaluations) == 12
    assert all(len(rows) == 2 for rows in platform.samples.values())


def test_the_runs_of_one_sync_resolve_each_environment_once(tmp_path: Path) -> None:
    platform = FakePlatform()
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    for n in range(6):
        build_run(tmp_path / f"run-{n}", f"env-once-{n}", 1)
    resolved: list[str] = []

    class Client(PlatformClient):
        def resolve_environment(self, name: str) -> str:
            resolved.append(name)
            return super().resolve_environment(name)

    with Client(settings, transport=platform.transport()) as client:
        reports = sync_paths([tmp_path], client, DEST, SyncOptions(), jobs=3)
    assert [r.state for r in reports] == ["synced"] * 6
    assert resolved == ["gsm8k"]


def test_runs_with_nothing_to_send_are_answered_without_a_pass(tmp_path: Path, monkeypatch) -> None:
    """A re-sync answers the unchanged runs in its own thread (RunSync.probe): no pass, no
    lock, no request; a run that grew since, and one whose state was lost, get their pass."""
    import prime_runs_spool.sync.many as many

    for n in range(6):
        build_run(tmp_path / "runs" / f"run-{n}", f"probe-run-{n}", 2)
    grows = build_run(tmp_path / "runs" / "run-grows", "probe-grows", 2, status=None)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            first = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions(), jobs=4)
            assert sorted(r.state for r in first) == ["crashed"] + ["synced"] * 6
            passes: list[str] = []
            real = many.sync_run
            monkeypatch.setattr(many, "sync_run", lambda run_dir, *a, **k: passes.append(run_dir.name) or real(
                run_dir, *a, **k))
            again = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions(), jobs=4)
            assert [r.state for r in again] == ["up_to_date"] * 7 and passes == []
            assert [r.pushed_total for r in again] == [2] * 7
            grows.open_segment()  # the crashed run resumed and wrote more
            grows.add(3)
            grows.seal()
            for path in sync_dir(tmp_path / "runs" / "run-0").glob("*.json"):
                path.unlink()  # a lost state: only a pass can find the evaluation again
            third = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions(), jobs=4)
            assert sorted(passes) == ["run-0", "run-grows"]
            states = {Path(r.path).name: (r.state, r.pushed_now) for r in third}
            assert states["run-grows"] == ("synced", 3) and states["run-0"][1] == 0


def test_a_lookup_reads_one_more_item_at_first_for_each_create_of_this_sync_in_flight() -> None:
    """Another job's create may land at the head before its answer is added to the index: a
    first read of one item then meets it and reads again. With that create counted, the
    first read is long enough to reach a known evaluation."""
    items = [{"evaluation_id": f"e{n}", "metadata": {"local_run_id": f"r{n}"}} for n in range(10)][::-1]
    index = EvaluationIndex()
    calls: list[tuple[int, int]] = []
    index.find("gsm8k", _reader(items, calls), _ours("r0"))
    with index.creating("gsm8k"):
        # landed on the platform, its answer not yet back
        items.insert(0, {"evaluation_id": "e-other", "metadata": {"local_run_id": "r-other"}})
        calls.clear()
        assert index.find("gsm8k", _reader(items, calls), _ours("r-mine")) == []
        assert calls == [(0, 2)]
        index.add("gsm8k", items[0])
    calls.clear()
    assert index.find("gsm8k", _reader(items, calls), _ours("r-other"))[0]["evaluation_id"] == "e-other"
    assert calls == [(0, 1)]  # nothing in flight: one item


def test_a_lookup_matches_the_local_run_id_and_the_replay_id_exactly() -> None:
    items = [{"evaluation_id": "plain", "metadata": {"local_run_id": "r1"}},
             {"evaluation_id": "replay-a", "metadata": {"local_run_id": "r1", "replay_id": "a"}},
             {"evaluation_id": "replay-b", "metadata": {"local_run_id": "r1", "replay_id": "b"}},
             {"evaluation_id": "other", "metadata": {"local_run_id": "r2"}},
             {"evaluation_id": "odd", "metadata": ["r1"]},
             {"evaluation_id": "none"},
             {"evaluation_id": "number", "metadata": {"local_run_id": 1}}]
    index = EvaluationIndex()
    calls: list[tuple[int, int]] = []

    def ids(run: tuple) -> list[str]:
        return [item["evaluation_id"] for item in index.find("gsm8k", _reader(items, calls), run)]

    assert ids(("r1", None)) == ["plain"]
    assert ids(("r1", "a")) == ["replay-a"]
    assert ids(("r1", "c")) == []
    assert ids(("r2", None)) == ["other"]
    assert ids(("1", None)) == []
    # An evaluation seen again with other metadata is found by what it carries now.
    index.add("gsm8k", {"evaluation_id": "other", "metadata": {"local_run_id": "r3"}})
    assert ids(("r3", None)) == ["other"]


def test_a_run_never_synced_here_is_given_to_a_pass_without_reading_its_spool(tmp_path: Path, monkeypatch) -> None:
    import prime_runs_spool.sync.engine as engine
    from prime_runs_spool.sync.engine import RunSync

    build_run(tmp_path / "run", "probe-fresh", 2)
    read: list[Path] = []
    monkeypatch.setattr(engine, "run_manifests", lambda run_dir: read.append(run_dir))
    platform = FakePlatform()
    settings = Settings("http://fake", Secret("key"), None, "http://app")
    with PlatformClient(settings, transport=platform.transport()) as client:
        assert RunSync(tmp_path / "run", client, DEST, SyncOptions()).probe() is None
    assert read == []


def test_a_followers_listing_answers_new_runs_only_while_it_is_recent() -> None:
    """A follower's listing answers a run no copy on this machine ever synced only while it
    was brought current less than ``answers_for`` seconds ago; older, the head is read first
    (and a run someone else synced meanwhile is found), which makes it recent again."""
    now = [0.0]
    evaluations = [{"evaluation_id": "e-1", "metadata": {"local_run_id": "run-1"}}]
    reads: list[tuple[int, int]] = []

    def read_page(skip: int, limit: int) -> dict:
        reads.append((skip, limit))
        return {"evaluations": evaluations[skip:skip + limit], "total": len(evaluations)}

    index = EvaluationIndex(answers_new_runs=True, answers_for=30.0, clock=lambda: now[0])
    assert [e["evaluation_id"] for e in index.find("gsm8k", read_page, ("run-1", None), never_held=True)] == ["e-1"]
    assert len(reads) == 1  # the listing, once
    now[0] = 29.0
    evaluations.insert(0, {"evaluation_id": "e-2", "metadata": {"local_run_id": "run-2"}})  # synced elsewhere
    assert index.find("gsm8k", read_page, ("run-3", None), never_held=True) == []
    assert len(reads) == 1  # recent: the listing answers, no request
    now[0] = 31.0
    assert [e["evaluation_id"] for e in index.find("gsm8k", read_page, ("run-2", None), never_held=True)] == ["e-2"]
    head = reads[1:]
    assert head and all(skip == 0 for skip, _ in head), reads  # old: the head first, which finds what is new
    now[0] = 60.0
    assert index.find("gsm8k", read_page, ("run-4", None), never_held=True) == []
    assert reads[1:] == head  # brought current at 31 s: recent again
