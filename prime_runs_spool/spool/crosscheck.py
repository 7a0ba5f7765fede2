"""The checks between a run's segments (docs/spool-format.md, section 4.1).

A segment can be perfect on its own and still be wrong for its run: copied under another
index, taken from another run, left behind a gap, or cut short while a later segment
follows it. Each of those would read as a smaller or a bigger run, never as damage, unless
the segments are checked against each other. :class:`RunLedger` is what a reader carries
from one segment to the next to do that: a few counters and an 8-byte hash per episode id,
never a record. The reader calls it at each segment's start, header, episode and seal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prime_runs_spool.errors import CorruptSpoolError
from prime_runs_spool.plural import episodes as plural_episodes
from prime_runs_spool.spool.layout import segment_name


def _id_hash(episode_id: str) -> int:
    """An episode id as 8 bytes: what the duplicate check holds per episode (section 4.1). The
    string's own hash (64-bit SipHash, kept on the string), as unlikely to collide as a 64-bit
    digest at a tenth of its cost; the sets that hold it live only as long as one read."""
    return hash(episode_id)


def _count(value: Any) -> int | None:
    """A count field of a header or seal, or None when absent (an older writer) or not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class RunLedger:
    """What the earlier segments of a run held, to check the next one against.

    ``from_start``: the reader reads the run from its first line, so the counts and ids of
    every earlier segment are known. A reader that resumes at a recorded position only
    knows the headers it read on the way (rules 1 and 2), and counts nothing before it.
    """

    def __init__(self, *, from_start: bool = True) -> None:
        self.run_id: str | None = None
        self.last_index = 0
        #: Episode lines in the segments before the current one; None when unknown.
        self.episodes: int | None = 0 if from_start else None
        self._earlier_ids: set[int] = set()
        self._current_ids: set[int] = set()
        #: Episode lines of the current segment, and whether it is read from its start.
        self.segment_episodes = 0
        self._segment_whole = True

    def begin(self, path: Path, index: int, *, whole: bool = True) -> None:
        """A segment starts (rule 1: no index may be missing before it)."""
        expected = self.last_index + 1
        self.last_index = index
        self.segment_episodes = 0
        self._segment_whole = whole
        if not whole:
            self.episodes = None
        if index != expected:
            missing = segment_name(expected) if index > expected else None
            self.episodes = None
            raise CorruptSpoolError(
                path, 0, f"segment {missing} is missing (the run's segments must be numbered 1, 2, 3...)"
                if missing else f"segment index {index} out of order")

    def header(self, path: Path, index: int, data: dict[str, Any]) -> None:
        """Rule 2: the header names this run, and the index in its file name."""
        run_id = data.get("run_id")
        if self.run_id is None:
            self.run_id = run_id if isinstance(run_id, str) else None
        elif run_id != self.run_id:
            self.episodes = None
            raise CorruptSpoolError(path, 0, f"the header names run {run_id!r}, but this run is {self.run_id!r}")
        if data.get("segment_index") != index:
            self.episodes = None
            raise CorruptSpoolError(
                path, 0, f"the header says segment {data.get('segment_index')!r} but the file is named "
                f"{segment_name(index)}: a segment copied or renamed")

    def prior(self, path: Path, data: dict[str, Any]) -> None:
        """The first half of rule 3: a header's ``prior_episodes`` is what the earlier
        segments hold (checked only when every earlier episode line was counted)."""
        prior = _count(data.get("prior_episodes"))
        if prior is not None and self.episodes is not None and prior != self.episodes:
            found = self.episodes
            self.episodes = None
            raise CorruptSpoolError(
                path, 0, f"the header says the earlier segments hold {plural_episodes(prior)}, but they hold "
                f"{found}: an earlier segment was truncated or lost lines")

    def episode(self, path: Path, offset: int, meta: dict[str, Any] | None) -> None:
        """Rule 4: an episode id an earlier segment holds is a copy."""
        self.segment_episodes += 1
        episode_id = (meta or {}).get("episode_id")
        if episode_id is None:
            return
        key = _id_hash(str(episode_id))
        if key in self._earlier_ids:
            self.episodes = None
            raise CorruptSpoolError(
                path, offset, f"episode {episode_id!r} is already in an earlier segment of this run")
        self._current_ids.add(key)

    def seal(self, path: Path, offset: int, seq: int, data: Any) -> None:
        """The second half of rule 3: a seal agrees with what its segment and run hold."""
        if not isinstance(data, dict) or not self._segment_whole:
            return
        last_seq, episodes = _count(data.get("last_seq")), _count(data.get("episodes"))
        problem = None
        if last_seq is not None and last_seq != seq - 1:
            problem = f"the seal says the line before it is seq {last_seq}, but it is seq {seq - 1}"
        elif episodes is not None and episodes != self.segment_episodes:
            problem = f"the seal counts {plural_episodes(episodes)} in its segment, but it holds {self.segment_episodes}"
        else:
            run_episodes = _count(data.get("run_episodes"))
            total = None if self.episodes is None else self.episodes + self.segment_episodes
            if run_episodes is not None and total is not None and run_episodes != total:
                problem = (f"the seal counts {plural_episodes(run_episodes)} in the run so far, but the segments "
                           f"hold {total}: an earlier segment was truncated or lost lines")
        if problem is not None:
            self.episodes = None
            raise CorruptSpoolError(path, offset, problem)

    def end(self) -> None:
        """The current segment ended cleanly (end of file, torn tail or seal)."""
        if self.episodes is not None:
            self.episodes += self.segment_episodes
        self._earlier_ids |= self._current_ids
        self._current_ids = set()

    def lost(self) -> None:
        """The current segment lost lines (a resynchronizing reader read past damage): its
        counts, and the run's from here on, are no longer known, so they stop being checked;
        the ids and the identity checks go on."""
        self.episodes = None
        self._segment_whole = False

    def damaged(self) -> None:
        """The current segment is corrupt: what it held is unknown, so counts stop being checked.

        Its ids seen before the damage still count as earlier ones: they are on disk.
        """
        self.episodes = None
        self._earlier_ids |= self._current_ids
        self._current_ids = set()
