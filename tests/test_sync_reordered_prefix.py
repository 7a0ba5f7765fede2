"""One run written by two spools that log its first episodes in different orders: an import
of outputs plain vf-eval wrote (synced first), and the spool ``prime-runs eval --resume``
started for the same run, which logs the episodes verifiers kept in the order its resume
rewrote them, grouped by task, then the new ones (docs/sync.md, "Runs continued by plain
vf-eval"; tests/test_vf_eval_mixed.py does it with the real vf-eval).

The evaluation holds the first spool's rows in its order; the second's first rows are the
same episodes in another order. Sync takes them as the same rows (a multiset of sample ids,
``sync/reconcile.py``) and pushes only the rest, exactly once through SIGKILLs; a prefix
holding a different episode is still refused, with nothing sent.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.episodes import make_episode
from prime_runs_spool.content.episodes import RolloutCounter
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.sync.reconcile import rows_in_pages, same_rows
from support.env import child_env
from support.runs import manifest_for
from support.sync_e2e import (  # noqa: F401
    TOKEN, api, evaluations_of, kill_syncs_at_random, run_sync, sample_ids, server, sync_cmd,
)

SALT = "reordered"
_RULES = MaskRules.defaults_for_episode()


def write_spool(run_dir: Path, run_id: str, numbers: list[int], status: str) -> list[str]:
    """One segment of the run holding ``make_episode(n)`` for each of ``numbers``, in that
    order, numbered and masked as ``open_run`` writes them; returns their ids."""
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", manifest_for(run_id))
    counter, items, ids = RolloutCounter(), [], []
    for number in numbers:
        episode = mask(make_episode(number, size=1_800, run_id=run_id, salt=f"{SALT}-{run_id}"), _RULES)
        ids.append(episode["id"])
        items.append(("episode", episode, {"episode_id": episode["id"],
                                           "rollout_number": counter.next_number(episode)}))
    writer.append_many(items)
    writer.seal(status)
    return ids


def platform_ids(api: httpx.Client, run_id: str) -> list[str]:
    [evaluation] = evaluations_of(api, run_id)
    return sample_ids(api, evaluation["evaluation_id"])


def held(api: httpx.Client, run_id: str) -> int:
    evaluations = evaluations_of(api, run_id)
    return evaluations[0]["total_samples"] if evaluations else 0


def imported_then_resumed(tmp_path: Path, api: httpx.Client, base_url: str, run_id: str, kept: int, new: int,
                          rng: random.Random, *, replace: int | None = None) -> tuple[list[str], Path]:
    """The import's spool (``kept`` episodes, Ctrl-C'd: sealed ``cancelled``) synced; then the
    resumed spool: the same episodes shuffled (``replace``: that one swapped for an episode
    of another number), then ``new`` more, sealed ``completed``. Returns the import's ids
    and the resumed spool's folder."""
    imported = write_spool(tmp_path / "imported" / "run", run_id, list(range(kept)), "cancelled")
    done = run_sync(base_url, str(tmp_path / "imported"), "--to", "samples")
    assert done.returncode == 0, done.stdout + done.stderr
    assert platform_ids(api, run_id) == imported
    prefix = list(range(kept))
    rng.shuffle(prefix)
    if replace is not None:
        prefix[prefix.index(replace)] = 10 * (kept + new)
    write_spool(tmp_path / "resumed" / "run", run_id, prefix + list(range(kept, kept + new)), "completed")
    return imported, tmp_path / "resumed"


