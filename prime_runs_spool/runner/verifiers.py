"""The verifiers eval runner's side of a run, duck-typed on verifiers' ``EvalConfig``.

This gives the runner what the seed's ``utils/platform.py`` gave it, without the network:

    run = open_eval_run(config, num_examples=len(tasks), push=push, config_file=at_file)
    ... await run.log_episodes_async([episode]) as each rollout lands ...
    await asyncio.to_thread(finish_eval_run, run)      # or abort_eval_run(run, exc)

What it reads from the config (attributes, never imports): ``run.name``, ``run.dir``
(else ``run.name``), ``run.id`` (optional: the runner's own id, kept as the run id so the
episodes it stamps match the spool; verifiers 0.4.0's ``RunConfig.id`` is a property that
raises ``RuntimeError`` until an id is assigned, which counts as "no id yet"),
``run.attach`` (refused: see :func:`open_eval_run`), ``push`` (``False`` is ``--no-push``:
nothing streamed while the eval runs, the spool written all the same),
``output_dir`` (else ``outputs``), ``model``, ``env.taskset.id`` (else ``env.id``),
``num_rollouts`` (else ``rollouts_per_example``).

What it gives back: the run's id, through ``config.run.assign_id(id)`` (verifiers 0.4.0:
callable once, before the first rollout; every episode the runner stamps afterwards
carries it), else ``config.run.adopt_id(id)`` on configs that have that instead.

The run directory is ``output_dir / run.dir``: the directory verifiers already writes
the run's results and ``configs/eval.json`` to, so the spool travels with them and
``--resume`` (same directory) continues the same run. docs/integration.md explains.

The eval must never fail because of the spool's optional parts: a config that cannot be
dumped is left out of the manifest with a warning, and aborting never raises. What is not
optional is durability: a disk error while opening the run or appending an episode
surfaces, because an eval that believes its episodes are safe when they are not is the
failure this package exists to prevent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prime_runs_spool.content.platform_runs import first_run_id_in
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.errors import UnsupportedRunConfigError
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.runner.modes import DISABLED, OFFLINE, ONLINE, resolve_mode
from prime_runs_spool.runner.run import Run, open_run

_log = logging.getLogger("prime_runs_spool")

#: Where verifiers writes its outputs when the config does not say.
DEFAULT_OUTPUT_DIR = "outputs"


def eval_run_dir(config: Any) -> Path:
    """``output_dir / run.dir``: the run's own directory, beside its results."""
    run = config.run
    folder = getattr(run, "dir", None) or run.name
    return Path(getattr(config, "output_dir", None) or DEFAULT_OUTPUT_DIR) / os.fspath(folder)


def eval_mode(push: bool) -> str:
    """The mode from ``PRIME_RUNS_MODE`` (``offline`` by default), with ``--no-push``
    turning ``online`` into ``offline``.

    ``--no-push`` is verifiers' "do not send anything while the eval runs": it never turns
    the spool off, because vf-eval users pass it by habit and the spool is what keeps their
    episodes through a crash. Only ``PRIME_RUNS_MODE=disabled`` keeps the run off the disk.
    An unknown value is an error, so a typo never silently changes what is recorded.
    """
    mode = resolve_mode(None)
    return OFFLINE if not push and mode == ONLINE else mode


def open_eval_run(
    config: Any,
    *,
    num_examples: int | None,
    push: bool | None = None,
    config_file: str | os.PathLike[str] | None = None,
    supersedes: Iterable[str] | None = None,
    platform_runs: Iterable[str] | None = None,
) -> Run:
    """Open (or, under ``--resume``, continue) the run before the first rollout.

    ``num_examples`` is the number of tasks selected (``None`` or ``-1`` when unknown);
    ``push`` whether the run may stream to the platform while it runs (``None``: the
    config's own ``push``, else ``True``; ``False`` keeps an ``online`` run ``offline``,
    the spool is written either way); ``config_file`` the ``@`` file the eval was launched from, if any;
    ``supersedes`` the spool's episodes a ``--resume`` replaces (content/supersede.py);
    ``platform_runs`` the platform runs plain vf-eval already pushed the kept episodes to
    (content/platform_runs.py).

    ``run.attach`` (a hosted evaluation's existing platform run) is refused with
    :class:`UnsupportedRunConfigError`: the spool syncs into an evaluation of its own, so
    accepting it would leave the launcher's evaluation waiting forever while the user
    believes the episodes went there.
    """
    if push is None:
        push = bool(getattr(config, "push", True))
    attach = getattr(config.run, "attach", None)
    if attach:
        raise UnsupportedRunConfigError(
            f"run.attach={attach!r} is not supported: a spool syncs into an evaluation of its "
            "own, not into an existing platform run; drop run.attach (and sync the spool "
            "with prime-runs sync), or run the eval with verifiers' own vf-eval"
        )
    mode = eval_mode(push)
    run_dir = eval_run_dir(config)
    # A resumed run keeps the id its spool already holds; a new one takes the runner's.
    # (A disabled run does not even look at the disk.)
    resuming = mode != DISABLED and bool(list_segments(run_dir))
    run_id = None if resuming else (_outputs_run_id(config, mode) or _runner_run_id(config))
    run = open_run(
        run_dir,
        name=config.run.name,
        environments=_environments(config),
        model=getattr(config, "model", None),
        framework="verifiers",
        config=_config_record(config),
        config_file=config_file,
        num_examples=num_examples,
        rollouts_per_example=_first_attr(config, "num_rollouts", "rollouts_per_example"),
        run_id=run_id,
        mode=mode,
        supersedes=tuple(supersedes or ()),
        platform_runs=tuple(platform_runs or ()),
    )
    _adopt_id(config, run)
    return run


