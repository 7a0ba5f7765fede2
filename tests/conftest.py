"""Fixtures shared by the tests; the helpers themselves live in ``tests/support/``."""

from __future__ import annotations

import os

import pytest

from support.env import child_env


@pytest.fixture(autouse=True, scope="session")
def _private_user_cache(tmp_path_factory: pytest.TempPathFactory):
    """Every test, and every process it starts, keeps sync's per-user files (the copy locks
    of sync/copies.py, the store's state copies) in a folder of this session, not in the
    user's ``~/.cache``: sessions running at once on one machine never share a lock."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture
def cli_env() -> dict[str, str]:
    return child_env()
