"""Reading on after damage, and what a damaged stretch reports (docs/spool-format.md,
section 4.2).

A resynchronizing read passes over damaged lines instead of stopping at the first one.
What it passed over is reported as a :class:`Damage`: where, how many bytes, why, and
which records it cost, with the episode ids still legible in a damaged line (a hint to
find the episode elsewhere, never trusted on its own). Kept apart from the reader so the
walk over a segment's lines says only where damage is, not how it is described.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from prime_runs_spool.errors import corruption_message
from prime_runs_spool.plural import count, plural
from prime_runs_spool.spool.format import parse_line


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes of a segment a resynchronizing reader passed over (docs/spool-format.md,
    section 4.2): complete lines that fail their checks, merged while no intact line comes
    between them, or lines missing between two intact ones (``length`` 0). ``lost`` is how
    many records the stretch held, from the sequence numbers around it (None when no
    intact line of the segment follows it); ``first_seq`` the first of them;
    ``episode_ids`` the ids still legible in a damaged line's meta (for the report, and to
    find the episode elsewhere), never trusted on their own."""

    segment_index: int
    path: Path
    offset: int
    length: int
    reason: str
    first_seq: int | None = None
    lost: int | None = None
    episode_ids: tuple[str, ...] = ()
    #: The rollout numbers legible beside ``episode_ids``, in the same order.
    rollout_numbers: tuple[int | None, ...] = ()

    @property
    def end_offset(self) -> int:
        return self.offset + self.length

    def message(self) -> str:
        """One line: where, how many bytes, why, and which records it cost."""
        what = f"{self.reason} ({count(self.length, 'byte')}"
        if self.lost is None:
            what += "; how many records they held is unknown: no intact line of the segment follows"
        elif self.lost:
            seqs = f"seq {self.first_seq}" if self.lost == 1 else f"seq {self.first_seq}-{self.first_seq + self.lost - 1}"
            what += f"; {count(self.lost, 'record')} lost: {seqs}"
        if self.episode_ids:
            what += f"; {plural(len(self.episode_ids), 'episode id')} legible in {plural(self.length, 'it', 'them')}: {', '.join(self.episode_ids)}"
        return corruption_message(self.path, self.offset, what + ")")

    def as_dict(self) -> dict[str, Any]:
        return {"segment": self.segment_index, "offset": self.offset, "length": self.length, "reason": self.reason,
                "first_seq": self.first_seq, "lost": self.lost, "episode_ids": list(self.episode_ids)}


#: Where a damaged line's meta is looked for: the end of the line, before its trailer.
_LEGIBLE_TAIL = 4096
_LEGIBLE_META = re.compile(
    rb',"type":"episode","meta":(\{"episode_id":(?:null|"(?:[^"\\\n]|\\.){0,1024}"),"rollout_number":(?:null|\d{1,20})\})'
    rb',"crc":"[0-9a-f]{8}"\}\n\Z')
#: How a line starts; a damaged line is searched for it, to find an intact line glued to it.
_LINE_START = b'{"data":'
#: At most this many places in one damaged line are tried as the start of a glued line.
_GLUED_TRIES = 16


def _legible_meta(raw: bytes) -> tuple[str, int | None] | None:
    """The episode id and rollout number a damaged episode line's meta still shows, if its
    end is whole; unverified (the checksum failed): a hint to look the episode up by."""
    match = _LEGIBLE_META.search(raw[-_LEGIBLE_TAIL:])
    if match is None:
        return None
    try:
        meta = orjson.loads(match.group(1))
    except orjson.JSONDecodeError:
        return None
    episode_id, rollout = meta.get("episode_id"), meta.get("rollout_number")
    return (episode_id, rollout) if isinstance(episode_id, str) else None


def glued_line(raw: bytes) -> int:
    """Where an intact line starts inside the damaged line ``raw`` (0: nowhere): a line
    whose line feed was damaged is glued to the next one, which is itself intact."""
    at = 0
    for _ in range(_GLUED_TRIES):
        at = raw.find(_LINE_START, at + 1)
        if at < 0:
            return 0
        if parse_line(raw[at:]) is not None:
            return at
    return 0


@dataclass
class PendingDamage:
    """Damaged lines not yet closed by an intact one."""

    offset: int
    end: int
    reason: str
    first_seq: int
    ids: list[str] = field(default_factory=list)
    rollouts: list[int | None] = field(default_factory=list)

    def add(self, end: int, raw: bytes | None) -> None:
        self.end = end
        meta = _legible_meta(raw) if raw else None
        if meta is not None:
            self.ids.append(meta[0])
            self.rollouts.append(meta[1])
