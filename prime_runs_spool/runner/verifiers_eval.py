"""``prime-runs eval``: the installed verifiers' own eval command, with its platform hooks bound to the spool.

verifiers' eval runner (``verifiers.v1.cli.eval.runner``) imports four hooks by name from
``verifiers.v1.utils.platform``: ``open_run(config, state, *, num_examples)``,
``log_episodes(run, episodes)``, ``finish_run(run, episodes, state)`` and
``abort_run(run, error, state)``. Upstream they drive the online SDK, which drops records
when its queue is full. :func:`run_vf_eval` replaces the runner module's four names with
the spool's (and puts them back afterwards), then calls verifiers' own ``main`` with the
arguments unchanged. Everything else is verifiers': argument parsing, ``@`` files,
``--resume``, the dashboard, the exit code.

What the bound hooks do:

- ``open_run``: :func:`~prime_runs_spool.runner.verifiers.open_eval_run` in
  ``output_dir / run.dir`` (beside ``traces.jsonl``), with the launch ``@`` file; the
  config gets the run's id (``assign_id``). On ``--resume``, the episodes verifiers did
  not keep in its rewritten ``traces.jsonl`` are recorded as superseded
  (``content/supersede.py``). It also routes this package's log records into verifiers'
  own log (``eval.log`` and the dashboard's log view): verifiers sends only its own
  logger there, so our warnings would otherwise be lost behind the dashboard.
- ``log_episodes``: durable on return, and a disk error **raises** (upstream swallows:
  its records are best effort; ours are the point). The runner calls it from
  ``on_complete``, so a rollout counts as done only once its episode is in the spool.
- ``finish_run``: logs any episode not yet logged, seals ``completed`` with the summary.
- ``abort_run``: seals ``cancelled`` on Ctrl-C, SIGTERM or cancellation, else ``failed``.

Versions: the hooks are matched by name and signature against :data:`HOOKS`. An
installed verifiers outside :data:`SUPPORTED_RANGE`, or whose runner does not import
exactly these hooks, is refused (:class:`VerifiersVersionError`) before anything runs:
an eval that runs without a spool while the user believes it has one is the failure
this command exists to prevent.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import inspect
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from prime_runs_spool.content.platform_runs import platform_runs_in
from prime_runs_spool.content.supersede import kept_episode_ids, superseded_ids
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.errors import VerifiersVersionError
from prime_runs_spool.files import DISK_FULL_ERRNOS, PERMISSION_ERRNOS, READ_ONLY_FS_ERRNOS, open_private, shell_word
from prime_runs_spool.plural import episodes
from prime_runs_spool.runner.clean_guard import refuse_clean_of_unshipped
from prime_runs_spool.runner.eval_help import SUPPORTED_BELOW, SUPPORTED_MIN, SUPPORTED_RANGE
from prime_runs_spool.runner.modes import DISABLED, OFFLINE
from prime_runs_spool.runner.run import Run
from prime_runs_spool.runner.terminal_mask import TerminalMask, masked_terminal
from prime_runs_spool.runner.verifiers import abort_eval_run, eval_mode, eval_run_dir, finish_eval_run, open_eval_run
from prime_runs_spool.spool.layout import spool_dir

_log = logging.getLogger("prime_runs_spool")

#: The module whose hook names are replaced, and each hook's parameters, in order.
RUNNER_MODULE = "verifiers.v1.cli.eval.runner"
MAIN_MODULE = "verifiers.v1.cli.eval.main"
HOOKS: dict[str, tuple[str, ...]] = {
    "open_run": ("config", "state", "num_examples"),
    "log_episodes": ("run", "episodes"),
    "finish_run": ("run", "episodes", "state"),
    "abort_run": ("run", "error", "state"),
}
#: verifiers' library logger: the one its ``setup_logging`` sends to ``eval.log``.
VERIFIERS_LOGGER = "verifiers.v1"


@dataclass
class EvalSession:
    """What one ``prime-runs eval`` invocation opened: for its closing line and for tests."""

    argv: list[str]
    runs: list[Run] = field(default_factory=list)
    #: Whether verifiers shows its log on the terminal (``--no-rich``); under its dashboard
    #: (the default) its log, and ours routed into it, goes to ``eval.log`` alone.
    logs_on_terminal: bool = False
    #: The secret values cleared from what verifiers prints (runner/terminal_mask.py).
    terminal: TerminalMask = field(default_factory=TerminalMask)
    #: The folder of the run being opened, set before its spool is: an error opening it
    #: (a read-only folder) is then told with the run's resume command, as any other ending.
    opening: Path | None = None

    @property
    def launch_file(self) -> str | None:
        return launch_file_of(self.argv)


def installed_version() -> str | None:
    """The installed verifiers' version, or None when it is not installed."""
    try:
        return metadata.version("verifiers")
    except metadata.PackageNotFoundError:
        return None


