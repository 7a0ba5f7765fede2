"""The command line is defined once and installed under the project's own name: the wheel
``pip`` builds from this checkout holds ``prime_runs_spool`` and ``prime_runs_spool_cli``
(the ``commands/`` folder) and no top-level ``commands`` package, which would collide with
any other distribution shipping one; and ``python -m prime_runs_spool.sync`` (what the online
shipper launches) takes ``prime-runs sync``'s own options."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.env import REPO_ROOT


@pytest.mark.slow
def test_the_wheel_installs_the_command_line_as_prime_runs_spool_cli_and_no_commands_package(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ in it
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("prime_runs_spool", "commands", "docs"):
        shutil.copytree(REPO_ROOT / name, source / name, ignore=ignore)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"prime_runs_spool", "prime_runs_spool_cli"}, tops
    expected = {f"prime_runs_spool/{p.relative_to(source / 'prime_runs_spool').as_posix()}"
                for p in (source / "prime_runs_spool").rglob("*.py")}
    expected |= {f"prime_runs_spool_cli/{p.name}" for p in (source / "commands").glob("*.py")}
    assert expected <= set(names), sorted(expected - set(names))  # no subpackage left out
    assert "prime_runs_spool/py.typed" in names
    pages = {p.name for p in (source / "docs").glob("*.md")}
    assert {f"prime_runs_spool_cli/docs/{page}" for page in pages} <= set(names)  # the help's link opens
    assert "prime_runs_spool_cli/docs/ci/sync-artifacts.sh" in names  # what prime-runs ci-script prints
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "prime-runs = prime_runs_spool_cli.entry:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    target = tmp_path / "installed"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    assert not (target / "commands").exists()
    # The installed command line runs under its own name (its modules import each other
    # relatively), from a folder that is not the checkout.
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    ran = subprocess.run([sys.executable, "-c", "import sys; from prime_runs_spool_cli.cli import cli; "
                          "import prime_runs_spool_cli, prime_runs_spool; "
                          "assert prime_runs_spool_cli.__file__.startswith(sys.argv[1]), prime_runs_spool_cli.__file__; "
                          "cli(['sync', '--help'])", str(target)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "--retry-for" in ran.stdout
    link = ran.stdout.rstrip().splitlines()[-1].strip()
    assert link == (target / "prime_runs_spool_cli" / "docs" / "cli.md").resolve().as_uri(), link
    script = subprocess.run([sys.executable, "-c", "from prime_runs_spool_cli.cli import cli; cli(['ci-script'])"],
                            capture_output=True, timeout=60, cwd=tmp_path, env=env)
    assert script.returncode == 0 and script.stdout == (REPO_ROOT / "docs" / "ci" / "sync-artifacts.sh").read_bytes()


def test_the_shippers_options_are_prime_runs_syncs_own() -> None:
    """``python -m prime_runs_spool.sync`` had restated them and drifted (``--jobs``
    unbounded there, 1..64 here)."""
    from commands.sync import sync
    from prime_runs_spool.sync.__main__ import main

    ours = {param.name: param for param in sync.params}
    theirs = {param.name: param for param in main.params if param.name != "paths"}  # ours also takes store URLs
    assert set(theirs) <= set(ours)
    for name, param in theirs.items():
        mine = ours[name]
        assert (param.opts, param.secondary_opts, param.default, param.envvar, param.hidden if hasattr(param, "hidden")
                else None, repr(param.type)) == \
            (mine.opts, mine.secondary_opts, mine.default, mine.envvar, mine.hidden if hasattr(mine, "hidden")
             else None, repr(mine.type)), name
    assert {"base_url", "team", "to", "jobs", "timeout", "retry_for", "follow", "exit_when_idle"} <= set(theirs)


def test_the_verifiers_extra_installs_the_releases_the_launcher_binds() -> None:
    """pyproject.toml's ``verifiers`` extra and the launcher's SUPPORTED_RANGE are one range:
    an extra wider than the launcher installs a verifiers that ``prime-runs eval`` refuses."""
    import tomllib

    from prime_runs_spool.runner.eval_help import SUPPORTED_RANGE

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["verifiers"] == [f"verifiers{SUPPORTED_RANGE}"]


def test_the_readmes_install_lines_work_from_a_clone() -> None:
    """The package is on no index: the README names what installs (the clone itself, with
    its extras), never ``prime-runs-spool[...]`` (prime-runs eval's own hint:
    tests/test_vf_eval_launcher.py)."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert "pip install 'prime-runs-spool" not in readme
    assert "pip install -e '.[verifiers]'" in readme and "pip install -e ." in readme


#: A pip line naming this package on an index, where it is not: it never resolves.
FROM_AN_INDEX = re.compile(r"""pip install\s+['"]?prime-runs-spool\b""")


def test_no_install_hint_names_the_package_on_an_index() -> None:
    """Every hint the code prints and every install line the docs give must work from a clone:
    export's Parquet hint, the store URLs' obstore hint and the CI recipe's install step said
    ``pip install 'prime-runs-spool[...]'``, which no index answers."""
    files = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md"), *(REPO_ROOT / "docs").rglob("*.sh"),
             *(REPO_ROOT / "prime_runs_spool").rglob("*.py"), *(REPO_ROOT / "commands").rglob("*.py")]
    found = [f"{path.relative_to(REPO_ROOT)}: {line.strip()}" for path in files
             for line in path.read_text().splitlines() if FROM_AN_INDEX.search(line)]
    assert not found, found
