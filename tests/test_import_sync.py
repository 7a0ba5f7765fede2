"""``sync``, ``status`` and ``verify`` over eval outputs that have no spool: sync imports them
first (unless ``--no-import``), the others list them as "not spooled" with the fix, and a
path with nothing at all under it is a failure (exit 1) unless ``--allow-empty``."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, REPO_ROOT, child_env

EVAL_OUTPUTS = REPO_ROOT / "fixtures" / "eval_outputs"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, env=child_env())


def tree(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "artifact"
    for name in names:
        shutil.copytree(EVAL_OUTPUTS / name, root / name, symlinks=True)
    return root


@pytest.mark.slow
def test_sync_imports_unspooled_outputs_first_one_line_each(tmp_path: Path) -> None:
    root = tree(tmp_path, "vf040-completed", "v0-completed")
    db = tmp_path / "p.db"
    done = cli("sync", str(root), "--local", "--db", str(db))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("imported ") for line in lines) == 2
    assert sum(line.startswith("synced ") for line in lines) == 2
    again = cli("sync", str(root), "--local", "--db", str(db), "--json")
    report = json.loads(again.stdout)
    assert again.returncode == 0 and report["ok"] is True
    assert sorted((Path(r["source"]).name, r["state"]) for r in report["imports"]) == [
        ("v0-completed", "up_to_date"), ("vf040-completed", "up_to_date")]
    assert [r["pushed_now"] for r in report["runs"]] == [0, 0]


@pytest.mark.slow
def test_sync_no_import_says_which_runs_it_left_out(tmp_path: Path) -> None:
    root = tree(tmp_path, "vf040-completed")
    done = cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"), "--no-import")
    assert done.returncode == 0, done.stderr
    assert f"not spooled {root / 'vf040-completed'}: not imported (run: prime-runs import" in done.stdout
    assert not (root / "vf040-completed" / "spool").exists()
    as_json = json.loads(cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"), "--no-import",
                             "--json").stdout)
    assert as_json["not_imported"] == [str(root / "vf040-completed")] and as_json["imports"] == []


@pytest.mark.slow
def test_status_and_verify_list_not_spooled_runs_with_the_fix(tmp_path: Path) -> None:
    root = tree(tmp_path, "vf040-completed")
    fix = f"prime-runs import {root / 'vf040-completed'}"
    status = cli("status", str(root))
    assert status.returncode == 0 and "not spooled" in status.stdout and fix in status.stdout
    verify = cli("verify", str(root))
    assert verify.returncode == 0 and "not spooled" in verify.stdout and fix in verify.stdout
    document = json.loads(cli("status", str(root), "--json").stdout)
    assert document["not_spooled"] == [{"path": str(root / "vf040-completed"), "fix": fix}]
    assert cli("import", str(root)).returncode == 0
    assert "not spooled" not in cli("status", str(root)).stdout


@pytest.mark.slow
def test_nothing_found_is_not_success(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "some" / "folder").mkdir(parents=True)
    for command in (["sync", "--local", "--db", str(tmp_path / "p.db")], ["status"], ["verify"]):
        done = cli(command[0], str(empty), *command[1:])
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "nothing found: neither a spool nor eval outputs" in done.stderr and "Traceback" not in done.stderr
        allowed = cli(command[0], str(empty), *command[1:], "--allow-empty")
        assert allowed.returncode == 0, (command, allowed.stderr)


@pytest.mark.slow
def test_sync_picks_up_episodes_appended_since_an_earlier_import(tmp_path: Path) -> None:
    root = tree(tmp_path, "vf040-completed")
    traces = root / "vf040-completed" / "traces.jsonl"
    lines = traces.read_bytes().splitlines(keepends=True)
    traces.write_bytes(b"".join(lines[:3]))
    db = tmp_path / "p.db"
    first = json.loads(cli("sync", str(root), "--local", "--db", str(db), "--json").stdout)
    assert [r["pushed_now"] for r in first["runs"]] == [3]
    with open(traces, "ab") as handle:
        handle.write(lines[3])
    second = json.loads(cli("sync", str(root), "--local", "--db", str(db), "--json").stdout)
    assert [(r["state"], r["episodes_added"]) for r in second["imports"]] == [("appended", 1)]
    assert [(r["state"], r["pushed_now"], r["pushed_total"]) for r in second["runs"]] == [("synced", 1, 4)]


@pytest.mark.slow
def test_outputs_without_any_episode_are_nothing_to_sync(tmp_path: Path) -> None:
    root = tree(tmp_path, "vf040-completed")
    (root / "vf040-completed" / "traces.jsonl").write_bytes(b"")  # died before its first rollout
    done = cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"))
    assert done.returncode == 1 and "nothing to sync" in done.stderr
    assert "no episode in the outputs yet" in done.stdout
    assert cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"), "--allow-empty").returncode == 0


@pytest.mark.slow
def test_a_spool_the_eval_wrote_itself_is_caught_up_with_its_traces_before_sync(tmp_path: Path) -> None:
    """The live path spooled 2 of the 4 episodes verifiers wrote (plain vf-eval continued
    the run): sync spools the other 2 into the eval's own spool first, then ships all 4;
    the next sync reads neither file again (the agreement mark) and pushes nothing."""
    from prime_runs_spool import open_run, read_run

    root = tree(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    episodes = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    with open_run(run_dir, name="live", run_id=episodes[0]["run"]["id"]) as run:
        run.log_episodes(episodes[:2])  # the live path spooled only these
    assert "2 episodes the spool lacks" in cli("status", str(root)).stdout
    done = cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(r["state"], r["episodes_added"]) for r in report["imports"]] == [("appended", len(episodes) - 2)]
    assert [r["pushed_now"] for r in report["runs"]] == [len(episodes)]
    assert read_run(run_dir).episodes_count == len(episodes)
    again = json.loads(cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"), "--json").stdout)
    assert again["imports"] == [] and [r["pushed_now"] for r in again["runs"]] == [0]
    status = cli("status", str(root)).stdout
    assert "not spooled" not in status and "DISAGREES" not in status


@pytest.mark.slow
def test_sync_says_nothing_of_an_eval_spool_that_agrees_with_its_traces(tmp_path: Path) -> None:
    """Every first sync after ``prime-runs eval`` printed "spooled ...: the eval wrote its own
    spool here; prime-runs sync ships it" above the run's own line: a hint to run the command
    being run, for nothing imported. ``import`` still says it (it is the answer there)."""
    from prime_runs_spool import open_run

    root = tree(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    episodes = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    with open_run(run_dir, name="live", run_id=episodes[0]["run"]["id"]) as run:
        run.log_episodes(episodes)  # the live path spooled every one
    done = cli("sync", str(root), "--local", "--db", str(tmp_path / "p.db"))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("synced ") and f"pushed {len(episodes)} " in lines[0], done.stdout
    assert "spooled" not in done.stdout and "prime-runs sync ships it" not in done.stdout, done.stdout
    assert cli("import", str(root)).stdout.startswith("spooled ")


@pytest.mark.slow
def test_a_re_sync_prints_one_line_a_run_whatever_the_import_found_in_its_cache(tmp_path: Path) -> None:
    """The first re-sync after an import printed the import's 'up_to_date ...: 0 episodes
    added' above the run's own up_to_date line, and the ones after it (answered from the
    import's stat cache) did not: the same re-sync printed two lines a run, then one. An
    import that added nothing and has nothing to say is not printed, as sync prints no
    'spooled' line; --json still lists it."""
    root = tree(tmp_path, "vf040-completed")
    db = tmp_path / "p.db"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}

    def sync(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(CLI + ["sync", str(root), "--local", "--db", str(db), *args], capture_output=True,
                              text=True, timeout=120, env=child_env(**env))

    assert sync().returncode == 0
    for _ in range(2):
        again = sync()
        assert again.returncode == 0, again.stdout + again.stderr
        [line] = [line for line in again.stdout.splitlines() if not line.startswith("browse with: ")]
        assert line.startswith(f"up_to_date {root / 'vf040-completed'}  evaluation "), again.stdout
    assert [r["state"] for r in json.loads(sync("--json").stdout)["imports"]] in ([], ["up_to_date"])


@pytest.mark.slow
def test_a_damaged_line_in_an_imported_spool_is_syncs_to_report_not_an_import_failure(tmp_path: Path) -> None:
    """An imported spool with a damaged line (not a cut): the import cannot compare it with
    its source, and says so, as for a spool the eval wrote; the damage is sync's to report
    (``corrupt``, one line) or, with ``--skip-corrupt``, to pass over. It was an import
    error besides, so ``sync --skip-corrupt`` that shipped the run whole still exited 1."""
    root = tree(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    assert cli("import", str(root)).returncode == 0
    segment = run_dir / "spool" / "seg-000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    offset = sum(len(line) + 1 for line in lines[:3])  # header, manifest, the first episode
    damaged = bytearray(segment.read_bytes())
    damaged[offset + len(lines[3]) // 2] ^= 0x01
    segment.write_bytes(bytes(damaged))

    again = cli("import", str(root))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "the spool is damaged, so it was not compared with" in again.stdout, again.stdout
    db = tmp_path / "p.db"
    stopped = cli("sync", str(root), "--local", "--db", str(db))
    assert stopped.returncode == 1
    assert [line.split()[0] for line in stopped.stdout.splitlines() if not line.startswith(" ")][:1] == ["corrupt"]
    assert "could not be imported" not in stopped.stderr and "error " not in stopped.stdout, stopped.stdout
    passed = cli("sync", str(root), "--local", "--db", str(db), "--skip-corrupt", "--json")
    report = json.loads(passed.stdout)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert [r["state"] for r in report["runs"]] == ["synced"] and report["ok"] is True
    assert [r["state"] for r in report["imports"] if r["state"] == "error"] == []


def many_episodes(run_dir: Path, count: int) -> None:
    """``run_dir``: the completed vf040 outputs with ``count`` episodes in ``traces.jsonl``
    (the fixture's four, again and again, each under an id of its own)."""
    lines = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    with open(run_dir / "traces.jsonl", "w") as handle:
        for number in range(count):
            row = dict(lines[number % len(lines)])
            row["id"] = f"{number:032x}"
            handle.write(json.dumps(row) + "\n")


#: Episodes in the ``traces.jsonl`` a signal stops the import of: seconds of work, so that
#: the signal meets the import part way.
MANY = 15_000


def interrupted_while_importing(tmp_path: Path, command: str, *options: str
                                ) -> tuple[Path, Path, subprocess.CompletedProcess[str], float]:
    """``prime-runs COMMAND ARTIFACT OPTIONS...`` started on the vf040 outputs holding MANY
    episodes, and sent SIGINT once the import has spooled 100 kB of them: the artifact, the
    run's folder, the command's outcome and the seconds from the signal to its exit."""
    import signal
    import time

    root = tree(tmp_path, "vf040-completed")
    run_dir = root / "vf040-completed"
    many_episodes(run_dir, MANY)
    started = subprocess.Popen(CLI + [command, str(root), *options], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=child_env())
    segment = run_dir / "spool" / "seg-000001.jsonl"
    deadline = time.monotonic() + 120
    while not (segment.exists() and segment.stat().st_size > 100_000):
        assert started.poll() is None and time.monotonic() < deadline, started.communicate()
        time.sleep(0.01)
    started.send_signal(signal.SIGINT)
    asked = time.monotonic()
    out, err = started.communicate(timeout=120)
    took = time.monotonic() - asked
    return root, run_dir, subprocess.CompletedProcess(started.args, started.returncode, out, err), took


@pytest.mark.slow
def test_a_signal_during_syncs_import_step_stops_it_within_seconds_and_the_next_sync_finishes(tmp_path: Path) -> None:
    """SIGINT while sync imports a large ``traces.jsonl``: the import went on to its end
    (seconds to minutes) before the command stopped. It stops at its next batch now, exit
    130 with the interrupted line, and the next sync imports the rest and ships each episode
    once."""
    from prime_runs_spool import read_run
    from prime_runs_spool.local_platform.store import Store

    db = tmp_path / "p.db"
    root, run_dir, sync, took = interrupted_while_importing(tmp_path, "sync", "--local", "--db", str(db))
    err = sync.stderr
    assert sync.returncode == 130, err
    assert took < 3.0, f"{took:.1f} s from SIGINT to exit"
    assert err.strip().splitlines()[-1].startswith("prime-runs: interrupted: "), err
    assert "Traceback" not in err
    assert read_run(run_dir).episodes_count < MANY  # stopped part way
    again = cli("sync", str(root), "--local", "--db", str(db), "--json")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr
    [run] = json.loads(again.stdout)["runs"]
    assert (run["state"], run["pushed_total"]) == ("synced", MANY)
    store = Store(db)
    try:
        [evaluation], _ = store.list_evaluations(skip=0, limit=10)
        bodies, _ = store.list_samples(evaluation["evaluation_id"], offset=0, limit=2 * MANY)
    finally:
        store.close()
    ids = [json.loads(body)["sample_id"] for body in bodies]
    assert len(ids) == len(set(ids)) == MANY


@pytest.mark.slow
def test_a_signal_stops_prime_runs_import_at_its_next_batch_with_exit_130(tmp_path: Path) -> None:
    """Ctrl-C of ``prime-runs import``: click's ``Aborted!`` and exit 1, the spool left
    unsealed. Now: the spool sealed ``cancelled`` at the batch, the run's line, one line
    saying what is left, exit 130; the next import appends the rest, sealed as the source."""
    from prime_runs_spool import read_run

    root, run_dir, started, took = interrupted_while_importing(tmp_path, "import")
    out, err = started.stdout, started.stderr
    assert started.returncode == 130, out + err
    assert took < 3.0
    assert out.startswith(f"interrupted {run_dir}: stopped by a signal part way"), out
    assert err.strip().splitlines()[-1] == ("prime-runs: interrupted: 0 runs done, the rest left; run the same "
                                            "prime-runs import again to carry on"), err
    stopped = read_run(run_dir)
    assert stopped.status == "cancelled" and stopped.episodes_count < MANY
    again = cli("import", str(root))
    assert again.returncode == 0 and again.stdout.startswith("appended "), again.stdout + again.stderr
    finished = read_run(run_dir)
    assert (finished.status, finished.episodes_count) == ("completed", MANY)
