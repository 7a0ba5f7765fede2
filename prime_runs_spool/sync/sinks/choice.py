"""Which sink a run's pass pushes to: the one place that decides (docs/sync.md, "Sinks").

The sink the state records, else the one ``--to`` names, else ``auto``'s: the one the
command fixed it to (``--local``: samples, :attr:`SyncOptions.auto_sink`), else the first of
:data:`AUTO_ORDER` the account has (one cheap probe before the first batch), falling back
to the next when it turns out unavailable before any of the run's batches was committed
there. The choice is recorded in the state (``store``, a persisted key), so one run never
ends up half in two sinks, ``--to`` naming another sink than the recorded one is refused,
and ``auto`` (whatever the command fixed it to) follows the recorded one.
It is made before the run's evaluation is created, whose metadata names it: a sync that finds
the evaluation again with no state reads the sink there, even where that sink cannot be asked.
"""

from __future__ import annotations

from collections.abc import Callable

from prime_runs_spool.errors import ServiceNotEnabled, SyncError
from prime_runs_spool.sync.options import AUTO, SAMPLES, RunReport
from prime_runs_spool.sync.replay import replay_option
from prime_runs_spool.sync.sinks import samples, traces  # noqa: F401 - registered when imported
from prime_runs_spool.sync.sinks.base import PassContext, Sink
from prime_runs_spool.sync.sinks.registry import BUILT_IN, known, sink_class
from prime_runs_spool.sync.state import SyncState

#: What ``auto`` tries, in order (the built-in sinks, registry.py): Prime Traces, the
#: platform's system of record, then the legacy samples table for an account without it.
AUTO_ORDER = BUILT_IN


def make(name: str, context: PassContext) -> Sink:
    """The sink registered as ``name``, for this pass."""
    sink: Sink = sink_class(name)(context)
    return sink


def recorded(state: SyncState, asked: str) -> str | None:
    """The sink the state says this run uses (one from before the choice was recorded is
    read from what it pushed); SyncError when ``asked`` (``--to``) names another, checked
    first thing, so even a finished run says so rather than "up to date"."""
    name = state.store
    if name is None:
        name = next((n for n in known() if sink_class(n).used_by(state)), None)
    _refuse_other(state, name, asked)
    return name


def _refuse_other(state: SyncState, name: str | None, asked: str) -> None:
    if name is not None and asked != AUTO and asked != name:
        raise SyncError(f"this run's episodes went to {name} on this destination, not {asked}; "
                        f"sync it with {_to(name)}, or with {replay_option(state.replay_id)} "
                        "as a new evaluation")


def _to(name: str) -> str:
    """``--to NAME`` as advice: ``auto`` takes the run there too, as it follows the record
    (and for a run with none, goes there as its first choice or its fallback)."""
    return f"--to {name} (or auto)"


def _unprobed(asked: str, auto_sink: str | None) -> str | None:
    """The sink a run with none recorded goes to without asking the account: the one
    ``--to`` names, or the one the command fixed ``auto`` to; None: ``auto``'s probe decides."""
    return auto_sink if asked == AUTO else asked


def pushed_total(state: SyncState) -> int:
    """What a report counts as on the platform, in the unit of the run's sink (rows while
    none is recorded, as a state from before the choice counted)."""
    count: int = sink_class(state.store or SAMPLES).pushed_total(state)
    return count


def show(report: RunReport, state: SyncState) -> None:
    """Put in ``report`` what ``state`` says the destination holds: its evaluation, its
    store and total, the episodes held back. One definition for a pass's report and for a
    run that cannot be read whose state is left (sync/many.py ``gone_segments_report``)."""
    report.evaluation_id, report.url, report.store = state.evaluation_id, state.viewer_url, state.store
    report.pushed_total = pushed_total(state)
    report.held_back = state.held_back


def for_dry_run(state: SyncState, asked: str, auto_sink: str | None = None) -> tuple[str, str | None]:
    """The sink a dry run counts for, and the one its report names: the recorded or asked
    one; for ``auto`` undecided, the last of its order (a dry run asks the platform nothing,
    not even the probe), named as undecided."""
    name = recorded(state, asked) or _unprobed(asked, auto_sink)
    return name or AUTO_ORDER[-1], name


def for_create(context: PassContext) -> str:
    """The sink a new evaluation of the run names in its metadata (sync/evaluation.py,
    ``SINK_KEY``): the recorded one, else the one ``--to`` names, else ``auto``'s first
    available one. So ``auto``'s probe is asked before the create, not after it, and its
    answer is kept for the push: the run costs the same requests."""
    options = context.options
    name = recorded(context.state, options.to)
    if name is not None:
        return name
    name = _unprobed(options.to, options.auto_sink)
    if name is not None:
        if name == options.to and not _available(context, sink := make(name, context)):
            # Asked for by --to, and the account has it off: said before the create, whose
            # evaluation would name a sink that holds nothing of the run (found again with
            # its state lost, it kept the run there for good).
            raise SyncError(_not_there(ServiceNotEnabled(f"{sink.title} is not enabled for this account"),
                                       _following(sink.name)))
        return name
    name = next((n for n in AUTO_ORDER if _available(context, make(n, context))), AUTO_ORDER[-1])
    # Taken on no answer (a gateway's 503 to the probe), the sink is a guess: the evaluation
    # names the last of the order, which the push renames before a batch goes to another
    # (engine.py, name_sink). Named there, a pass stopped before any batch left the run, found
    # again with another state where the account lacks that sink, unsyncable but by --replay.
    return name if context.available.get(name) is not None else AUTO_ORDER[-1]


