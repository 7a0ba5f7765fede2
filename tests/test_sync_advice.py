"""Every command a sink refusal suggests works where it was printed: run as printed (its
options added to the refused command), it syncs the run rather than being refused the same way.

The real ``prime-runs sync --local --db`` (the embedded platform runs Prime Traces only for
``--to traces``, so there ``auto`` means samples), against one database."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import build_run


def suggested(error: str) -> list[list[str]]:
    """The options each command a refusal suggests adds to the refused one: ``--to X``, its
    ``(or auto)``, and ``--replay`` (with the ``--to`` it names, if any)."""
    found: list[list[str]] = []
    for replay, to, or_auto in re.findall(r"(--replay )?--to (\w+)( \(or auto\))?", error):
        found.append([*replay.split(), "--to", to])
        if or_auto:
            found.append([*replay.split(), "--to", "auto"])
    found += [["--replay"] for _ in re.finditer(r"--replay(?! --to)", error)]
    return found


class Local:
    """``prime-runs sync RUNS --local --db DB --json OPTIONS``, its one run's report and exit code."""

    def __init__(self, tmp_path: Path) -> None:
        self.runs, self.db, self.cache = tmp_path / "runs", tmp_path / "local.db", tmp_path / "cache"

    def __call__(self, *options: str) -> tuple[int, dict]:
        result = subprocess.run(CLI + ["sync", str(self.runs), "--local", "--db", str(self.db), "--json", *options],
                                capture_output=True, text=True, timeout=120,
                                env=child_env(XDG_CACHE_HOME=str(self.cache)))
        assert "Traceback" not in result.stderr, result.stderr
        (report,) = json.loads(result.stdout)["runs"]
        return result.returncode, report


@pytest.mark.slow
@pytest.mark.parametrize(("first", "refused_with"), [(("--to", "traces"), ()), ((), ("--to", "traces"))])
def test_each_command_a_local_refusal_suggests_syncs_the_run(tmp_path: Path, first: tuple[str, ...],
                                                             refused_with: tuple[str, ...]) -> None:
    """A run in traces synced with ``--local`` alone (auto: samples), and a run in samples
    synced with ``--local --to traces``: refused (exit 1, one line), and each suggestion,
    run as printed, exits 0 with the run synced (``--replay``: to a new evaluation)."""
    build_run(tmp_path / "runs" / "run", "advice", 3)
    local = Local(tmp_path)
    code, report = local(*first)
    assert (code, report["state"]) == (0, "synced"), report
    evaluation_id = report["evaluation_id"]
    code, refused = local(*refused_with)
    assert (code, refused["state"]) == (1, "error") and "\n" not in refused["error"], refused
    options = suggested(refused["error"])
    assert options and ["--replay"] in options, refused["error"]
    for option in options:
        code, done = local(*option)
        assert code == 0 and done["state"] in ("synced", "up_to_date"), (option, refused["error"], done)
        assert (done["evaluation_id"] != evaluation_id) == ("--replay" in option), (option, done)


def _sync_in_process(root: Path, db: Path, to: str, *, replay: bool = False):
    from prime_runs_spool.local_platform.server import EmbeddedPlatform
    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.sync.many import sync_paths
    from prime_runs_spool.sync.options import SyncOptions
    from prime_runs_spool.sync.state import local_destination
    from support.local_client import local_settings

    with EmbeddedPlatform(db, traces=True) as platform, PlatformClient(local_settings(platform), timeout=10) as client:
        (report,) = sync_paths([root], client, local_destination(db, None),
                               SyncOptions(to=to, replay=replay, traces_batch_bytes=1_500))
    return report


@pytest.mark.parametrize("committed", [0, 2])
def test_a_line_too_long_for_traces_is_told_a_samples_command_that_works(tmp_path: Path, monkeypatch,
                                                                         committed: int) -> None:
    """``--to traces`` meets an episode over Prime Traces' limit for one line. With nothing of
    the run there, ``--to samples`` (as advised) syncs it; with batches committed there, the
    advice is a replay to samples, and that syncs it as a new evaluation."""
    import prime_runs_spool.platform_api.traces as contract
    from support.runs import RunBuilder

    monkeypatch.setattr(contract, "MAX_LINE_BYTES", 4_000)  # 64 MiB in truth
    builder = RunBuilder(tmp_path / "runs" / "run", f"too-long-{committed}")
    builder.open_segment()
    if committed:
        builder.add(committed + 1, size=1_000)  # each batch closes before the next line: all but the last sent
    builder.add(1, size=6_000, traces=3)
    builder.seal()
    db = tmp_path / "p.db"
    refused = _sync_in_process(tmp_path / "runs", db, "traces")
    assert refused.state == "error" and "limit for one line" in refused.error, refused
    assert refused.pushed_total == committed, refused
    (option,) = [o for o in suggested(refused.error) if o != ["--to", "auto"]]
    assert option == (["--replay", "--to", "samples"] if committed else ["--to", "samples"]), refused.error
    done = _sync_in_process(tmp_path / "runs", db, "samples", replay="--replay" in option)
    assert (done.state, done.store) == ("synced", "samples"), (refused.error, done)
    assert (done.evaluation_id != refused.evaluation_id) == bool(committed)
    assert done.pushed_total == len(builder.ids)  # one row each, the long one included
