"""How an imported run ended, from what verifiers left on disk (docs/integration.md, "Importing").

verifiers 0.4.0 records no end state of its own: ``traces.jsonl`` only grows, and the
attempt's ``eval.log`` is the only witness of how the process stopped. What it shows:

- the first attempt's plan, ``running NxM rollouts on MODEL`` (N tasks, M rollouts each);
- on SIGINT/SIGTERM, verifiers' interrupt handler logs ``interrupted`` (a *cancel*);
- leaving its serving context (normally, or on an error) it logs ``interception down``;
  a killed process never gets there.

So, for the latest attempt (``logs/latest``, else the highest ``attempt_N``):

| what the outputs show | kind | seal |
| --- | --- | --- |
| a torn last line of ``traces.jsonl`` (verifiers writes each line whole, under a lock, shielded from cancellation: only a dying process tears one) | crashed | ``crashed`` |
| the interrupt line | cancelled | ``cancelled`` (``interrupted``, as the live path seals a Ctrl-C) |
| every planned rollout in ``traces.jsonl``, no torn tail | completed | ``completed`` |
| rollouts missing, the teardown line after the last rollout started | failed | ``failed`` |
| anything else: killed, still running, no log, no plan | crashed | ``crashed`` |

When it cannot tell, it never says completed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_runs_spool.importer.paths import LATEST_LOG_LINK, LOGS_DIRNAME, EVAL_LOG_NAME, attempt_log_paths
from prime_runs_spool.spool.format import CANCELLED, COMPLETED, CRASHED, FAILED

_PLAN = re.compile(r"running (\d+)x(\d+) rollouts")
_INTERRUPTED = "interrupted"
_TEARDOWN = "interception down"
_ROLLOUT_START = "rollout start:"
#: Enough of a log to find its lines; a verifiers eval.log is a few KB per hundred rollouts.
_LOG_READ_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class Outcome:
    """How the run ended: ``status`` is the seal to write, ``kind`` the finer verdict."""

    status: str
    kind: str
    reason: str
    #: The plan (tasks, rollouts per task) when the first attempt's log gave it.
    tasks: int | None = None
    rollouts: int | None = None


def _read(path: Path) -> list[str]:
    with open(path, "rb") as handle:
        return handle.read(_LOG_READ_LIMIT).decode("utf-8", "replace").splitlines()


def _latest_log(output_dir: Path, attempts: list[Path]) -> Path | None:
    latest = output_dir / LOGS_DIRNAME / LATEST_LOG_LINK / EVAL_LOG_NAME
    if latest.is_file():
        return latest
    return attempts[-1] if attempts else None


def _plan(attempts: list[Path]) -> tuple[int | None, int | None]:
    for log in attempts:
        for line in _read(log):
            match = _PLAN.search(line)
            if match:
                return int(match.group(1)), int(match.group(2))
    return None, None


def v040_outcome(output_dir: Path, per_task: dict[Any, int], torn: bool) -> Outcome:
    """The verdict for a verifiers 0.4.0 run directory (see the module docstring)."""
    attempts = attempt_log_paths(output_dir)
    tasks, rollouts = _plan(attempts)
    written = sum(per_task.values())
    planned = f"{written} of {tasks * rollouts}" if tasks and rollouts else f"{written}"
    latest = _latest_log(output_dir, attempts)
    if latest is None:
        return Outcome(CRASHED, CRASHED, f"no logs/attempt_N/{EVAL_LOG_NAME}: the outputs do not say how the "
                       f"run ended ({written} rollouts written)", tasks, rollouts)
    if torn:
        return Outcome(CRASHED, CRASHED, f"the last line of traces.jsonl is torn: vf-eval died mid-write "
                       f"({planned} complete rollouts written)", tasks, rollouts)
    lines = _read(latest)
    if any(_INTERRUPTED in line and "WARNING" in line for line in lines):
        return Outcome(CANCELLED, CANCELLED, f"cancelled: vf-eval was interrupted (SIGINT or SIGTERM) with "
                       f"{planned} rollouts written", tasks, rollouts)
    complete = (tasks is not None and rollouts is not None and len(per_task) >= tasks
                and all(count >= rollouts for count in per_task.values()))
    if complete:
        return Outcome(COMPLETED, COMPLETED, f"all {tasks}x{rollouts} rollouts written", tasks, rollouts)
    if _left_serving(lines) and tasks is not None:
        return Outcome(FAILED, FAILED, f"vf-eval stopped on an error with {planned} rollouts written "
                       "(its error went to the console, not to the outputs)", tasks, rollouts)
    why = "no plan in the first attempt's log" if tasks is None else "the log ends without a teardown"
    return Outcome(CRASHED, CRASHED, f"vf-eval was killed or is still running ({why}; {planned} rollouts "
                   "written)", tasks, rollouts)


def latest_log(output_dir: Path) -> Path | None:
    """The latest attempt's ``eval.log`` (``logs/latest``, else the highest ``attempt_N``)."""
    return _latest_log(output_dir, attempt_log_paths(output_dir))


def torn_down(log: Path) -> bool:
    """Whether the attempt that wrote ``log`` left its serving context after its last
    rollout started: ``interception down``, logged once its platform run was closed out
    (a normal end, an error, an interrupt), never by a process still running or killed."""
    return _left_serving(_read(log))


def _left_serving(lines: list[str]) -> bool:
    last_start = max((i for i, line in enumerate(lines) if _ROLLOUT_START in line), default=-1)
    return any(_TEARDOWN in line for line in lines[last_start + 1:])


def v0_outcome(rows: int, num_examples: Any, rollouts_per_example: Any) -> Outcome:
    """The older layout's ``metadata.json`` is written once the eval is over; completed
    only when ``results.jsonl`` holds every rollout it announces."""
    if isinstance(num_examples, int) and isinstance(rollouts_per_example, int) and num_examples > 0:
        expected = num_examples * rollouts_per_example
        if rows >= expected:
            return Outcome(COMPLETED, COMPLETED, f"all {expected} rows written", num_examples, rollouts_per_example)
        return Outcome(CRASHED, CRASHED, f"results.jsonl holds {rows} of {expected} rows", num_examples,
                       rollouts_per_example)
    return Outcome(CRASHED, CRASHED, "metadata.json does not say how many rollouts to expect")
