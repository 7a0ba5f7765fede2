"""The console script exists and answers --version and --help without a traceback."""

import contextlib
import io
import json
import re
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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
        "syncing 1 run: 0 episodes, 0.0 MB sent",
        "syncing 1 run: 5 episodes, 0.0 MB sent",
    ]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["run-a", "run-b", "run-c"]), st.integers(0, 50), st.integers(0, 10**8)),
                min_size=1, max_size=30))
def test_the_progress_line_sums_each_runs_latest_counts(updates):
    """The totals are kept as reports change, not summed again at each update: whatever the
    order, and although a pass updates its one report in place, the line says the sum of
    each run's latest counts."""
    from types import SimpleNamespace

    from commands.output import Progress

    now = [0.0]
    progress = Progress(enabled=True, clock=lambda: now[0])
    reports: dict[str, SimpleNamespace] = {}
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        for path, pushed, sent in updates:
            report = reports.setdefault(path, SimpleNamespace(path=path, pushed_now=0, bytes_sent=0))
            report.pushed_now, report.bytes_sent = pushed, sent
            now[0] += 1.0  # past the redraw limit: each update draws what it sums
            progress.update(report)
    drawn = [part.strip() for part in err.getvalue().split("\r") if part.strip()]
    pushed = sum(r.pushed_now for r in reports.values())
    sent = sum(r.bytes_sent for r in reports.values())
    assert drawn[-1] == f"syncing {len(reports)} run{'s' * (len(reports) != 1)}: {pushed} episode{'s' * (pushed != 1)}, {sent / 1e6:.1f} MB sent"


@pytest.mark.slow
def test_a_malformed_base_url_is_a_usage_error_at_once(tmp_path):
    """Exit 2 with one line, not 85 s of retries (the old ``htp:/typo``) nor an internal
    error (the old ``http://[::1``); both entry points, the flag and the environment."""
    import sys

    run = tmp_path / "run"
    (run / "spool").mkdir(parents=True)
    (run / "spool" / "seg-000001.jsonl").write_bytes(b"")
    for bad in ("htp:/typo", "http://[::1"):
        for argv, extra in [(CLI + ["sync", str(tmp_path), "--base-url", bad], {}),
                            (CLI + ["sync", str(tmp_path)], {"PRIME_API_BASE_URL": bad}),
                            ([sys.executable, "-m", "prime_runs_spool.sync", str(tmp_path), "--base-url", bad], {})]:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                                  env=child_env(PRIME_API_KEY="k", HOME=str(tmp_path), **extra))
            assert done.returncode == 2, (argv, done.stdout, done.stderr)
            assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
            assert f"{bad!r} is not a usable URL" in done.stderr and "Traceback" not in done.stderr


#: What ``prime-runs --help`` must not import: the machinery behind the commands. Each costs
#: tens of milliseconds of start-up (benchmarks/startup.py), and --help uses none of it.
HEAVY_FOR_HELP = (
    "httpx", "pydantic", "starlette", "uvicorn", "jinja2", "verifiers", "prime_traces", "obstore",
    "prime_runs_spool.spool.reader", "prime_runs_spool.sync.state", "prime_runs_spool.sync.engine",
    "prime_runs_spool.runner.run", "prime_runs_spool.local_platform.app", "prime_runs_spool.viewer.app",
    "prime_runs_spool.viewer.index",
)


#: Every command as typed, for the checks each one gets.
EVERY_COMMAND = [[], ["eval"], ["export"], ["import"], ["mirror"], ["platform"], ["platform", "serve"], ["status"],
                 ["sync"], ["verify"], ["view"]]


