"""What one sync is asked to do (:class:`SyncOptions`) and what it says it did (:class:`RunReport`).

Kept apart from the engine so the command line, the follower and the console can build
options and read reports without the protocol that acts on them, and cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prime_runs_spool.platform_api.v0 import MAX_REQUEST_BYTES
from prime_runs_spool.spool.format import CORRUPT
from prime_runs_spool.sync.retry import Backoff

#: The sink a run's episodes go to on a destination (``sync --to``; sync/sinks/): Prime
#: Traces, the legacy samples table, or ``auto``: traces, falling back to samples when the
#: account answers ``service_not_enabled`` before any batch was committed (docs/sync.md,
#: "Sinks"). The names are persisted (the state file's ``store``): they never change.
TRACES = "traces"
SAMPLES = "samples"
AUTO = "auto"
SINKS = (TRACES, SAMPLES, AUTO)
#: The environment variable that sets ``--to`` for ``prime-runs sync`` and the online shipper.
SINK_ENV = "PRIME_RUNS_SYNC_TO"

#: The default request lifetime for the real platform: after this long, a request sent and
#: never answered can no longer be processed. Conservative on purpose (docs/sync.md).
DEFAULT_REQUEST_LIFETIME = 600.0
#: The shortest lifetime the command line takes: a request held more than half its lifetime
#: before its last byte is never finished (sync/protocol.py), so at 0 no request that is
#: not idempotent could go, and each pass retried that until it gave up, leaving a request
#: in doubt for the next sync to wait out.
MIN_REQUEST_LIFETIME = 0.1

def seconds_problem(value: float, minimum: float = 0.0) -> str | None:
    """Why ``value`` is not a number of seconds sync can wait by, or None. NaN passes every
    range check (it compares false with everything): a NaN request lifetime made every
    fence end at once, so a request in doubt was resent before it could no longer land; an
    infinite one waits forever, an infinite timeout overflowed the clock."""
    if value != value or value in (float("inf"), float("-inf")):
        return f"{value} is not a finite number of seconds"
    if value < minimum:
        return f"{value:g} is below the least allowed, {minimum:g} s"
    return None


#: Seconds a pass waits by default for another sync pushing a copy of the same run to the
#: same destination before it reports the run ``skipped`` (sync/copies.py; ``prime-runs sync
#: --copy-wait``, env PRIME_RUNS_COPY_WAIT).
DEFAULT_COPY_WAIT = 30.0
#: The environment variable that sets ``--copy-wait``.
COPY_WAIT_ENV = "PRIME_RUNS_COPY_WAIT"

#: A run's report state (``RunReport.state``), beside the run statuses it is reported with,
#: which are the spool's (spool/format.py): ``live`` and ``corrupt``, and a seal's (completed
#: runs are ``synced``; failed, cancelled, crashed). Printed and in ``--json``: the values
#: never change.
UP_TO_DATE = "up_to_date"   # nothing new since the last sync
SYNCED = "synced"           # completed and finalized
SKIPPED = "skipped"         # another sync holds the run, or a copy of it
DRY_RUN = "dry_run"         # counted, nothing sent
ERROR = "error"
INTERRUPTED = "interrupted"  # a SIGINT or SIGTERM ended the pass (or kept it from starting)
LOST = "lost"               # the spool lost lines already pushed: never finalized (docs/sync.md)
GONE = "gone"               # the run's folder was deleted or moved away under the pass (sync/many.py, sync/follow.py)

#: What a run's report says was pushed, by whether the pass was a dry run (sent nothing):
#: a damaged run's dry run said "everything before it was pushed".
PUSHED = {False: "was pushed", True: "would be pushed"}

#: Report states that mean the run did not get where it should (exit 1): a run ``gone``
#: under a plain sync too (nothing lost, but not all of it pushed, perhaps: it is synced
#: where it went); ``--follow`` follows it there and counts it not.
FAILED_STATES = frozenset({ERROR, CORRUPT, LOST, GONE})

#: Exit codes of ``prime-runs sync`` and of the shipper's ``python -m prime_runs_spool.sync``
#: (docs/cli.md); EXIT_INTERRUPTED (128 + SIGINT, as a shell reports Ctrl-C) after SIGINT or
#: SIGTERM ended a sync that was not following.
EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: The defaults of the command-line options that are not SyncOptions' own. They live here,
#: in a module that imports almost nothing, so that defining the command's options (which
#: ``prime-runs --help`` does) costs no import of the machinery behind them.
DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_BACKOFF_CAP = 30.0
DEFAULT_POLL_INTERVAL = 0.1
#: Runs synced at once. A small run waits on its requests and its fsync'd state writes far
#: longer than it computes, so more runs at once overlap those waits (against a remote
#: platform each round trip weighs more still): the first sync of 400 runs took 31-32 ms
#: a run with 4 jobs, 22-29 with 8, 21-26 with 16 (load 4-6, Dec 1, benchmarks/sync_many.py).
#: The threads cost no work on two cores: a new run's instructions in the whole command are
#: the same with 1, 2 or 8 jobs (6.60, 6.55, 6.55 M over 30 and 90 runs, cachegrind), its
#: CPU within the noise (400 runs: 5.0-5.5 ms with 1, 4.0-5.2 with 2 to 8, 5.1-6.1 with 16),
#: while one job took 2-4x the wall time of eight (load 7-9, Dec 7). With the local
#: platform's writes no longer sleeping in SQLite's busy handler, 400 runs in turns, six
#: rounds (load 7-9, Dec 7 later): 8 jobs 3.9-7.1 s (median 4.6), 16 jobs 4.1-6.9 s (4.8;
#: slower in four rounds, and more CPU), 4 jobs 4.9-8.8 s (7.4): the GIL's hand-overs among
#: more threads cost what the waits they overlap save (benchmarks/sync_many.py --jobs).
#: Memory does not grow with it (at most two large bodies are alive per process,
#: sync/rows.py): eight jobs over eight large runs peaked at 123 MB, four at 114 MB
#: (benchmarks/sync_memory.py, Dec 1). One run is one job whatever the setting.
DEFAULT_JOBS = 8


@dataclass
class SyncOptions:
    request_lifetime: float = DEFAULT_REQUEST_LIFETIME
    max_request_bytes: int = MAX_REQUEST_BYTES
    skip_corrupt: bool = False
    dry_run: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    #: For --replay: push each run as a new evaluation. Without ``replay_id``, each run
    #: continues its latest unfinished replay or starts one (sync/replay.py).
    replay: bool = False
    #: The replay's id: its own state file, and the key the evaluation is found again by.
    replay_id: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()
    #: The sink episodes go to: TRACES, SAMPLES (or another registered sink) or AUTO. The
    #: library's default stays SAMPLES, as before there was a choice; the command line's is AUTO.
    to: str = SAMPLES
    #: The sink ``auto`` sends a run with no sink recorded to where the command decided it,
    #: not the account: ``--local`` says samples (nothing to probe on this machine's own
    #: platform). A run whose state records a sink follows it whatever this says (a later
    #: plain ``--local`` carries on in traces). None: ``auto``'s probe and fallback.
    auto_sink: str | None = None
    #: Uncompressed bytes at which a traces batch closes (tests use smaller ones).
    traces_batch_bytes: int | None = None
    #: Seconds a pass waits for another sync on this machine pushing a copy of the same run
    #: (sync/copies.py) before reporting it ``skipped``; None: until that one is done
    #: (``--wait``); 0: not at all (the follower, which tries again shortly).
    copy_wait: float | None = DEFAULT_COPY_WAIT


@dataclass
class RunReport:
    path: str
    local_run_id: str | None = None
    name: str | None = None
    evaluation_id: str | None = None
    url: str | None = None
    pushed_now: int = 0
    pushed_total: int = 0
    #: One of the report states above, or the seal status a run ended with.
    state: str = ERROR
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    replay_id: str | None = None
    #: The sink the run's episodes went to: TRACES or SAMPLES (None: not decided yet). The
    #: key keeps its name: it is part of ``--json``'s output.
    store: str | None = None
    #: With --skip-corrupt: stretches of damage this pass passed over (each also said in a
    #: ``skipped:`` warning), and the records they lost where the sequence numbers tell.
    skipped_corrupt: int = 0
    skipped_records: int = 0
    #: The folder of another copy of this run (``cp -r``, an artifact unpacked twice), the
    #: last one synced on this machine, when it left this pass nothing to push: why it
    #: pushed nothing.
    copy_of: str | None = None
    #: Errored episodes of a run that did not complete, not pushed: held for a ``--resume``
    #: to retry, sent once the run completes (docs/sync.md, "Resumed runs"). Said, so that
    #: "pushed 0" of a crashed run is never a silent mystery.
    held_back: int = 0
    #: What the pass learned of the destination rather than of the run (Prime Traces off
    #: for the account): the same for every run, so a sync's text says each once
    #: (sync/console.py, ``report_lines``); ``--json`` gives it among each run's warnings.
    notices: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        document = dict(self.__dict__)
        document["warnings"] = [*document.pop("notices"), *self.warnings]
        return document