def check_verifiers() -> Any:
    """The runner module, once the installed verifiers is one this binds; else a clear error."""
    version = installed_version()
    if version is None:
        raise VerifiersVersionError(
            f"verifiers is not installed; install it with: pip install 'verifiers{SUPPORTED_RANGE}' "
            "(from a clone of prime-runs-spool, pip install -e '.[verifiers]' does the same)"
        )
    parsed = _release(version)
    if parsed is None or not SUPPORTED_MIN <= parsed < SUPPORTED_BELOW:
        raise VerifiersVersionError(
            f"verifiers {version} is installed; prime-runs eval supports verifiers {SUPPORTED_RANGE}. "
            f"Install a supported one: pip install 'verifiers{SUPPORTED_RANGE}'"
        )
    try:
        runner = importlib.import_module(RUNNER_MODULE)
        importlib.import_module(MAIN_MODULE)
    except Exception as exc:
        raise VerifiersVersionError(
            f"verifiers {version}: its eval runner cannot be imported ({type(exc).__name__}: {exc}); "
            f"prime-runs eval supports verifiers {SUPPORTED_RANGE}"
        ) from None
    differences = [problem for name, params in HOOKS.items() if (problem := _hook_problem(runner, name, params))]
    if differences:
        raise VerifiersVersionError(
            f"verifiers {version}: its eval runner's platform hooks differ from what prime-runs eval "
            f"binds ({'; '.join(differences)}); supported: verifiers {SUPPORTED_RANGE}"
        )
    return runner


def launch_file_of(argv: Sequence[str]) -> str | None:
    """The root ``@ file`` the eval was launched from (the first one), as verifiers reads it.

    A ``--flag @ file`` is a nested reference belonging to that flag, not the launch file.
    """
    for index, arg in enumerate(argv):
        if arg == "@" and index + 1 < len(argv) and (index == 0 or not argv[index - 1].startswith("--")):
            return argv[index + 1]
    return None


def launch_file_problem(argv: Sequence[str]) -> str | None:
    """What is wrong with the launch file before verifiers reads it, as one line: a folder
    (``@ configs/``, a completion stopped short) ended in verifiers' ``IsADirectoryError``
    traceback; a FIFO, a socket or a device blocked this process reading it for the
    terminal's masking. None when it is a file, or missing (verifiers says so in one line)."""
    from prime_runs_spool.files import special_file_kind

    path = launch_file_of(argv)
    if path is None:
        return None
    if os.path.isdir(path):
        kind = "a folder"
    else:
        kind = special_file_kind(path)
        if kind is None:
            return None
    return f"@ {path}: it is {kind}, not a config file; give the eval's .toml, .json or .yaml file"


