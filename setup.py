"""The packages, for setuptools (everything else is in pyproject.toml).

The command line's folder is commands/ in the repository and installs as the package
``prime_runs_spool_cli``: a top-level package named ``commands`` would collide with any
other distribution that ships one. Its modules import each other relatively, so they run
under either name (``python -m commands`` from a checkout, as the tests do). The library's
packages are found, so a new subpackage is never left out of the wheel. The docs' pages go
with the command line as ``prime_runs_spool_cli/docs`` (its package-data: pyproject.toml), so
the link every ``--help`` ends with opens wherever the wheel is installed
(commands/doc_links.py).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["prime_runs_spool", "prime_runs_spool.*"]), "prime_runs_spool_cli",
              "prime_runs_spool_cli.docs"],
    package_dir={"prime_runs_spool_cli": "commands", "prime_runs_spool_cli.docs": "docs"},
)
