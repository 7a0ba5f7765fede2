"""Online mode's shipper, seen from the run: started once the manifest is durable, drained
within a bounded time after the seal, and read for progress (docs/integration.md).

Shipping is optional: nothing here raises into the eval. The shipper itself is a separate
process (runner/online.py) that watches the spool's files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from prime_runs_spool.runner.ending import describe_error
from prime_runs_spool.spool.layout import shipper_log_path

if TYPE_CHECKING:
    from prime_runs_spool.runner.online import Shipper
    from prime_runs_spool.sync.state import SyncState

_log = logging.getLogger("prime_runs_spool")


class Shipping:
    """The online shipper of one run, if one was started."""

    def __init__(self, run_id: str, run_dir: Path) -> None:
        self._run_id = run_id
        self._dir = run_dir
        self._shipper: Shipper | None = None
        #: How long the drain after the seal may take (``ship_timeout``), set when started.
        self._timeout = 0.0

    def start(self, timeout: float | None) -> None:
        """Start shipping the spool in the background (the manifest is durable)."""
        from prime_runs_spool.runner.online import Shipper, ship_timeout

        self._timeout = ship_timeout(timeout)
        try:
            self._shipper = Shipper.start(self._dir)
        except Exception as exc:  # shipping is optional; the spool is what must not fail
            _log.warning("run %s: the online shipper could not be started: %s", self._run_id, describe_error(exc))

    def progress(self) -> SyncState | None:
        """What the shipper has acknowledged so far (its state file); None without a shipper.
        The shipper object stays after the drain, so progress can be read after the run ends."""
        return self._shipper.progress() if self._shipper else None

    def drain(self) -> None:
        """After the seal: let the shipper finish within the bounded time, then stop it."""
        shipper = self._shipper
        if shipper is None or not shipper.running:
            return
        status = shipper.drain(self._timeout)
        if status != 0:
            _log.warning("run %s: the online shipper did not finish within %.0f s (exit %s); "
                         "run prime-runs sync to ship the rest (its log: %s)", self._run_id,
                         self._timeout, status, shipper_log_path(self._dir))