@contextlib.contextmanager
def bound_hooks(session: EvalSession) -> Iterator[None]:
    """The runner module's four hook names bound to the spool for the block, then restored."""
    runner = check_verifiers()
    originals = {name: getattr(runner, name) for name in HOOKS}
    hooks = _Hooks(session)
    for name in HOOKS:
        setattr(runner, name, getattr(hooks, name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(runner, name, original)


def run_vf_eval(argv: Sequence[str], session: EvalSession | None = None) -> tuple[int, EvalSession]:
    """verifiers' eval ``main(argv)`` with the hooks bound; returns (exit code, session).

    The exit code is verifiers' own: 0 on success, its ``SystemExit`` code otherwise
    (130 for Ctrl-C). An exception verifiers lets escape is re-raised after the hooks are
    restored (its traceback is verifiers' to show); a ``session`` passed in records the
    runs opened, for the caller's message about it.
    """
    session = session if session is not None else EvalSession(argv=list(argv))
    session.terminal.add_launch_file(session.launch_file)
    with bound_hooks(session), masked_terminal(session.terminal):
        module = importlib.import_module(MAIN_MODULE)
        main = module.main
        try:
            _record_run_folder(module, session)
            main(list(argv))
        except SystemExit as exc:
            return _exit_code(exc.code), session
        finally:
            _forget_run_folder(module)
    return 0, session


#: The function verifiers' eval ``main`` names the run's folder with, bound here to record it.
_OUTPUT_PATH = "output_path"


def _record_run_folder(module: Any, session: EvalSession) -> None:
    """Have the name ``main`` calls first for the run's folder (``output_path(config)``)
    record it in ``session.opening``: a folder it then cannot write (its own logs, before any
    hook runs) is told in one line like one the spool cannot write (``unwritable_error``)."""
    original = getattr(module, _OUTPUT_PATH, None)
    if original is None or getattr(original, "_records_for", None) is not None:
        return

    def output_path(*args: Any, **kwargs: Any) -> Any:
        path = original(*args, **kwargs)
        session.opening = Path(path)
        if args:  # before verifiers' --clean deletes the folder (runner/clean_guard.py)
            refuse_clean_of_unshipped(args[0], Path(path))
        return path

    output_path._records_for = original  # type: ignore[attr-defined]
    setattr(module, _OUTPUT_PATH, output_path)


def _forget_run_folder(module: Any) -> None:
    bound = getattr(module, _OUTPUT_PATH, None)
    original = getattr(bound, "_records_for", None)
    if original is not None:
        setattr(module, _OUTPUT_PATH, original)


def sync_hint(session: EvalSession) -> str | None:
    """The one closing line for an offline run that wrote a spool: how to ship it."""
    offline = [run for run in session.runs if run.mode == OFFLINE]
    if not offline:
        return None
    run_dir = offline[-1].dir
    return f"spool written to {spool_dir(run_dir)}; ship it with: prime-runs sync {shell_word(run_dir)}"


def not_shipped_lines(session: EvalSession) -> list[str]:
    """Online mode's closing lines, one per run that ended with episodes not shipped, for
    the command line to print when verifiers' log did not already show them: under its
    dashboard our warnings reach ``eval.log`` alone, and a platform that is down or a
    refused key must never be told to a file only."""
    if session.logs_on_terminal:
        return []
    return [line for run in session.runs if (line := run.not_shipped)]


def resume_command(session: EvalSession) -> str | None:
    """The exact command that continues the session's run: ``prime-runs eval`` with
    verifiers' own saved config (``configs/resolved/*.json``, the exact config its
    ``--resume`` requires) and ``--resume``. None before verifiers saved one."""
    run_dir = session.runs[-1].dir if session.runs else session.opening
    if run_dir is None:
        return None
    from verifiers.v1.cli.output import saved_config_path  # verifiers names its own file

    saved = saved_config_path(run_dir)
    return None if saved is None else f"prime-runs eval @ {shell_word(saved)} --resume"


def interrupt_hint(session: EvalSession) -> str | None:
    """The closing line after Ctrl-C / SIGTERM (exit 130): how to continue the run."""
    command = resume_command(session)
    return None if command is None else f"interrupted; resume with: {command}"


#: A file may not grow past a limit: the process's (``ulimit -f``, ``RLIMIT_FSIZE``; Python
#: ignores ``SIGXFSZ``, so the write fails) or the file system's largest file. No bug either.
FILE_SIZE_LIMIT_ERRNOS = frozenset({errno.EFBIG})


def disk_full_error(error: BaseException) -> OSError | None:
    """The "no space left" (or quota, or file size limit) error behind ``error``, wherever it
    was raised: verifiers' own ``traces.jsonl`` write, or the spool's (wrapped or not)."""
    return next((found for found in _os_errors_behind(error)
                 if found.errno in DISK_FULL_ERRNOS | FILE_SIZE_LIMIT_ERRNOS), None)


def unwritable_error(error: BaseException, session: EvalSession) -> OSError | None:
    """The error behind ``error`` that says the eval's outputs cannot be written: a read-only
    file system, wherever it is, or permission refused on the run's folder, a path in it, or
    a folder above it (verifiers making ``output_dir``), or a file where one of those folders
    should be (``output_dir`` given as a file, a file named ``spool`` in the run's folder:
    ``ENOTDIR``), a symbolic link to nothing or a loop of them on the way. Any of these
    anywhere else is the environment's own code at work: None, so its traceback is shown."""
    run_dir = session.runs[-1].dir if session.runs else session.opening
    for found in _os_errors_behind(error):
        if found.errno in READ_ONLY_FS_ERRNOS:
            return found
        if found.errno in PERMISSION_ERRNOS | NOT_A_FOLDER_ERRNOS | MISSING_FOLDER_ERRNOS | LOOP_ERRNOS \
                and run_dir is not None and found.filename and _related(Path(os.fsdecode(found.filename)), run_dir) \
                and (found.errno not in MISSING_FOLDER_ERRNOS or _dangling_link(Path(os.fsdecode(found.filename)))) \
                and (found.errno not in LOOP_ERRNOS or _link_loop(Path(os.fsdecode(found.filename)))):
            return found
    return None


#: A ``mkdir`` stopped by a loop of symbolic links on the way (``output_dir`` linked to itself).
LOOP_ERRNOS = frozenset({errno.ELOOP})


def _link_loop(path: Path) -> Path | None:
    """The first of the folders above ``path`` and ``path`` itself, from the top down, that
    is a symbolic link in a loop; None when none is."""
    for candidate in [*reversed(path.parents), path]:
        if os.path.islink(candidate):
            try:
                os.stat(candidate)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    return candidate
    return None


#: A ``mkdir`` stopped by a symbolic link to nothing on the way: ``ENOENT`` below it, ``EEXIST`` on it.
MISSING_FOLDER_ERRNOS = frozenset({errno.ENOENT, errno.EEXIST})


def _dangling_link(path: Path) -> Path | None:
    """The first of the folders above ``path`` and ``path`` itself, from the top down, that
    is a symbolic link to nothing (``output_dir`` linked to a disk not mounted): None when
    none is, and an ``ENOENT`` is then the environment's own."""
    for candidate in [*reversed(path.parents), path]:
        if os.path.islink(candidate) and not os.path.exists(candidate):
            return candidate
    return None


#: A file stands where the run needs a folder (verifiers' ``mkdir``, the spool's ``scandir``).
NOT_A_FOLDER_ERRNOS = frozenset({errno.ENOTDIR})


def unwritable_line(session: EvalSession, error: OSError) -> str:
    """One line for an eval stopped by a folder it may not write: which path, why, and how
    to continue once it can be written."""
    path = Path(os.fsdecode(error.filename)) if error.filename else session.opening or Path.cwd()
    link = _dangling_link(path) if error.errno in MISSING_FOLDER_ERRNOS else None
    loop = _link_loop(path) if error.errno in LOOP_ERRNOS else None
    if loop is not None:
        line = (f"cannot write {path}: {'it' if loop == path else loop} is a loop of symbolic links; "
                "point it at a folder or set another output_dir")
    elif link is not None:
        line = (f"cannot write {path}: {'it' if link == path else link} is a symbolic link to {os.readlink(link)}, "
                "which does not exist; "
                "make that folder or set another output_dir")
    elif error.errno in NOT_A_FOLDER_ERRNOS:
        file = _file_in_the_way(path)
        what = "it" if file == path else str(file)
        line = f"cannot write {path}: {what} is a file, not a folder; move it away or set another output_dir"
    else:
        why = "read-only file system" if error.errno in READ_ONLY_FS_ERRNOS else "permission denied"
        line = (f"cannot write {path}: {why} (file system {_mount_point(path)}); "
                "make it writable or set another output_dir")
    command = resume_command(session)
    if command is None:
        return f"{line}, then run the eval again"
    return f"{line}, then resume with: {command}"


def _file_in_the_way(path: Path) -> Path:
    """The first of ``path`` and the folders above it, from the top down, that exists and
    is not a folder: what an ``ENOTDIR`` on ``path`` stumbled on (``path`` when none is)."""
    for candidate in [*reversed(path.parents), path]:
        if os.path.lexists(candidate) and not os.path.isdir(candidate):
            return candidate
    return path


def _os_errors_behind(error: BaseException) -> Iterator[OSError]:
    """Every ``OSError`` in ``error``'s chain of causes, ``error`` first."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            yield current
        current = current.__cause__ or current.__context__


def _related(path: Path, run_dir: Path) -> bool:
    """Whether ``path`` is ``run_dir``, inside it, or a folder above it."""
    path, run_dir = Path(os.path.abspath(path)), Path(os.path.abspath(run_dir))
    return path == run_dir or run_dir in path.parents or path in run_dir.parents


def disk_full_line(session: EvalSession, error: OSError) -> str:
    """One line for an eval the disk stopped: which path (and the file system it is on)
    is full, and how to continue once space is freed."""
    path = Path(error.filename) if error.filename else (session.runs[-1].dir if session.runs else Path.cwd())
    if error.errno in FILE_SIZE_LIMIT_ERRNOS:
        which = path if error.filename else f"a file in {path}"  # a write's error names no file
        line = (f"{which} cannot grow: it reached the largest file this process may write (a file size limit: "
                f"ulimit -f, or the file system's own; file system {_mount_point(path)})")
        way = "raise the limit"
    else:
        line = f"no space left on the device holding {path} (file system {_mount_point(path)})"
        way = "free space"
    command = resume_command(session)
    if command is None:
        return f"{line}; {way}, then run the eval again"
    return f"{line}; {way}, then resume with: {command}"


def _mount_point(path: Path) -> Path:
    """The mount point of the file system ``path`` (or its nearest existing parent) is on."""
    current = Path(os.path.abspath(path))
    while not os.path.ismount(current) and current.parent != current:
        current = current.parent
    return current


class _Hooks:
    """The four hooks, with the signatures verifiers' runner calls them with."""

    def __init__(self, session: EvalSession) -> None:
        self._session = session

    def open_run(self, config: Any, state: Any, *, num_examples: int) -> Run:
        _route_logs_to_verifiers()
        self._session.opening = eval_run_dir(config)
        self._session.logs_on_terminal = getattr(config, "rich", None) is None  # as its setup_logging reads it
        supersedes = _superseded_by_resume(config)
        run = open_eval_run(
            config, num_examples=num_examples, config_file=self._session.launch_file, supersedes=supersedes,
            platform_runs=_pushed_before_resume(config),
        )
        self._session.runs.append(run)
        self._session.terminal.add(run.masked_config_forms)
        _keep_outputs_private(eval_run_dir(config))
        if supersedes:
            _log.info("run %s: resumed; %s earlier superseded by retried rollouts", run.id, episodes(len(supersedes)))
        return run

    def log_episodes(self, run: Run, episodes: list[Any]) -> None:
        if episodes:
            run.log_episodes(episodes)

    def finish_run(self, run: Run, episodes: list[Any], state: Any) -> None:
        finish_eval_run(run, episodes)

    def abort_run(self, run: Run, error: BaseException, state: Any) -> None:
        abort_eval_run(run, error)


def _keep_outputs_private(run_dir: Path) -> None:
    """Make the files verifiers writes beside the spool ``0600``, as the spool's are.

    verifiers writes the launch file verbatim (``configs/<cli>.toml``), the resolved config
    (``configs/resolved/<cli>.json``) and ``traces.jsonl`` (every episode's resolved seat
    configs) with the umask's mode, ``0644`` by default: a client's headers and keys, which
    the spool masks, readable by every user of the machine. By the time the run opens,
    verifiers has written the configs (and a resume's ``traces.jsonl``); a ``traces.jsonl``
    not there yet is created ``0600`` here, empty, so verifiers' appends keep that mode. A
    symbolic link is left alone (its target is not this run's file)."""
    from verifiers.v1.cli.output import CONFIG_DIR, RESOLVED_DIR  # verifiers names its own folders

    configs = run_dir / CONFIG_DIR
    paths = [verifiers_traces_path(run_dir)]
    for folder in (configs, configs / RESOLVED_DIR):
        with contextlib.suppress(OSError):
            paths += sorted(entry for entry in folder.iterdir() if entry.is_file() and not entry.is_symlink())
    for path in paths:
        try:
            os.close(open_private(path, os.O_RDONLY | os.O_NOFOLLOW))
        except OSError as exc:
            _log.warning("%s: could not be made private (%s); it may hold credentials in clear text",
                         path, exc.strerror or exc)


def _superseded_by_resume(config: Any) -> list[str] | None:
    """On ``--resume``: the spool's episodes that verifiers did not keep (it re-runs their slots).

    By the time the runner calls ``open_run``, verifiers has rewritten ``traces.jsonl`` to
    the rollouts it keeps, so the file is the keep-verdict (content/supersede.py).
    """
    if not getattr(config, "resume", False) or eval_mode(bool(getattr(config, "push", True))) == DISABLED:
        return None  # a disabled run does not even look at the disk
    from prime_runs_spool.errors import NotARunError
    from prime_runs_spool.spool.scan import read_run  # only on resume: one streaming pass

    run_dir = eval_run_dir(config)
    try:
        spool = read_run(run_dir)
    except NotARunError:
        return None
    kept = kept_episode_ids(verifiers_traces_path(run_dir))
    return superseded_ids((_episode_id(record) for record in spool.episodes()), kept)


def _pushed_before_resume(config: Any) -> list[str]:
    """On ``--resume``: the platform runs a plain, pushing vf-eval stamped on the episodes
    verifiers kept (they are logged to this run too): sync adopts that evaluation
    (content/platform_runs.py)."""
    if not getattr(config, "resume", False) or eval_mode(bool(getattr(config, "push", True))) == DISABLED:
        return []
    return platform_runs_in(verifiers_traces_path(eval_run_dir(config)))


def _episode_id(record: Any) -> str | None:
    value = record.get("id") if isinstance(record, dict) else None
    return None if value is None else str(value)


def _route_logs_to_verifiers() -> None:
    """Send this package's log records where verifiers sends its own (``eval.log``, the dashboard).

    verifiers' ``setup_logging`` (already run by its ``main``) attaches its handler to its
    library logger only; the same handlers on ours put our warnings in the same file.
    """
    ours = logging.getLogger("prime_runs_spool")
    theirs = logging.getLogger(VERIFIERS_LOGGER)
    for handler in theirs.handlers:
        if handler not in ours.handlers:
            ours.addHandler(handler)
    if theirs.handlers:
        ours.setLevel(theirs.level or logging.INFO)
        ours.propagate = False


def _hook_problem(runner: Any, name: str, params: tuple[str, ...]) -> str | None:
    hook = getattr(runner, name, None)
    if not callable(hook):
        return f"no {name}"
    try:
        found = tuple(inspect.signature(hook).parameters)
    except (TypeError, ValueError):
        return f"{name} has no readable signature"
    if found != params:
        return f"{name}({', '.join(found)}) instead of {name}({', '.join(params)})"
    return None


def _release(version: str) -> tuple[int, int, int] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # SystemExit("message"): as Python itself would, then exit 1
    return 1
