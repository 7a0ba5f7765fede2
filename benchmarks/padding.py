"""What writing into padding saves the disk: the bare loop appending to a growing file
against the same loop writing into NUL padding written ahead (docs/spool-format.md,
section 5), with nothing of the spool in either.

Run: ``python3 benchmarks/padding.py [--rounds 5] [--seconds 2] [--dir DIR] [--size 25600]``

Both loops write the same bytes (``--size``, default 25 KB, about a realistic episode) and
fdatasync after each write; they take turns in blocks of 8 (benchmarks/append.py
``interleaved``), so both see the same disk. The padded loop writes ``PADDING_BYTES`` of
NUL bytes after its line whenever a line passes the padding's end, before that line's
fdatasync, exactly as ``DurableFile._pad`` does, so its figure includes writing the
padding. On ext4 the appending loop's every fdatasync also commits the journal (the file's
new size); the padded loop's do so once per ``PADDING_BYTES``. Run with ``--dir`` on the
disk you care about: on a tmpfs both are memory copies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from append import FLAGS, interleaved  # noqa: E402
from prime_runs_spool.spool.format import PADDING_BYTES  # noqa: E402


def appending(fd: int, line: bytes) -> Callable[[], bool]:
    def step() -> bool:
        os.write(fd, line)
        os.fdatasync(fd)
        return True

    return step


def padded(fd: int, line: bytes) -> Callable[[], bool]:
    zeros = bytes(PADDING_BYTES)
    ends = [0, 0]  # where the lines end, where the padding ends

    def step() -> bool:
        os.pwrite(fd, line, ends[0])
        ends[0] += len(line)
        if ends[0] > ends[1]:
            ends[1] = ends[0] + os.pwrite(fd, zeros, ends[0])
        os.fdatasync(fd)
        return True

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=".", help="where to put the scratch folder (default: current directory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per loop per round")
    parser.add_argument("--size", type=int, default=25_600, help="bytes per write, line feed included")
    args = parser.parse_args()
    line = b"x" * (args.size - 1) + b"\n"
    folder = Path(tempfile.mkdtemp(prefix="padding-bench-", dir=args.dir))
    pairs = []
    try:
        for n in range(args.rounds):
            fds = [os.open(folder / f"appending-{n}", FLAGS, 0o600),
                   os.open(folder / f"padded-{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)]
            try:
                pairs.append(interleaved(appending(fds[0], line), padded(fds[1], line), args.seconds))
            finally:
                for fd in fds:
                    os.close(fd)
                for name in (f"appending-{n}", f"padded-{n}"):
                    os.unlink(folder / name)
            print(f"  round {n + 1}: appending {pairs[-1][0]:.0f}/s, padded {pairs[-1][1]:.0f}/s, "
                  f"ratio {pairs[-1][1] / pairs[-1][0]:.2f}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratios = [p / a for a, p in pairs]
    print(f"{args.size} B writes, each fdatasync'd, {args.rounds} rounds of {args.seconds:g} s per loop: "
          f"appending {statistics.median(a for a, _ in pairs):.0f}/s, "
          f"padded {statistics.median(p for _, p in pairs):.0f}/s, "
          f"padded / appending {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
