"""Fixtures shared by the tests; the helpers themselves live in ``tests/support/``."""

from __future__ import annotations

import pytest

from support.env import child_env


@pytest.fixture
def cli_env() -> dict[str, str]:
    return child_env()
