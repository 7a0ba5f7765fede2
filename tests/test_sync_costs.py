"""What the first sync of new runs costs in requests, against the local platform: the cost
per run that sets how long a sweep of thousands of small runs takes to sync
(benchmarks/sync_many.py; docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from support.env import CLI, child_env
from support.local_client import CountingClient, local_settings
from support.runs import RunBuilder, build_run
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.content.summary import SummaryAccumulator
from prime_runs_spool.spool.format import EPISODE
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.sync.index import EvaluationIndex
from prime_runs_spool.sync import copies, many
from prime_runs_spool.sync.copies import COPY_LOCKS_DIRNAME, copy_lock_path, run_key_digest
from prime_runs_spool.sync.user_cache import cache_root
from prime_runs_spool.sync.interrupt import Interrupt
from prime_runs_spool.sync.many import sync_lock, sync_paths, sync_run
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.store.objects import ObjectStore
from prime_runs_spool.store.source import find_store_runs
from prime_runs_spool.sync import unchanged
from prime_runs_spool.sync.follow import FollowOptions, Follower
from prime_runs_spool.sync.state import Destination, remote_destination
from prime_runs_spool.sync.store_sync import StoreRunSync, default_local_root, sync_store

DEST = Destination(key="costs-dest", base_url="http://local")


def _evaluations(platform: EmbeddedPlatform) -> list[dict]:
    """Every evaluation on the platform, read without the client under test."""
    return httpx.get(f"{platform.base_url}/api/v1/evaluations/", params={"limit": 100}).json()["evaluations"]


def _sync(tmp_path: Path, platform: EmbeddedPlatform, paths: list[Path], *, jobs: int = 1,
          index: EvaluationIndex | None = None, run: Path | None = None,
          options: SyncOptions | None = None) -> tuple[CountingClient, list]:
    settings = local_settings(platform)
    options = options or SyncOptions()
    with CountingClient(settings) as client:
        if run is not None:
            reports = [sync_run(run, client, DEST, options, index=index)]
        else:
            reports = sync_paths(paths, client, DEST, options, jobs=jobs)
    return client, reports


def _new_runs(tmp_path: Path, name: str, runs: int) -> None:
    """``runs`` new completed runs of 2 episodes each, ``tmp_path/runs/run-N``, whose ids
    are ``costs-NAME-N``: what the per-run count tests sync for the first time."""
    for n in range(runs):
        build_run(tmp_path / "runs" / f"run-{n}", f"costs-{name}-{n}", 2)


def _first_sync(tmp_path: Path, name: str, runs: int = 3, *, jobs: int = 1,
                before_sync: Callable[[], object] = lambda: None) -> CountingClient:
    """:func:`_new_runs`, then one sync of ``tmp_path/runs`` against a fresh local platform,
    each run reported synced: the client that counted its requests. ``before_sync`` is called
    once the runs are built, so a count it sets up counts the sync and not the building."""
    _new_runs(tmp_path, name, runs)
    before_sync()
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        client, reports = _sync(tmp_path, platform, [tmp_path / "runs"], jobs=jobs)
    assert [r.state for r in reports] == ["synced"] * runs, [(r.state, r.error) for r in reports]
    return client


#: While a test listens (opened_under), every file this process opens: the "open" audit
#: event covers open(), io.open and os.open, whichever code opens.
_LISTENERS: list[list[str]] = []


def _on_audit(event: str, args: tuple) -> None:
    if event == "open" and _LISTENERS and isinstance(args[0], (str, bytes, os.PathLike)):
        _LISTENERS[-1].append(os.fsdecode(args[0]))
    elif event in ("os.scandir", "os.listdir") and _LISTINGS and isinstance(args[0], (str, bytes, os.PathLike)):
        _LISTINGS[-1].append(os.fsdecode(args[0]))


#: While a test listens (listed_under), every folder this process lists.
_LISTINGS: list[list[str]] = []


@contextmanager
def opened_under(folder: Path) -> Iterator[list[str]]:
    """The files under ``folder`` this process opens (to read or to write) meanwhile."""
    if _on_audit not in _HOOKED:
        sys.addaudithook(_on_audit)  # audit hooks cannot be removed: one for the session
        _HOOKED.append(_on_audit)
    opened: list[str] = []
    _LISTENERS.append(opened)
    try:
        yield opened
    finally:
        _LISTENERS.remove(opened)
    opened[:] = [path for path in opened if Path(path).is_relative_to(folder)]


_HOOKED: list[object] = []


@contextmanager
def listed_under(folder: Path) -> Iterator[Counter[str]]:
    """How many times this process lists each folder under ``folder`` meanwhile."""
    if _on_audit not in _HOOKED:
        sys.addaudithook(_on_audit)
        _HOOKED.append(_on_audit)
    listed: list[str] = []
    counts: Counter[str] = Counter()
    _LISTINGS.append(listed)
    try:
        yield counts
    finally:
        _LISTINGS.remove(listed)
    counts.update(str(Path(path).resolve()) for path in listed if Path(path).resolve().is_relative_to(folder))


def _settled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files count as settled as soon as the file system's clock moved on (sync/unchanged.py
    waits 2 s for it), so a test need not wait for the no-op answers to be kept."""
    monkeypatch.setattr(unchanged, "SETTLED", 0.0)
    time.sleep(0.05)


def test_a_new_run_costs_a_create_its_samples_and_a_finalize(tmp_path: Path) -> None:
    """Per new completed run of one request of samples: the create (carrying the metadata),
    the samples and the finalize (carrying the metrics), nothing else. The environment is
    listed once for all the runs (none of them was ever synced on this machine, so no
    evaluation can carry their ids but those listed), and resolved once; no metadata PUT, no
    read of the count before finalizing (this pass created the evaluation and had every
    answer). What the platform then holds is what the PUT gave it before."""
    runs = 6
    builders = [build_run(tmp_path / "runs" / f"run-{n}", f"costs-{n}", 3) for n in range(runs)]
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        client, reports = _sync(tmp_path, platform, [tmp_path / "runs"], jobs=3)
        evaluations = {e["metadata"]["local_run_id"]: e for e in _evaluations(platform)}
    assert [r.state for r in reports] == ["synced"] * runs
    assert client.requests == {
        "POST /environmentshub/resolve": 1,
        "GET /evaluations/": 1,
        "POST /evaluations/": runs,
        "POST /evaluations/ID/samples": runs,
        "POST /evaluations/ID/finalize": runs,
    }, client.requests
    for builder in builders:
        evaluation = evaluations[builder.run_id]
        summary = SummaryAccumulator()
        for record in iter_records(builder.run_dir):
            if record.type == EPISODE:
                summary.add(record.data)
        assert evaluation["status"] == "COMPLETED" and evaluation["metrics"] == summary.result(), evaluation
        assert evaluation["metadata"]["local_run_id"] == builder.run_id and "model" in evaluation["metadata"]


