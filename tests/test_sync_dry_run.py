"""``prime-runs sync --dry-run`` reads and writes nothing to a run: a dry run over an artifact
or a colleague's outputs must leave them as they were, byte for byte, with no file added
(docs/sync.md, "Dry run"). The real command over real spools, one of them synced before
into the real local platform, so a dry run finds a state, a lock and more to push."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import RunBuilder, build_run

pytestmark = pytest.mark.slow  # three runs of the command line


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120,
                          env=child_env(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "data")))


def everything_under(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each file and folder under ``root``: its mode, its modification time and its bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        status = path.lstat()
        found[str(path.relative_to(root))] = (status.st_mode, status.st_mtime_ns,
                                              path.read_bytes() if path.is_file() else b"")
    return found


def test_a_dry_run_leaves_every_run_as_it_found_it(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    build_run(outputs / "sealed", "dry-run-sealed", 3)
    build_run(outputs / "crashed", "dry-run-crashed", 2, status=None)  # a dead writer's segment
    synced = RunBuilder(outputs / "synced", "dry-run-synced")
    synced.open_segment()
    synced.add(2)
    first = cli(tmp_path, "sync", str(outputs / "synced"), "--local")
    assert first.returncode == 0 and "pushed 2" in first.stdout, first.stdout + first.stderr
    synced.add(3)
    synced.seal()

    before = everything_under(outputs)
    dry = cli(tmp_path, "sync", str(outputs), "--local", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    lines = sorted(line for line in dry.stdout.splitlines() if not line.startswith("browse with:"))
    assert [line.split()[0] for line in lines] == ["dry_run"] * 3, lines
    assert "would push 3 (2 pushed before)" in lines[2] and lines[2].split()[1].endswith(f"{os.sep}synced"), lines
    assert everything_under(outputs) == before  # no lock, no state, no mode made private: nothing

    # What it counted is what a sync then pushes.
    real = cli(tmp_path, "sync", str(outputs / "synced"), "--local")
    assert real.returncode == 0 and "pushed 3 (total 5)" in real.stdout, real.stdout + real.stderr


def test_a_dry_run_counts_a_read_only_spool_without_a_state_dir(tmp_path: Path) -> None:
    """An artifact unpacked read-only (0555) needs ``--state-dir`` for a sync, which keeps its
    lock and state there; a dry run keeps nothing, so it counts the run from its own folder,
    reading the state a sync left beside it, and still writes nothing."""
    run = RunBuilder(tmp_path / "outputs" / "archived", "dry-run-read-only")
    run.open_segment()
    run.add(2)
    first = cli(tmp_path, "sync", str(run.run_dir), "--local")
    assert first.returncode == 0 and "pushed 2" in first.stdout, first.stdout + first.stderr
    run.add(4)
    run.seal()
    spool = run.run_dir / "spool"
    for folder in [spool, *(p for p in spool.rglob("*") if p.is_dir())]:
        folder.chmod(0o555)
    try:
        before = everything_under(run.run_dir)
        dry = cli(tmp_path, "sync", str(run.run_dir), "--local", "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "would push 4 (2 pushed before)" in dry.stdout, dry.stdout + dry.stderr
        assert everything_under(run.run_dir) == before
        plain = cli(tmp_path, "sync", str(run.run_dir), "--local")  # a real sync still asks for --state-dir
        assert plain.returncode == 1 and "--state-dir" in plain.stdout + plain.stderr, plain.stdout + plain.stderr
    finally:
        for folder in [spool, *(p for p in spool.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)


def test_a_dry_run_over_a_damaged_run_says_nothing_was_pushed(tmp_path: Path) -> None:
    """A damaged line in a run: the dry run's line said 'corrupt ... pushed 1 (total 0)' and
    'everything before it was pushed' while nothing was sent; it says what a sync would
    push, and the run is left as it was."""
    outputs = tmp_path / "outputs"
    build_run(outputs / "damaged", "dry-run-damaged", 3)
    segment = outputs / "damaged" / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    second = data.index(b'"episode"', data.index(b'"episode"') + 1)  # the second episode's line
    data[second + 100:second + 105] = b"XXXXX"
    segment.write_bytes(bytes(data))
    before = everything_under(outputs)
    dry = cli(tmp_path, "sync", str(outputs), "--local", "--dry-run")
    assert dry.returncode == 1, dry.stdout + dry.stderr
    (line, error) = [line for line in dry.stdout.splitlines() if not line.startswith("browse with:")][:2]
    assert line.split()[0] == "corrupt" and "would push 1 (0 pushed before)" in line, dry.stdout
    assert "pushed 1 (total" not in line and "was pushed" not in error, dry.stdout
    assert "everything before it would be pushed" in error, dry.stdout
    assert everything_under(outputs) == before
