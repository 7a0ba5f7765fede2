"""Where imported spools go when not beside their sources: the ``--state-dir`` setting.

Apart from the importer so the command line can define its options (``prime-runs --help``)
without importing the machinery behind them.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable ``--state-dir`` defaults to.
STATE_DIR_ENV = "PRIME_RUNS_STATE_DIR"


def default_state_dir(state_dir: str | os.PathLike[str] | None) -> Path | None:
    """``state_dir``, else ``$PRIME_RUNS_STATE_DIR``, else None (spools beside their sources)."""
    value = state_dir if state_dir is not None else os.environ.get(STATE_DIR_ENV) or None
    return Path(value).expanduser() if value else None