@pytest.mark.slow
def test_a_resumed_spool_logging_the_kept_episodes_in_another_order_pushes_the_rest_once_through_sigkills(
        tmp_path: Path, server, api) -> None:
    kept, new, run_id = 24, 120, "reordered-prefix-sigkills"
    rng = random.Random(20261206)
    imported, resumed = imported_then_resumed(tmp_path, api, server.base_url, run_id, kept, new, rng)
    env = child_env(PRIME_API_KEY=TOKEN)
    cmd = sync_cmd(server.base_url, str(resumed), "--to", "samples", "--max-request-bytes", "6000")
    kill_syncs_at_random(cmd, env, lambda: held(api, run_id), 6, rng)
    final = run_sync(server.base_url, str(resumed), "--to", "samples", "--json", "--max-request-bytes", "6000")
    assert final.returncode == 0, final.stdout + final.stderr
    ids = platform_ids(api, run_id)
    expected = imported + [make_episode(n, run_id=run_id, salt=f"{SALT}-{run_id}")["id"]
                           for n in range(kept, kept + new)]
    assert ids == expected, f"{len(ids)} rows for {len(expected)} episodes"
    [evaluation] = evaluations_of(api, run_id)
    evaluation = api.get(f"/evaluations/{evaluation['evaluation_id']}").json()
    assert (evaluation["status"], evaluation["finalize_count"], evaluation["total_samples"]) == (
        "COMPLETED", 1, kept + new)
    again = run_sync(server.base_url, str(tmp_path), "--to", "samples", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(platform_ids(api, run_id)) == kept + new


@pytest.mark.slow
def test_a_resumed_spool_whose_first_episodes_differ_is_still_refused_with_nothing_sent(
        tmp_path: Path, server, api) -> None:
    kept, run_id = 6, "reordered-prefix-replaced"
    imported, resumed = imported_then_resumed(tmp_path, api, server.base_url, run_id, kept, 4, random.Random(7),
                                              replace=kept - 1)
    done = run_sync(server.base_url, str(resumed), "--to", "samples", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    [report] = json.loads(done.stdout)["runs"]
    assert report["pushed_now"] == 0 and "not the spool's in another order" in report["error"], report
    assert platform_ids(api, run_id) == imported


# -- the comparison, in isolation -----------------------------------------------------------


@given(st.lists(st.integers(0, 40), max_size=60), st.randoms(use_true_random=False))
def test_same_rows_holds_for_any_order_of_the_same_ids(ids: list[int], rng: random.Random) -> None:
    theirs = list(ids)
    rng.shuffle(theirs)
    assert same_rows(iter(ids), iter(theirs))


@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.randoms(use_true_random=False),
       st.sampled_from(["replace", "drop", "add", "repeat"]))
def test_same_rows_refuses_any_other_multiset(ids: list[int], rng: random.Random, change: str) -> None:
    theirs = list(ids)
    rng.shuffle(theirs)
    where = rng.randrange(len(theirs))
    if change == "replace":
        theirs[where] = 1_000  # an id the spool never had
    elif change == "drop":
        del theirs[where]
    elif change == "add":
        theirs.append(1_000)
    else:  # one of ours twice, another once less: the same set, not the same rows
        other = next((i for i in theirs if i != theirs[where]), None)
        if other is None:
            theirs.append(theirs[where])
        else:
            theirs[theirs.index(other)] = theirs[where]
    assert Counter(ids) != Counter(theirs)
    assert not same_rows(iter(ids), iter(theirs))


def test_an_id_that_is_none_never_matches() -> None:
    assert not same_rows(iter([None, "a"]), iter(["a", None]))


@given(st.integers(0, 450), st.integers(1, 450), st.integers(1, 450), st.sampled_from([1, 7, 100]))
def test_rows_in_pages_reads_exactly_the_rows_asked_for(held: int, first: int, span: int, limit: int) -> None:
    rows = [f"row-{n}" for n in range(1, held + 1)]
    pages: list[int] = []

    def read_page(page: int) -> list[str]:
        pages.append(page)
        return rows[(page - 1) * limit:page * limit]

    last = first + span - 1
    assert list(rows_in_pages(read_page, first, last, limit)) == rows[first - 1:last]
    assert pages == sorted(set(pages))  # each page read once, in order
    assert len(pages) <= (last - 1) // limit - (first - 1) // limit + 1
