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


#: The longest environment name sync sends (characters). Environment ids are short
#: (``owner/name``); a name of 100 KB made the evaluations listing's URL too long for the
#: HTTP client ("internal error: InvalidURL"), and no platform keeps such a name.
MAX_ENVIRONMENT_NAME_CHARS = 256


def environment_problem(environments: Any) -> str | None:
    """Why the names :func:`environment_list` reads from ``environments`` cannot be sent
    (one that is not a string, or longer than :data:`MAX_ENVIRONMENT_NAME_CHARS`), or None."""
    for name in environment_list(environments):
        if name is None or name == "":
            continue  # no name: passed over, as sync always did
        if not isinstance(name, str):
            return f"an environment name is {type(name).__name__} {str(name)[:40]!r}, not a string"
        if len(name) > MAX_ENVIRONMENT_NAME_CHARS:
            return (f"the environment name {name[:40]!r}... is {len(name):,} characters, over the "
                    f"limit of {MAX_ENVIRONMENT_NAME_CHARS}")
    return None
