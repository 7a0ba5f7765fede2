"""Which of the three run modes applies: ``offline``, ``online`` or ``disabled``.

An explicit ``mode=`` argument wins, then ``PRIME_RUNS_MODE``, then ``offline``. The
environment variable exists so a user can switch spooling off (``disabled``) for a
command without touching its code; an unknown value is an error rather than a silent
fallback, because a typo in ``disabled`` must not quietly write episodes to disk.
"""

from __future__ import annotations

import os

MODE_ENV_VAR = "PRIME_RUNS_MODE"
OFFLINE = "offline"
ONLINE = "online"
DISABLED = "disabled"
MODES = (OFFLINE, ONLINE, DISABLED)


def resolve_mode(mode: str | None = None) -> str:
    """The mode to run in; raises ``ValueError`` naming the valid modes for anything else."""
    source = "mode"
    if mode is None:
        mode, source = os.environ.get(MODE_ENV_VAR) or OFFLINE, MODE_ENV_VAR
    normalized = mode.strip().lower() if isinstance(mode, str) else mode
    if normalized not in MODES:
        raise ValueError(f"unknown {source} {mode!r}: expected one of {', '.join(MODES)}")
    return normalized


def writes_spool(mode: str) -> bool:
    """``online`` spools exactly like ``offline``; its shipper reads the spool, not memory."""
    return mode != DISABLED
