"""Location names as users write them: masking matches them in any spelling (docs/masking.md)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


@st.composite
def spelled(draw: Any, name: str) -> str:
    """``name`` with each letter in either case and its words joined by ``_``, ``-`` or
    nothing (``extra_headers``: ``Extra-Headers``, ``eXtRaheaders``, ``EXTRA_HEADERS``)."""
    joiner = draw(st.sampled_from(["_", "-", ""]))
    return joiner.join("".join(c.upper() if draw(st.booleans()) else c for c in word) for word in name.split("_"))
