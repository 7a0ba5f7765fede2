"""A writer process for tests/test_crash.py: appends from several threads until killed.

Prints ``<seq> <thread>-<n>`` (flushed) only after that append returned, so every line the
test reads names a record the writer reported durable.
"""

from __future__ import annotations

import sys
import threading

from prime_runs_spool import SegmentWriter
from prime_runs_spool.content.mask_locations import MASKING_VERSION


def main() -> None:
    run_dir, threads = sys.argv[1], int(sys.argv[2])
    writer = SegmentWriter.create(run_dir, "crash-run")
    writer.append("manifest", {"name": "crash", "masking_version": MASKING_VERSION})  # written as today masks
    out = threading.Lock()

    def work(t: int) -> None:
        n = 0
        while True:
            record_id = f"{writer.index}.{t}-{n}"
            seq = writer.append("episode", {"id": record_id, "pad": "z" * (50 * (n % 40))})
            with out:
                sys.stdout.write(f"{seq} {record_id}\n")
                sys.stdout.flush()
            n += 1

    workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
