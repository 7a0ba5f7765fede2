"""Hostile review, kept as regression tests: the local platform's dashboard for runs synced --to traces (viewer/index.py
PlatformIndex, local_platform/traces.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from fixtures.episodes import make_episode
from prime_runs_spool.content.masking import MASKING_VERSION
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.spool.writer import SegmentWriter
from support.env import CLI, child_env
from test_secrets_travel_e2e import LEAKED, leaky_seat


def foreign_spool(run_dir: Path, run_id: str) -> None:
    """A spool from a foreign producer that records today's masking_version but missed
    the trace-config locations (docs/masking.md: 'a spool from an older or foreign
    producer that missed a location still never puts a credential on the screen')."""
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", {"run_id": run_id, "name": "foreign", "environments": ["gsm8k"], "model": "m",
                               "framework": "verifiers", "config": {"model": "m"},
                               "masking_version": MASKING_VERSION})
    items = []
    for number in range(2):
        episode = make_episode(number, run_id=run_id)
        for trace in episode["traces"]:
            trace["agent"]["config"].update(leaky_seat())
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    writer.append_many(items)
    writer.seal("completed")


import pytest


@pytest.mark.parametrize("to", ["traces", "samples"])
def test_a_dashboard_episode_page_masks_what_the_producer_missed(tmp_path: Path, to: str) -> None:
    foreign_spool(tmp_path / "runs" / "foreign", "foreign")
    db = tmp_path / "p.db"
    result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--to", to,
                                   "--json"], capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    # the same spool viewed locally (prime-runs view) is masked on display: the dashboard must be too
    with EmbeddedPlatform(db, traces=True) as platform, httpx.Client(follow_redirects=True) as browser:
        page = browser.get(platform.base_url + "/dashboard/episode", params={"run": report["evaluation_id"], "n": 1})
        assert page.status_code == 200
        shown = [name for name, secret in LEAKED.items() if secret in page.text]
        assert not shown, f"the dashboard's episode page shows credentials in clear at: {shown}"
