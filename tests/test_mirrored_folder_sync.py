"""A run ``prime-runs mirror`` copies into a store is synced from its own folder on the eval
machine and from the bucket on another at the same moment: the folder sync takes the run's
lease in the store, the one the bucket's syncers take (docs/deploy.md), so the two never both
push; each episode reaches the platform once. A folder sync that cannot reach that store
pushes nothing and says so in one line.

The real command, the real local platform over HTTP, a real ``file://`` store and the
real ``mirror``; each "machine" has its own home and cache, so no lock on this machine
keeps the two syncs apart, only the store.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.fault_proxy import FaultProxy
from support.children import reaped
from support.env import CLI, child_env
from support.runs import build_run
from support.store_runs import (get_object, live_run, machine_env, mirror_once, start_sync_from_store,
                                sync_from_store)
from support.sync_e2e import api, assert_exactly_once, evaluations_of, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow  # two syncs and a mirror per try, against the platform process

#: Tries of the race: the old code pushed every episode twice in each of them.
TRIES = 4
#: Seconds between the folder's sync starting and the bucket's, by try.
STORE_DELAYS = (0.0, 0.6, 0.0, 0.3)


@pytest.fixture
def bucket(tmp_path: Path) -> str:
    (tmp_path / "bucket" / "outputs").mkdir(parents=True)
    return f"file://{tmp_path}/bucket/outputs"


def mirrored_run(tmp_path: Path, bucket: str, name: str, episodes: int):  # noqa: ANN201
    """A sealed run in ``node/outputs/<name>``, mirrored once to ``<bucket>/node``."""
    outputs = tmp_path / "node" / "outputs"
    for old in outputs.glob("*"):  # one run per try under the mirrored folder
        shutil.rmtree(old)
    builder = build_run(outputs / name, name, episodes)
    mirrored = mirror_once(outputs, f"{bucket}/node")
    assert mirrored.returncode == 0, mirrored.stdout + mirrored.stderr
    return builder


def test_a_mirrored_run_synced_from_its_folder_and_the_bucket_at_once_lands_once(tmp_path: Path, server, api,
                                                                                bucket: str) -> None:
    """Started together, and the bucket's sync started a little after the folder's, so
    that each wins the lease in some tries: one pushes the run, the other pushes nothing
    (it found the lease held, or, taking it after, the run on the platform)."""
    small = ("--json", "--max-request-bytes", "6000")
    for attempt in range(TRIES):
        builder = mirrored_run(tmp_path, bucket, f"mirrored-race-{attempt}", 12)
        with reaped(start_sync_from_store(server.base_url, tmp_path / "eval-machine", str(builder.run_dir),
                                          *small)) as folder:
            time.sleep(STORE_DELAYS[attempt % len(STORE_DELAYS)])
            with reaped(start_sync_from_store(server.base_url, tmp_path / "sync-machine", bucket, *small)) as store:
                outs = [proc.communicate(timeout=120) for proc in (folder, store)]
        assert_exactly_once(api, builder)
        assert [folder.returncode, store.returncode] == [0, 0], outs
        folder_report, store_report = ([r for r in json.loads(out)["runs"] if r["path"].endswith(builder.run_dir.name)]
                                       for out, _ in outs)
        pushed = sorted((r["pushed_now"], r["state"]) for r in folder_report + store_report)
        assert pushed[1] == (12, "synced") and pushed[0][0] == 0, outs
        assert pushed[0][1] in ("skipped", "synced", "up_to_date"), outs
        lease = json.loads(get_object(bucket, f"node/{builder.run_dir.name}/spool/sync.lease.json"))
        assert lease["released"] is True


def test_a_folder_sync_that_cannot_reach_the_mirror_store_pushes_nothing(tmp_path: Path, server, api,
                                                                          bucket: str) -> None:
    builder = mirrored_run(tmp_path, bucket, "mirrored-unreachable", 3)
    store_folder = tmp_path / "bucket"
    shutil.rmtree(store_folder)
    store_folder.write_bytes(b"")  # the store's folder is gone: nothing can be written there
    refused = sync_from_store(server.base_url, tmp_path / "eval-machine", str(builder.run_dir))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = [line for line in refused.stdout.splitlines() if line.startswith("  error: ")]
    assert len(lines) == 1 and f"{bucket}/node/mirrored-unreachable" in lines[0] \
        and f"prime-runs sync {bucket}/node/mirrored-unreachable --base-url {server.base_url})" in lines[0], \
        refused.stdout
    assert "Traceback" not in refused.stdout + refused.stderr
    assert not any(e["metadata"].get("local_run_id") == builder.run_id
                   for e in api.get("/evaluations/", params={"environment_name": "gsm8k"}).json()["evaluations"])


def test_the_store_sync_a_local_folder_sync_suggests_goes_where_that_sync_went(tmp_path: Path,
                                                                              bucket: str) -> None:
    """``--local --db DB --to traces`` refused for a store out of reach: the command it
    suggests, pasted once the store is back, syncs the run from the store into that database
    and sink (with no API key: it went to the public platform, exit 2, before)."""
    builder = mirrored_run(tmp_path, bucket, "mirrored-local", 3)
    db = tmp_path / "local.db"
    (tmp_path / "bucket").rename(tmp_path / "bucket-away")
    (tmp_path / "bucket").write_bytes(b"")  # out of reach: nothing can be written there
    env = child_env(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "home" / "cache"))
    refused = subprocess.run(CLI + ["sync", str(builder.run_dir), "--local", "--db", str(db), "--to", "traces"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    [line] = [line for line in refused.stdout.splitlines() if line.startswith("  error: ")]
    command = line.split("sync it from the store (", 1)[1].split("), ", 1)[0]
    (tmp_path / "bucket").unlink()
    (tmp_path / "bucket-away").rename(tmp_path / "bucket")
    pasted = subprocess.run(["sh", "-c", shlex.join(CLI) + command.removeprefix("prime-runs") + " --json"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert pasted.returncode == 0, command + pasted.stdout + pasted.stderr
    [run] = [r for r in json.loads(pasted.stdout)["runs"] if r["local_run_id"] == builder.run_id]
    assert (run["state"], run["pushed_total"], run["store"]) == ("synced", 3, "traces"), run
    again = subprocess.run(CLI + ["sync", str(builder.run_dir), "--local", "--db", str(db), "--to", "traces", "--json"],
                           capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["runs"][0]["pushed_now"] == 0, again.stdout


def _next_report(proc: subprocess.Popen[str], state: str) -> dict:
    """The follower's next JSON line, which must be about ``state``."""
    line = proc.stdout.readline()
    assert line, proc.communicate(timeout=5)
    report = json.loads(line)
    assert report["state"] == state, report
    return report


