"""Work run in many threads at once, as an eval's concurrent rollouts call the library."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(work: Callable[[int], object], count: int, *, timeout: float | None = None,
                   hung: str = "a thread never ended") -> None:
    """``work(0)`` to ``work(count - 1)``, each in a thread of its own, all started, then
    all waited for. With ``timeout``, each is waited for that long at most and none may
    still run (``hung`` says what that means): a hang fails the test, not the whole suite."""
    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), hung
