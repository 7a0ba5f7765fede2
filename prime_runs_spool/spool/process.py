"""Which process wrote a segment, precisely enough to tell later whether it still runs.

A pid alone is reused; a pid with the kernel's boot id and the process's start time (in
clock ticks since boot, field 22 of ``/proc/PID/stat``) names one process for good. The
writer records all three in its header (docs/spool-format.md, section 3) so that a reader
finding a segment's lock file deleted can still tell a live writer from a dead one
(section 5). Where ``/proc`` is missing, both are None and the check never says "alive".
"""

from __future__ import annotations

import functools
import os
from typing import Any

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.lru_cache(maxsize=1)
def _boot_id() -> str | None:
    """This boot's id: read once, it cannot change while this process runs."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def identity() -> dict[str, Any]:
    """This process, as a header's ``writer`` records it (with pid and hostname)."""
    return {"boot_id": _boot_id(), "start_time": _start_time(os.getpid())}


def process_alive(writer: Any) -> bool:
    """Whether the process a header's ``writer`` names is running on this machine now."""
    if not isinstance(writer, dict):
        return False
    pid, boot_id, start_time = writer.get("pid"), writer.get("boot_id"), writer.get("start_time")
    if not isinstance(pid, int) or boot_id is None or start_time is None or boot_id != _boot_id():
        return False  # another machine, another boot, or a writer that did not say: not provably alive
    return start_time == _start_time(pid)
