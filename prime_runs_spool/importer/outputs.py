"""``prime-runs import``: turn an eval output folder written without a spool into one.

The spool is written through ``open_run`` and ``Run.log_episodes``, the live path itself,
so it is exactly what the eval would have written had it used a spool: the manifest built
from the resolved config (masked by location; the launch file attached only when it sets
no credential table), every episode masked at append, rollout numbers assigned in arrival
order (the file's order), the summary over the whole run, one seal
(``importer/outcome.py`` decides which).

Idempotent and incremental. The episode ids already in the spool are compared with the
source's: none new and the same ending means nothing is written (not even an empty
segment); new episodes, or a different ending (a run imported while still running),
go into one new segment, as a resumed run's would. A ``traces.jsonl`` that lost episodes
the spool holds was rewritten by a ``--resume`` that retried rollouts: the lost ones are
superseded by the new segment, the rule a live resume follows (content/supersede.py), so
each slot counts once; an accepted episode it lost with no new attempt of its task was
cut short, not dropped, and is kept (:func:`_dropped_by_resume`). The older layout has no
resume: a ``results.jsonl`` that lost rows is refused (:class:`RewrittenOutputError`) and
the run left as it was imported.

Where the spool goes (``importer/places.py``): beside the outputs
(``<run dir>/spool/``), or with ``state_dir`` under ``state_dir/imports/<digest of the
source's absolute path>/<run id>/``, which is how a read-only source is synced without
writing into it. ``spool/import.json`` records the
source of an imported spool (``prime-runs sync`` refreshes those, and leaves spools a live
run wrote alone).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from prime_runs_spool.errors import (
    CorruptSpoolError,
    ImportSourceError,
    MissingMetadataError,
    NotARunError,
    ReadOnlySourceError,
    RewrittenOutputError,
    SpoolError,
    Stopped,
)
from prime_runs_spool.content.manifest import read_config_source
from prime_runs_spool.content.masking import MaskRules
from prime_runs_spool.content.platform_runs import is_platform_run_id
from prime_runs_spool.content.recovers import Cut
from prime_runs_spool.content.episodes import episode_id_of, rollout_key
from prime_runs_spool.content.supersede import superseded_ids, superseded_in_run
from prime_runs_spool.plural import count, episodes, plural
from prime_runs_spool.spool.format import CANCELLED, COMPLETED, EPISODE, FAILED, LIVE
from prime_runs_spool.content.supersede import verifiers_traces_path
from prime_runs_spool.files import FILE_MODE, OnLink, OnUnreadable, is_read_only, pass_over, replace_private
from prime_runs_spool.importer.paths import find_eval_outputs, import_lock_path, import_mark_path
from prime_runs_spool.spool.layout import ensure_spool_dir, list_segments
from prime_runs_spool.spool.durable_mark import durable_mark
from prime_runs_spool.spool.reader import resync_records
from prime_runs_spool.spool.resync import Damage
from prime_runs_spool.spool.scan import read_run
from prime_runs_spool.importer import agreement
from prime_runs_spool.importer.options import STATE_DIR_ENV
from prime_runs_spool.importer.pushing import still_pushing
from prime_runs_spool.importer.places import (
    imported_run_dir,
    spooled_by_eval,
    to_refresh,
    unspooled,
)
from prime_runs_spool.importer.source import V0, SourceRun, read_v040
from prime_runs_spool.importer.unchanged import fingerprints, imports_unchanged, source_files, spool_files
from prime_runs_spool.importer.v0_layout import read_v0
from prime_runs_spool.runner.resume import scan_prior_run
from prime_runs_spool.runner.run import open_run
from prime_runs_spool.sync.options import ERROR, INTERRUPTED, UP_TO_DATE

_log = logging.getLogger("prime_runs_spool")

#: Episodes handed to ``log_episodes`` at once: one fsync per batch, bounded memory.
BATCH = 32

#: Report states; ``up_to_date`` (nothing new) and ``error`` are sync's words (sync/options.py),
#: since ``prime-runs sync`` reports its imports beside its runs, and ``live`` (a pushing
#: vf-eval may still be running: left for a later sync, importer/pushing.py) a run's.
IMPORTED = "imported"        # a new spool
APPENDED = "appended"        # a new segment in an imported spool
SPOOLED = "spooled"          # the eval wrote its own spool, or a spool is damaged in place: nothing to import
EMPTY = "empty"              # no episode yet: nothing written
LEFT = "left"                # rewritten by a resume: left as it was imported (an error too)
#: The states that make ``prime-runs import`` and ``sync`` exit 1.
FAILED_STATES = (ERROR, LEFT)


@dataclass
class ImportReport:
    """What importing one eval output folder did."""

    source: str
    state: str
    run_dir: str | None = None
    run_id: str | None = None
    name: str | None = None
    layout: str | None = None
    episodes_added: int = 0
    #: Episodes of the spool this import superseded (a resume rewrote traces.jsonl).
    superseded: int = 0
    #: The run's effective episodes in the spool (superseded ones left out).
    episodes_total: int = 0
    #: The seal the spool ends with, and the finer verdict (``cancelled`` is sealed crashed).
    status: str | None = None
    outcome: str | None = None
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_source(output_dir: Path) -> SourceRun:
    return read_v040(output_dir) if verifiers_traces_path(output_dir).is_file() else read_v0(output_dir)


def import_output(output_dir: Path, *, state_dir: Path | None = None,
                  stop: Callable[[], bool] | None = None) -> ImportReport:
    """Import one eval output folder; never raises for a bad source (the report says).
    ``stop``: asked after each batch of episodes written; once true, the spool is sealed
    ``cancelled`` there (the next import appends the rest) and the report is ``interrupted``."""
    report = ImportReport(source=str(output_dir), state=ERROR)
    try:
        _import(output_dir, state_dir, report, stop)
    except Stopped:
        report.state, report.reason = INTERRUPTED, "stopped by a signal part way; the next import or sync spools the rest"
    except RewrittenOutputError as exc:
        report.state, report.error = LEFT, str(exc)
    except ImportSourceError as exc:
        report.state, report.error = ERROR, str(exc)
    except SpoolError as exc:
        report.state, report.error = ERROR, f"{output_dir}: {exc}"
    except OSError as exc:
        report.state, report.error = ERROR, f"{output_dir}: {exc.strerror or exc} ({exc.filename or ''})"
    except Exception as exc:  # as sync does (sync/many.py): one folder's bug must not stop the others
        report.state, report.error = ERROR, f"{output_dir}: internal error: {type(exc).__name__}: {exc}"
    return report


def import_paths(paths: Iterable[Path], *, state_dir: Path | None = None,
                 refresh_only: bool = False, stop: Callable[[], bool] | None = None,
                 on_link: OnLink | None = None, on_unreadable: OnUnreadable = pass_over) -> list[ImportReport]:
    """Import every eval output folder under ``paths``. ``refresh_only`` (what ``sync``
    does) skips folders whose spool the eval wrote itself. ``stop`` (a signal's flag): once
    true, the folder being imported stops at its next batch and no other is begun.
    ``on_link`` (without ``refresh_only``) is told of each link to a folder outside the
    paths, not followed (``paths.find_eval_outputs``); ``on_unreadable`` (likewise) of each
    folder that cannot be read, in which eval outputs may hide."""
    found = to_refresh(paths, state_dir) if refresh_only else find_eval_outputs(paths, on_link, on_unreadable)
    reports = []
    for output_dir in found:
        if stop is not None and stop():
            break
        reports.append(import_output(output_dir, state_dir=state_dir, stop=stop))
    imports_unchanged().save()
    return reports


def _import(output_dir: Path, state_dir: Path | None, report: ImportReport,
            stop: Callable[[], bool] | None = None) -> None:
    if spooled_by_eval(output_dir):  # with or without a state dir: one spool per run, ever
        report.state, report.run_dir = SPOOLED, str(output_dir)
        report.reason = "the eval wrote its own spool here; prime-runs sync ships it"
        if verifiers_traces_path(output_dir).is_file():
            _catch_up(output_dir, report)
        return
    traces_file = _file_identity(verifiers_traces_path(output_dir))  # before it is read: see _lost_in_place
    source_look = fingerprints(source_files(output_dir))  # before it is read: importer/unchanged.py
    try:
        source = read_source(output_dir)
    except MissingMetadataError as exc:  # the eval writes it last: a spool of the run holds it whole
        if unspooled(output_dir, state_dir):
            raise
        run = read_run(imported_run_dir(output_dir, "", state_dir))  # one that exists: not unspooled
        report.state, report.run_dir, report.run_id = UP_TO_DATE, str(run.run_dir), run.run_id
        report.episodes_total, report.status = run.episodes_count, run.status
        report.warnings.append(exc.kept)
        return
    report.layout, report.name, report.outcome = source.layout, source.name, source.outcome.kind
    report.reason = source.outcome.reason
    if not source.ids or source.run_id is None:
        report.state, report.episodes_total = EMPTY, 0
        report.reason = "no episode in the outputs yet: nothing to import"
        return
    waiting = still_pushing(output_dir, source.run_ids)
    if waiting:
        report.state, report.reason, report.run_id = LIVE, waiting, source.run_id
        return
    run_dir = imported_run_dir(output_dir, source.run_id, state_dir)
    report.run_dir = str(run_dir)
    if state_dir is None and is_read_only(output_dir):
        raise ReadOnlySourceError(
            f"{output_dir} is read-only: keep the imported spool and the sync state elsewhere with "
            f"--state-dir DIR (or {STATE_DIR_ENV}=DIR)")
    ensure_spool_dir(run_dir)  # and every missing level above it (a state directory's), 0700, durably
    with FileLock(import_lock_path(run_dir), mode=FILE_MODE):  # a concurrent import of the same run waits
        spool_look = fingerprints(spool_files(run_dir))
        _import_locked(source, output_dir, run_dir, report, traces_file, stop)
    if report.state == UP_TO_DATE and source_look is not None and spool_look is not None:
        imports_unchanged().learn(output_dir, state_dir, source_look + spool_look)


def _import_locked(source: SourceRun, output_dir: Path, run_dir: Path, report: ImportReport,
                   traces_file: list[int] | None, stop: Callable[[], bool] | None = None) -> None:
    resuming = bool(list_segments(run_dir))
    already = superseded_in_run(run_dir) if resuming else set()
    try:
        prior = scan_prior_run(run_dir, already) if resuming else None
    except CorruptSpoolError as exc:  # a cut is made good from the source; other damage stays
        report.state = UP_TO_DATE
        if not _spool_past_cut(run_dir, lambda: source, report, exc):
            # As for a spool the eval wrote (_catch_up): the damage is sync's to report, or
            # with --skip-corrupt to pass over, and not an import failure besides.
            report.state, report.run_id = SPOOLED, source.run_id
            report.reason = f"the spool is damaged, so it was not compared with the eval outputs ({exc})"
            return
        if report.state == UP_TO_DATE:
            report.status = _status(run_dir)
            report.reason = f"{exc}; what the source holds past the cut is spooled already"
        _write_mark(run_dir, source, report, traces_file)
        return
    known = prior.episode_ids if prior is not None else set()
    new = [episode_id for episode_id in dict.fromkeys(source.ids) if episode_id not in known]
    supersedes = (_superseded_now(run_dir, source, already, _lost_in_place(run_dir, source, traces_file),
                                  set(new), report) if prior is not None else [])
    report.run_id = prior.run_id if prior is not None and prior.run_id else source.run_id
    status_now = _status(run_dir) if prior is not None else None
    if prior is not None and not new and not supersedes and status_now == source.outcome.status:
        report.state, report.status = UP_TO_DATE, status_now
        report.episodes_total = prior.episodes
        return
    report.warnings[:0] = _config_warnings(source)
    if prior is None:
        # Marked before the first segment exists: nobody ever sees this spool without its
        # mark and takes it for one the eval wrote itself.
        _write_mark(run_dir, source, report, traces_file)
    _write(source, run_dir, report, prior is not None, set(new), supersedes, stop=stop)
    report.state = APPENDED if prior is not None else IMPORTED
    report.episodes_added = len(new)
    report.superseded = len(supersedes)
    report.episodes_total = (prior.episodes if prior is not None else 0) - len(supersedes) + len(new)
    report.status = source.outcome.status
    _write_mark(run_dir, source, report, traces_file)


def _catch_up(run_dir: Path, report: ImportReport) -> None:
    """A spool the eval wrote, behind its ``traces.jsonl`` (importer/agreement.py): the
    episodes only ``traces.jsonl`` holds go into a new segment, the spool's episodes it
    dropped are superseded, as for an imported spool. The spool's own seal stands when
    nothing differs. A damaged spool's damage is sync's to report (or, with
    ``--skip-corrupt``, to pass over, recovering from ``traces.jsonl`` what it can:
    sync/recover.py); it is caught up only when it was cut short (:func:`_catch_up_cut`),
    else left as it is: spooling the episodes of damaged lines again would copy them into
    the run."""
    try:
        _catch_up_intact(run_dir, report)
    except CorruptSpoolError as exc:
        if not _catch_up_cut(run_dir, report, exc):
            report.reason = f"the spool is damaged, so it was not compared with traces.jsonl ({exc})"


def _catch_up_cut(run_dir: Path, report: ImportReport, exc: CorruptSpoolError) -> bool:
    """A spool the eval wrote, cut short: :func:`_spool_past_cut`, its ``traces.jsonl`` then
    marked as agreeing. False for any other damage, and while the eval still writes. A
    read-only folder is not written: one warning says what its ``traces.jsonl`` holds past
    the cut, and what to do (a spool is one folder, so its new segment cannot go under a
    ``--state-dir``, which holds the sync state of such a spool, never its records)."""
    if agreement.is_live(run_dir):
        return False
    traces_version = agreement.version(run_dir)
    if traces_version is None:
        return False
    if is_read_only(run_dir):
        found = _past_cut(run_dir, lambda: read_source(run_dir))
        if found is None:
            return False
        if found[1]:
            report.warnings.append(
                f"{exc}; {verifiers_traces_path(run_dir)} holds {episodes(len(found[1]))} the spool lost past the "
                f"cut, which cannot be spooled in a read-only folder (--state-dir keeps only its sync state): "
                f"copy the folder somewhere writable and sync the copy with --skip-corrupt")
        return True
    with FileLock(import_lock_path(run_dir), mode=FILE_MODE):
        if not _spool_past_cut(run_dir, lambda: read_source(run_dir), report, exc):
            return False
        agreement.mark_agreed(run_dir, traces_version["traces"])
    return True


def _past_cut(run_dir: Path, source_of: Callable[[], SourceRun]) -> tuple[Cut, list[str], SourceRun] | None:
    """Where the spool was cut, the source's episode ids it lost there (in the source's
    order) and the source, when its only damage is a cut (:func:`_cut_short`); else None."""
    readable: set[str] = set()
    damages: list[Damage] = []
    for item in resync_records(run_dir):
        if isinstance(item, Damage):
            damages.append(item)
        elif item.type == EPISODE:
            found = (item.meta or {}).get("episode_id") or episode_id_of(item.data)
            if found is not None:
                readable.add(str(found))
    cut = _cut_short(damages, list_segments(run_dir))
    if cut is None:
        return None
    source = source_of()
    return cut, [episode_id for episode_id in dict.fromkeys(source.ids) if episode_id not in readable], source


def _spool_past_cut(run_dir: Path, source_of: Callable[[], SourceRun], report: ImportReport,
                    exc: CorruptSpoolError) -> bool:
    """A spool one of whose segments was cut short (a bad disk, a truncated artifact: its
    lines end before its durable mark) lost the episodes past the cut, which no damaged line
    names. The episodes the source (``traces.jsonl``, ``results.jsonl``) holds and the spool
    can no longer read are the eval's all the same: they go into a new segment after the
    run's last one, which names the cut (content/recovers.py); the damaged segment stays as
    it is, and so do the intact ones after it. Sync still stops at the damage (``corrupt``);
    ``--skip-corrupt`` passes it and ships the new segment, so each episode reaches the
    platform once, by its place in the stream like any other (docs/sync.md, "A spool cut
    short"). Any other damage (a damaged line, which may hold an episode the new segment
    would copy) is left alone: False. The caller holds the import lock."""
    found = _past_cut(run_dir, source_of)
    if found is None:
        return False
    cut, new, source = found
    prior = scan_prior_run(run_dir, past_damage=True)
    report.run_id, report.layout, report.name = prior.run_id, source.layout, source.name
    report.episodes_total = prior.episodes
    if new:
        report.warnings[:0] = _config_warnings(source)
        _write(source, run_dir, report, True, set(new), [], spool_run_id=prior.run_id, recovers=cut)
        report.state, report.outcome, report.status = APPENDED, source.outcome.kind, source.outcome.status
        report.episodes_added = len(new)
        report.episodes_total = prior.episodes + len(new)
        report.warnings.append(
            f"{exc}; {verifiers_traces_path(source.path) if source.layout != V0 else source.path} holds "
            f"{episodes(len(new))} the spool lost past the "
            f"cut: spooled in a new segment after the last (prime-runs sync --skip-corrupt ships "
            f"{plural(len(new), 'it', 'them')}; the damage stays)")
    elif cut.segment == prior.last_index and source.outcome.status in (COMPLETED, FAILED, CANCELLED):
        # Nothing lost but the run's end: the last segment's seal was past the cut. Without
        # it the run reads crashed for good (its errored episodes held forever); the eval's
        # own end, from the source, seals a new segment instead.
        _write(source, run_dir, report, True, set(), [], spool_run_id=prior.run_id, recovers=cut)
        report.state, report.outcome, report.status = APPENDED, source.outcome.kind, source.outcome.status
        report.warnings.append(
            f"{exc}; the spool lost its seal past the cut: the run, {source.outcome.status} as "
            f"{verifiers_traces_path(source.path) if source.layout != V0 else source.path} says, is sealed "
            f"{source.outcome.status} in a new segment after the last (prime-runs sync --skip-corrupt ships it; "
            "the damage stays)")
    return True


def _cut_short(damages: list[Damage], segments: list[tuple[int, Path]]) -> Cut | None:
    """Where the run was cut, when its only damage is one segment cut short (any of them):
    the file is shorter than the bytes its writer made durable (docs/spool-format.md,
    section 4.1, check 5), and that is all the reader found. Damage in place (a line rotten
    where it lies) is not: a sync may have read past it already and would take the new
    segment's copy of its episode for a new one, where a sync that read past a cut finds
    the segment shorter, or its cursor past the cut the new segment names, and refuses the
    run (``lost``)."""
    if len(damages) != 1 or not segments:
        return None
    [damage] = damages
    path = dict(segments).get(damage.segment_index)
    if path is None:
        return None
    mark = durable_mark(path)
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if damage.first_seq is None and not damage.episode_ids and damage.end_offset == mark and size < mark:
        return Cut(damage.segment_index, damage.offset)
    return None


def _catch_up_intact(run_dir: Path, report: ImportReport) -> None:
    if agreement.is_live(run_dir):
        report.reason = "the eval is still writing this run; its traces.jsonl is compared once it has exited"
        return
    traces_version = agreement.version(run_dir)
    if traces_version is None or agreement.agreed(run_dir, traces_version):
        return
    source = read_source(run_dir)
    if is_read_only(run_dir):
        found = agreement.disagreement(run_dir, damage_raises=True)  # a cut is said (_catch_up_cut)
        if found is not None:
            raise ReadOnlySourceError(f"{run_dir} is read-only, and its spool and traces.jsonl disagree: "
                                      f"{found.describe()}; copy the folder somewhere writable and sync the copy")
        return
    with FileLock(import_lock_path(run_dir), mode=FILE_MODE):
        already = superseded_in_run(run_dir)
        prior = scan_prior_run(run_dir, already)  # damage raises: nothing is appended after it
        waiting = still_pushing(run_dir, source.run_ids, own_run_id=prior.run_id)
        if waiting:  # a plain vf-eval resume, pushing: compared once it has exited
            report.state, report.reason = LIVE, waiting
            return
        known = prior.episode_ids
        new = [episode_id for episode_id in dict.fromkeys(source.ids) if episode_id not in known]
        missing = superseded_ids(agreement.spool_episode_ids(run_dir), set(source.ids) | already)
        if missing and agreement.lost_in_place(run_dir, traces_version["traces"]):
            raise _lost_lines(run_dir, len(missing))
        supersedes = _dropped_by_resume(run_dir, source, set(new), missing)
        report.run_id, report.layout, report.name = prior.run_id, source.layout, source.name
        report.episodes_total = prior.episodes
        report.status = _status(run_dir)
        if len(missing) > len(supersedes):
            report.warnings.append(_kept_line(run_dir, len(missing) - len(supersedes)))
        if new or supersedes:
            report.warnings[:0] = _config_warnings(source)
            _write(source, run_dir, report, True, set(new), supersedes, spool_run_id=prior.run_id)
            report.state, report.outcome, report.status = APPENDED, source.outcome.kind, source.outcome.status
            report.episodes_added, report.superseded = len(new), len(supersedes)
            report.episodes_total = prior.episodes - len(supersedes) + len(new)
            report.warnings.append(
                f"{verifiers_traces_path(run_dir)} held {episodes(len(new))} the spool lacked"
                + (f" and dropped {len(supersedes)} it held (superseded)" if supersedes else "")
                + ": the run was continued without the spool (plain vf-eval?); spooled now")
    agreement.mark_agreed(run_dir, traces_version["traces"])


def _superseded_now(run_dir: Path, source: SourceRun, already: set[str], lost_in_place: bool, new: set[str],
                    report: ImportReport) -> list[str]:
    """The spool's episodes the source no longer holds because a ``--resume`` that retried
    rollouts rewrote ``traces.jsonl`` without them, to run their slots again. The same rule
    as a live resume (content/supersede.py): they are superseded, in spool order; the others
    are kept, and said (:func:`_dropped_by_resume`). The older layout has no resume, so a
    changed ``results.jsonl`` is refused instead, and so is a ``traces.jsonl`` that lost
    lines in place (``lost_in_place``: no resume wrote it)."""
    kept = set(source.ids) | already
    gone = superseded_ids((record_id for record_id in _spool_episode_ids(run_dir)), kept)
    if gone and source.layout == V0:
        raise RewrittenOutputError(
            f"{source.path}: {count(len(gone), 'row')} imported earlier {plural(len(gone), 'is', 'are')} no longer in results.jsonl; the older "
            "layout has no resume that would explain it, so this run was left as it was imported")
    if gone and lost_in_place:
        raise _lost_lines(source.path, len(gone))
    rerun = _dropped_by_resume(run_dir, source, new, gone)
    if len(gone) > len(rerun):
        report.warnings.append(_kept_line(source.path, len(gone) - len(rerun)))
    return rerun


def _dropped_by_resume(run_dir: Path, source: SourceRun, new: set[str], missing: list[str]) -> list[str]:
    """Of the spool's episodes ``missing`` from ``traces.jsonl``, those a resume dropped to
    run again, in spool order: an errored one (verifiers' default keep-verdict is ``ok``, so
    a resume redoes exactly those; sync holds them back until the run completes anyway), and
    an accepted one whose task ``traces.jsonl`` holds a new attempt of (an env's own
    verdict), as many per task (``rollout_key``) as there are new attempts. An accepted
    episode with neither is not what a resume drops: ``traces.jsonl`` was cut short (a torn
    last line, an artifact packed as the eval died), and superseding it would lose an
    episode the spool holds durably, so it is kept."""
    if not missing:
        return []
    reruns: dict[Any, int] = {}
    for episode in source.episodes():
        if str(episode.get("id")) in new:
            key = rollout_key(episode)
            reruns[key] = reruns.get(key, 0) + 1
    wanted, replaced = set(missing), set()
    for record in read_run(run_dir).records():
        if record.type != EPISODE or not isinstance(record.data, dict):
            continue
        episode_id = (record.meta or {}).get("episode_id") or episode_id_of(record.data)
        if episode_id is None or str(episode_id) not in wanted or str(episode_id) in replaced:
            continue
        key = rollout_key(record.data)
        if record.data.get("ok") is not True:
            replaced.add(str(episode_id))
        elif reruns.get(key, 0) > 0:
            reruns[key] -= 1
            replaced.add(str(episode_id))
    return [episode_id for episode_id in missing if episode_id in replaced]


def _kept_line(where: Path, kept: int) -> str:
    return (f"{verifiers_traces_path(where)} lacks {episodes(kept)} the spool accepted and holds, and no "
            f"new attempt of {plural(kept, 'its task', 'their tasks')} (cut short: a torn last line, a partial artifact?): kept, as the spool holds them")


def _lost_lines(run_dir: Path, count: int) -> RewrittenOutputError:
    return RewrittenOutputError(
        f"{verifiers_traces_path(run_dir)}: {episodes(count)} the spool holds {plural(count, 'is', 'are')} no longer in it, and it is the "
        "same file, shorter (a --resume replaces it with a new one): lines were lost in place (a power cut before "
        "vf-eval's writes reached the disk?); the spool keeps them (sync ships them) and this run was left as it was")


def _file_identity(path: Path) -> list[int] | None:
    """Which file ``path`` is (device, inode): verifiers' ``--resume`` replaces ``traces.jsonl``
    through a new file and a rename, so the same file later is not a rewrite."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return [found.st_dev, found.st_ino]


