"""``prime-runs eval --clean`` over a spool whose episodes no sync shipped: refused.

verifiers' ``--clean`` deletes the run's folder before the run begins (its own message
suggests it for a folder that already holds results), and the spool goes with it: episodes
that were durable, never shipped anywhere, gone without a word. The spool exists so that an
eval never loses an episode, so such a clean is refused in one line, before verifiers
deletes anything, naming the sync that ships them; once a sync state says its destination
holds every episode (or the folder holds no spool, or no episode), the clean goes ahead as
verifiers does it. A spool that cannot be read is left to verifiers' clean as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import CleanRefusedError, SpoolError
from prime_runs_spool.files import shell_word
from prime_runs_spool.plural import episodes
from prime_runs_spool.spool.layout import is_run_dir
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.sync.state import read_state, sync_dir


def refuse_clean_of_unshipped(config: Any, run_dir: Path) -> None:
    """Raise :class:`CleanRefusedError` when ``config`` asks verifiers to ``--clean``
    ``run_dir`` and its spool holds episodes no destination holds all of."""
    if not getattr(config, "clean", False) or getattr(config, "resume", False):
        return
    try:
        if not is_run_dir(run_dir):
            return
    except OSError:  # a spool folder that cannot be looked into, or whose segments are gone: nothing to keep
        return
    try:
        held = read_run(run_dir).episodes_count
    except (SpoolError, OSError):  # damaged or unreadable: not this guard's to judge
        return
    if held == 0 or any(pushed >= held for pushed in _pushed_per_destination(run_dir)):
        return
    quoted = shell_word(run_dir)
    raise CleanRefusedError(
        f"--clean would delete {run_dir} with its spool, whose {episodes(held)} no sync has shipped whole "
        f"anywhere (prime-runs status {quoted}); ship them first with: prime-runs sync {quoted}, or move the "
        "folder away, then run the eval again")


def _pushed_per_destination(run_dir: Path) -> Iterator[int]:
    """Episodes each of the run's sync states says it pushed; a state that cannot be read
    holds none (the clean is refused rather than guessed safe)."""
    for path in sorted(sync_dir(run_dir).glob("*.json")):
        try:
            yield read_state(path)[0].episodes_pushed
        except (SpoolError, OSError):
            continue
