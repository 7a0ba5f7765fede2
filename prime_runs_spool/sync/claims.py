"""The order in which one sync of a store URL takes up the runs it listed.

Several syncers on one prefix each go through every run of the listing (each reports each
run), and a run is worked on by whoever takes its lease first. Two syncers going the same
way through the same stretch leapfrog: the one behind finds the runs the other holds (each
a lease write refused, a read, a skip), takes the next ones, and the other then meets those;
in that stretch about every other run is met for nothing (a quarter of 200 runs with two
syncers, benchmarks/fleet.py).

So each sync starts at its own random place in the listing, and once a run shows it
another syncer's work (a run another holds, or a state written since the listing) it
carries on from a random place among the runs it has left, so the two part again. What
it jumped over comes after; by then it is mostly done by the other (one read each, no lease
write). A jump is random, not "the other end", so that two syncers that met together
(started at one place, say) do not jump together.
"""

from __future__ import annotations

import random
import threading
from collections import deque


class ClaimOrder:
    """The runs not yet taken up, by their index in the listing. Thread-safe: the sync's
    workers share one."""

    def __init__(self, count: int) -> None:
        start = random.randrange(count) if count else 0
        self._left = deque([*range(start, count), *range(start)])
        #: Which stretch runs are taken from: a jump begins the next one.
        self._stretch = 0
        self._jumps = random.Random()  # its own generator: seeding the module's fixes only the start
        self._lock = threading.Lock()
        #: How many times this sync jumped (what the tests count).
        self.jumps = 0

    def take(self) -> tuple[int, int] | None:
        """The next run's index and the stretch it was taken from; None when every run was
        taken up."""
        with self._lock:
            if not self._left:
                return None
            return self._left.popleft(), self._stretch

    def met_another(self, stretch: int) -> None:
        """A run taken from ``stretch`` showed another syncer's work: jump, unless a run of
        that stretch made this sync jump already (the sync's other workers, beside it, meet
        the same syncer's other runs)."""
        with self._lock:
            if stretch != self._stretch or not self._left:
                return
            self._left.rotate(-self._jumps.randrange(len(self._left)))
            self._stretch += 1
            self.jumps += 1
