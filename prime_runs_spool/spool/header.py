"""A segment's header line, read alone (docs/spool-format.md, section 3, "header").

The header is a segment's first line and never changes once written, so a reader that needs
one of its fields (whose writer it was, the run's id, the segment's id) reads that line and
nothing else. One function, so what counts as a header read this way (a whole line within
``HEADER_READ_LIMIT``, intact, of type ``header``, holding an object) is decided in one
place by the writer's liveness check, a resume and the viewer alike.
"""

from __future__ import annotations

import os
from typing import Any

from prime_runs_spool.spool.format import HEADER, HEADER_READ_LIMIT, parse_line


def read_header(segment: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed header of a segment, or None when it has no intact header (yet: a writer
    that died before its header was durable leaves it empty or cut short). An ``OSError``
    opening or reading the file is raised: whether an unreadable segment means "no header"
    is the caller's to say."""
    with open(segment, "rb") as f:
        first = f.readline(HEADER_READ_LIMIT)
    parsed = parse_line(first) if first.endswith(b"\n") else None
    if parsed is None or parsed.type != HEADER or not isinstance(parsed.data, dict):
        return None
    return parsed.data
