"""A spool that travelled as a CI artifact through a tool that drops modes (a zip, unpacked
the way most unzip libraries and upload actions do: every file 0644, every folder 0755 under
a 022 umask) is private again after ``prime-runs sync``, which says so in one warning line;
one it may not change (read-only, with ``--state-dir``; or ``--dry-run``) is named with the
command that makes it private, and left byte for byte and mode for mode as it was; so is
one ``verify`` looks at. Each
episode still reaches the platform exactly once, from a second unpacking with no state and
another machine's cache too."""

from __future__ import annotations

import os
import stat
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.env import CLI, child_env
from support.runs import build_run
from support.sync_e2e import TOKEN, api, assert_exactly_once, server, sync_cmd  # noqa: F401

pytestmark = pytest.mark.slow  # several sync processes against the platform process


@pytest.fixture(autouse=True)
def ci_umask() -> Iterator[None]:
    """A CI runner's umask, which lets 0644 through for every file an unpacker creates."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def pack(outputs: Path, archive: Path) -> None:
    """``zip -r``: the members keep their paths; their modes are recorded, which the
    unpacker below ignores, as actions/download-artifact does."""
    with zipfile.ZipFile(archive, "w") as packed:
        for path in sorted(outputs.rglob("*")):
            packed.write(path, path.relative_to(outputs.parent))


def unpack(archive: Path, where: Path) -> Path:
    where.mkdir(parents=True)
    with zipfile.ZipFile(archive) as packed:
        packed.extractall(where)
    return where / "outputs"


def modes_under(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(path.relative_to(root)): (path.lstat().st_mode, path.read_bytes() if path.is_file() else b"")
            for path in sorted(root.rglob("*"))}


def open_to_others(root: Path) -> list[str]:
    return [str(path) for path in root.rglob("*") if path.lstat().st_mode & 0o077]


def ci_sync(base_url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A CI step: stdout and stderr piped, a home and a cache of its own (another machine's)."""
    home.mkdir(exist_ok=True)
    return subprocess.run(sync_cmd(base_url, *args), capture_output=True, text=True, timeout=120,
                          env=child_env(PRIME_API_KEY=TOKEN, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache")),
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def artifact(tmp_path: Path):
    builder = build_run(tmp_path / "eval-job" / "outputs" / "run-a", "ci-artifact-modes", 5)
    archive = tmp_path / "eval-outputs.zip"
    pack(tmp_path / "eval-job" / "outputs", archive)
    return builder, archive


def test_a_spool_unpacked_open_to_others_is_made_private_and_synced_once(tmp_path: Path, artifact, server,
                                                                         api) -> None:
    builder, archive = artifact
    outputs = unpack(archive, tmp_path / "sync-job-1")
    spool = outputs / "run-a" / "spool"
    assert open_to_others(spool), "the unpacker was to drop the modes"

    first = ci_sync(server.base_url, tmp_path / "home-1", str(outputs))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "of the spool were open to other users (e.g. spool/ 0755): made private" in first.stdout, first.stdout
    assert open_to_others(spool) == [] and stat.S_IMODE(spool.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in spool.rglob("*") if p.is_file())
    assert_exactly_once(api, builder)

    again = ci_sync(server.base_url, tmp_path / "home-1", str(outputs))
    assert again.returncode == 0 and "open to other users" not in again.stdout, again.stdout

    # The upload job re-run: the artifact unpacked afresh, on another machine (no cache).
    fresh = unpack(archive, tmp_path / "sync-job-2")
    rerun = ci_sync(server.base_url, tmp_path / "home-2", str(fresh))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "made private" in rerun.stdout and "pushed 0 (total 5)" in rerun.stdout, rerun.stdout
    assert_exactly_once(api, builder)


def test_a_spool_sync_may_not_change_is_named_with_the_command_and_left_as_it_is(tmp_path: Path, artifact, server,
                                                                                 api) -> None:
    builder, archive = artifact
    outputs = unpack(archive, tmp_path / "sync-job")
    spool = outputs / "run-a" / "spool"

    dry = ci_sync(server.base_url, tmp_path / "home", str(outputs), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"of the spool are open to other users (e.g. spool/ 0755); a spool holds what the eval saw: " \
           f"chmod -R go= {spool}" in dry.stdout, dry.stdout
    assert open_to_others(spool)
    verify = subprocess.run(CLI + ["verify", str(outputs)], capture_output=True, text=True, timeout=60,
                            env=child_env())
    assert verify.returncode == 0 and f"chmod -R go= {spool}" in verify.stdout, verify.stdout + verify.stderr
    assert open_to_others(spool)

    # Unpacked read-only (files 0444, folders 0555): its lock and state go to --state-dir.
    for path in [spool.parent, *spool.parent.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = modes_under(outputs)
    synced = ci_sync(server.base_url, tmp_path / "home", str(outputs), "--state-dir", str(tmp_path / "state"))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert f"chmod -R go= {spool}" in synced.stdout, synced.stdout
    assert modes_under(outputs) == before
    assert_exactly_once(api, builder)


def test_a_followed_spool_unpacked_open_to_others_is_made_private_and_synced_once(tmp_path: Path, artifact,
                                                                                  server, api) -> None:
    """``--follow`` makes a spool private through the one-shot's own rule, and says so once."""
    builder, archive = artifact
    outputs = unpack(archive, tmp_path / "sync-job")
    spool = outputs / "run-a" / "spool"
    assert open_to_others(spool), "the unpacker was to drop the modes"

    followed = ci_sync(server.base_url, tmp_path / "home", str(outputs), "--follow", "--exit-when-idle")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert followed.stdout.count("of the spool were open to other users (e.g. spool/ 0755): made private") == 1, \
        followed.stdout
    assert open_to_others(spool) == [] and stat.S_IMODE(spool.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in spool.rglob("*") if p.is_file())
    assert_exactly_once(api, builder)
