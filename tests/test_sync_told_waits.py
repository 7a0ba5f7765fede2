"""Every wait of a sync is told before it starts, not only its retries: the wait for a
request that may still land, up to a whole request lifetime (600 s by default), is a line on
stderr naming the run, how long and why (docs/sync.md, "Concurrency"; sync/retry.py ``Wait``).

The case: a CI job's ``timeout`` kills a sync while the platform holds its first request
(the evaluation's create) unanswered, and the folder is unpacked again, its state gone. The
next sync cannot tell what was sent (the copy lock's note says only that the pass had begun
to announce), so it waits a lifetime before reading the platform. It used to wait in
silence, then call the run "another copy" in a warning printed only at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fixtures.fault_proxy import FaultProxy
from support import platform_process
from support.env import CLI, child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, assert_exactly_once

LIFETIME = 3.0
SECOND_LIFETIME = 10.0


def _sync(base_url: str, root: Path, cache: Path) -> list[str]:
    return CLI + ["sync", str(root), "--base-url", base_url, "--request-lifetime", str(LIFETIME),
                  "--timeout", "60", "--backoff-cap", "0.2"]


def _env(cache: Path) -> dict[str, str]:
    return child_env(PRIME_API_KEY=TOKEN, XDG_CACHE_HOME=str(cache), HOME=os.environ.get("HOME", "/root"))


def _under_way(cache: Path) -> bool:
    for note in (cache / "prime-runs").rglob("*.lock"):
        try:
            if json.loads(note.read_text() or "{}").get("under_way"):
                return True
        except ValueError:
            pass
    return False


@pytest.mark.slow
def test_a_sync_killed_with_its_create_out_then_its_state_deleted_makes_the_next_one_say_that_it_waits(
        tmp_path: Path) -> None:
    builder = build_run(tmp_path / "runs" / "r", "told-wait", 3)
    cache = tmp_path / "cache"
    with platform_process.running(tmp_path / "p.db", "--token", TOKEN) as platform, \
            FaultProxy(platform.api.removesuffix("/api/v1"), rates={"delay_after": 1.0}, methods={"POST"},
                       paths=r"/evaluations/?$",
                       delay=120.0) as proxy, \
            httpx.Client(base_url=platform.api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        first = subprocess.Popen(_sync(proxy.base_url, tmp_path / "runs", cache), env=_env(cache),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        # The create, announced under the copy lock, is forwarded and its answer held.
        while "delay_after" not in proxy.faults():
            assert first.poll() is None and time.monotonic() < deadline, "the first sync never reached its pass"
            time.sleep(0.05)
        time.sleep(0.3)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert _under_way(cache), "the killed pass's note still says so"
        proxy.set_rates({})
        shutil.rmtree(tmp_path / "runs" / "r" / "spool" / "sync")  # the folder unpacked again: its state gone
        # Stopped while it waits (Ctrl-C): it says it was stopped, never that it waited it out.
        stopped = subprocess.Popen(_sync(proxy.base_url, tmp_path / "runs", cache) + ["--request-lifetime", "60"],
                                   env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        told = stopped.stderr.readline()
        assert "waiting 60 s before sending more" in told, told
        stopped.send_signal(signal.SIGINT)
        out, err = stopped.communicate(timeout=60)
        assert stopped.returncode == 130, err
        assert "interrupted" in out and "waited until it could no longer land" not in out, out
        started = time.monotonic()
        # Its own lifetime longer, so that the wait is still to come however long a loaded
        # machine took to start and stop the syncs between (at load 14 they took 3 s).
        second = subprocess.run(_sync(proxy.base_url, tmp_path / "runs", cache)
                                + ["--request-lifetime", str(SECOND_LIFETIME)],
                                env=_env(cache), capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
        assert second.returncode == 0, second.stderr
        waits = [line for line in second.stderr.splitlines() if "waiting" in line]
        assert len(waits) == 1, second.stderr
        # What is left of its lifetime since the stopped sync handed the request on: 10 s,
        # less on a loaded machine where the syncs between took a second or more.
        told_wait = re.match(re.escape(f"prime-runs: {tmp_path / 'runs' / 'r'}: waiting ") + r"(\d+) s before sending more: ",
                             waits[0])
        assert told_wait is not None and 1 <= int(told_wait.group(1)) <= SECOND_LIFETIME, waits
        assert "stopped mid-pass" in waits[0] and "--request-lifetime" in waits[0], waits
        assert took >= int(told_wait.group(1)) - 1, "the wait it told of was waited"
        assert "another copy" not in second.stdout, second.stdout
        assert_exactly_once(api, builder)


def _local_sync(root: Path, db: Path, cache: Path, *more: str) -> list[str]:
    return CLI + ["sync", str(root), "--local", "--db", str(db), "--json", *more]


def _rows_and_finalizes(db: Path) -> tuple[list[int], list[int]]:
    import sqlite3

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        evaluations = conn.execute("SELECT id, finalize_count FROM evaluations").fetchall()
        rows = [conn.execute("SELECT COUNT(*) FROM samples WHERE evaluation_id = ?", (e,)).fetchone()[0]
                for e, _ in evaluations]
    return rows, [finalized for _, finalized in evaluations]


@pytest.mark.slow
def test_a_state_file_of_zero_length_says_until_when_it_waits_and_how_to_end_the_wait(tmp_path: Path) -> None:
    """A state file that exists but holds nothing (a crash as it was made, a full disk, a
    copy cut short) cannot say what its sync had in flight, nor when: its mtime is no bound
    (an overwrite in place is made durable by fdatasync, which leaves the mtime behind) and
    the platform's answer is read only after the wait (docs/sync.md, "State"). So the sync
    waits a whole request lifetime; it said only 'waiting 600 s', not until when, nor that a
    person who knows no sync of the run ran for a lifetime may end it by removing the file.
    Both are said now, and doing as told pushes nothing twice. The run failed, so its
    evaluation is closed out, not finalized: one finalized holding every row the run yields
    is adopted at once (below)."""
    runs, db, cache = tmp_path / "runs", tmp_path / "p.db", tmp_path / "cache"
    builder = build_run(runs / "r", "zero-length-state", 3, status="failed")
    env = child_env(XDG_CACHE_HOME=str(cache), HOME=os.environ.get("HOME", "/root"))
    first = subprocess.run(_local_sync(runs, db, cache), env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    state.write_bytes(b"")
    before = time.time()
    waited = subprocess.run(_local_sync(runs, db, cache, "--request-lifetime", str(LIFETIME)), env=env,
                            capture_output=True, text=True, timeout=120)
    assert waited.returncode == 0, waited.stderr
    (line,) = [line for line in waited.stderr.splitlines() if "waiting" in line]
    until = re.search(r"until (\d\d):(\d\d):(\d\d) UTC", line)
    assert until is not None, line
    ends = time.gmtime(before + LIFETIME)
    told = int(until.group(1)) * 3600 + int(until.group(2)) * 60 + int(until.group(3))
    assert 0 <= (told - (ends.tm_hour * 3600 + ends.tm_min * 60 + ends.tm_sec)) % 86400 <= 30, line
    assert f"remove {state} to go on at once" in line and "in the last 3 s" in line, line
    (report,) = json.loads(waited.stdout)["runs"]
    assert (report["state"], report["pushed_now"]) == ("failed", 0), report
    # Done as the line says: stopped, the file removed, the next sync goes on at once.
    state.write_bytes(b"")
    stopped = subprocess.Popen(_local_sync(runs, db, cache), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    told_line = stopped.stderr.readline()
    assert "waiting 600 s" in told_line and "until" in told_line, told_line
    stopped.send_signal(signal.SIGINT)
    stopped.communicate(timeout=60)
    assert stopped.returncode == 130
    state.unlink()
    started = time.monotonic()
    skipped = subprocess.run(_local_sync(runs, db, cache), env=env, capture_output=True, text=True, timeout=120)
    assert skipped.returncode == 0 and "waiting" not in skipped.stderr, skipped.stderr
    assert time.monotonic() - started < 60
    (report,) = json.loads(skipped.stdout)["runs"]
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("failed", 0, 3), report
    assert _rows_and_finalizes(db) == ([3], [0])


@pytest.mark.slow
def test_a_zero_length_state_of_a_run_finalized_with_every_row_costs_no_wait(tmp_path: Path) -> None:
    """A completed run synced, then its state left of zero length (a copy cut short, a full
    disk): the sync waited a whole request lifetime (600 s) before it read the platform,
    whose evaluation was finalized and held every row the run yields. No request of that
    state can still land (a finalize follows only settled requests, and no row is sent
    twice), and nothing is sent again (found, finalized, no row missing): adopted at once."""
    runs, db, cache = tmp_path / "runs", tmp_path / "p.db", tmp_path / "cache"
    builder = build_run(runs / "r", "zero-length-finalized", 3)
    env = child_env(XDG_CACHE_HOME=str(cache), HOME=os.environ.get("HOME", "/root"))
    first = subprocess.run(_local_sync(runs, db, cache), env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
    state.write_bytes(b"")
    again = subprocess.run(_local_sync(runs, db, cache), env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "waiting" not in again.stderr, again.stderr
    (report,) = json.loads(again.stdout)["runs"]
    assert (report["state"], report["pushed_now"], report["pushed_total"]) == ("synced", 0, 3), report
    assert _rows_and_finalizes(db) == ([3], [1])


@pytest.mark.slow
def test_a_zero_length_state_still_waits_for_rows_a_finalized_evaluation_lacks(tmp_path: Path) -> None:
    """A run synced and finalized, then resumed to completion: the sync pushing the resumed
    episodes is SIGKILLed while the proxy holds their samples request, its state left of zero
    length, and the run synced again where no copy lock knows of the killed pass (another
    cache: another machine's). The evaluation is finalized but lacks the two rows on their
    way, so it does not hold every row the run yields: the sync waits, and the held request,
    landed late, is each row's only copy."""
    builder = build_run(tmp_path / "runs" / "r", "zero-length-rows-on-their-way", 3)
    runs = tmp_path / "runs"
    with platform_process.running(tmp_path / "p.db", "--token", TOKEN) as platform, \
            httpx.Client(base_url=platform.api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        upstream = platform.api.removesuffix("/api/v1")
        with FaultProxy(upstream) as plain:
            port = int(plain.base_url.rsplit(":", 1)[1])  # the same address after: one destination
            done = subprocess.run(_sync(plain.base_url, runs, tmp_path / "a"), env=_env(tmp_path / "a"),
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        builder.open_segment()
        builder.add(2)
        builder.seal()
        (state,) = (builder.run_dir / "spool" / "sync").glob("*.json")
        with FaultProxy(upstream, methods={"POST"}, hold_first=r"/samples$", port=port) as proxy:
            first = subprocess.Popen(_sync(proxy.base_url, runs, tmp_path / "a") + ["--request-lifetime", "10"],
                                     env=_env(tmp_path / "a"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while not proxy.holding():
                assert first.poll() is None and time.monotonic() < deadline, "the resumed rows were never sent"
                time.sleep(0.01)
            sent = time.monotonic()
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            state.write_bytes(b"")
            for twin in state.parent.glob(".*.twin"):
                twin.unlink()
            second = subprocess.Popen(_sync(proxy.base_url, runs, tmp_path / "b") + ["--request-lifetime", "10"],
                                      env=_env(tmp_path / "b"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            time.sleep(max(0.0, sent + 4 - time.monotonic()))
            proxy.release_held()  # lands late, within its lifetime
            out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        assert "waiting" in err, err
        assert_exactly_once(api, builder)
