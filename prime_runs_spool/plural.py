"""Counts in good English, for every message the package and its command line print:
"1 run", "2 runs", never "run(s)". One home, in the lowest layer, so that a warning the
spool or the importer writes counts the way a command's report does."""

from __future__ import annotations


def plural(number: int, singular: str, many: str | None = None) -> str:
    """The word that goes with ``number``: ``singular`` for one, else ``many`` (the singular
    and an "s" unless given): a noun ("run", "runs") or a verb ("is", "are")."""
    return singular if number == 1 else many or singular + "s"


def count(number: int, noun: str, many: str | None = None) -> str:
    """``number`` and its noun: "1 segment", "2 segments", "0 files or folders"."""
    return f"{number} {plural(number, noun, many)}"


def episodes(number: int) -> str:
    """"1 episode", "2 episodes" (spelled here in an f-string: the bare word is the spool's
    record type, which spool/format.py alone spells out)."""
    return f"{number} episode{'' if number == 1 else 's'}"