def finish_eval_run(run: Run | None, episodes: Iterable[Any] | None = None) -> dict[str, Any] | None:
    """Seal the run completed with the summary of all its episodes; returns the summary.

    ``episodes`` (optional) are logged first: ones already logged are skipped by id
    without being serialized again, so a runner that streamed every episode may still
    pass the full list, and one that streamed none loses nothing. Call it through
    ``asyncio.to_thread`` from an event loop. A disk error surfaces.
    """
    if run is None:
        return None
    if episodes is not None:
        run.log_episodes(episodes)
    return run.finish()


def abort_eval_run(run: Run | None, error: BaseException | str) -> None:
    """Seal the run failed (cancelled, "interrupted", for Ctrl-C, SIGTERM or a cancellation). Never raises."""
    if run is None:
        return
    try:
        run.abort(error)
    except Exception as exc:  # on an exit path: the eval's own error is the one to show
        _log.warning("run %s could not be aborted: %s", run.id, type(exc).__name__)


def _environments(config: Any) -> list[str]:
    env = getattr(config, "env", None)
    taskset = getattr(env, "taskset", None)
    for candidate in (getattr(taskset, "id", None), getattr(env, "id", None)):
        if candidate:
            return [str(candidate)]
    return []


def _first_attr(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def _outputs_run_id(config: Any, mode: str) -> str | None:
    """On ``--resume`` of outputs plain vf-eval wrote without a spool: the run id an import
    of them takes (content/platform_runs.py), so that this spool and such an import (made
    under ``--state-dir``, or from a copy, before this resume) are one run to sync, not two
    evaluations holding the kept episodes twice."""
    if not getattr(config, "resume", False) or mode == DISABLED:
        return None
    return first_run_id_in(verifiers_traces_path(eval_run_dir(config)))


def _runner_run_id(config: Any) -> str | None:
    """The runner's own run id, or None when it has none yet.

    verifiers 0.4.0's ``RunConfig.id`` raises ``RuntimeError`` until ``assign_id`` ran;
    older shapes have a plain attribute, or none at all.
    """
    try:
        value = getattr(config.run, "id", None)
    except RuntimeError:
        return None
    return str(value) if value else None


def _adopt_id(config: Any, run: Run) -> None:
    """Give the runner the run's id (a resumed spool's id wins over the runner's own).

    ``assign_id`` (verifiers 0.4.0) may be called once, and a second call with another id
    raises; it is called only when the runner's id differs, so a runner that already holds
    this id is left alone. ``adopt_id`` is the older name for the same.
    """
    if _runner_run_id(config) == run.id:
        return
    for name in ("assign_id", "adopt_id"):
        give = getattr(config.run, name, None)
        if callable(give):
            give(run.id)
            return


def _config_record(config: Any) -> dict[str, Any] | None:
    """The fields somebody set on the config, or None (with a warning) if it cannot be dumped.

    Dumped here rather than in ``open_run`` so that a config that fails to serialize costs
    only the manifest's ``config``, never the run.
    """
    dump = getattr(config, "model_dump", None)
    if not callable(dump):
        _log.warning("run %s: config left out of the manifest (not a pydantic model)", config.run.name)
        return None
    try:
        return dump(mode="json", exclude_unset=True)
    except Exception as exc:
        _log.warning("run %s: config left out of the manifest (%s)", config.run.name, type(exc).__name__)
        return None
