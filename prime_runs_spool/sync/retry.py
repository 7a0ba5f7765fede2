"""How long to wait before trying again: exponential backoff with full jitter and a cap.

Jitter keeps many syncs (``--jobs``, CI matrices) from hammering a recovering platform in
lockstep; ``Retry-After`` from the platform wins when it asks for longer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    #: Consecutive failures of one operation before the run gives up (its state is saved;
    #: the next sync carries on).
    max_attempts: int = 10
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """The wait before retry number ``attempt`` (1 for the first retry)."""
        ceiling = min(self.cap, self.base * (2 ** (attempt - 1)))
        wait = self.rng.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.cap * 4))
        return wait