def test_a_request_sets_its_sockets_timeout_only_when_it_changes(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On the sync's own connection a request's writes (its head, its body) share one timeout,
    set on the socket once (each setting an ``ioctl``, a hand-over of the interpreter lock
    among the sync's threads); each read of an answer is given what is left of its deadline,
    so a read may set it again. Before, httpcore's stream set it before every write and read."""
    import socket

    counts: Counter[str] = Counter()

    def counting(name: str):  # noqa: ANN202
        inner = getattr(socket.socket, name)

        def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if threading.current_thread().name.startswith("prime-runs-sync"):
                counts[name] += 1
            return inner(self, *args, **kwargs)
        return counted

    for name in ("settimeout", "send", "recv"):
        monkeypatch.setattr(socket.socket, name, counting(name), raising=False)
    runs = 3
    _first_sync(tmp_path, "timeouts", runs)
    requests = 3 * runs  # each run's create, samples and finalize, on a pass's thread
    assert counts["send"] >= requests, counts
    assert counts["settimeout"] <= counts["recv"] + requests, counts


def test_a_small_requests_head_goes_out_with_its_body_in_one_write(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request of a new run's first sync (its create, its samples, its finalize) is
    small: its head and its body go out in one ``send`` (each ``send`` of a socket with a
    timeout is a ``poll`` too, and a hand-over of the interpreter lock among the passes).
    Before, the head and the body were written one after the other: 2 a request. The bytes
    on the wire are the same (tests/test_client_wire.py)."""
    import socket

    sends: list[int] = []
    inner = socket.socket.send

    def counted(self, data, *args):  # noqa: ANN001, ANN002, ANN202
        if threading.current_thread().name.startswith("prime-runs-sync"):
            sends.append(len(data))
        return inner(self, data, *args)

    monkeypatch.setattr(socket.socket, "send", counted, raising=False)
    runs = 3
    client = _first_sync(tmp_path, "one-write", runs)
    assert sum(client.requests.values()) == 3 * runs + 2, client.requests  # and the environment's resolve and listing
    assert len(sends) == sum(client.requests.values()), sends


def test_a_requests_socket_is_given_no_timeout_and_is_not_polled_before_a_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync's own connection keeps its socket non-blocking for its life and waits with a
    ``poll`` of its own only where a read or a write would block: no ``settimeout`` (an
    ``ioctl``) for a request or a read, and each ``send`` made on a socket with no timeout,
    which Python makes without a ``poll`` first. Before: the timeout set once a request and
    again for a read, each ``send`` after a ``poll``."""
    import socket

    timeouts_at_send: list[float | None] = []
    set_timeouts: list[float | None] = []
    send, settimeout = socket.socket.send, socket.socket.settimeout

    def sending(self, data, *args):  # noqa: ANN001, ANN002, ANN202
        if threading.current_thread().name.startswith("prime-runs-sync"):
            timeouts_at_send.append(self.gettimeout())
        return send(self, data, *args)

    def setting(self, value):  # noqa: ANN001, ANN202
        if threading.current_thread().name.startswith("prime-runs-sync"):
            set_timeouts.append(value)
        return settimeout(self, value)

    monkeypatch.setattr(socket.socket, "send", sending, raising=False)
    monkeypatch.setattr(socket.socket, "settimeout", setting, raising=False)
    client = _first_sync(tmp_path, "nonblocking")
    assert len(timeouts_at_send) == sum(client.requests.values()), timeouts_at_send
    assert set(timeouts_at_send) == {0.0}, timeouts_at_send  # non-blocking: no poll before the send
    assert len(set_timeouts) == 1, set_timeouts  # the connect's (httpcore's), for the one connection


def test_a_small_samples_request_is_announced_on_its_own_thread_before_it_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of one piece has nothing to send before its last byte, so its announcement is
    not handed to the announcers' thread to be written alongside (a hand-over of about
    0.1 M instructions a run): the sending thread writes it, then sends. A body of several
    pieces still goes out while its announcement is written (test_sync_announce_alongside.py)."""
    from prime_runs_spool.sync import protocol as protocol_module

    handed: list[str] = []
    writers: list[tuple[str | None, int]] = []
    real_announcers, real_save = protocol_module._announcers, protocol_module.save_state

    def announcers():  # noqa: ANN202
        handed.append("alongside")
        return real_announcers()

    def save(path, state, *writer):  # noqa: ANN001, ANN202
        writers.append((state.in_flight.kind if state.in_flight else None, threading.get_ident()))
        real_save(path, state, *writer)

    monkeypatch.setattr(protocol_module, "_announcers", announcers)
    monkeypatch.setattr(protocol_module, "save_state", save)
    build_run(tmp_path / "runs" / "run", "costs-inline", 3)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, (report,) = _sync(tmp_path, platform, [tmp_path / "runs"], run=tmp_path / "runs" / "run")
    assert report.state == "synced" and report.pushed_now == 3, report
    assert handed == []
    assert [kind for kind, _ in writers] == ["create", "samples", "finalize", None]
    assert {thread for _, thread in writers} == {threading.get_ident()}


def test_a_copy_synced_by_another_sync_after_the_listing_is_found_not_created_again(tmp_path: Path) -> None:
    """The listing answers only for runs no copy on this machine ever synced: a copy of a
    run that another sync pushed after this sync listed the environment (its copy lock then
    has a note) is looked for at the head of the listing again, and its evaluation adopted."""
    build_run(tmp_path / "first" / "run", "costs-copied", 3)
    build_run(tmp_path / "other" / "run", "costs-other", 2)
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    index = EvaluationIndex(answers_new_runs=True)  # this sync's, listed before the copy was synced
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, (other,) = _sync(tmp_path, platform, [], run=tmp_path / "other" / "run", index=index)
        _, (first,) = _sync(tmp_path, platform, [tmp_path / "first"])  # another sync, its own listing
        client, (second,) = _sync(tmp_path, platform, [], run=tmp_path / "second" / "run", index=index)
        evaluations = _evaluations(platform)
    assert (other.state, first.state) == ("synced", "synced")
    assert (second.state, second.pushed_now) == ("synced", 0), (second.state, second.error, second.warnings)
    assert second.evaluation_id == first.evaluation_id
    assert len(evaluations) == 2
    assert client.requests["GET /evaluations/"] >= 1 and "POST /evaluations/" not in client.requests


def test_a_run_whose_metadata_changed_since_its_create_is_sent_it_again(tmp_path: Path) -> None:
    """A run synced while live, then crashed and resumed to completion: its end is recorded
    with a PUT (the crash), and the completion's metadata, which no longer says it crashed,
    goes with one more PUT before the finalize; a run finished with nothing changed since its
    create sends none (the test above)."""
    builder = RunBuilder(tmp_path / "runs" / "run", "costs-resumed")
    builder.open_segment()
    builder.add(2)
    builder.abandon()
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        crashed_client, (crashed,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        builder.open_segment()
        builder.add(2)
        builder.seal()
        client, (completed,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        evaluation = httpx.get(f"{platform.base_url}/api/v1/evaluations/{completed.evaluation_id}").json()
    assert (crashed.state, completed.state) == ("crashed", "synced")
    assert crashed_client.requests["PUT /evaluations/ID"] == 2  # the run's end, then its status
    assert client.requests["PUT /evaluations/ID"] == 1 and client.requests["POST /evaluations/ID/finalize"] == 1
    assert "prime_runs" not in evaluation["metadata"] and evaluation["status"] == "COMPLETED"


def test_a_run_already_synced_is_answered_without_its_lock_and_without_a_request(tmp_path: Path) -> None:
    """A no-op re-sync answers an up-to-date run in the discovering thread from its state and
    the first lines of its spool (RunSync.probe): held by another sync, it is still
    ``up_to_date``, not ``skipped``, and the platform is asked nothing."""
    build_run(tmp_path / "runs" / "run", "costs-noop", 3)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, (first,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        lock = sync_lock(tmp_path / "runs" / "run")
        lock.acquire()
        try:
            client, (again,) = _sync(tmp_path, platform, [tmp_path / "runs"])
        finally:
            lock.release()
    assert first.state == "synced"
    assert (again.state, again.local_run_id, again.evaluation_id) == ("up_to_date", "costs-noop", first.evaluation_id)
    assert not client.requests


def test_a_no_op_resync_of_many_runs_opens_no_file_of_theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a sync found the runs up to date, the next one answers each of them from a few
    ``stat`` calls (sync/unchanged.py): no request, no file of the runs opened (no segment
    read, no state read or written, no lock taken), and the same report."""
    runs = 12
    for n in range(runs):
        build_run(tmp_path / "runs" / f"run-{n:02d}", f"costs-unchanged-{n}", 2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, first = _sync(tmp_path, platform, [tmp_path / "runs"], jobs=3)
        _settled_at_once(monkeypatch)
        _, probed = _sync(tmp_path, platform, [tmp_path / "runs"])  # reads each run once more, keeps the answer
        with opened_under(tmp_path / "runs") as opened:
            client, answered = _sync(tmp_path, platform, [tmp_path / "runs"])
    assert [r.state for r in first] == ["synced"] * runs
    assert [r.as_json() for r in answered] == [r.as_json() for r in probed]
    assert {r.state for r in answered} == {"up_to_date"} and all(r.evaluation_id for r in answered)
    assert not client.requests, client.requests
    assert opened == [], opened


def test_a_no_op_resync_lists_each_spool_folder_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run answered from its kept answer costs no listing of its spool folder beyond the
    walk's, which finds it a run: whether a segment came or went, the folder's own times say
    (sync/unchanged.py)."""
    runs = 6
    for n in range(runs):
        build_run(tmp_path / "runs" / f"run-{n:02d}", f"costs-listed-{n}", 2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _sync(tmp_path, platform, [tmp_path / "runs"])
        _settled_at_once(monkeypatch)
        _, probed = _sync(tmp_path, platform, [tmp_path / "runs"])  # keeps the answers
        with listed_under(tmp_path.resolve() / "runs") as listed:
            _, answered = _sync(tmp_path, platform, [tmp_path / "runs"])
    assert [r.as_json() for r in answered] == [r.as_json() for r in probed]
    spools = {str((tmp_path / "runs" / f"run-{n:02d}" / "spool").resolve()) for n in range(runs)}
    assert {folder: listed[folder] for folder in spools} == dict.fromkeys(spools, 1), listed


#: What a no-op re-sync answered from kept answers must not load: the HTTP stack, the lock's
#: library, the checksum library, the reader and the engine, the shared listings, the other
#: commands.
NOT_FOR_A_NO_OP = ("httpx", "filelock", "crc32c", "crc32c._crc32c", "prime_runs_spool.spool.reader", "prime_runs_spool.sync.engine",
                   "prime_runs_spool.sync.index", "prime_runs_spool.importer.agreement", "commands.verify",
                   "commands.status", "commands.view", "commands.export", "commands.mirror", "commands.platform",
                   "commands.eval")


def test_a_no_op_resync_asks_the_platform_nothing_and_loads_none_of_the_sync_machinery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prime-runs sync`` of runs found up to date before sends nothing, so it asks nothing,
    not even whether the key is good (docs/cli.md): it succeeds with the platform gone. And
    it imports only what answers it (benchmarks/sync_noop_many.py: start-up is most of it)."""
    for n in range(3):
        build_run(tmp_path / "runs" / f"run-{n}", f"costs-no-op-command-{n}", 2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        destination = remote_destination(platform.base_url, None)  # the command's, for this URL
        with CountingClient(local_settings(platform)) as client:
            sync_paths([tmp_path / "runs"], client, destination, SyncOptions())
            _settled_at_once(monkeypatch)
            probed = sync_paths([tmp_path / "runs"], client, destination, SyncOptions())  # keeps the answers
        base_url = platform.base_url
    for output in (["--json"], []):  # the report as JSON, and as lines
        probe = ("import atexit, json, sys\n"
                 f"atexit.register(lambda: sys.stderr.write(json.dumps([m for m in {NOT_FOR_A_NO_OP!r} "
                 "if m in sys.modules]) + '\\n'))\n"
                 "from commands.cli import main\n"
                 f"sys.argv = ['prime-runs', 'sync', {str(tmp_path / 'runs')!r}, '--base-url', {base_url!r}, "
                 f"*{output!r}]\n"
                 "main()\n")
        done = subprocess.run([CLI[0], "-c", probe], capture_output=True, text=True, timeout=60,
                              env=child_env(PRIME_API_KEY="a-key-nobody-checks"))
        assert done.returncode == 0, done.stderr
        if output:
            assert [r["state"] for r in json.loads(done.stdout)["runs"]] == ["up_to_date"] * 3
            assert [r["evaluation_id"] for r in json.loads(done.stdout)["runs"]] == [r.evaluation_id for r in probed]
        else:
            assert [line.split()[0] for line in done.stdout.splitlines() if "/runs/run-" in line] == ["up_to_date"] * 3
        assert done.stderr.strip().splitlines()[-1] == "[]", (output, done.stderr)


def test_a_run_changed_since_it_was_found_up_to_date_is_read_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept answer holds only while the run's files do: a segment cut short (lines the
    platform holds are gone) is reported ``lost``, a crashed run resumed to completion has
    its new episodes pushed, and ``--to`` naming another sink than the run's is refused, as
    when the answer is read from the files."""
    lost = build_run(tmp_path / "runs" / "lost", "costs-lost", 3)
    resumed = build_run(tmp_path / "runs" / "resumed", "costs-resumed-later", 2, status=None)
    build_run(tmp_path / "runs" / "same", "costs-same", 2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _sync(tmp_path, platform, [tmp_path / "runs"])
        _settled_at_once(monkeypatch)
        _, probed = _sync(tmp_path, platform, [tmp_path / "runs"])
        _, refused = _sync(tmp_path, platform, [tmp_path / "runs" / "same"],
                           options=dataclasses.replace(SyncOptions(), to="traces"))
        segment = lost.run_dir / "spool" / "seg-000001.jsonl"
        os.truncate(segment, segment.stat().st_size - 40)
        resumed.open_segment(counted=True)
        resumed.add(2)
        resumed.seal()
        _, again = _sync(tmp_path, platform, [tmp_path / "runs"])
    assert [(r.path.rsplit("/", 1)[-1], r.state) for r in probed] == [
        ("lost", "up_to_date"), ("resumed", "up_to_date"), ("same", "up_to_date")]
    assert refused[0].state == "error" and "--to samples" in (refused[0].error or ""), refused[0]
    states = {r.path.rsplit("/", 1)[-1]: (r.state, r.pushed_now) for r in again}
    assert states == {"lost": ("lost", 0), "resumed": ("synced", 2), "same": ("up_to_date", 0)}, again


def test_a_run_that_lost_a_segment_before_its_last_is_never_up_to_date(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment missing before the last (deleted, or not restored from a backup) is
    corruption (docs/spool-format.md, section 4.1), and the platform holds episodes the spool
    no longer has. The first and last segments and the state are untouched, so neither the
    kept answer (sync/unchanged.py) nor the probe's sizes see it: the listing must. Sync
    reports the run ``corrupt``, with or without a kept answer, never ``up_to_date``."""
    builder = RunBuilder(tmp_path / "runs" / "gap", "costs-gap")
    for segment, episodes in enumerate((3, 2, 2)):
        builder.open_segment(counted=segment > 0)
        builder.add(episodes)
        if segment < 2:
            builder.abandon()  # a crash, then a resume: the next segment
        else:
            builder.seal()
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, first = _sync(tmp_path, platform, [tmp_path / "runs"])
        _settled_at_once(monkeypatch)
        _, probed = _sync(tmp_path, platform, [tmp_path / "runs"])  # keeps the answer
        (builder.run_dir / "spool" / "seg-000002.jsonl").unlink()
        _, kept = _sync(tmp_path, platform, [tmp_path / "runs"])
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-kept-answers"))
        _, read = _sync(tmp_path, platform, [tmp_path / "runs"])
    assert [(r.state, r.pushed_now) for r in first] == [("synced", 7)] and probed[0].state == "up_to_date"
    for report in (*kept, *read):
        assert report.state == "corrupt" and "seg-000002.jsonl is missing" in (report.error or ""), report


@pytest.mark.parametrize("to", ["samples", "traces"])
def test_two_copies_of_a_completed_run_in_one_sync_are_finalized_once(tmp_path: Path, to: str) -> None:
    """The second copy finds the evaluation in the sync's one listing, which holds it as the
    first copy created it (not yet finalized); the count it reads says every row is there,
    and its status says finalized: read then, not taken from the listing, or the run was
    finalized a second time (``finalize_count`` 2, the platform's statistics job run twice)."""
    builder = build_run(tmp_path / "runs" / "a", "costs-two-copies", 3)
    shutil.copytree(builder.run_dir, tmp_path / "runs" / "b")
    with EmbeddedPlatform(tmp_path / "platform.db", traces=to == "traces") as platform:
        _, reports = _sync(tmp_path, platform, [tmp_path / "runs"], options=SyncOptions(to=to))
        (evaluation,) = _evaluations(platform)
        found = httpx.get(f"{platform.base_url}/api/v1/evaluations/{evaluation['evaluation_id']}").json()
    assert [(r.state, r.evaluation_id) for r in reports] == [("synced", found["evaluation_id"])] * 2, reports
    if to == "samples":  # traces are addressed: the copy's upload of the same bytes lands on the same key
        assert [r.pushed_now for r in reports] == [3, 0], reports
    assert (found["total_samples"], found["finalize_count"]) == (3 if to == "samples" else 0, 1), found


def test_a_follower_finds_a_burst_of_new_runs_in_one_listing(tmp_path: Path) -> None:
    """A follower lists the environment once for new runs that appear together (a sweep
    starting): its listing answers a run no copy on this machine ever synced while it is
    recent (sync/index.py), so no run costs a read of the listing's head."""
    runs = 5
    for n in range(runs):
        build_run(tmp_path / "runs" / f"run-{n}", f"costs-followed-{n}", 2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with CountingClient(local_settings(platform)) as client:
            reports = Follower([tmp_path / "runs"], client, DEST, SyncOptions(),
                               FollowOptions(exit_when_idle=True)).run()
        evaluations = _evaluations(platform)
    assert sorted(r.state for r in reports) == ["synced"] * runs
    assert client.requests["GET /evaluations/"] == 1, client.requests
    assert client.requests["POST /evaluations/"] == runs and len(evaluations) == runs


def _file_store(tmp_path: Path, runs: int, prefix: str) -> str:
    """``runs`` sealed runs in a ``file://`` store (a folder laid out as a bucket)."""
    for n in range(runs):
        build_run(tmp_path / "bucket" / f"run-{n}", f"{prefix}-{n}", 2)
    return f"file://{tmp_path / 'bucket'}"


def test_a_store_sync_finds_its_new_runs_in_one_listing(tmp_path: Path) -> None:
    """Over a store URL, a run whose lease this syncer made (no syncer on any machine ever
    held it) is found in the sync's one listing of its environment, as a new local run is:
    one listing for all the runs, none per run."""
    runs = 5
    url = _file_store(tmp_path, runs, "costs-stored")
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with CountingClient(local_settings(platform)) as client:
            reports = sync_store(url, client, DEST, SyncOptions(), jobs=3)
        evaluations = _evaluations(platform)
    assert [r.state for r in reports] == ["synced"] * runs, [(r.state, r.error) for r in reports]
    assert client.requests["GET /evaluations/"] == 1, client.requests
    assert client.requests["POST /evaluations/"] == runs and len(evaluations) == runs


def test_a_store_run_another_syncer_held_is_looked_for_at_the_head(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing answers only for a run no syncer held: a run another syncer (another
    machine, keeping its state there) synced after this sync listed the environment has a
    lease this syncer did not make, so it reads the listing's head again and adopts the
    evaluation it finds instead of creating a second one."""
    url = _file_store(tmp_path, 2, "costs-stored-held")
    index = EvaluationIndex(answers_new_runs=True)  # this sync's, listed before the other syncer's pass
    options = SyncOptions()
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        settings = local_settings(platform)
        store = ObjectStore(url)
        here = tmp_path / "this-machine"
        first, second = find_store_runs(store, store.list(), default_local_root(store.url, here))
        with CountingClient(settings) as client:
            assert StoreRunSync(first, client, DEST, options, in_store=False, wait=False, index=index,
                                on_progress=None).sync().state == "synced"
        with monkeypatch.context() as elsewhere, CountingClient(settings) as other:
            # another machine: its own cache (no note in this machine's copy locks), its state kept there
            elsewhere.setenv("XDG_CACHE_HOME", str(tmp_path / "other-machine" / "cache"))
            (_, other_report) = sync_store(url, other, DEST, options, state_dir=tmp_path / "other-machine")
        with CountingClient(settings) as client:
            report = StoreRunSync(second, client, DEST, options, in_store=False, wait=False, index=index,
                                  on_progress=None).sync()
        evaluations = _evaluations(platform)
    assert other_report.state == "synced"
    assert (report.state, report.pushed_now) == ("synced", 0), (report.state, report.error, report.warnings)
    assert report.evaluation_id == other_report.evaluation_id
    assert len(evaluations) == 2
    assert client.requests["GET /evaluations/"] >= 1 and "POST /evaluations/" not in client.requests


def test_a_cancelled_run_resumed_to_completion_costs_its_samples_one_put_and_the_finalize(tmp_path: Path) -> None:
    """The end a pass recorded (``metadata.prime_runs``: cancelled, ``interrupted``) is what sync
    itself must not leave stale once the run completes: the completing pass's metadata PUT,
    which it sends anyway because the metadata changed, replaces it (nothing of ``prime_runs``
    in the body), and no request is added for it. ``error_message`` is not in that PUT nor in
    the finalize (the platform's contract has no such field there: docs/platform-api.md)."""
    builder = RunBuilder(tmp_path / "runs" / "run", "costs-resumed")
    builder.open_segment()
    builder.add(3)
    builder.seal("cancelled", error="interrupted")
    bodies: list[dict] = []

    class RecordingClient(CountingClient):
        def _request(self, method, path, **kwargs):  # noqa: ANN001, ANN003, ANN202
            if method in ("PUT", "POST") and not path.endswith("/samples"):
                bodies.append({"request": f"{method} {path.rsplit('/', 1)[-1]}", **(kwargs.get("json_body") or {})})
            return super()._request(method, path, **kwargs)

    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _sync(tmp_path, platform, [tmp_path / "runs"])
        builder.open_segment()
        builder.add(2)
        builder.seal()
        with RecordingClient(local_settings(platform)) as client:
            [report] = sync_paths([tmp_path / "runs"], client, DEST, SyncOptions())
        [evaluation] = _evaluations(platform)
    assert report.state == "synced", report
    assert client.requests == {
        "POST /evaluations/ID/samples": 1,
        "PUT /evaluations/ID": 1,
        "POST /evaluations/ID/finalize": 1,
    }, client.requests
    put, finalize = bodies
    assert (put["request"].split()[0], finalize["request"]) == ("PUT", "POST finalize"), bodies
    assert "prime_runs" not in put["metadata"] and "error_message" not in put, put
    assert set(finalize) == {"request", "metrics"}, finalize
    assert evaluation["status"] == "COMPLETED" and "prime_runs" not in evaluation["metadata"]


def _state_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Reads of sync states in any store (``spool/sync/*.json``), by key, from now on."""
    reads: Counter[str] = Counter()
    real_read = ObjectStore.read

    def counted(store: ObjectStore, key: str):  # noqa: ANN202
        if re.search(r"/spool/sync/[^/]+\.json$", key):
            reads[key] += 1
        return real_read(store, key)

    monkeypatch.setattr(ObjectStore, "read", counted)
    return reads


def test_a_new_store_run_has_its_state_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with no state in the listing has it read once, before its lease (another syncer
    may have synced it since the listing): when there was none and this syncer then made the
    lease, no syncer held the run in between, so the pass does not read it again."""
    runs = 4
    url = _file_store(tmp_path, runs, "costs-state-once")
    reads = _state_reads(monkeypatch)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with CountingClient(local_settings(platform)) as client:
            reports = sync_store(url, client, DEST, SyncOptions(), jobs=2)
    assert [r.state for r in reports] == ["synced"] * runs, [(r.state, r.error) for r in reports]
    assert sorted(reads.values()) == [1] * runs, reads


def test_a_state_written_without_the_lease_is_read_not_overwritten(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass that does not read the state again relies on the store: its first write is
    create-only. A state put there without the lease (an old syncer, a copy made by hand)
    after the read and before the lease refuses that write; the next pass reads it and
    settles from it: one evaluation, each episode once, finalized once."""
    from prime_runs_spool.store.lease import Lease

    url = _file_store(tmp_path, 1, "costs-stray-state")
    store = ObjectStore(url)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        settings = local_settings(platform)
        with CountingClient(settings) as client:
            [first] = sync_store(url, client, DEST, SyncOptions())
        assert first.state == "synced"
        [state_key] = [o.key for o in store.list() if re.search(r"/spool/sync/[^/]+\.json$", o.key)]
        stray = store.read(state_key)[0]
        for info in store.list():
            if info.key.endswith((".json", ".etag")) and "/spool/sync" in info.key:
                store.delete(info.key)  # the lease and the state gone: as if no syncer ever held the run
        real_take = Lease.try_take

        def state_put_back_first(lease: Lease) -> bool:
            store.create(state_key, stray)
            return real_take(lease)

        monkeypatch.setattr(Lease, "try_take", state_put_back_first)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-machine"))
        with CountingClient(settings) as client:
            [again] = sync_store(url, client, DEST, SyncOptions())
        evaluations = _evaluations(platform)
    assert again.state in ("synced", "up_to_date") and again.pushed_now == 0, (again.state, again.error)
    [evaluation] = evaluations
    assert evaluation["total_samples"] == 2 and evaluation.get("finalize_count", 1) == 1, evaluation


def test_a_damaged_record_of_runs_found_up_to_date_costs_only_the_read(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What sync/unchanged.py keeps is a cache: garbage in its file (or one of another
    version) makes the next sync read the runs as before, with the same answers, and keep
    them again."""
    for n in range(3):
        build_run(tmp_path / "runs" / f"run-{n}", f"costs-damaged-cache-{n}", 2)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _sync(tmp_path, platform, [tmp_path / "runs"])
        _settled_at_once(monkeypatch)
        _, probed = _sync(tmp_path, platform, [tmp_path / "runs"])
        (kept,) = (Path(os.environ["XDG_CACHE_HOME"]) / "prime-runs" / unchanged.UNCHANGED_DIRNAME).glob("*.json")
        kept.write_bytes(b'{"version": 1, "runs": [')
        with opened_under(tmp_path / "runs") as read_again:
            client, again = _sync(tmp_path, platform, [tmp_path / "runs"])
        with opened_under(tmp_path / "runs") as opened:
            _, answered = _sync(tmp_path, platform, [tmp_path / "runs"])
    assert [r.as_json() for r in again] == [r.as_json() for r in answered] == [r.as_json() for r in probed]
    assert not client.requests and read_again and not opened
    assert kept.stat().st_mode & 0o777 == 0o600


def test_a_store_run_renews_its_lease_only_to_announce_a_request(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request announced in the state renews the lease first (the fence, and the
    announcement a --state-dir taker reads there); a state write that announces nothing (the
    pass's last, recording the answers) does not, the lease being fresh: a new run's lease is
    written once to take it, once per announcement, and once to release it."""
    import json

    runs = 3
    url = _file_store(tmp_path, runs, "costs-lease-writes")
    writes: list[tuple[str, bool]] = []  # (object, whether the state written announces a request)
    real_put = ObjectStore._put_local

    def recorded(store: ObjectStore, key: str, data: bytes, mode: object) -> str:
        if key.endswith("/spool/sync.lease.json"):
            writes.append((key.rsplit("/spool/", 1)[0] + " lease", False))
        elif re.search(r"/spool/sync/[^/]+\.json$", key):
            writes.append((key.rsplit("/spool/", 1)[0] + " state", json.loads(data).get("in_flight") is not None))
        return real_put(store, key, data, mode)

    monkeypatch.setattr(ObjectStore, "_put_local", recorded)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with CountingClient(local_settings(platform)) as client:
            reports = sync_store(url, client, DEST, SyncOptions(), jobs=1)
    assert [r.state for r in reports] == ["synced"] * runs, [(r.state, r.error) for r in reports]
    for run in {what.rsplit(" ", 1)[0] for what, _ in writes}:
        leases = sum(1 for what, _ in writes if what == f"{run} lease")
        states = [announces for what, announces in writes if what == f"{run} state"]
        assert states[-1] is False and leases == sum(states) + 2, (run, leases, states)


class _TracesCountingClient(CountingClient):
    """Also counts the reads of Prime Traces' episode listing made on this client's own
    connection: ``auto``'s probe, and the question put to an evaluation found again."""

    def _get(self, url, **options):  # noqa: ANN001, ANN003, ANN202
        self.requests["GET /episodes" + ("?run_id" if "run_id" in (options.get("params") or {}) else "")] += 1
        return super()._get(url, **options)


def test_auto_names_the_sink_in_the_create_at_no_cost_and_a_run_found_again_is_not_asked(tmp_path: Path) -> None:
    """``auto``'s probe is asked before the create (its answer is what the create's metadata
    names) and once for the sync's runs, as after it; a run found again with its state lost
    is followed into the sink its evaluation names, without asking Prime Traces' listing."""
    runs = 4
    builders = [build_run(tmp_path / "runs" / f"run-{n}", f"auto-costs-{n}", 3) for n in range(runs)]
    options = SyncOptions(to="auto")
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with _TracesCountingClient(local_settings(platform)) as client:
            reports = sync_paths([tmp_path / "runs"], client, DEST, options, jobs=1)
        assert [(r.state, r.store) for r in reports] == [("synced", "samples")] * runs
        assert client.requests == {
            "POST /environmentshub/resolve": 1,
            "GET /evaluations/": 1,
            "GET /episodes": 1,
            "POST /evaluations/": runs,
            "POST /evaluations/ID/samples": runs,
            "POST /evaluations/ID/finalize": runs,
        }, client.requests
        assert {e["metadata"]["prime_runs_sink"] for e in _evaluations(platform)} == {"samples"}

        for builder in builders:
            shutil.rmtree(builder.run_dir / "spool" / "sync")
        with _TracesCountingClient(local_settings(platform)) as client:
            again = sync_paths([tmp_path / "runs"], client, DEST, options, jobs=1)
        assert [(r.state, r.store, r.pushed_now) for r in again] == [("synced", "samples", 0)] * runs
        assert not {name for name in client.requests if name.startswith("GET /episodes")}, client.requests


def test_a_new_runs_first_sync_reads_each_of_its_files_once(tmp_path: Path) -> None:
    """What a fresh run's first pass asks of its spool folder, for a run sealed as the runner
    seals it (its summary in the seal, so the records are read once): the folder listed for
    the manifests, whose listing the records and the read-ahead's size are read by, plus
    the walk's that found the run (whether a segment came after the seal is one ``lstat``
    of the next segment's name; the size and version recorded then are the cursor's
    segment's, one stat; a spool folder no one else may enter is not walked for its files'
    modes: 4 listings before); the segment opened for its first two lines, and for its records, fsync'd (a dead
    writer's) on that descriptor; its writer's lock probed once, before the records are
    read (a small run's size needs no answer from it); its durable mark read once; the
    state written four times: renamed into place once, with its twin beside it and the folder
    fsync'd after both (and the spool folder once, for the new ``sync/``), then overwritten in
    place three times, the file and its twin opened once for all three (sync/state_file.py).
    The layers each used to list the folder and open the segment and its lock again: 4 opens
    of each, its mark read twice, 8 listings; then 7 listings, the segment opened 3 times,
    ``sync/`` fsync'd after every write; then each write a new temporary file renamed into
    place, ``sync/`` fsync'd after the three that announce a request."""
    run = tmp_path / "runs" / "run"
    builder = RunBuilder(run, "costs-files")
    builder.open_segment()
    builder.add(3)
    summary = SummaryAccumulator()
    for record in iter_records(run):
        if record.type == EPISODE:
            summary.add(record.data)
    builder.writer.seal("completed", summary=summary.result())  # type: ignore[union-attr]
    builder.writer = None
    spool = str((run / "spool").resolve())
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with opened_under(tmp_path.resolve() / "runs") as opened, listed_under(tmp_path.resolve() / "runs") as listed:
            _, (report,) = _sync(tmp_path, platform, [tmp_path / "runs"])
    assert report.state == "synced"
    names = Counter(".tmp" if path.endswith(".tmp") else Path(path).name for path in opened)
    assert names == {
        "seg-000001.jsonl": 2, "seg-000001.lock": 1, "seg-000001.durable": 1,  # the reads
        "sync.lock": 1, "mirror.json": 1,  # the lock, the mirror's note
        "costs-dest.json": 2,  # the state read (there is none), then opened to be overwritten in place
        ".tmp": 1, "spool": 1, "sync": 1,  # the first write, its folder fsync'd once
        ".costs-dest.json.twin": 2,  # made by the first write (its first try makes sync/), overwritten before each announcement
    }, names
    assert listed[spool] == 2, listed


def test_only_a_spool_folder_others_may_enter_is_walked_for_its_modes(tmp_path: Path) -> None:
    """A pass looks inside the spool for files others may read only when others may enter
    its folder (one ``stat``, as the probe of a run up to date already decides): such a
    spool (an artifact unpacked with a 022 umask) is walked and made private, and said so;
    one in a folder no one else may enter is not walked (its files are reached only through
    it), one listing fewer, and nothing is said."""
    import stat as stat_module

    runs = {name: build_run(tmp_path / "runs" / name, f"costs-modes-{name}", 2).run_dir for name in ("open", "closed")}
    for name, run in runs.items():
        segment = next((run / "spool").glob("seg-*.jsonl"))
        os.chmod(segment, 0o644)
        os.chmod(run / "spool", 0o755 if name == "open" else 0o700)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with listed_under(tmp_path.resolve() / "runs") as listed:
            _, reports = _sync(tmp_path, platform, [tmp_path / "runs"])
    by_name = {Path(report.path).name: report for report in reports}
    assert {name: report.state for name, report in by_name.items()} == {"open": "synced", "closed": "synced"}
    assert any("made private" in line for line in by_name["open"].warnings), by_name["open"].warnings
    assert not any("open to other users" in line for line in by_name["closed"].warnings), by_name["closed"].warnings
    opened = runs["open"] / "spool"
    assert stat_module.S_IMODE(opened.stat().st_mode) == 0o700
    assert all(not path.lstat().st_mode & 0o077 for path in opened.rglob("*"))
    assert stat_module.S_IMODE((runs["closed"] / "spool").stat().st_mode) == 0o700  # no one else may enter
    spools = {name: str((run / "spool").resolve()) for name, run in runs.items()}
    assert listed[spools["open"]] == listed[spools["closed"]] + 1, listed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere statvfs asks for a read-only mount")
def test_whether_a_new_runs_spool_is_read_only_asks_no_statvfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a spool folder is read-only (where its lock and state go) is asked of every
    run a sync finds: on Linux ``access`` already says a read-only mount is (``EROFS``;
    tests/test_import_readonly.py mounts one), so no ``statvfs`` is asked. Before: one a run."""
    asked: list[str] = []
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: asked.append(os.fspath(path)) or real(path))
    _first_sync(tmp_path, "statvfs")
    assert asked == [], asked


def test_the_walks_that_find_new_runs_ask_their_folders_listings_not_a_call_a_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync's two walks (for eval outputs to import, for runs) list each folder they
    enter; whether a folder holds ``traces.jsonl``, or ``metadata.json`` and
    ``results.jsonl``, and whether its ``spool/`` is a folder, is answered from that listing:
    no ``access`` of those names, no ``lstat`` of ``spool``. Before: two ``access`` and one
    ``lstat`` a run, in the command's thread."""
    asked: list[tuple[str, str]] = []
    real_access, real_lstat = os.access, os.lstat

    def access(path, mode, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if threading.current_thread() is threading.main_thread():  # the walks'
            asked.append(("access", os.fspath(path)))
        return real_access(path, mode, *args, **kwargs)

    def lstat(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if threading.current_thread() is threading.main_thread():
            asked.append(("lstat", os.fspath(path)))
        return real_lstat(path, *args, **kwargs)

    runs = 3
    _new_runs(tmp_path, "walks", runs)
    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "lstat", lstat)
    from commands.cli import cli

    monkeypatch.setenv("PRIME_API_KEY", "local")
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)
    out = io.StringIO()
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli(["sync", str(tmp_path / "runs"), "--base-url", platform.base_url, "--json"], standalone_mode=False)
    assert out.getvalue().count('"synced"') == runs, out.getvalue()
    names = Counter((call, Path(path).name) for call, path in asked)
    assert names[("access", "traces.jsonl")] == names[("access", "metadata.json")] == 0, names
    assert names[("lstat", "spool")] == 0, names


def test_a_new_runs_copy_lock_note_is_rewritten_without_cutting_the_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass rewrites its copy lock's note when it takes the lock, before its first
    announcement and at its end (sync/copies.py); a shorter note is padded with spaces to the
    file's length, so no rewrite truncates the file. Before: the note's ``"announced": true``
    after ``false`` is a byte shorter, an ``ftruncate`` every new run. The next pass reads
    the note, padding and all."""
    cut: list[int] = []
    real = os.ftruncate
    runs = 3
    _first_sync(tmp_path, "note", runs, before_sync=lambda: monkeypatch.setattr(
        os, "ftruncate", lambda fd, size: cut.append(size) or real(fd, size)))
    assert cut == [], cut
    for n in range(runs):  # each note as the next pass reads it
        lock = copy_lock_path(cache_root() / COPY_LOCKS_DIRNAME, run_key_digest(DEST.key, f"costs-note-{n}", None))
        fd = os.open(lock, os.O_RDONLY)
        try:
            note, size = copies._read_note(fd)
        finally:
            os.close(fd)
        assert size == lock.stat().st_size and note["under_way"] is False, note


def test_a_new_runs_state_writes_ask_no_process_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file a new run's first state write renames into place is named by the
    process and the thread (files.replace_private): the process's id is kept, asked again only
    in a forked child (``os.getpid`` is a system call). Before: asked at every such write."""
    asked: list[int] = []
    real = os.getpid
    _first_sync(tmp_path, "pid", jobs=2, before_sync=lambda: monkeypatch.setattr(
        os, "getpid", lambda: threading.current_thread().name.startswith("prime-runs-sync")
        and asked.append(1) or real()))
    assert asked == [], len(asked)
    pid = real()
    child = os.fork()
    if child == 0:  # a fork names its files by its own id
        from prime_runs_spool import files

        os._exit(0 if files._PID[0] == real() != pid else 1)
    assert os.waitpid(child, 0)[1] == 0


def test_a_new_runs_segment_is_read_without_a_seek_and_sized_by_the_fsyncs_fstat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead writer's segment is opened, fsync'd through that descriptor and read from its
    start: the ``fstat`` the fsync takes first gives its size (spool/writer_state.py,
    ``make_durable``), and a file just opened is at 0 already, so no seek. Before: an
    ``fstat`` more for the size and a seek to 0 (an ``lseek``) each segment read."""
    import io

    from prime_runs_spool.spool import reader

    seeks: list[int] = []
    sized: list[int] = []
    walks: list[Path] = []

    class Counting(io.BufferedReader):
        def seek(self, *args):  # noqa: ANN002, ANN202
            seeks.append(args[0])
            return super().seek(*args)

    real_open, real_fstat = reader._open_segment, os.fstat

    def opened(path):  # noqa: ANN001, ANN202
        if getattr(path, "open_bytes", None) is not None:
            return real_open(path)
        walks.append(path)
        return Counting(io.FileIO(path, "rb"), reader._READ_BUFFER)

    def fstat(fd):  # noqa: ANN001, ANN202
        if isinstance(fd, int) and os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl"):
            sized.append(fd)
        return real_fstat(fd)

    def count() -> None:
        monkeypatch.setattr(reader, "_open_segment", opened)
        monkeypatch.setattr(os, "fstat", fstat)

    _first_sync(tmp_path, "seek", 2, before_sync=count)
    assert walks and seeks == [], seeks
    assert len(sized) == 2 * len(walks), (sized, walks)  # the fsync's, and the end's (where the lines end)


def test_a_segments_writer_is_probed_without_unlocking_before_the_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a segment's writer lives is a shared ``flock`` tried on a descriptor of the
    probe's own, dropped by closing it (spool/writer_state.py): no ``LOCK_UN`` first. A
    writer that holds its lock is still seen alive, and the probe leaves it free for it.
    Before: a ``LOCK_UN`` each probe."""
    import fcntl

    from prime_runs_spool.spool.writer_state import writer_alive

    unlocked: list[int] = []
    real = fcntl.flock
    _first_sync(tmp_path, "probe", 2, before_sync=lambda: monkeypatch.setattr(
        fcntl, "flock", lambda fd, op: (op & fcntl.LOCK_UN and unlocked.append(fd)) or real(fd, op)))
    assert unlocked == [], unlocked
    segment = next((tmp_path / "runs" / "run-0" / "spool").glob("seg-*.jsonl"))
    assert writer_alive(segment) is False
    held = os.open(segment.with_suffix(".lock"), os.O_RDWR)
    try:
        real(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a live writer holds it: after the probes above
        assert writer_alive(segment) is True
    finally:
        os.close(held)


def test_a_sync_lock_that_is_not_a_file_costs_only_its_run(tmp_path: Path) -> None:
    """The sync lock is taken by a plain flock on a file of its own: a FIFO in its place (a
    folder received from elsewhere) is that run's error, in one line that says what to do, and
    the other runs are synced all the same."""
    build_run(tmp_path / "runs" / "a", "costs-lock-fifo", 2)
    build_run(tmp_path / "runs" / "b", "costs-lock-fine", 2)
    os.mkfifo(tmp_path / "runs" / "a" / "spool" / "sync.lock", 0o600)
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        _, reports = _sync(tmp_path, platform, [tmp_path / "runs"])
        local_ids = {e["metadata"]["local_run_id"] for e in _evaluations(platform)}
    by_run = {Path(r.path).name: r for r in reports}
    assert by_run["b"].state == "synced" and local_ids == {"costs-lock-fine"}
    assert by_run["a"].state == "error" and "\n" not in by_run["a"].error, by_run["a"].error
    assert "sync.lock is not a regular file; remove it (sync makes it again)" in by_run["a"].error


def _calls_of_the_commands_thread(monkeypatch: pytest.MonkeyPatch, runs: int) -> int:
    """The Python calls the command's thread makes over ``sync_paths`` of ``runs`` new runs
    whose passes (stand-ins, 1 ms each, one at a time) end one after the other."""
    found = [Path(f"/runs/run-{n:04d}") for n in range(runs)]
    monkeypatch.setattr(many, "discover", lambda paths, on_link=None, on_unreadable=None: list(found))
    monkeypatch.setattr(many, "up_to_date", lambda *args, **kwargs: None)

    def a_pass(run_dir: Path, *args: object, **kwargs: object) -> RunReport:
        time.sleep(0.001)
        return RunReport(path=str(run_dir), state="synced")

    monkeypatch.setattr(many, "sync_run", a_pass)
    calls = [0]

    def count(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)  # this thread only: the passes' threads are not counted
    try:
        reports = sync_paths([Path("/runs")], None, DEST, SyncOptions(replay=True), jobs=1,  # type: ignore[arg-type]
                             stop=Interrupt())
    finally:
        sys.setprofile(None)
    assert [r.state for r in reports] == ["synced"] * runs
    return calls[0]


def test_the_commands_thread_waits_for_the_passes_at_a_cost_a_run_that_does_not_grow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While the passes run, the command's thread looks at the stop now and then; it does not
    wake at each pass's end to wait on every future still pending, work that grew with the
    square of the runs (over 2,000 new runs, 1.1 ms of its CPU a run, taken from the passes)."""
    few, many_runs = 40, 160
    per_run_few = _calls_of_the_commands_thread(monkeypatch, few) / few
    per_run_many = _calls_of_the_commands_thread(monkeypatch, many_runs) / many_runs
    assert per_run_many <= 1.2 * per_run_few, (per_run_few, per_run_many)
