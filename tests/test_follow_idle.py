"""An idle ``--follow`` costs what changes cost, not runs x polls (docs/sync.md, "Following").

These count the follower's looks at spools (its ``signature`` calls) while real live runs
sit idle; they time nothing. The CPU it saves is measured in benchmarks/follow_idle.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.platform_api.settings import Secret, Settings
from prime_runs_spool.sync import follow as follow_module
from prime_runs_spool.sync.engine import SyncOptions
from prime_runs_spool.sync.follow import IDLE_POLL_CAP, FollowOptions, Follower
from prime_runs_spool.sync.retry import Backoff
from prime_runs_spool.sync.state import remote_destination
from prime_runs_spool.sync.watch import NO_INOTIFY_ENV, ChangeWatch
from support.fake_platform import FakePlatform
from support.runs import RunBuilder

RUNS = 12


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Following:
    """A follower of ``RUNS`` idle live runs in a thread, counting its looks per run."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.platform = FakePlatform()
        self.builders = []
        for n in range(RUNS):
            builder = RunBuilder(root / f"run-{n:02d}", f"idle-{n}")
            builder.open_segment()
            builder.add(1)
            self.builders.append(builder)
        self.looks: Counter[str] = Counter()
        real = follow_module.signature

        def counted(run_dir: Path):
            self.looks[run_dir.name] += 1
            return real(run_dir)

        monkeypatch.setattr(follow_module, "signature", counted)
        settings = Settings(base_url="http://platform.test", api_key=Secret("k"), team_id=None,
                            frontend_url="http://app.test")
        self.client = PlatformClient(settings, transport=self.platform.transport())
        self.follower = Follower([root], self.client, remote_destination("http://platform.test", None),
                                 SyncOptions(request_lifetime=0.5, backoff=Backoff(base=0.05, cap=0.1)),
                                 FollowOptions(poll_interval=0.1))
        self.thread = threading.Thread(target=self.follower.run, daemon=True)

    def samples(self) -> int:
        return sum(len(rows) for rows in self.platform.samples.values())

    def __enter__(self) -> Following:
        self.thread.start()
        wait_for(lambda: self.samples() >= RUNS, "every run's first episode on the platform")
        return self

    def __exit__(self, *exc: object) -> None:
        self.follower.stop.set()
        self.thread.join(10)
        for builder in self.builders:
            builder.abandon()
        self.client.close()

    def idle_looks(self, seconds: float) -> Counter[str]:
        """The looks taken over ``seconds`` of doing nothing (after a second to settle)."""
        time.sleep(1.0)
        before = Counter(self.looks)
        time.sleep(seconds)
        return self.looks - before

    def append_and_wait(self, n: int) -> None:
        before = self.samples()
        self.builders[n].add(1)
        wait_for(lambda: self.samples() == before + 1, f"the episode appended to idle run {n} on the platform")