def heavy_modules_loaded(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The command line's own ``main`` run with ``argv`` in a fresh interpreter, and which of
    HEAVY_FOR_HELP it imported (counted, not timed: the machine may be loaded)."""
    probe = ("import sys, json\n"
             "from commands.cli import main\n"
             f"sys.argv = ['prime-runs', *{argv!r}]\n"
             "try:\n"
             "    main()\n"
             "finally:\n"
             f"    print(json.dumps([m for m in {HEAVY_FOR_HELP!r} if m in sys.modules]), file=sys.stderr)\n")
    done = subprocess.run([CLI[0], "-c", probe], capture_output=True, text=True, env=child_env(), timeout=120)
    *message, loaded = done.stderr.rstrip("\n").split("\n")
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "\n".join(message)), json.loads(loaded)


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda command: " ".join(command) or "prime-runs")
def test_help_imports_none_of_the_machinery_behind_the_commands(command):
    """``eval --help`` imported verifiers to print its help: 6.6 s of CPU, 26 s under load."""
    done, loaded = heavy_modules_loaded([*command, "--help"])
    assert done.returncode == 0, done.stderr
    assert "Examples:" in done.stdout or command in ([], ["platform"]), done.stdout
    assert loaded == [], f"prime-runs {' '.join(command)} --help imported {loaded}"


@pytest.mark.parametrize("command", [command for command in EVERY_COMMAND if command not in ([], ["eval"])],
                         ids=" ".join)
def test_a_usage_error_imports_none_of_the_machinery_behind_the_commands(command):
    """An unknown option is click's to refuse, before any of the command's work is loaded
    (``eval`` parses none of its arguments: verifiers refuses them)."""
    done, loaded = heavy_modules_loaded([*command, "--no-such-option"])
    assert done.returncode == 2, done.stderr
    assert "--no-such-option" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert loaded == [], f"prime-runs {' '.join(command)} --no-such-option imported {loaded}"


def test_sync_exits_without_the_final_garbage_collections(tmp_path):
    """``prime-runs sync`` leaves through ``commands.output.leave``: the heap is frozen
    before the interpreter's teardown, which otherwise collects it again and again (about
    0.1 s after the report, Dec 1, benchmarks/startup.py), and the exit status is kept."""
    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: sys.stderr.write(f'frozen {gc.get_freeze_count() > 0}\\n'))\n"
             "from commands.cli import main\n"
             f"sys.argv = ['prime-runs', 'sync', {str(tmp_path)!r}, '--base-url', 'http://127.0.0.1:9',\n"
             "            '--allow-empty']\n"
             "main()\n")
    env = {**child_env(), "PRIME_API_KEY": "k"}
    done = subprocess.run([CLI[0], "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "frozen True", done.stderr


def test_the_http_stack_still_sends_without_the_extras_a_sync_leaves_out():
    """``prime-runs sync`` makes trio and httpx's command line unimportable
    (commands.output.without_unused_http_extras): httpx and httpcore must still import and
    send, as they do where those are not installed."""
    probe = ("import sys\n"
             "from commands.output import UNUSED_HTTP_EXTRAS, without_unused_http_extras\n"
             "without_unused_http_extras()\n"
             "import httpx\n"
             "with httpx.Client(transport=httpx.HTTPTransport()) as http:\n"
             "    try:\n"
             "        http.get('http://127.0.0.1:9/')\n"
             "    except httpx.ConnectError:\n"
             "        pass\n"
             "assert sys.modules['httpcore'] is not None\n"
             "print(sorted(n for n in ('trio', 'rich', 'pygments', *UNUSED_HTTP_EXTRAS) if sys.modules.get(n)))\n")
    done = subprocess.run([CLI[0], "-c", probe], capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_progress_line_on_a_terminal_counts_episodes_whatever_the_sink(tmp_path):
    """A sync to Prime Traces pushes episodes (its report says 'pushed 3 (total 3) to traces'),
    and a sample is one episode: the terminal's progress line said '3 samples' there."""
    import os
    import pty

    from support.runs import build_run

    build_run(tmp_path / "outputs" / "r", "progress-traces", 3)
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(CLI + ["sync", "--local", "--to", "traces", "--db", str(tmp_path / "local.db"),
                                     str(tmp_path / "outputs")], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=terminal, text=True, timeout=120,
                              env=child_env(XDG_CACHE_HOME=str(tmp_path / "cache"), COLUMNS="200"))
        os.close(terminal)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's other end is closed and drained
            while chunk := os.read(controller, 65536):
                shown += chunk
    finally:
        os.close(controller)
    assert done.returncode == 0 and "pushed 3 (total 3) to traces" in done.stdout, done.stdout
    drawn = [part.strip() for part in shown.decode().split("\r") if part.strip()]
    # Which counts are drawn depends on timing (at most ten draws a second: a quick sync may
    # show only its first, '0 episodes'): every line drawn counts episodes, none samples.
    assert drawn and all(re.fullmatch(r"syncing 1 run: [0-3] episodes?, 0\.0 MB sent", line) for line in drawn), drawn
