"""A segment copied line by line, some records' data replaced and their lines framed anew.

Why: a copy of a spool that must not hold some of what the spool holds (``prime-runs
mirror`` of a spool written under older masking rules) has to be a spool itself, which the
reader, ``verify`` and sync accept as they accept the original: one line per record, the
same sequence numbers, types and meta, each line checksummed. Only the record data that
the caller changes is serialized again; every other line is copied byte for byte.

The copy of a segment's first ``n`` bytes is a prefix of the copy of its first ``m > n``
bytes, whenever ``change`` gives the same answer for the same record: each line is copied
or framed on its own, nothing in a line depends on the lines around it. So a copy made
again as its source grows only ever grows, and a reader of the older copy (sync's cursor,
an offset into it) finds every byte it read where it was.

The records are the reader's (``reader.walk_segment``, one line held at a time, whatever the
segment's size): damage the reader refuses is refused here, and a torn tail, which the reader
reads as the end, ends the copy.
"""

from __future__ import annotations

import os
from contextlib import closing
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from prime_runs_spool.spool.format import HEADER_READ_LIMIT, framing_rest, frame_line, prepare
from prime_runs_spool.spool.reader import Record, SegmentState, walk_segment

#: Given one record, the data its copy holds: the record's own ``data`` object (the same
#: object, ``is``) to copy its line as it is, else the data to frame a new line around.
RecordChange = Callable[[Record], Any]


def rewrite_segment(source: Path, index: int, size: int, out: IO[bytes], change: RecordChange) -> int:
    """Write into ``out`` the copy of ``source``'s lines that end within its first ``size``
    bytes, each record's data as ``change`` gives it; return the bytes written. Raises the
    reader's ``CorruptSpoolError`` for damage within them (nothing after a damaged line can
    be told to be what its writer wrote, so no copy of it is made)."""
    with open(source, "rb") as raw:
        header = raw.readline(HEADER_READ_LIMIT)
        if not header.endswith(b"\n") or len(header) > size:
            return 0  # no complete header within size yet: nothing to copy
        out.write(header)  # the walk checks it before anything else: a damaged one raises
        written = len(header)
        with closing(walk_segment(source, index, SegmentState())) as records:
            for record in records:
                if not isinstance(record, Record) or record.end_offset > size:
                    break
                data = change(record)
                if data is record.data:
                    line = os.pread(raw.fileno(), record.end_offset - record.offset, record.offset)
                    parts: tuple[bytes, ...] = (line,)
                else:
                    parts = frame_line(prepare(data, f"the {record.type} record at byte {record.offset} of {source}"),
                                       record.seq, framing_rest(record.type, record.meta))
                for part in parts:
                    out.write(part)
                    written += len(part)
    return written