@pytest.mark.slow
@pytest.mark.skipif(not ChangeWatch().available, reason="no inotify here")
def test_with_inotify_idle_runs_are_not_looked_at_until_they_change(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(NO_INOTIFY_ENV, raising=False)
    with Following(tmp_path, monkeypatch) as following:
        looks = following.idle_looks(2.0)
        # Polling every 0.1 s this was 20 looks per run; now the kernel says when to look.
        assert sum(looks.values()) <= 2, looks
        following.looks.clear()
        following.append_and_wait(5)
        assert set(following.looks) == {"run-05"}, following.looks


@pytest.mark.slow
def test_without_inotify_idle_runs_are_polled_less_and_less(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(NO_INOTIFY_ENV, "1")
    with Following(tmp_path, monkeypatch) as following:
        assert not following.follower.watch.available
        looks = following.idle_looks(2.0)
        # Each idle run's interval doubles up to IDLE_POLL_CAP: about two looks in 2 s, not 20.
        assert max(looks.values()) <= 2.0 / IDLE_POLL_CAP + 2, looks
        assert min(looks.values()) >= 1, looks  # still looked at: an append is not missed
        following.append_and_wait(7)


WRITER = """
import sys, time
from pathlib import Path
from support.runs import RunBuilder
builder = RunBuilder(Path(sys.argv[1]), "idle-killed")
builder.open_segment()
builder.add(1)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not ChangeWatch().available, reason="no inotify here")
def test_with_inotify_a_sigkilled_writer_is_recorded_crashed_without_waiting_for_a_poll(
        tmp_path: Path, monkeypatch) -> None:
    """A writer's death changes no byte, but the kernel closing its files is an event: the
    run is recorded crashed long before the 30 s safety look."""
    import subprocess
    import sys

    from support.env import REPO_ROOT, child_env

    monkeypatch.delenv(NO_INOTIFY_ENV, raising=False)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "run-killed")], stdout=subprocess.PIPE,
                              text=True, env=child_env(PYTHONPATH=f"{REPO_ROOT}:{REPO_ROOT / 'tests'}"))
    try:
        assert writer.stdout.readline() == "ready\n"
        with Following(tmp_path, monkeypatch) as following:
            reports = {}
            following.follower.on_report = lambda report: reports.__setitem__(Path(report.path).name, report.state)
            wait_for(lambda: following.samples() == RUNS + 1, "the killed writer's episode")
            following.idle_looks(0.5)
            writer.kill()
            wait_for(lambda: reports.get("run-killed") == "crashed", "the run recorded crashed", timeout=10)
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.slow
@pytest.mark.skipif(not ChangeWatch().available, reason="no inotify here")
def test_with_inotify_a_run_started_in_new_nested_folders_is_found_by_events(tmp_path: Path, monkeypatch) -> None:
    """Folders created faster than they can be watched (``makedirs`` of three levels at
    once, then the run) are walked again once watched, so the run is found long before the
    30 s safety walk."""
    monkeypatch.delenv(NO_INOTIFY_ENV, raising=False)
    with Following(tmp_path, monkeypatch) as following:
        following.idle_looks(0.5)
        for n in range(3):
            late = RunBuilder(tmp_path / f"new-{n}" / "deeper" / "still" / "run", f"idle-late-{n}")
            late.open_segment()
            late.add(1)
            following.builders.append(late)
            wait_for(lambda: following.samples() == RUNS + n + 1, f"run new-{n}'s episode", timeout=10)


def test_a_pass_after_the_one_that_synced_a_run_keeps_it_reported_synced(tmp_path) -> None:
    """The pass that finalized a run can still see its writer alive (the seal is written, the
    lock not yet let go); the next pass finds nothing to do. That is no change of the run:
    no ``up_to_date`` line after ``synced`` (docs/cli.md, "Following"), and the run's
    last report stays ``synced``."""
    from prime_runs_spool.sync.follow import Followed, Follower
    from prime_runs_spool.sync.options import RunReport

    told: list[str] = []
    follower = Follower(paths=[tmp_path], client=None, destination=None, options=None,  # type: ignore[arg-type]
                        on_report=lambda report: told.append(report.state))
    followed = Followed(run_dir=tmp_path)
    follower._record(followed, RunReport(path=str(tmp_path), evaluation_id="ev1", state="live"), live=True)
    follower._record(followed, RunReport(path=str(tmp_path), evaluation_id="ev1", state="synced"), live=True)
    follower._record(followed, RunReport(path=str(tmp_path), evaluation_id="ev1", state="up_to_date"), live=False)
    assert told == ["live", "synced"]
    assert followed.report is not None and followed.report.state == "synced" and followed.done


@pytest.mark.slow
def test_an_unchanged_plain_output_costs_each_walk_stat_calls_not_an_import(tmp_path: Path, monkeypatch) -> None:
    """``sync --follow`` imports eval outputs without a spool before every walk; once one is
    imported and up to date (and its files have settled), a walk answers it from ``stat``
    calls (importer/unchanged.py): no import, no read of its ``traces.jsonl``."""
    import shutil

    from commands.follow_imports import FollowImports
    from prime_runs_spool.importer import outputs as importer_outputs
    from prime_runs_spool.importer import unchanged
    from prime_runs_spool.sync.unchanged import SETTLED
    from prime_runs_spool.sync.user_cache import CACHE_ENV
    from support.env import REPO_ROOT

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(unchanged, "_loaded", None)  # this process's view of the cache: the new one
    outputs = tmp_path / "outputs"
    shutil.copytree(REPO_ROOT / "fixtures" / "eval_outputs" / "vf040-completed", outputs / "plain", symlinks=True)
    imports, walks = Counter[str](), Counter[str]()
    real_import = importer_outputs.import_output

    def counted_import(output_dir: Path, **kwargs: object):
        imports[output_dir.name] += 1
        return real_import(output_dir, **kwargs)

    monkeypatch.setattr(importer_outputs, "import_output", counted_import)
    imports_seen = FollowImports([outputs], None, as_json=True, echo=lambda line: None, flush=lambda: None)

    def discover():
        walks["walk"] += 1
        return imports_seen()

    platform = FakePlatform()
    settings = Settings(base_url="http://platform.test", api_key=Secret("k"), team_id=None,
                        frontend_url="http://app.test")
    with PlatformClient(settings, transport=platform.transport()) as client:
        follower = Follower([outputs], client, remote_destination("http://platform.test", None),
                            SyncOptions(request_lifetime=0.5, backoff=Backoff(base=0.05, cap=0.1)),
                            FollowOptions(poll_interval=0.1, rescan_interval=0.2), discover=discover)
        thread = threading.Thread(target=follower.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: sum(len(rows) for rows in platform.samples.values()) == 4, "the imported episodes")
            time.sleep(SETTLED + 1.0)  # the spool and the outputs settle; a walk keeps the answer
            before, walks_before = imports["plain"], walks["walk"]
            time.sleep(2.0)
            idle_imports, idle_walks = imports["plain"] - before, walks["walk"] - walks_before
        finally:
            follower.stop.set()
            thread.join(10)
    assert imports["plain"] >= 1 and idle_walks >= 5, (imports, idle_walks)
    assert idle_imports == 0, f"{idle_imports} imports of unchanged outputs in {idle_walks} walks"
    assert sum(len(rows) for rows in platform.samples.values()) == 4
