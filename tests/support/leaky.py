"""Credentials at the locations that once leaked, and spools holding them in clear text.

The spools are written straight through the segment writer, as an older or a foreign
producer left them (no masking at append): tests check that sync, the viewer and the
dashboard still let none of these values travel or show.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from pathlib import Path
from typing import Any

from fixtures.episodes import make_episode
from prime_runs_spool.spool.writer import SegmentWriter

#: The key a test's platform accepts; it must never be written, printed or logged.
API_KEY = "prk-live-9f8e7d6c5b4a39281706"
#: The locations that leaked before, each with its own value, in the config and in
#: every trace's resolved config.
LEAKED = {
    "client.api_key": "sk-CLIENT_API_KEY_1111",
    "client.extra_headers": "xh_EXTRA_HEADER_2222",
    "client.default_headers": "dh_DEFAULT_HEADER_3333",
    "sampling_args.extra_headers": "sa_REQUEST_HEADER_4444",
    "client.base_url userinfo": "pw_BASE_URL_PASSWORD_5555",
    "env_vars": "ev_ENV_VARS_SECRET_6666",
    "headers as a string": "hs_HEADER_STRING_7777",
}


def leaky_seat() -> dict:
    """A seat config holding a secret at each location that once leaked."""
    return {
        "client": {"type": "eval", "api_key": LEAKED["client.api_key"],
                   "base_url": f"https://svc:{LEAKED['client.base_url userinfo']}@vllm.internal/v1",
                   "extra_headers": {"X-Extra": LEAKED["client.extra_headers"]},
                   "default_headers": {"X-Default": LEAKED["client.default_headers"]}},
        "sampling_args": {"extra_headers": {"Authorization": f"Bearer {LEAKED['sampling_args.extra_headers']}"}},
        "env_vars": {"TOKEN": LEAKED["env_vars"]},
        "judge": {"headers": f"Authorization: Bearer {LEAKED['headers as a string']}"},
    }


def leaky_items(run_id: str, numbers: Iterable[int], *, salt: str = "",
                errored: Container[int] = ()) -> list[tuple[str, dict, dict[str, Any]]]:
    """Episodes ``numbers`` for ``SegmentWriter.append_many``, each trace's config holding
    :func:`leaky_seat` in clear text; those in ``errored`` failed."""
    items = []
    for number in numbers:
        episode = make_episode(number, run_id=run_id, salt=salt, ok=number not in errored)
        for trace in episode["traces"]:
            trace["agent"]["config"].update(leaky_seat())
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    return items


def leaky_episodes(run_id: str) -> list[dict]:
    """Three episodes as :func:`leaky_items` makes them, for an eval's ``log_episodes``."""
    return [episode for _, episode, _ in leaky_items(run_id, range(3))]


def write_leaky_spool(run_dir: Path, run_id: str, manifest: dict, numbers: Iterable[int], *,
                      errored: Container[int] = ()) -> None:
    """A completed one-segment spool: ``manifest`` as given, then :func:`leaky_items`."""
    writer = SegmentWriter.create(run_dir, run_id)
    writer.append("manifest", manifest)
    writer.append_many(leaky_items(run_id, numbers, errored=errored))
    writer.seal("completed")
