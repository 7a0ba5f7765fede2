"""The console script exists and answers --version and --help without a traceback."""

import subprocess
from conftest import CLI, child_env

from prime_runs_spool import __version__


def test_version_flag_prints_package_version():
    out = subprocess.run(
        CLI + ["--version"],
        capture_output=True, text=True, check=True, env=child_env(),
    )
    assert __version__ in out.stdout
