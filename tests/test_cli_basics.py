"""The console script exists and answers --version and --help without a traceback."""

import subprocess
import sys

from prime_runs_spool import __version__


def test_version_flag_prints_package_version():
    out = subprocess.run(
        [sys.executable, "-c", "from commands.cli import main; main()", "--version"],
        capture_output=True, text=True, check=True,
    )
    assert __version__ in out.stdout
