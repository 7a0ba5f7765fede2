"""How long to wait before trying again, for how long in all, and who is told.

Exponential backoff with full jitter and a cap: jitter keeps many syncs (``--jobs``, CI
matrices) from hammering a recovering platform in lockstep; ``Retry-After`` from the
platform wins when it asks for longer.

Two bounds end the retries of a failing request: ``max_attempts`` consecutive failures, and
``retry_for`` seconds of failures on the platform. The second is shared by every run of one
sync (they share one :class:`Backoff` through their options): a platform that is down
costs the whole command ``retry_for``, not that much once per run, and a run started after
the platform was given up on tries once and is reported failed at once. Any request that
gets an answer ends the streak.

Every wait is told before it starts: a retry (``on_retry``), and the wait for a request in
doubt to become unable to land (``on_wait``, up to a whole request lifetime, 600 s by
default), are never silent (``prime-runs sync`` prints each on the progress line or as one
line on stderr).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Seconds of consecutive failures on one platform after which a sync stops retrying
#: (``prime-runs sync --retry-for``): long enough to ride out a deploy or a proxy restart,
#: short enough that a CI job against a platform that is down ends in minutes.
DEFAULT_RETRY_FOR = 180.0
#: The environment variable that sets ``--retry-for``.
RETRY_FOR_ENV = "PRIME_RUNS_RETRY_FOR"


@dataclass(frozen=True)
class Retry:
    """One failed request about to be tried again: what failed, why, and when the next try is."""

    #: What the sync was doing ("creating the evaluation", "uploading episodes to Prime Traces").
    what: str
    #: Why it failed, as the platform client worded it (refused, name not resolved, TLS,
    #: timed out, an HTTP status).
    why: str
    #: The failed attempt's number (1 for the first failure).
    attempt: int
    #: Seconds until the next try.
    delay: float


@dataclass(frozen=True)
class Wait:
    """A wait before anything more is sent to the platform for one run, no retry: a request
    that may still land must be waited out (sync/protocol.py, ``Protocol.fence``)."""

    #: The run's folder (or URL) as a message names it.
    run: str
    #: Why the run waits, worded for a person.
    why: str
    #: Seconds the wait lasts.
    delay: float
    #: When it ends (wall clock, seconds since the epoch; None: not said): a wait of minutes
    #: read later in a log says whether it is over.
    until: float | None = None
    #: How a person who knows more than the sync may end it sooner ("" when nothing may).
    skip: str = ""

    def line(self) -> str:
        """The wait as one line says it, wherever it is told."""
        ends = "" if self.until is None else \
            f", until {time.strftime('%H:%M:%S', time.gmtime(self.until))} UTC"
        return (f"{self.run}: waiting {self.delay:.0f} s before sending more: {self.why} (--request-lifetime{ends})"
                + (f"; {self.skip}" if self.skip else ""))


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    #: Consecutive failures of one operation before the run gives up (its state is saved;
    #: the next sync carries on).
    max_attempts: int = 10
    #: Seconds of failures on the platform after which every run gives up (None: no bound
    #: but ``max_attempts``).
    retry_for: float | None = None
    #: Told of every wait before it starts.
    on_retry: Callable[[Retry], None] | None = None
    #: Told of every fence (:class:`Wait`) before it starts.
    on_wait: Callable[[Wait], None] | None = None
    rng: random.Random = field(default_factory=random.Random)
    monotonic: Callable[[], float] = time.monotonic
    #: When the current streak of failures began (None: the last request was answered):
    #: when its first failed request was sent, so that the wait for that request's answer
    #: counts against ``retry_for`` too.
    _failing_since: float | None = field(default=None, init=False, repr=False)
    #: When a request was last answered: a streak begins no earlier.
    _answered_at: float = field(default=float("-inf"), init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """The wait before retry number ``attempt`` (1 for the first retry)."""
        ceiling = min(self.cap, self.base * (2 ** (attempt - 1)))
        wait = self.rng.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.cap * 4))
        return wait

    def answered(self) -> None:
        """A request got an answer: the platform is up, the streak of failures is over."""
        with self._lock:
            self._failing_since = None
            self._answered_at = self.monotonic()

    def time_left(self) -> float | None:
        """Seconds of ``retry_for`` left to the current streak of failures (None: no streak,
        or no such bound): what a retry's wait for its answer may take at most."""
        since = self._failing_since
        if since is None or self.retry_for is None:
            return None
        return max(0.0, self.retry_for - (self.monotonic() - since))

    def next_wait(self, what: str, why: str, attempt: int, retry_after: float | None = None,
                  sent: float | None = None) -> float | None:
        """After failure number ``attempt`` of one request, sent at ``sent`` (``monotonic``;
        None: now): the wait before trying again (told to ``on_retry``), or None when it is
        time to give up. A streak begins when its first failed request was sent (no earlier
        than the last answer): a platform that takes the connection and never answers has
        failed for the whole wait."""
        with self._lock:
            now = self.monotonic()
            if self._failing_since is None:
                began = now if sent is None else max(sent, self._answered_at)
                self._failing_since = min(began, now)
            spent = now - self._failing_since
        if attempt >= self.max_attempts:
            return None
        wait = self.delay(attempt, retry_after)
        if self.retry_for is not None and wait >= self.retry_for - spent:
            # The try after that wait would have no time left for its answer (``time_left``
            # bounds it): it could only time out, and the run would be reported as given no
            # answer by a platform that answered every try (a 500).
            return None
        if self.on_retry is not None:
            self.on_retry(Retry(what=what, why=why, attempt=attempt, delay=wait))
        return wait

    def waiting(self, wait: Wait) -> None:
        """Tell whoever watches that a run waits ``wait.delay`` seconds before sending more."""
        if self.on_wait is not None:
            self.on_wait(wait)

    def gave_up_after(self) -> float:
        """Seconds the current streak of failures has lasted (0 when there is none)."""
        since = self._failing_since
        return 0.0 if since is None else max(0.0, self.monotonic() - since)
