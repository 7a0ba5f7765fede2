"""Online mode's shipper, seen from the run: started once the manifest is durable, drained
within a bounded time after the seal, and read for progress (docs/integration.md).

Shipping is optional: nothing here raises into the eval. The shipper itself is a separate
process (runner/online.py) that watches the spool's files.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from prime_runs_spool.plural import episodes as plural_episodes, plural
from prime_runs_spool.runner.error_line import describe_error
from prime_runs_spool.sync.state import sync_command

if TYPE_CHECKING:
    from prime_runs_spool.runner.online import Shipper
    from prime_runs_spool.sync.state import SyncState

_log = logging.getLogger("prime_runs_spool")


class Shipping:
    """The online shipper of one run, if one was started."""

    def __init__(self, run_id: str, run_dir: Path, pending: Callable[[], int] | None = None) -> None:
        self._run_id = run_id
        self._dir = run_dir
        self._shipper: Shipper | None = None
        #: How long the drain after the seal may take (``ship_timeout``), set when started.
        self._timeout = 0.0
        #: Durable episodes the platform has not acknowledged (the run's ``pending``).
        self._pending = pending or (lambda: 0)
        #: Online mode was asked for (``start`` ran), so the run's end says what was not shipped.
        self._online = False
        #: Why no shipper runs, when one was asked for and could not be started.
        self._not_started: str | None = None
        #: The end's line when episodes were not shipped (how many, why, the command that
        #: ships them), kept for a command line whose logs go to a file, not the terminal.
        self.not_shipped: str | None = None
        #: Set once the run's end drains the shipper: its exit from then on is the end's to tell.
        self._draining = threading.Event()

    def start(self, timeout: float | None) -> None:
        """Start shipping the spool in the background (the manifest is durable)."""
        from prime_runs_spool.runner.online import Shipper, ship_timeout

        self._online = True
        self._timeout = ship_timeout(timeout)
        try:
            started = Shipper.start(self._dir)
        except Exception as exc:  # shipping is optional; the spool is what must not fail
            started = f"the online shipper could not be started: {describe_error(exc)}"
        if isinstance(started, str):
            self._not_started = started
            _log.warning("run %s: online mode: %s; nothing is shipped while the run goes on, the spool is "
                         "complete (%s ships it)", self._run_id, started, self._sync_command())
        else:
            self._shipper = started
            # A shipper that gives up while the run goes on (a refused key, a platform down
            # past its retries) is told then, once: the end's line may be hours away.
            threading.Thread(target=self._watch, args=(started,), name="prime-runs-shipper-watch",
                             daemon=True).start()

    def _watch(self, shipper: Shipper) -> None:
        code = shipper.wait()
        if code in (0, None) or self._draining.is_set():
            return
        _log.warning("run %s: online mode: the shipper stopped while the run goes on (%s); every episode is "
                     "still spooled, %s ships them once it ends", self._run_id,
                     shipper.why_not_shipped(), self._sync_command())

    def _sync_command(self) -> str:
        """The command that ships the run where the shipper was to: with its base URL and
        team (and sink, once its state names one), for a setting given to the eval alone
        (``PRIME_API_BASE_URL=... prime-runs eval``) is not the shell's."""
        shipper = self._shipper
        if shipper is None:
            return sync_command(str(self._dir), None, None)
        state = shipper.progress()
        return sync_command(str(self._dir), shipper.destination, state.store if state else None)

    def progress(self) -> SyncState | None:
        """What the shipper has acknowledged so far (its state file); None without a shipper.
        The shipper object stays after the drain, so progress can be read after the run ends."""
        return self._shipper.progress() if self._shipper else None

    def drain(self) -> None:
        """After the seal: let the shipper finish within the bounded time, then stop it; then
        one line if anything was not shipped: how many episodes, why, and the command that
        ships them. Never raises, and never changes how the eval ends."""
        if not self._online:
            return
        self._draining.set()
        shipper = self._shipper
        if shipper is not None and shipper.running:
            shipper.drain(self._timeout)
        try:
            left = self._pending()
        except Exception:  # noqa: BLE001 - a count for a message must not fail the eval's end
            return
        if not left:
            return
        why = shipper.why_not_shipped() if shipper is not None else self._not_started or "no shipper ran"
        self.not_shipped = (f"online mode: {plural_episodes(left)} not shipped ({why}); "
                            f"ship {plural(left, 'it', 'them')} with: {self._sync_command()}")
        _log.warning("run %s: %s", self._run_id, self.not_shipped)
