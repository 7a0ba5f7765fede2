"""Instructions per call of one piece of the append path, counted by valgrind: warm, exact.

Run: ``PYTHONHASHSEED=0 python3 benchmarks/log_episodes_pieces.py 'EXPRESSION' [...]`` (needs valgrind;
about 10 s a piece)

``log_episodes_instructions.py`` counts a whole append; this counts one piece of it, to see
what a change to that piece saves. Each expression is evaluated with ``e`` bound to one of
200 of log_episodes.py's episodes (the reference record padded to 25 KB, ids changed),
over all 200, 12 times and 2 times, each under ``valgrind --tool=cachegrind
--cache-sim=no``; the difference over the 2,000 calls between is one call's instructions,
start-up, imports and building the episodes cancelled out, the loop and the call (``pass``:
about 0.5k) included. The expression sees ``run`` (an open run whose fdatasync is a no-op; a
log_episodes needs a fresh ``e["id"] = str(next(counter))`` first, or it is skipped as a
duplicate), ``rules`` (the episode rules, their memo warmed by the first pass), the
modules ``admission``, ``summary``, ``episodes``, ``masking``, ``mask_fragments``, ``format``, ``writer``, ``durable_file``, and ``orjson``,
``os``, ``payload`` and ``rest`` (one episode's, for the writer's pieces). Examples:

    'summary.read_episode(e)'
    'admission.prepare_episode(e, rules, e["id"])'
    'format.frame_line(payload, 5, rest)'
    'e["id"] = str(next(counter)); run.log_episodes([e])'

Set ``PYTHONHASHSEED`` (0): the hash seed moves a figure by a thousand or two between runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _instructions import bench_episodes  # noqa: E402
from _instructions import instructions as count_instructions  # noqa: E402
EPISODES = 200
FEW, MANY = 2, 12


def run_piece(expression: str, passes: int) -> None:
    sys.path.insert(0, str(ROOT))
    import gc

    import orjson

    from prime_runs_spool import open_run
    from prime_runs_spool.content import episodes, mask_fragments, masking, summary
    from prime_runs_spool.content.masking import MaskRules
    from prime_runs_spool.runner import admission
    from prime_runs_spool.spool import durable_file, format, writer

    durable_file._fdatasync = lambda fd: None
    durable_file._RWF_DSYNC = 0  # writers write, then call the no-op sync (no synced pwritev)
    pool = bench_episodes(EPISODES)
    gc.collect()
    gc.freeze()
    folder = Path(tempfile.mkdtemp(prefix="log-episodes-pieces-"))
    try:
        run = open_run(folder / "run", name="bench", model="m", environments=["gsm8k"])
        names = dict(run=run, counter=iter(range(10**12)), rules=MaskRules.defaults_for_episode(),
                     admission=admission, summary=summary, episodes=episodes, masking=masking,
                     mask_fragments=mask_fragments, format=format,
                     writer=writer,
                     durable_file=durable_file,
                     orjson=orjson, os=os, payload=format.prepare(pool[0]), rest=format.episode_rest("x", 1))
        exec(f"def piece(e):\n    {expression}\n", names)
        piece = names["piece"]
        for _ in range(passes):
            for episode in pool:
                piece(episode)
        run.finish()
    finally:
        shutil.rmtree(folder)


def instructions(expression: str, passes: int) -> int:
    return count_instructions(__file__, ["--passes", str(passes), expression])


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--passes":
        run_piece(args[2], int(args[1]))
        return
    if not args:
        raise SystemExit(__doc__)
    for expression in args:
        per_call = (instructions(expression, MANY) - instructions(expression, FEW)) / ((MANY - FEW) * EPISODES)
        print(f"{per_call / 1000:8.1f}k  {expression}")


if __name__ == "__main__":
    main()
