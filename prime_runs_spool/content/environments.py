"""A run's environments as the manifest names them (docs/manifest.md): the one reading of
that field, for the manifest's writer, sync (which creates them on the platform), the v0
create body and the viewer. Its own module so that reading it costs sync no import of the
manifest builder (TOML, masking)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def environment_list(environments: Any) -> list[Any]:
    """A run's environments as a list, whoever wrote them. A single name given as a string
    is one environment: a ``str`` is a ``Sequence[str]``, so ``list("gsm8k")`` made five
    (``g``, ``s``, ``m``, ``8``, ``k``), each then created on the platform and attached to
    the evaluation. Anything that is not a list of names (a number, a mapping, from a
    foreign producer's manifest) names none."""
    if isinstance(environments, str):
        return [environments]
    if isinstance(environments, Iterable) and not isinstance(environments, Mapping):
        return list(environments)
    return []
