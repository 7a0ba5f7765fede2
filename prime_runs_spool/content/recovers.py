"""Which cut a segment the importer added to a damaged spool makes good.

A segment cut short (a bad disk, a truncated artifact) loses the episodes past the cut, and
no damaged line is left to name them. When verifiers' ``traces.jsonl`` still holds them,
the importer spools them in a new segment after the run's last one (importer/outputs.py),
and that segment's manifest names the cut: ``"recovers": {"segment": N, "offset": B}``,
where the damaged segment's lines end (docs/manifest.md).

Why sync needs it: those episodes are copies of lines that were once in the damaged segment.
A sync whose cursor had passed the cut read them there, before the cut, and shipped them; it
must not ship the copies too. The cut's position is what tells (sync/recover.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

#: The manifest key of a segment that holds episodes a cut lost, naming that cut.
RECOVERS_KEY = "recovers"


class Cut(NamedTuple):
    """Where a damaged segment's readable lines end: what a recovering segment makes good."""

    segment: int
    offset: int

    def as_manifest(self) -> dict[str, int]:
        return {"segment": self.segment, "offset": self.offset}


def cuts_recovered(manifests: Iterable[object]) -> list[Cut]:
    """The cuts the run's segment manifests name, in segment order (a malformed entry,
    which no writer makes, is none)."""
    found: list[Cut] = []
    for manifest in manifests:
        entry = manifest.get(RECOVERS_KEY) if isinstance(manifest, dict) else None
        if isinstance(entry, dict):
            segment, offset = entry.get("segment"), entry.get("offset")
            if type(segment) is int and type(offset) is int and segment > 0 and offset >= 0:
                found.append(Cut(segment, offset))
    return found