def test_a_folder_follower_frozen_while_the_bucket_pushes_pushes_none_of_it_again(tmp_path: Path, server, api,
                                                                                   bucket: str) -> None:
    """The lease changes hands twice around a follower of the run's folder, whose state file
    this process wrote itself (trusted without a read, were the lease not to say otherwise):
    frozen (SIGSTOP) between two passes while the writer adds 4 episodes, the mirror copies
    them and a sync of the bucket pushes them, it wakes, finds the lease naming the bucket's
    state, checks its own against the platform, and pushes none of the 4 again."""
    outputs = tmp_path / "node" / "outputs"
    builder, _ = live_run(outputs / "run", "mirrored-follower", 5)
    assert mirror_once(outputs, f"{bucket}/node").returncode == 0
    follower = start_sync_from_store(server.base_url, tmp_path / "eval-machine", str(builder.run_dir), "--follow",
                                     "--exit-when-idle", "--json", "--poll-interval", "0.05")
    with reaped(follower):
        assert _next_report(follower, "live")["pushed_now"] == 5
        follower.send_signal(signal.SIGSTOP)
        try:
            builder.add(4)
            assert mirror_once(outputs, f"{bucket}/node").returncode == 0
            pushed = sync_from_store(server.base_url, tmp_path / "sync-machine", bucket, "--json")
            assert pushed.returncode == 0, pushed.stdout + pushed.stderr
            [report] = json.loads(pushed.stdout)["runs"]
            assert (report["state"], report["pushed_now"]) == ("live", 4), report
        finally:
            follower.send_signal(signal.SIGCONT)
        builder.seal()
        out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, out + err
    assert json.loads(out.splitlines()[-1])["state"] == "synced", out
    assert_exactly_once(api, builder)  # 9 rows for 9 episodes, finalized once
    lease = json.loads(get_object(bucket, "node/run/spool/sync.lease.json"))
    assert lease["released"] is True and lease["generation"] >= 3