def _lost_in_place(run_dir: Path, source: SourceRun, traces_file: list[int] | None) -> bool:
    """``traces.jsonl`` is the very file the last import read (``traces_file``, taken before
    this one read it), and now holds fewer bytes than that import read (agreement.py)."""
    return traces_file is not None and agreement.lost_in_place(run_dir, [*traces_file, source.size, None])


def _spool_episode_ids(run_dir: Path) -> Iterable[str | None]:
    for record in read_run(run_dir).records():
        if record.type == EPISODE:
            meta = record.meta or {}
            yield meta.get("episode_id") or episode_id_of(record.data)


def _status(run_dir: Path) -> str | None:
    try:
        return read_run(run_dir).status
    except (NotARunError, SpoolError):
        return None


def _config_warnings(source: SourceRun) -> list[str]:
    """What ``open_run`` will warn about the launch file (a credential table, by name)."""
    warnings: list[str] = []
    if source.config_file is not None:
        read_config_source(source.config_file, MaskRules.defaults_for_config(), warnings)
    return warnings


def _write(source: SourceRun, run_dir: Path, report: ImportReport, resuming: bool, new: set[str],
           supersedes: list[str], spool_run_id: str | None = None, recovers: Cut | None = None,
           stop: Callable[[], bool] | None = None) -> None:
    """``spool_run_id``: the id of the spool the eval wrote itself, when catching it up (its
    own id on episodes is a local one, not a platform's). ``recovers``: the cut whose lost
    episodes these are, written after the damage (:func:`_catch_up_cut`). ``stop``: asked
    after each batch; once true, the run is sealed as a Ctrl-C seals a live one, and
    :class:`Stopped` raised."""
    run = open_run(
        run_dir,
        name=source.name,
        environments=source.environments,
        model=source.model,
        framework="verifiers",
        config=source.config,
        config_file=source.config_file,
        num_examples=source.num_examples,
        rollouts_per_example=source.rollouts_per_example,
        run_id=None if resuming else source.run_id,
        mode="offline",
        created_at=source.created_at,
        supersedes=supersedes,
        platform_runs=[run_id for run_id in source.run_ids if is_platform_run_id(run_id) and run_id != spool_run_id],
        past_damage=recovers is not None,
        recovers=recovers,
    )
    try:
        batch: list[dict[str, Any]] = []
        for episode in source.episodes():
            if episode["id"] in new:
                batch.append(episode)
            if len(batch) >= BATCH:
                run.log_episodes(batch)
                batch = []
                if stop is not None and stop():
                    raise Stopped
        if batch:
            run.log_episodes(batch)
    except BaseException as exc:
        run.abort(KeyboardInterrupt() if isinstance(exc, Stopped) else exc)
        raise
    outcome = source.outcome
    if outcome.status == COMPLETED:
        run.finish()
    elif outcome.status == CANCELLED:  # exactly what the live path seals for a Ctrl-C
        run.abort(KeyboardInterrupt())
    else:  # failed, or crashed: the reason says which rule decided
        run.abort(outcome.reason, status=outcome.status)


def _write_mark(run_dir: Path, source: SourceRun, report: ImportReport, traces_file: list[int] | None) -> None:
    """``spool/import.json``: the source of this spool, written atomically (0600); with which
    ``traces.jsonl`` it read, and how much of it (:func:`_lost_in_place`)."""
    mark = import_mark_path(run_dir)
    data = json.dumps({"source": str(source.path.resolve()), "layout": source.layout,
                       "run_id": report.run_id, "episodes": report.episodes_total,
                       "source_bytes": source.size, "source_file": traces_file, "status": report.status},
                      indent=1).encode()
    replace_private(mark, data, durable=True)
