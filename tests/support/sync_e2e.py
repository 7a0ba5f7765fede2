"""The pieces every end-to-end sync test shares: the local platform process (a module
fixture), the ``prime-runs sync`` command line with short timeouts, and the platform-side
checks of exactly once (one evaluation, each sample once, finalized once)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable

import httpx

from support import platform_process
from support.env import CLI, child_env
from support.runs import RunBuilder  # noqa: F401  (a type in the checks)

TOKEN = "e2e-token-not-a-secret"


# The platform refuses to commit a write more than 0.4 s after the request arrived, so the
# protocol's assumption (nothing lands later than the 1 s request lifetime) holds by
# construction, however loaded the machine.
server, api = platform_process.module_fixtures(TOKEN, "api", "--request-deadline", "0.4")


def sync_cmd(base_url: str, *args: str) -> list[str]:
    return CLI + ["sync", *args, "--base-url", base_url, "--request-lifetime", "1.0",
                  "--backoff-cap", "0.2", "--timeout", "5"]


def run_sync(base_url: str, *args: str, key: str = TOKEN, timeout: float = 120,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sync_cmd(base_url, *args), capture_output=True, text=True, timeout=timeout,
                          env=child_env(PRIME_API_KEY=key, HOME=os.environ.get("HOME", "/root"), **(extra_env or {})))


def evaluations_of(api: httpx.Client, local_run_id: str, environment: str = "gsm8k") -> list[dict]:
    found, skip = [], 0
    while True:
        page = api.get("/evaluations/", params={"environment_name": environment, "skip": skip, "limit": 100}).json()
        found += [e for e in page["evaluations"] if (e.get("metadata") or {}).get("local_run_id") == local_run_id]
        skip += len(page["evaluations"])
        if not page["evaluations"] or skip >= page["total"]:
            return found


def sample_ids(api: httpx.Client, evaluation_id: str) -> list[str]:
    ids, page = [], 1
    while True:
        body = api.get(f"/evaluations/{evaluation_id}/samples", params={"page": page, "limit": 100}).json()
        ids += [row["sample_id"] for row in body["samples"]]
        if not body["hasMore"]:
            return ids
        page += 1


def assert_exactly_once(api: httpx.Client, builder: RunBuilder, *, finalized: bool = True) -> dict:
    evaluations = evaluations_of(api, builder.run_id)
    assert len(evaluations) == 1, f"{len(evaluations)} evaluations for run {builder.run_id}"
    evaluation = api.get(f"/evaluations/{evaluations[0]['evaluation_id']}").json()
    assert sample_ids(api, evaluation["evaluation_id"]) == builder.ids
    assert evaluation["total_samples"] == len(builder.ids)
    assert evaluation["finalize_count"] == (1 if finalized else 0)
    return evaluation


def kill_on_progress(proc: subprocess.Popen[bytes], held: Callable[[], int], more: int,
                     patience: float = 60.0) -> bool:
    """SIGKILL ``proc`` once ``held()`` (what the platform holds of the run) is ``more`` beyond
    what it was when called (``more == 0``: as soon as it is seen running). False if the sync
    ended first.

    Killing on observed progress, not after a fixed sleep, is what keeps the SIGKILL tests
    independent of the machine's speed: every kill lands while the sync is mid-push, and each
    one consumes a bounded amount of the run, so there is always work left for the next."""
    target = held() + more
    deadline = time.monotonic() + patience
    while proc.poll() is None:
        if more == 0 or held() >= target:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        assert time.monotonic() < deadline, f"sync made no progress in {patience} s"
        time.sleep(0.005)
    return False


def kill_syncs_at_random(cmd: list[str], env: dict[str, str], held: Callable[[], int], kills: int,
                         rng: random.Random) -> None:
    """Start ``cmd`` again and again and SIGKILL it on progress (:func:`kill_on_progress`):
    one start in five during its start-up (state read, evaluation looked up or created),
    the others once ``held()`` grew by 1 to 12; until ``kills`` syncs were killed while
    running, in at most three times as many starts."""
    killed = started = 0
    while killed < kills and started < 3 * kills:
        started += 1
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.0, 0.3))
            killed += kill_on_progress(proc, held, 0)
        else:
            killed += kill_on_progress(proc, held, rng.randint(1, 12))
        proc.wait()
    assert killed >= kills, f"only {killed} of {started} syncs were still running when killed"
