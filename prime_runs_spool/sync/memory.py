"""Give large freed buffers back to the system at once, for a sync process.

A sync holds request bodies of up to 25 MiB, built on read-ahead threads and freed after
each request. glibc's malloc raises its mmap threshold to the size of the largest block
freed, so after the first 25 MiB body the next ones come from per-thread arenas instead,
and freed arena memory stays with the process: ``--jobs 4`` over four large runs peaked at
262 MB that way, against 111 MB with the threshold fixed at 1 MiB (Nov 29,
benchmarks/sync_memory.py).
Fixing the threshold turns that adjustment off, so every block of 1 MiB or more is mapped
on its own and unmapped when freed.

Smaller blocks, the pieces a request body is laid out in (sync/rows.py, ``Batch``), come
from one arena shared by every thread: a piece is made on a run's read-ahead thread and freed
on its sending thread, which gives it back to the arena it came from, so with an arena per
thread each of ``--jobs 4``'s runs kept its own bodies' worth of freed pieces (150 MB peak,
against 93 MB with one arena). Sharing one costs no waiting: Python allocates under the GIL.

It changes the allocator of the whole process, so the ``prime-runs sync`` command calls it
(the process is ours) and the library never does on its own. Elsewhere than glibc it does
nothing.
"""

from __future__ import annotations

import ctypes

#: mallopt's parameter numbers for the mmap threshold and the most arenas (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

#: Blocks at least this large are mapped on their own and unmapped when freed.
LARGE_BLOCK = 1 << 20


def return_large_blocks_promptly(threshold: int = LARGE_BLOCK) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes, and its arenas at one; True if the
    C library took the threshold."""
    try:
        # The process's own symbols, the C library's among them. Not find_library("c"):
        # with ctypes.util it costs about 7 ms (it runs ldconfig in a child process), which
        # every sync, even one with nothing to send, paid at start.
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # no mallopt here (macOS, Windows)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    mallopt(_M_ARENA_MAX, 1)
    return mallopt(_M_MMAP_THRESHOLD, threshold) == 1
