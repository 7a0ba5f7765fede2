"""The online mode's shipper: ``python -m prime_runs_spool.sync --follow`` on one run, in a
child process.

Why a child process rather than a thread in the eval:

- **No contention with the eval.** Reading, projecting and sending rows is CPU work in
  Python; in a thread it would compete for the eval's GIL and show up in its append
  latency. A child process has its own interpreter.
- **Crash isolation.** Nothing the shipper meets (a hung socket, a bug, a platform storm)
  can raise into, block or kill the eval; nothing the eval does (``os._exit``, a segfault)
  can leave the sync state half-written, because the child's protocol is crash-safe anyway.
- **One code path.** The child runs exactly ``--follow`` under the run's sync lock, so the
  online mode has the same guarantees as a plain sync, and a ``prime-runs sync`` started
  alongside simply skips the run while the shipper holds it.

The eval only starts it (after the manifest is durable), reads its progress from the sync
state file (a few hundred bytes, no request), and at the end gives it a bounded time to
drain before stopping it. Whatever is left is picked up by a later ``prime-runs sync``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from prime_runs_spool.errors import MESSAGE_PREFIX, InvalidSettingsError
from prime_runs_spool.files import open_private
from prime_runs_spool.platform_api.settings import load_settings
from prime_runs_spool.spool.layout import spool_dir
from prime_runs_spool.sync.state import Destination, SyncState, read_state, remote_destination, sync_state_path


#: The online shipper's log, in the spool folder (verify and sync only look at ``seg-*`` files).
SHIPPER_LOG_NAME = "shipper.log"


def shipper_log_path(run_dir: str | os.PathLike[str]) -> Path:
    return spool_dir(run_dir) / SHIPPER_LOG_NAME

_log = logging.getLogger("prime_runs_spool")

SHIP_TIMEOUT_ENV = "PRIME_RUNS_SHIP_TIMEOUT"
#: Seconds ``finish()`` lets the shipper drain before stopping it.
DEFAULT_SHIP_TIMEOUT = 30.0
#: After SIGTERM, how long the child gets to end its current request before SIGKILL
#: (which is safe too: the sync state is consistent at every instant).
TERMINATE_GRACE = 5.0
#: Seconds the child waits for one answer: bounds how long a SIGTERM can take to act.
CHILD_REQUEST_TIMEOUT = 30.0
#: Seconds of failures after which the child stops retrying a platform that fails every
#: request (its ``--retry-for``); shorter than an interactive sync's, so that at the eval's
#: end a platform that is down costs about this long, not the whole ``ship_timeout``: the
#: child's last pass after the seal then fails at once and it exits. While the eval runs
#: the follower still tries again after each backoff, so an outage is ridden out.
CHILD_RETRY_FOR = 10.0
#: How much of the end of ``shipper.log`` is read to tell why episodes were not shipped.
LOG_TAIL_BYTES = 16_384

#: The shipper looks for new episodes this often: fewer, larger requests than an interactive
#: follower's, so its state fsyncs compete less with the eval's appends, and still well
#: within a second of each append.
SHIPPER_POLL_INTERVAL = 0.5

#: How much the shipper child yields the CPU to the eval (nice increment).
SHIPPER_NICENESS = 10


def ship_timeout(explicit: float | None = None) -> float:
    """``explicit``, else ``PRIME_RUNS_SHIP_TIMEOUT``, else 30 s; never negative."""
    if explicit is not None:
        return max(0.0, float(explicit))
    raw = os.environ.get(SHIP_TIMEOUT_ENV)
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            _log.warning("ignoring %s=%r: not a number of seconds", SHIP_TIMEOUT_ENV, raw)
    return DEFAULT_SHIP_TIMEOUT


def _import_path() -> str:
    """``PYTHONPATH`` for the child: this interpreter's own import path, in order, so the
    child imports the very ``prime_runs_spool`` the eval runs (a checkout, a virtualenv or
    an install), whatever its working directory."""
    entries = [entry or os.getcwd() for entry in sys.path]
    return os.pathsep.join(filter(None, [*entries, os.environ.get("PYTHONPATH")]))


def _lower_priority() -> None:
    """Runs in the child before exec: lower its CPU priority below the eval's."""
    os.nice(SHIPPER_NICENESS)