def test_a_folder_sync_under_way_when_the_mirror_first_copies_the_run_goes_on_under_the_lease(
        tmp_path: Path, server, api, bucket: str) -> None:
    """The folder's sync began before the mirror's first pass (no note, no lease): its first
    samples request is held on the way while the mirror copies the run; once that request
    has landed, a sync of the bucket starts while the folder's pass, its answers slowed,
    still has 3 requests to go. The folder's pass announces none of them without the lease,
    so the two never push at once: each episode once."""
    outputs = tmp_path / "node" / "outputs"
    builder = build_run(outputs / "run", "mirrored-meanwhile", 12)
    with FaultProxy(server.base_url, methods={"POST"}, paths=r"/samples$", hold_first=r"/samples$",
                    rates={"delay_after": 1.0}, delay=0.5) as proxy:
        folder = start_sync_from_store(proxy.base_url, tmp_path / "eval-machine", str(builder.run_dir), "--json",
                                       "--max-request-bytes", "6000")
        with reaped(folder):
            deadline = time.monotonic() + 60
            while not proxy.holding():
                assert folder.poll() is None and time.monotonic() < deadline, folder.communicate()
                time.sleep(0.01)
            assert mirror_once(outputs, f"{bucket}/node").returncode == 0
            proxy.release_held()  # the folder's first request lands, its answer 0.5 s late
            [evaluation] = evaluations_of(api, builder.run_id)
            while api.get(f"/evaluations/{evaluation['evaluation_id']}").json()["total_samples"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            store = sync_from_store(server.base_url, tmp_path / "sync-machine", bucket, "--json", "--wait")
            out, err = folder.communicate(timeout=120)
    assert_exactly_once(api, builder)
    assert folder.returncode == 0 and store.returncode == 0, (out, err, store.stdout, store.stderr)


def test_a_folder_sync_killed_with_its_request_out_hands_the_lease_to_the_bucket_which_waits_it_out(
        tmp_path: Path, server, api, bucket: str) -> None:
    """The folder's sync is SIGKILLed while its samples request is held on the way; a sync
    of the bucket takes the expired lease, which announces that request (the folder's state
    is a file the bucket's syncer cannot read), waits until it can no longer land, and
    pushes nothing twice: the request lands late, within its lifetime, 5 rows for 5 episodes."""
    lifetime = 8.0
    lease_env = {"PRIME_RUNS_LEASE_TTL": "1.5", "PRIME_RUNS_LEASE_CLOCK_SKEW": "0"}
    outputs = tmp_path / "node" / "outputs"
    builder = build_run(outputs / "run", "mirrored-handover", 5)
    assert mirror_once(outputs, f"{bucket}/node").returncode == 0

    def sync(base_url: str, path: str, machine: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(CLI + ["sync", path, "--json", "--base-url", base_url, "--request-lifetime",
                                       str(lifetime), "--backoff-cap", "0.2", "--timeout", "30", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=machine_env(tmp_path / machine, **lease_env))

    with FaultProxy(server.base_url, methods={"POST"}, hold_first=r"/samples$") as proxy:
        folder = sync(proxy.base_url, str(builder.run_dir), "eval-machine")
        with reaped(folder):
            deadline = time.monotonic() + 60
            while not proxy.holding():
                assert folder.poll() is None and time.monotonic() < deadline, folder.communicate()
                time.sleep(0.01)
            sent = time.monotonic()
            folder.kill()  # it dies with its request out: the platform has not seen it yet
            folder.communicate()
        with reaped(sync(proxy.base_url, bucket, "sync-machine", "--wait")) as store:
            time.sleep(max(0.0, sent + lifetime / 2 - time.monotonic()))
            proxy.release_held()  # the folder's request lands, late but within its lifetime
            out, err = store.communicate(timeout=120)
    assert_exactly_once(api, builder)  # 5 rows for 5 episodes, one evaluation, finalized once
    assert store.returncode == 0, err
    [report] = json.loads(out)["runs"]
    assert report["state"] == "synced" and any("waited" in warning for warning in report["warnings"]), report
    lease = json.loads(get_object(bucket, "node/run/spool/sync.lease.json"))
    assert lease["generation"] == 2 and lease["released"] is True and lease["in_flight_until"] == 0.0


def test_a_first_mirror_that_uploaded_nothing_binds_the_folder_to_no_store(tmp_path: Path, server, api,
                                                                             bucket: str) -> None:
    """A mirror into a URL that cannot be written (mistyped) left its note anyway: every sync
    of the folder then failed on that store's lease ('sync it from the store'), which never
    held the run, and a mirror into the right store kept the wrong note. The note is taken
    back once the store answers that the upload left nothing: mirrored right, the run is
    synced from its folder under the right copy's lease, and from the bucket too, once."""
    outputs = tmp_path / "node" / "outputs"
    builder = build_run(outputs / "first-mirror-failed", "first-mirror-failed", 3)
    # Listed as empty (no such folder), but nothing can be made there, root or not (Linux's /proc).
    wrong = mirror_once(outputs, f"file:///proc/prime-runs-mistyped-{tmp_path.name}/outputs")
    assert wrong.returncode == 1 and "cannot upload" in wrong.stdout + wrong.stderr, wrong.stdout + wrong.stderr
    note = builder.run_dir / "spool" / "mirror.json"
    assert not note.exists(), note.read_text()
    right = mirror_once(outputs, f"{bucket}/node")
    assert right.returncode == 0, right.stdout + right.stderr
    assert json.loads(note.read_text())["run_url"] == f"{bucket}/node/first-mirror-failed"
    folder = sync_from_store(server.base_url, tmp_path / "eval-machine", str(builder.run_dir), "--json")
    assert folder.returncode == 0, folder.stdout + folder.stderr
    assert [(r["state"], r["pushed_now"]) for r in json.loads(folder.stdout)["runs"]] == [("synced", 3)]
    store = sync_from_store(server.base_url, tmp_path / "sync-machine", bucket, "--json")
    assert store.returncode == 0, store.stdout + store.stderr
    assert [r["pushed_now"] for r in json.loads(store.stdout)["runs"]] == [0]
    assert_exactly_once(api, builder)
