"""Shared pieces of the sync benchmarks: spools, a platform subprocess, a client, stats.

Not a benchmark itself. Every scratch folder is made under ``--dir`` (default: the
repository's parent directory's disk, never /tmp, which may be a tmpfs) and removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fixtures.episodes import make_episode  # noqa: E402
from prime_runs_spool.platform_api.client import PlatformClient  # noqa: E402
from prime_runs_spool.content.episodes import RolloutCounter  # noqa: E402
from prime_runs_spool.content.mask_locations import MASKING_VERSION  # noqa: E402
from prime_runs_spool.content.masking import MaskRules, mask  # noqa: E402
from prime_runs_spool.spool.layout import list_segments  # noqa: E402
from prime_runs_spool.platform_api.settings import Secret, Settings  # noqa: E402
from prime_runs_spool.content.summary import SummaryAccumulator  # noqa: E402
from prime_runs_spool.sync.state import Destination, destination_key  # noqa: E402
from prime_runs_spool.spool.writer import SegmentWriter  # noqa: E402

PYTHON = sys.executable
API_KEY = "bench-key"


def arguments(doc: str | None, *, repeat: int, quick: str) -> argparse.ArgumentParser:
    """The options every sync benchmark takes; each script adds its own and its --quick."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=20_000, help="bytes per episode, about")
    parser.add_argument("--repeat", type=int, default=repeat)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--dir", default=None, help="scratch folder parent (a real disk, not tmpfs)")
    return parser


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PRIME_API_KEY"] = API_KEY
    env.pop("PRIME_TEAM_ID", None)
    return env


@contextmanager
def scratch(base: str | None, prefix: str) -> Iterator[Path]:
    """A scratch folder on a real disk (``base``, default the repository's folder)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base or str(ROOT)))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_run(run_dir: Path, run_id: str, episodes: int, size: int, *, group: int = 500) -> int:
    """One sealed run of ``episodes`` episodes of about ``size`` bytes; returns its bytes on disk.

    Written as the runner writes (rollout numbers stamped, a summary in the seal), in
    groups of ``group`` records per ``append_many`` (one fdatasync per group).
    """
    counter = RolloutCounter()
    summary = SummaryAccumulator()
    writer = SegmentWriter.create(run_dir, run_id)
    # What open_run writes: a manifest of today's masking version, episodes masked at append
    # (so sync passes them through as it does a real spool's, content/remask.py).
    writer.append("manifest", {"run_id": run_id, "name": f"bench-{run_id}", "environments": ["gsm8k"],
                               "model": "Qwen/Qwen3-8B", "framework": "verifiers",
                               "masking_version": MASKING_VERSION, "config": {"model": "Qwen/Qwen3-8B"}})
    rules = MaskRules.defaults_for_episode()
    done = 0
    while done < episodes:
        items = []
        for number in range(done, min(episodes, done + group)):
            episode = mask(make_episode(number, size=size, run_id=run_id, salt=run_id), rules)
            summary.add(episode)
            items.append(("episode", episode, {"episode_id": episode["id"],
                                               "rollout_number": counter.next_number(episode)}))
        writer.append_many(items)
        done += len(items)
    writer.seal("completed", summary=summary.result())
    return sum(path.stat().st_size for _, path in list_segments(run_dir))


def write_tree(root: Path, runs: int, total_bytes: int, size: int) -> tuple[int, int]:
    """``runs`` runs holding about ``total_bytes`` together; returns (episodes, bytes)."""
    per_run = max(1, total_bytes // runs // (size + 400))
    written = 0
    for number in range(runs):
        written += write_run(root / f"run-{number:03d}", f"bench-{number:03d}-{uuid.uuid4().hex[:8]}",
                             per_run, size)
    return per_run * runs, written


@dataclass
class Platform:
    proc: subprocess.Popen[str]
    base_url: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def platform(db: Path, *extra: str, checkout: Path = ROOT) -> Iterator[Platform]:
    """``prime-runs platform serve`` in its own process (its own GIL) on ``db`` (``extra``:
    more options, e.g. ``--traces``; ``checkout``: the source tree whose platform runs)."""
    env = child_env()
    env["PYTHONPATH"] = str(checkout) + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.Popen([PYTHON, "-m", "commands", "platform", "serve", "--db", str(db), "--port", "0", *extra],
                            cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not box or not box[0]:
        proc.kill()
        raise RuntimeError(f"the platform did not start: {proc.stderr.read()}")
    server = Platform(proc, box[0].strip())
    try:
        yield server
    finally:
        server.stop()


def client_for(base_url: str) -> tuple[PlatformClient, Destination]:
    settings = Settings(base_url=base_url, api_key=Secret(API_KEY), team_id=None, frontend_url=base_url)
    identity = f"{base_url}|"
    return PlatformClient(settings), Destination(key=destination_key(identity), base_url=base_url)


def cli_sync(tree: Path, base_url: str, *extra: str, checkout: Path = ROOT) -> tuple[float, dict]:
    """``prime-runs sync TREE --json`` as a fresh process: its wall time and its report.
    ``checkout``: the source tree whose command runs (another revision's ``git worktree``)."""
    env = child_env()
    env["PYTHONPATH"] = str(checkout) + os.pathsep + env["PYTHONPATH"]
    start = now()
    proc = subprocess.run([PYTHON, "-m", "commands", "sync", str(tree), "--base-url", base_url, "--json", *extra],
                          cwd=checkout, env=env, capture_output=True, text=True)
    elapsed = now() - start
    if proc.returncode != 0:
        raise SystemExit(f"sync exited {proc.returncode}: {proc.stderr or proc.stdout[-2000:]}")
    return elapsed, json.loads(proc.stdout)


def drop_state(root: Path) -> None:
    """Forget every sync state below ``root``, so that the next sync starts as the first
    does: its state folder, and the sync lock a first sync makes (a turn that found the
    one the turn before it made paid for no file's creation, 0.3 ms of CPU a run), gone;
    each segment's times touched, so that the fsync a pass gives a dead writer's segment
    commits them as it does after the runner wrote it (once a turn fsync'd them, the next
    found nothing to commit)."""
    for folder in root.glob("**/spool/sync"):
        shutil.rmtree(folder)
    for lock in root.glob("**/spool/sync.lock"):
        lock.unlink()
    for segment in root.glob("**/spool/seg-*.jsonl"):
        os.utime(segment)


def spread(values: list[float]) -> str:
    """``median (min-max)`` of some figures."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.3f}"
    return f"{med:.3f} ({min(values):.3f}-{max(values):.3f})"


def human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{nbytes:.0f} B"
        nbytes /= 1024
    return f"{nbytes:.1f} GB"


def now() -> float:
    return time.perf_counter()
