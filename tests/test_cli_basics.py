"""The console script exists and answers --version and --help without a traceback."""

import subprocess
from support.env import CLI, child_env

from prime_runs_spool import __version__


def test_version_flag_prints_package_version():
    out = subprocess.run(
        CLI + ["--version"],
        capture_output=True, text=True, check=True, env=child_env(),
    )
    assert __version__ in out.stdout


def test_progress_line_redraws_only_on_change_and_at_most_ten_times_a_second(capsys):
    from types import SimpleNamespace

    from commands.output import Progress

    now = [100.0]
    progress = Progress(enabled=True, clock=lambda: now[0])
    report = SimpleNamespace(path="run-a", pushed_now=0, bytes_sent=0)
    progress.update(report)
    progress.update(report)  # same text: no redraw
    report.pushed_now = 5
    now[0] += 0.05
    progress.update(report)  # changed, but too soon
    now[0] += 0.1
    progress.update(report)
    progress.close()
    drawn = [part for part in capsys.readouterr().err.split("\r") if part.strip()]
    assert [line.strip() for line in drawn] == [
        "syncing 1 run(s): 0 samples, 0.0 MB sent",
        "syncing 1 run(s): 5 samples, 0.0 MB sent",
    ]


#: What ``prime-runs --help`` must not import: the machinery behind the commands. Each costs
#: tens of milliseconds of start-up (benchmarks/startup.py), and --help uses none of it.
HEAVY_FOR_HELP = (
    "httpx", "pydantic", "starlette", "uvicorn", "jinja2", "verifiers", "prime_traces", "obstore",
    "prime_runs_spool.spool.reader", "prime_runs_spool.sync.state", "prime_runs_spool.sync.engine",
    "prime_runs_spool.runner.run", "prime_runs_spool.local_platform.app", "prime_runs_spool.viewer.app",
    "prime_runs_spool.viewer.index",
)


def test_help_imports_none_of_the_machinery_behind_the_commands():
    probe = ("import sys, json\n"
             "from click.testing import CliRunner\n"
             "from commands.cli import cli\n"
             "result = CliRunner().invoke(cli, ['--help'])\n"
             "assert result.exit_code == 0, result.output\n"
             f"print(json.dumps([m for m in {HEAVY_FOR_HELP!r} if m in sys.modules]))\n")
    done = subprocess.run([CLI[0], "-c", probe], capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"prime-runs --help imported {done.stdout.strip()}"
