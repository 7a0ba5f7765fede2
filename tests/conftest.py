"""Fixtures shared by the tests; the helpers themselves live in ``tests/support/``."""

from __future__ import annotations

import pytest

from support.env import child_env

#: ``browser`` and ``page`` for every module that serves a ``viewer``.
pytest_plugins = ("support.browser",)


@pytest.fixture(autouse=True)
def _private_user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, and every process it starts, keeps sync's per-user files (the copy locks
    of sync/copies.py, the store's state copies) in a folder of its own, not in the user's
    ``~/.cache``: sessions running at once on one machine never share a lock, and no test
    finds the note another test's pass left on a lock."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))


@pytest.fixture
def cli_env() -> dict[str, str]:
    return child_env()