def _following(name: str) -> tuple[str, ...]:
    """The sinks ``auto`` tries after ``name``."""
    return AUTO_ORDER[AUTO_ORDER.index(name) + 1:] if name in AUTO_ORDER else ()


def _not_there(exc: Exception, following: tuple[str, ...]) -> str:
    """The line for a sink the account does not have, asked for by ``--to``, nothing sent."""
    advice = f"sync it with {_to(following[0])}" if following else "sync it with --to auto"
    return f"{exc}; nothing of this run was sent there: {advice}"


def _holds_nothing(context: PassContext, name: str) -> bool:
    """Whether the sink an evaluation found again names surely holds nothing of the run: it
    counts what it holds, and counts nothing (a request a lost state of this machine left
    there was waited out before, engine.py ``_fence_other_copy``, so nothing can land there
    later). Followed there anyway, ``--to`` naming another sink was refused for good, though
    no row of the run was anywhere."""
    sink = make(name, context)
    return sink.counts_what_it_holds and not sink.holds_run()


def _available(context: PassContext, sink: Sink) -> bool:
    """``sink.available()``, asked at most once a pass; no answer is taken as yes."""
    if sink.name not in context.available:
        context.available[sink.name] = sink.available()
    return context.available[sink.name] is not False


def push(context: PassContext, *, adopted: bool, other_copy_sink: str | None,
         push_to: Callable[[Sink], None]) -> None:
    """Choose the run's sink and ``push_to`` it; for ``auto``, fall back to the next sink
    when one turns out unavailable before anything of the run was committed there.
    ``adopted``: the evaluation was found on the platform; ``other_copy_sink``: the sink
    another copy of the spool last sent the run's episodes to (sync/copies.py)."""
    state, asked, report, auto_sink = context.state, context.options.to, context.report, context.options.auto_sink
    name = recorded(state, asked)
    if name is None and adopted:
        # Found again with no state naming its sink: the sink the evaluation names; for one
        # that names none (created before sinks were recorded there), the other copy's sink,
        # else what the platform holds of the run. Recorded before --to is checked against it,
        # so a later pass from this state refuses the other sink too.
        name = (state.evaluation_sink or other_copy_sink
                or next((n for n in known() if make(n, context).holds_run()), None))
        if name is not None and asked not in (AUTO, name) and _holds_nothing(context, name):
            name = None  # named, and surely empty: the person's --to takes the run (renamed before a batch)
        if name is not None:
            state.store, state.sink_from_platform = name, True
            context.protocol.note()
        _refuse_other(state, name, asked)
    chosen = name or _unprobed(asked, auto_sink)
    if chosen is not None and state.store != chosen:
        state.store = chosen
        context.protocol.note()  # written before anything is sent to it (protocol.note)
    report.store = chosen
    sink = make(chosen or AUTO_ORDER[0], context)
    try:
        if (chosen is None or state.sink_from_platform) and not _available(context, sink):
            raise ServiceNotEnabled(f"{sink.title} is not enabled for this account")
        push_to(sink)
        return
    except ServiceNotEnabled as exc:
        if state.sink_from_platform and state.store == sink.name:
            # This state cannot tell that nothing of the run is there: it never leaves.
            if not sink.in_doubt():
                state.in_flight = None  # a batch only ever answered service_not_enabled was not stored
            context.protocol.save()
            raise SyncError(f"{sink.title} is not enabled for this account; this run's episodes went to "
                            f"{sink.name} on this destination, and what {sink.title} holds of it cannot be read "
                            f"now: nothing was sent; sync it again once {sink.title} is on for the account, or "
                            f"with {replay_option(state.replay_id)} as a new evaluation") from None
        sink.refuse_if_committed(exc)  # a batch there, or one that may be, keeps the run there
        # Nothing of the run is there (a batch announced was refused, not stored): no sink
        # is kept that would trap it.
        state.store, state.in_flight = None, None
        following = _following(sink.name)
        if asked != AUTO or not following:
            context.protocol.save()
            raise SyncError(_not_there(exc, following)) from None
        fallback = make(following[0], context)
        state.store = fallback.name
        context.protocol.note()  # with the first announcement there; lost, the probe is asked again
        report.store = fallback.name
        report.notices.append(f"{exc}; runs with no batch there go to {fallback.title}")  # the account's: said once
    push_to(fallback)
