"""A no-op re-sync of eval outputs written without a spool (plain vf-eval's ``traces.jsonl``,
the older ``metadata.json`` + ``results.jsonl``) costs what one of a spool the eval wrote
does: ``stat`` calls. No file of the outputs is opened, and nothing is asked of the platform,
not even whether the key is good: it succeeds with the platform gone (importer/unchanged.py).
While a source's files change, it is read again: a row added is imported and pushed.

Real outputs (fixtures/eval_outputs), real ``prime-runs sync`` processes against a platform
process over HTTP, beside the outputs and with ``--state-dir``; what the last sync opens is
counted by Python's audit hook in that process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from support.env import CLI, REPO_ROOT, child_env
from support.platform_process import running

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"
TOKEN = "unchanged-token-not-a-secret"
#: sync/unchanged.py keeps no answer resting on a file changed less than this ago.
SETTLE = 2.2

#: ``prime-runs sync`` with Python's audit hook: every file opened under the folders
#: ``argv[1]`` names (os.pathsep between them) and every connection begun, printed on
#: stderr's last line as JSON.
COUNTED_SYNC = """
import json, os, sys
watched, opened = tuple(sys.argv[1].split(os.pathsep)), []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and os.fsdecode(args[0]).startswith(watched):
        opened.append(os.fsdecode(args[0]))
    elif event == "socket.connect":
        opened.append("connect " + repr(args[1]))
sys.addaudithook(hook)
import atexit
atexit.register(lambda: sys.stderr.write("\\n" + json.dumps(opened) + "\\n"))
from commands.cli import main
sys.argv = ["prime-runs", "sync", *sys.argv[2:]]
main()
"""


def counted_sync(watched: list[Path], home: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = subprocess.run([sys.executable, "-c", COUNTED_SYNC, os.pathsep.join(map(str, watched)), *args],
                          capture_output=True,
                          text=True, timeout=120, env=sync_env(home))
    return done, json.loads(done.stderr.strip().splitlines()[-1])


def sync_env(home: Path) -> dict[str, str]:
    return child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))


def synced(base_url: str, home: Path, *args: str) -> dict:
    done = subprocess.run(CLI + ["sync", *args, "--base-url", base_url, "--json"], capture_output=True, text=True,
                          timeout=120, env=sync_env(home))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow  # sync processes against platform processes, 2 s for the files to settle
@pytest.mark.parametrize("state_dir", [False, True], ids=["beside", "state-dir"])
def test_a_no_op_resync_of_plain_outputs_opens_none_of_them_and_asks_nothing(tmp_path: Path,
                                                                             state_dir: bool) -> None:
    outputs, home = tmp_path / "outputs", tmp_path / "home"
    for name in ("vf040-completed", "v0-completed"):
        shutil.copytree(EVAL_OUTPUTS / name, outputs / name, symlinks=True)
    flags = ["--state-dir", str(tmp_path / "state")] if state_dir else []
    watched = [outputs, tmp_path / "state"]  # the outputs, and the spools imported under the state dir
    with running(tmp_path / "platform.db", "--token", TOKEN) as server:
        base_url = server.base_url
        first = synced(base_url, home, str(outputs), *flags)
        assert sorted(r["state"] for r in first["imports"]) == ["imported", "imported"], first
        time.sleep(SETTLE)
        second = synced(base_url, home, str(outputs), *flags)  # found up to date: the answers are kept
        assert sorted(r["state"] for r in second["imports"]) == ["up_to_date", "up_to_date"], second
        assert [r["pushed_now"] for r in second["runs"]] == [0, 0], second
        evaluations = sorted(r["evaluation_id"] for r in second["runs"])

    done, opened = counted_sync(watched, home, str(outputs), *flags, "--base-url", base_url, "--json")
    assert opened == [], opened  # no file of the outputs or their spools, no connection
    assert done.returncode == 0, done.stdout + done.stderr  # the platform is gone: nothing was asked of it
    report = json.loads(done.stdout)
    assert report["imports"] == [], report
    assert [r["state"] for r in report["runs"]] == ["up_to_date", "up_to_date"], report
    assert sorted(r["evaluation_id"] for r in report["runs"]) == evaluations

    # A row added to traces.jsonl: the source is read again, and the row pushed.
    traces = outputs / "vf040-completed" / "traces.jsonl"
    row = json.loads(traces.read_text().splitlines()[0])
    row["id"] = uuid.uuid4().hex
    with open(traces, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    port = urlsplit(base_url).port
    with running(tmp_path / "platform.db", "--token", TOKEN, "--port", str(port)) as server:
        assert server.base_url == base_url
        done, opened = counted_sync(watched, home, str(outputs), *flags, "--base-url", base_url, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        [appended] = report["imports"]
        assert (appended["state"], appended["episodes_added"]) == ("appended", 1), appended
        assert sorted(r["pushed_now"] for r in report["runs"]) == [0, 1], report
        assert str(traces) in opened


def _change(output_dir: Path, spool_dir: Path, change: str) -> None:
    if change == "log-grows":  # the eval's log gains a line (how it ended is read there)
        [log] = (output_dir / "logs").glob("attempt_*/eval.log")
        with open(log, "a") as handle:
            handle.write("INFO one more line\n")
    elif change == "traces-renamed-over":  # a --resume writes a new file and renames it in
        traces = output_dir / "traces.jsonl"
        other = traces.with_name("traces.jsonl.new")
        other.write_bytes(traces.read_bytes())
        os.replace(other, traces)
    elif change == "attempt-added":  # a new attempt's folder in logs/
        (output_dir / "logs" / "attempt_2").mkdir()
    elif change == "segment-cut":  # the imported spool's segment cut short
        [segment] = spool_dir.glob("seg-*.jsonl")
        os.truncate(segment, segment.stat().st_size // 2)
    elif change == "spool-removed":
        shutil.rmtree(spool_dir.parent)


@pytest.mark.parametrize("change", ["log-grows", "traces-renamed-over", "attempt-added", "segment-cut",
                                    "spool-removed"])
def test_a_kept_answer_holds_only_while_the_outputs_and_their_spool_stay_as_they_were(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    from prime_runs_spool.importer import unchanged
    from prime_runs_spool.importer.outputs import UP_TO_DATE, import_paths
    from prime_runs_spool.importer.places import to_refresh
    from prime_runs_spool.sync import unchanged as sync_unchanged

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sync_unchanged, "SETTLED", 0.0)
    monkeypatch.setattr(unchanged, "_loaded", None)
    outputs, state = tmp_path / "outputs", tmp_path / "state"
    shutil.copytree(EVAL_OUTPUTS / "vf040-completed", outputs / "run", symlinks=True)
    [first] = import_paths([outputs], state_dir=state, refresh_only=True)
    time.sleep(0.05)
    [again] = import_paths([outputs], state_dir=state, refresh_only=True)  # up to date: kept
    assert again.state == UP_TO_DATE, again
    monkeypatch.setattr(unchanged, "_loaded", None)  # the next process reads the cache back
    assert to_refresh([outputs], state) == []
    time.sleep(0.05)
    _change(outputs / "run", Path(first.run_dir) / "spool", change)
    monkeypatch.setattr(unchanged, "_loaded", None)
    assert to_refresh([outputs], state) == [outputs / "run"]
