"""What each run status means, in one sentence a reader of a page understands.

The statuses themselves are the spool's (``spool/format.py``: those a seal records and
those ``spool/scan.py`` derives); the viewer adds its own for eval outputs with no spool
(``plain.py``), for a Prime Traces run with no evaluation (``traces_runs.py``) and for a
run it cannot read (``index.py``). A page shows the sentence beside the status, so nobody
has to look up what ``torn`` means.
"""

from __future__ import annotations

from prime_runs_spool.spool.format import CANCELLED, COMPLETED, CORRUPT, CRASHED, FAILED, LIVE, TORN
from prime_runs_spool.viewer.index import UNREADABLE
from prime_runs_spool.viewer.plain import NOT_SPOOLED
from prime_runs_spool.viewer.traces_runs import UPLOADED

MEANINGS = {
    LIVE: "A writer is still appending to this run: what is shown grows as it does.",
    COMPLETED: "The eval ran to its end and sealed the run: every episode it logged is here.",
    FAILED: "The eval stopped on an error of its own and sealed the run as failed: "
            "the episodes logged before the error are here.",
    CANCELLED: "The eval was interrupted (Ctrl-C, a signal) and sealed the run as cancelled: "
               "the episodes logged before that are here; a resume continues it.",
    CRASHED: "The writer died between two lines without sealing the run (killed, out of memory, "
             "power lost): every episode it logged is intact; a resume continues it.",
    TORN: "The writer died in the middle of a line: that last line is cut off and not an episode; "
          "every line before it is intact.",
    CORRUPT: "Bytes that were written and checksummed have changed since: the run is shown up to "
             "the damage, whose place and reason are given.",
    NOT_SPOOLED: "Eval outputs with no spool: shown read-only as the eval wrote them; importing "
                 "them makes the spool that sync ships.",
    UPLOADED: "Episodes this platform's Prime Traces service holds under a run id no evaluation "
              "names (uploaded by another client than sync): Prime Traces keeps no status of its own.",
    UNREADABLE: "This run cannot be read at all (the reason is given), for example a spool "
                "written by a newer version.",
}


def meaning(status: str) -> str | None:
    """The sentence for ``status``; None for one this module does not know (a platform's)."""
    return MEANINGS.get(status)
