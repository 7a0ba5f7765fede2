"""A bound on the answers one thread waits for, tighter than ``--timeout`` for a while.

Why: ``--retry-for`` promises how long a platform that fails every request is tried. Once
it has failed, a retry that waited a whole ``--timeout`` for an answer that never comes ran
past that promise by up to the timeout; the sync's retries (sync/protocol.py) bound each
try's answer by what is left of it (sync/retry.py, ``Backoff.time_left``), and the transport
(platform_api/deadline.py) applies the bound. Its own module, with nothing imported, so the
sync's protocol can set it without importing the HTTP stack at start-up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def answers_within(seconds: float | None) -> Iterator[None]:
    """Bound the answers to the requests this thread sends inside the block by ``seconds``
    as well as by the transport's timeout (None: the timeout alone)."""
    before = getattr(_local, "cap", None)
    _local.cap = seconds
    try:
        yield
    finally:
        _local.cap = before


def answer_cap() -> float | None:
    """The bound :func:`answers_within` set on this thread, or None."""
    return getattr(_local, "cap", None)
