"""The static export's file names: one file per page, never two pages in one file
(docs/viewer.md, "Export").

A run's example ids often share a long prefix (``dataset/split/item-000123``): names cut to
a prefix plus a 32-bit hash collided from about 65,000 examples on, and the second group
page overwrote the first. Names now spell the key out (or carry its whole SHA-256 when it
is long): different keys, different names, also on a disk that ignores case.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from fixtures.episodes import make_episode
from prime_runs_spool import open_run
from prime_runs_spool.viewer.render import ExportLinks, file_slug
from support.env import CLI, child_env

#: 40 characters: every example id below shares them, as the old names' readable part.
PREFIX = "dataset-split-with-a-long-shared-prefix-"


def _old_name_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _two_ids_the_old_names_merged() -> tuple[str, str]:
    """Two example ids sharing :data:`PREFIX` whose 32-bit hashes are equal (a birthday
    search: about 77,000 ids on average)."""
    seen: dict[str, str] = {}
    for n in itertools.count():
        example = f"{PREFIX}{n:07d}"
        found = seen.setdefault(_old_name_hash(example), example)
        if found != example:
            return found, example
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_two_examples_whose_old_names_collided_get_a_page_each(tmp_path: Path) -> None:
    first, second = _two_ids_the_old_names_merged()
    run_dir = tmp_path / "runs" / "shared-prefix"
    with open_run(run_dir, name="shared-prefix", environments=["gsm8k"]) as run:
        for number, example in enumerate((first, second)):
            episode = make_episode(number, run_id=run.id)
            episode["traces"][0]["task"]["data"]["idx"] = example
            run.log_episodes([episode])
        run.finish()
    out = tmp_path / "export"
    done = subprocess.run(CLI + ["view", str(tmp_path / "runs"), "--export", str(out)], capture_output=True,
                          text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    groups = sorted(out.glob("group-*.html"))
    assert len(groups) == 2, [path.name for path in groups]
    shown = [re.findall(re.escape(PREFIX) + r"\d{7}", path.read_text()) for path in groups]
    assert sorted(set(ids) for ids in shown) == sorted([{first}, {second}])  # each page its own example


_KEYS = st.one_of(st.text(max_size=60), st.text("aA-_.~+/0", max_size=12), st.text(min_size=100, max_size=300))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(a=_KEYS, b=_KEYS)
def test_different_keys_never_share_a_name_even_ignoring_case(a: str, b: str) -> None:
    for key in (a, b):
        slug = file_slug(key)
        assert re.fullmatch(r"[a-z0-9._~\-]*", slug) and len(slug) <= 105, slug
    if a != b:
        assert file_slug(a).lower() != file_slug(b).lower()


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(first=st.tuples(_KEYS, _KEYS), second=st.tuples(_KEYS, _KEYS), pages=st.tuples(st.integers(1, 99), st.integers(1, 99)))
def test_every_page_of_an_export_has_a_name_of_its_own(first, second, pages) -> None:
    """Run, episode and group pages of any two runs and examples: equal names only for the
    same page, and each name short enough for a file system (255 bytes)."""
    links = ExportLinks()

    def names(run: str, example: str, n: int) -> list[str]:
        return [links.run(run, {"page": str(n)}), links.episode(run, n), links.group(run, example)]

    a, b = names(*first, pages[0]), names(*second, pages[1])
    for name in a + b:
        assert len(name.encode()) <= 255 and "/" not in name, name
    for x, y in zip(a, b):
        same_page = (first[0], pages[0]) == (second[0], pages[1]) if x.startswith(("run-", "episode-")) \
            else first == second
        assert (x.lower() == y.lower()) == same_page, (x, y)
    assert len(set(a)) == 3