class Shipper:
    """A running shipper child for one run; see the module docstring."""

    def __init__(self, proc: subprocess.Popen[bytes], run_dir: Path, destination: Destination) -> None:
        self._proc = proc
        self._run_dir = run_dir
        self.destination = destination

    @classmethod
    def start(cls, run_dir: Path) -> Shipper | str:
        """Start shipping ``run_dir``; else why not (no credentials, the child could not be
        started), for the line at the run's end. Never raises: the eval goes on either way."""
        try:
            settings = load_settings()
        except InvalidSettingsError as exc:
            return str(exc)
        if not settings.api_key:
            return "no API key: set PRIME_API_KEY, or api_key in ~/.prime/config.json"
        env = dict(os.environ)
        env["PYTHONPATH"] = _import_path()
        env.pop("PRIME_RUNS_MODE", None)  # the child writes no run of its own
        cmd = [sys.executable, "-m", "prime_runs_spool.sync", "--follow", "--exit-when-idle",
               "--poll-interval", str(SHIPPER_POLL_INTERVAL), "--retry-for", str(CHILD_RETRY_FOR),
               "--timeout", str(CHILD_REQUEST_TIMEOUT), "--base-url", settings.base_url, str(run_dir)]
        if settings.team_id:
            cmd += ["--team", settings.team_id]
        try:
            # Its log holds errors, maybe episode ids: 0600, like everything the package writes.
            log_fd = open_private(shipper_log_path(run_dir), os.O_WRONLY | os.O_APPEND)
            with os.fdopen(log_fd, "ab") as log:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, close_fds=True,
                                        # its own session: a Ctrl-C meant for the eval does not
                                        # cut the shipper off before finish() lets it drain.
                                        start_new_session=True,
                                        # the eval comes first: the shipper takes the CPU it
                                        # leaves (docs/benchmarks.md, "An append with the
                                        # online shipper on").
                                        preexec_fn=_lower_priority)
        except OSError as exc:
            return f"the shipper could not be started: {exc}"
        return cls(proc, run_dir, remote_destination(settings.base_url, settings.team_id))

    def why_not_shipped(self) -> str:
        """Why the shipper left episodes behind, from the end of its log (each retry, each
        run's error and the key check's refusal that stopped it at the start are lines
        there): the platform unreachable, the key refused (401) or not allowed (403), else
        its last error; "it was stopped" when it said nothing."""
        try:
            with open(shipper_log_path(self._run_dir), "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
                lines = log.read().decode("utf-8", "replace").splitlines()
        except OSError:
            lines = []
        said = [line.strip() for line in lines
                if line.startswith(MESSAGE_PREFIX) or " failed: " in line or line.strip().startswith("error:")]
        return reason_from(said[-1], self.destination.base_url) if said else "the shipper was stopped before it was done"

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def wait(self) -> int | None:
        """Block until the child exits; its exit status (None if it cannot be waited for)."""
        try:
            return self._proc.wait()
        except OSError:
            return None

    def progress(self) -> SyncState | None:
        """What the shipper has acknowledged so far, from its state file (no request), read as
        every reader reads it: the shipper overwrites it in place, so a read meeting a write
        takes the twin rather than a torn file."""
        try:
            return read_state(sync_state_path(self._run_dir, self.destination.key))[0]
        except (OSError, ValueError):
            return None

    def drain(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the child to finish on its own (it exits once the
        sealed run is synced), then stop it: SIGTERM, a short grace, SIGKILL. Returns its
        exit status (None if it could not be reaped)."""
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE), (signal.SIGKILL, TERMINATE_GRACE)):
            try:
                self._proc.send_signal(sig)
                return self._proc.wait(grace)
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                break
        _log.warning("online mode: the shipper (pid %s) did not stop", self._proc.pid)
        return None


def reason_from(line: str, platform: str) -> str:
    """A shipper log line (a retry or a run's error) as the reason a person acts on;
    ``platform``: the base URL the shipper sent to, named with a refused key (a key sent to
    another platform than its own)."""
    text = line.removeprefix(MESSAGE_PREFIX).removeprefix("error: ")
    if "answered 401" in text:
        return (f"the platform at {platform} refused the API key (401): check PRIME_API_KEY, and that the key "
                "is this platform's (PRIME_API_BASE_URL)")
    if "answered 403" in text:
        return (f"the API key may not write at {platform} (403): check the key's permissions and PRIME_TEAM_ID, "
                "and that the key is this platform's (PRIME_API_BASE_URL)")
    for cause in ("cannot connect (", "no answer ("):
        if cause in text:
            return f"the platform was unreachable: {_to_closing(text.split(cause, 1)[1])}"
    return text[:300]


def _to_closing(text: str) -> str:
    """``text`` up to the ")" that closes the parenthesis opened just before it: a cause
    may hold parentheses of its own (``timed out (ReadTimeout)``)."""
    depth = 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                return text[:index]
            depth -= 1
    return text

