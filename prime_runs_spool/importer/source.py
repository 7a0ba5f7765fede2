"""One eval output folder, read as the run it records: identity, config, episodes, ending.

The importer (``importer/outputs.py``) writes whatever a :class:`SourceRun` says
through ``open_run``, so both layouts reach the spool exactly as a live run would have
written them. This module reads verifiers 0.4.0's layout; ``importer/v0_layout.py`` the
older one.

verifiers 0.4.0, per run directory: the episodes in ``traces.jsonl`` (each carries its
run's id as ``run.id``), the resolved config in ``configs/resolved/<cli>.json`` (the
name, model and environment come from it), the launch file in ``configs/<cli>.toml``, and
the attempts' logs (``importer/outcome.py`` reads how the run ended from them).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_runs_spool.content.manifest import recordable_count
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.errors import ImportSourceError
from prime_runs_spool.files import read_regular_file
from prime_runs_spool.importer.outcome import Outcome, v040_outcome
from prime_runs_spool.importer.paths import launch_file_paths, resolved_config_paths
from prime_runs_spool.importer.traces_file import iter_episodes, scan_traces

#: ``layout`` values.
VERIFIERS_040 = "verifiers-0.4"
V0 = "v0"


@dataclass
class SourceRun:
    """What the importer needs of one eval output folder (episodes are streamed)."""

    path: Path
    layout: str
    run_id: str | None
    name: str
    model: str | None
    environments: list[str]
    config: dict[str, Any] | None
    config_file: Path | None
    num_examples: int | None
    rollouts_per_example: int | None
    created_at: str | None
    #: Episode ids in source order.
    ids: list[str]
    episodes: Callable[[], Iterator[dict[str, Any]]]
    outcome: Outcome
    #: Bytes of the episode file that were checked (the import mark records them).
    size: int
    #: Every distinct run id on the episodes, in file order (content/platform_runs.py says
    #: which of them name a platform's run).
    run_ids: list[str] = field(default_factory=list)


def read_v040(output_dir: Path) -> SourceRun:
    """Read a verifiers 0.4.0 run directory; raises :class:`ImportSourceError` subclasses."""
    scan = scan_traces(verifiers_traces_path(output_dir))
    config = resolved_config(output_dir)
    identity = config_identity(config)
    outcome = v040_outcome(output_dir, scan.per_task, torn=bool(scan.torn_bytes))
    rollouts = config.get("num_rollouts")
    launch = launch_file_paths(output_dir)
    return SourceRun(
        path=output_dir,
        layout=VERIFIERS_040,
        run_id=scan.run_id,
        name=identity.name or scan.run_name or output_dir.name,
        model=identity.model,
        environments=identity.environments,
        config=config or None,
        config_file=launch[0] if len(launch) == 1 else None,
        num_examples=recordable_count("num_examples", outcome.tasks),
        rollouts_per_example=(recordable_count("rollouts_per_example", rollouts)
                              or recordable_count("rollouts_per_example", outcome.rollouts)),
        created_at=_iso(scan.started_at),
        ids=scan.ids,
        episodes=lambda: iter_episodes(scan),
        outcome=outcome,
        size=scan.end,
        run_ids=scan.run_ids,
    )


def unreadable_json(path: Path, exc: Exception) -> ImportSourceError:
    """The error for a JSON file of the outputs that cannot be read: why, as the system says
    it ("not a regular file", "Permission denied"), not only the exception's type."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
    return ImportSourceError(f"{path}: cannot be read as JSON ({why}); nothing of this run was imported")


@dataclass
class ConfigIdentity:
    """What a resolved config names: the run's name (None: the config names none), model
    and environment. Read without the episodes, so a viewer can list a run as cheaply as it
    lists a spool's manifest."""

    name: str | None
    model: str | None
    environments: list[str]


def config_identity(config: dict[str, Any]) -> ConfigIdentity:
    run = config.get("run") if isinstance(config.get("run"), dict) else {}
    env = config.get("env") if isinstance(config.get("env"), dict) else {}
    taskset = env.get("taskset") if isinstance(env.get("taskset"), dict) else {}
    return ConfigIdentity(name=str(run["name"]) if run.get("name") else None,
                          model=config.get("model") if isinstance(config.get("model"), str) else None,
                          environments=[str(v) for v in (taskset.get("id"), env.get("id")) if v][:1])


def resolved_config(output_dir: Path) -> dict[str, Any]:
    """The run's resolved config (``configs/resolved/<cli>.json``), ``{}`` when there is none."""
    paths = resolved_config_paths(output_dir)
    if not paths:
        return {}
    try:
        value = json.loads(read_regular_file(paths[0]).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise unreadable_json(paths[0], exc) from None
    return value if isinstance(value, dict) else {}


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat().replace("+00:00", "Z")
