"""Every command a sink refusal suggests works where it was printed: run as printed (its
options added to the refused command), it syncs the run rather than being refused the same way.

The real ``prime-runs sync --local --db`` (there ``auto`` means samples for a run with no
sink recorded, and follows the recorded one), against one database."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import RunBuilder


#: One option a refusal may suggest, with its value: a sink, or a replay id sync made up.
OPTION = r"--(?:to|replay-id|replay)(?: (?:traces|samples|auto|[0-9a-f]{32}))?"


def suggested(error: str) -> list[list[str]]:
    """The options of each command a refusal suggests (``--to X``, ``(or auto)`` after it,
    ``--replay`` with what follows it)."""
    found: list[list[str]] = []
    for match in re.finditer(rf"{OPTION}(?: {OPTION})*", error):
        words = match.group(0).split()
        found.append(words)
        if error[match.end():].startswith(" (or auto)"):
            found.append([*words[:-1], "auto"])
    return found


def as_printed(refused: tuple[str, ...], option: list[str]) -> list[str]:
    """The refused command's options with a suggestion's: its ``--to`` and ``--replay``
    taking the place of theirs."""
    base = list(refused)
    if "--to" in option and "--to" in base:
        del base[base.index("--to"):base.index("--to") + 2]
    if "--replay" in option and "--replay" in base:
        base.remove("--replay")
    return [*base, *option]


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
@pytest.mark.parametrize(("first", "refused_with"), [(("--to", "traces"), ("--to", "samples")),
                                                     ((), ("--to", "traces")),
                                                     (("--replay", "--to", "traces"), ("--replay", "--to", "samples"))])
def test_each_command_a_local_refusal_suggests_syncs_the_run(tmp_path: Path, first: tuple[str, ...],
                                                             refused_with: tuple[str, ...]) -> None:
    """A run in traces synced with ``--local --to samples``, a run in samples synced with
    ``--local --to traces``, and a live run's unfinished replay in traces continued with
    ``--local --replay --to samples``: refused (exit 1, one line), and each suggestion, run as printed,
    exits 0 with the run synced (or live), a new evaluation where it says so."""
    builder = RunBuilder(tmp_path / "runs" / "run", "advice")
    builder.open_segment()
    builder.add(3)
    live = "--replay" in first  # its replay stays unfinished: --replay alone continues it
    if not live:
        builder.seal()
    local = Local(tmp_path)
    code, report = local(*first)
    assert (code, report["state"]) == (0, "live" if live else "synced"), report
    evaluation_id = report["evaluation_id"]
    code, refused = local(*refused_with)
    assert (code, refused["state"]) == (1, "error") and "\n" not in refused["error"], refused
    options = suggested(refused["error"])
    assert options and any("--replay" in o for o in options), refused["error"]
    for option in options:
        code, done = local(*as_printed(refused_with, option))
        assert code == 0 and done["state"] in ("synced", "up_to_date", "live"), (option, refused["error"], done)
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
