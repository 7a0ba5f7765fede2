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
