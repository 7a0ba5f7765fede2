"""The run-level metrics the dashboard renders: ``avg_reward``, ``avg_metrics``, ``avg_error``.

Computed from episode *records*, streaming, so the runner can seal a run with it and sync
can recompute it for a run that crashed before writing one, without holding a spool in
memory.

Semantics (docs/platform-api.md, "What the dashboard reads"):

- A trace's reward is the projection's: the sum of ``score * weight`` over its non-null
  rewards (0 with none; none, dropped, when a reward's score is null), so ``avg_reward``
  agrees with the rows' ``reward`` column (``content.episodes.reward_and_scores``).
- Rewards and metrics average over the trainable traces of the whole run. The fallback
  to all traces applies **per run**: only when no trace of any episode is trainable.
  That is the upstream reading (its ``run_metrics`` pooled the traces of all episodes,
  then filtered), and it keeps one definition per run: a per-episode fallback would
  silently mix judges' scores into a policy's average whenever a single episode lost
  its trainable trace.
- ``avg_metrics`` holds, per name, each reward's own ``score`` (unweighted) and each
  metric, averaged over the traces that report it; a metric and a reward of the same
  name on one trace count once, as the metric. This is prime-runs 0.1.4's
  ``prime_runs.metrics.from_episodes``, which verifiers 0.4.0 seals its runs with: the
  summary of a run equals the SDK's for the same episodes (tests/test_summary.py and the
  real ``vf-eval`` run in tests/test_vf_eval_e2e.py check it against the function).
- ``avg_error`` is the share of episodes whose ``ok`` is not ``True`` (a record without
  ``ok`` counts as an error: we cannot claim it succeeded).
- A run with no scored trace has ``avg_reward`` 0.0, and one with no episode
  ``avg_error`` 0.0, as the SDK reports them.
- The one difference from the SDK, on purpose: non-finite numbers (NaN, ±inf) and
  non-numeric values are dropped before averaging (the SDK would carry a NaN into a JSON
  body that cannot hold it); a mean whose every value was dropped is ``None``. Finite
  rewards or metrics whose sum overflows have their finite mean (``content/means.py``),
  not ``inf``.

A run counts each episode **as it was written** (``read_episode``'s ``written``, the line's
payload), never as it was in memory: its live summary, the one it seals, is then the
summary of its spool, which a resumed run continues and sync recomputes. The two readings
differ only where an episode holds a NaN or an infinity that the reading meets, since the
line holds it as null: a NaN score in memory drops its trace's reward, and so does a null
one (what a NaN is once written); a NaN weight drops the reward, a null one is 1; a NaN
metric is dropped in place of the reward's score of its name, a null one leaves that
score; a NaN ``trainable`` is true, a null one false. On episodes in
memory (``compute_summary``, tests/test_summary.py) the semantics above hold as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from prime_runs_spool.content.episodes import reward_and_scores
from prime_runs_spool.content.means import BIG, SCALE, mean_of_sums

#: ``-BIG``, negated once: the split below runs per trace and per metric.
_LOW = -BIG


class _Means:
    """Running sums for the reward and each metric over one population of traces."""

    def __init__(self) -> None:
        #: The rewards' sums as ``content/means.py`` sums them: beyond ``BIG`` apart, scaled,
        #: so finite rewards never sum to an infinite mean.
        self.reward_sum = 0.0
        self.reward_big = 0.0
        self.reward_count = 0
        #: Per name, in the order the names first appear: ``[sum, big, count]``, summed as the
        #: rewards are, one entry looked up a value, not sums and a count in dicts of their
        #: own (the run adds under its lock).
        self.metrics_by_name: dict[str, list[Any]] = {}

    def reward(self, traces: int) -> float | None:
        if self.reward_count:
            return mean_of_sums(self.reward_sum, self.reward_big, self.reward_count)
        return 0.0 if traces == 0 else None  # nothing scored (SDK: 0.0) vs every value dropped

    def metrics(self) -> dict[str, float]:
        return {name: mean_of_sums(*sums) for name, sums in self.metrics_by_name.items()}


#: What a trace adds to its population's means (:func:`_trace_numbers`): its finite reward
#: (None if dropped), and the finite value of each name it reports, in the order the names
#: first appear.
TraceNumbers = tuple["float | None", "dict[str, float]"]

#: The reading of a trace with no rewards and no metrics: its reward is the sum over none
#: (as ``content.episodes.trace_reward`` reads it). Never mutated: nothing adds to a reading.
_NOTHING_SCORED: TraceNumbers = (0.0, {})


def _trace_numbers(trace: Mapping[str, Any], rewards: Any, metrics: Any, written: bytes | None) -> TraceNumbers:
    """What a trace with ``rewards`` or ``metrics`` (its own, read by the caller; not both
    empty) adds to a population's means, read once however many populations count it (the
    trainable one and all traces): its finite reward (None if dropped), and the finite
    value of each name it reports, in the order the names first appear (each reward's own
    score, then each metric; a metric replaces a reward's score of its name). With ``written``
    (read_episode's), raises :class:`_WrittenOtherwise` where it meets a NaN or an infinity."""
    if rewards:
        try:
            reward, values = reward_and_scores(rewards)  # trace_reward, and the scores by name
        except TypeError:  # a non-numeric score or weight: not a reward we can average
            reward = None
            # each reward's score in its place, a null one too (reward_and_scores's order)
            values = {name: entry.get("score") for name, entry in rewards.items()
                      if type(entry) is dict or isinstance(entry, Mapping)}
        else:
            if type(reward) is not float or reward - reward != 0.0:  # NaN and infinities give NaN
                reward = _finite(reward)
                if reward is None and written is not None:  # a non-finite score or weight (or sum)
                    # (a sum of finite values past the float range reads alike: re-read for nothing)
                    raise _WrittenOtherwise
        if metrics:
            for name, value in metrics.items():
                if value is not None:
                    values[name] = value
    else:
        reward = 0.0
        values = metrics  # no reward name to replace: the metrics as they are
    for value in values.values():
        if type(value) is not float or value - value != 0.0:  # not a finite float: drop or convert
            break
    else:  # the common case: every value a finite float, kept as it is (a copy of the trace's own)
        return reward, values if rewards else dict(values)
    numbers = {}
    for name, value in values.items():
        if type(value) is float:
            if value - value == 0.0:
                numbers[name] = value
            elif written is not None:
                raise _WrittenOtherwise
        elif value is not None:
            number = _finite(value)
            if number is not None:
                numbers[name] = number
    return reward, numbers


#: What an episode adds to the summary (:func:`read_episode`): whether it counts as an error,
#: how many traces it has, how many of them are trainable, and the :data:`TraceNumbers` of
#: the traces its run averages over, in order: the trainable ones, or, in an episode with
#: none, all of them. The rest are never read: once a trace of a run is trainable, the
#: others are no longer averaged at all (:class:`SummaryAccumulator`).
EpisodeReading = tuple[bool, int, int, list[TraceNumbers]]


def read_episode(episode: Mapping[str, Any], written: bytes | None = None) -> EpisodeReading:
    """Everything :class:`SummaryAccumulator` counts of ``episode``, read once.

    ``written``: the episode's serialization (orjson's, the payload of its spool line), for
    a run, whose summary must be the one its spool gives (a resumed run continues it, sync
    recomputes it): then the reading is of the episode as written. The two differ only
    where the reading meets a NaN or an infinity (a score, a weight, a metric,
    ``trainable``), which orjson writes as null: a null score is skipped (the trace's reward
    is the others' sum), a null weight is 1, a null metric leaves the reward's score of its
    name, a null ``trainable`` is false. Only such an episode, met, is parsed from
    ``written`` and read again; any other costs nothing more (docs/benchmarks.md, "The run's
    summary reads an episode as written").
    """
    traces = episode.get("traces") or ()
    counted: list[TraceNumbers] = []
    trainables = 0
    try:
        for trace in traces:
            get = trace.get
            agent = get("agent")
            trainable = agent.get("trainable") if agent else False
            if trainable is not True and trainable is not False:  # not a bool: read by its truth
                if written is not None and type(trainable) is float and trainable - trainable != 0.0:
                    raise _WrittenOtherwise
                trainable = bool(trainable)
            if trainable:
                if not trainables:  # the traces read until now are not trainable: not averaged
                    counted = []
                trainables += 1
            elif trainables:
                # A trainable trace came first: this one is not averaged, nor read (whichever
                # way it was written: its trainable flag, read above, is the same there).
                continue
            rewards = get("rewards")
            metrics = get("metrics")
            counted.append(_trace_numbers(trace, rewards, metrics, written) if rewards or metrics
                           else _NOTHING_SCORED)
    except _WrittenOtherwise:
        return read_episode(orjson.loads(written))  # type: ignore[arg-type]  # raised only with it
    return episode.get("ok") is not True, len(traces), trainables, counted


class _TwoPass(Exception):
    """:meth:`SummaryAccumulator.add` met a value its one pass does not read: the episode is
    read the two-pass way. Private, like :class:`_WrittenOtherwise`: raised and caught inside
    ``add``, never seen by a caller."""


class _WrittenOtherwise(Exception):
    """A reading of an episode as written (:func:`read_episode`'s ``written``) met a value
    its line holds otherwise (a NaN or an infinity, there null).

    Private, and not in errors.py's tree: it is not an error but a signal, raised and
    caught inside :func:`read_episode` (which then reads the episode again as written), so
    no caller ever sees it."""


def _finite(value: Any) -> float | None:
    if type(value) is float:  # the common case first
        return value if value - value == 0.0 else None  # NaN and infinities give NaN
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class SummaryAccumulator:
    """Incremental form of :func:`compute_summary`: ``add`` each episode, then ``result``.

    Each trace is counted in one population: the trainable traces, or the others. The run
    averages over all traces only when none is trainable, and then all of them are the
    others, in the same order: so a trainable trace is added once, not twice, and once a
    trace of the run was trainable the others are no longer added up at all."""

    def __init__(self) -> None:
        self._trainable = _Means()
        self._others = _Means()
        self._episodes = 0
        self._errors = 0
        # Counted apart from the means: a trainable trace whose numbers were all dropped
        # as non-finite is still trainable, and must not switch the run to all traces.
        self._trainable_traces = 0
        self._traces = 0

    def add(self, episode: Mapping[str, Any], written: bytes | None = None) -> None:
        """Count ``episode``: exactly ``add_reading(read_episode(episode, written))``, read
        and added in one pass where every value it reads is plain (exact dicts holding the
        keys verifiers writes, bools and finite floats), so a run can count it under its lock
        for less than the reading and the adding cost apart (docs/benchmarks.md). Anything
        else (a key missing, a NaN, an int, a mapping of another type) is met before anything
        is added and read the two-pass way, so the result and the order of the means' names
        never differ, and an error leaves the sums as they were."""
        traces = episode.get("traces") or ()
        # First the traces averaged, each checked plain, its reward summed: nothing added yet.
        # Exact dicts only, read by subscript (a missing key is a KeyError: the two-pass way, as
        # is anything else not plain, _TwoPass).
        counted = []  # (reward, rewards, metrics) of each trace averaged
        trainables = 0
        spread = 0.0  # the sum of the metrics read: finite only if each of them is
        try:
            for trace in traces:
                if type(trace) is not dict or type(agent := trace["agent"]) is not dict:
                    raise _TwoPass
                trainable = agent["trainable"]
                if trainable is True:
                    if not trainables:  # the traces read until now are not trainable: not averaged
                        counted = []
                    trainables += 1
                elif trainable is not False:  # not a bool: read_episode's to read
                    raise _TwoPass
                elif trainables:
                    continue  # a trainable trace came first: this one is not averaged
                rewards = trace["rewards"]
                metrics = trace["metrics"]
                if type(rewards) is not dict or type(metrics) is not dict:
                    raise _TwoPass
                total: Any = 0  # content.episodes.reward_and_scores's sum: its operations, in its order
                for entry in rewards.values():
                    if type(entry) is not dict:
                        if entry is None:
                            continue
                        raise _TwoPass
                    score = entry["score"]
                    if score is None:  # the trace's reward is dropped (reward_and_scores): read_episode's
                        raise _TwoPass
                    weight = entry["weight"]
                    if type(score) is not float or (weight is not None and type(weight) is not float):
                        raise _TwoPass
                    total += score * (1.0 if weight is None else weight)
                # A NaN or an infinity among the scores and weights makes the sum one (inf * 0
                # and inf - inf are NaN): one check for all of them, and for a sum that overflows.
                if total - total != 0.0:
                    raise _TwoPass
                for value in metrics.values():
                    if type(value) is not float:
                        if value is None:
                            continue
                        raise _TwoPass
                    spread += value  # likewise: finite only if every metric is
                counted.append((total if type(total) is float else 0.0, rewards, metrics))
        except (KeyError, _TwoPass):  # outside the loops: an error reading again is not caught here
            return self.add_reading(read_episode(episode, written))
        if spread - spread != 0.0:
            return self.add_reading(read_episode(episode, written))
        # Then the additions, as add_reading makes them (nothing here can raise).
        self._episodes += 1
        self._errors += episode.get("ok") is not True
        self._traces += len(traces)
        if trainables:
            self._trainable_traces += trainables
            means = self._trainable
        elif self._trainable_traces:
            return None  # the others are averaged only in a run with no trainable trace (result)
        else:
            means = self._others
        by_name = means.metrics_by_name
        for reward, rewards, metrics in counted:
            if _LOW < reward < BIG:  # content/means.py's split, inline: this runs per trace
                means.reward_sum += reward
            else:
                means.reward_big += reward * SCALE
            means.reward_count += 1
            # Each reward's score by name, or the metric of its name in its place; then each
            # metric no reward's score stood for: read_episode's order.
            for name, entry in rewards.items():
                if entry is None or (number := entry["score"]) is None:
                    continue
                if name in metrics and (value := metrics[name]) is not None:
                    number = value
                try:
                    sums = by_name[name]
                except KeyError:  # once a name a run (an exception costs nothing until raised)
                    sums = by_name[name] = [0.0, 0.0, 0]  # a sum from 0.0: -0.0 becomes 0.0
                if _LOW < number < BIG:  # as the rewards
                    sums[0] += number
                else:
                    sums[1] += number * SCALE
                sums[2] += 1
            for name, number in metrics.items():
                if number is None or (name in rewards and (entry := rewards[name]) is not None
                                      and entry["score"] is not None):
                    continue  # counted in the reward's place
                try:
                    sums = by_name[name]
                except KeyError:
                    sums = by_name[name] = [0.0, 0.0, 0]
                if _LOW < number < BIG:
                    sums[0] += number
                else:
                    sums[1] += number * SCALE
                sums[2] += 1
        return None

    @property
    def counts(self) -> tuple[int, int]:
        """The episodes and the traces added: episodes that hold no trace at all have no
        row for the platform (docs/projection.md), which a run's end tells."""
        return self._episodes, self._traces

    def add_reading(self, reading: EpisodeReading) -> None:
        """Count an episode as :func:`read_episode` read it: a few additions, so a run can
        read its episodes outside its lock and count them under it."""
        error, traces, trainable, counted = reading
        self._episodes += 1
        self._errors += error
        self._traces += traces
        if trainable:
            self._trainable_traces += trainable
            means = self._trainable
        elif self._trainable_traces:
            return  # the others are averaged only in a run with no trainable trace (result)
        else:
            means = self._others
        for reward, numbers in counted:
            if reward is not None:
                if _LOW < reward < BIG:  # as above
                    means.reward_sum += reward
                else:
                    means.reward_big += reward * SCALE
                means.reward_count += 1
            if numbers:
                by_name = means.metrics_by_name
                get = by_name.get
                for name, number in numbers.items():
                    entry = get(name)
                    if entry is None:
                        entry = by_name[name] = [0.0, 0.0, 0]  # a sum from 0.0: -0.0 becomes 0.0
                    if _LOW < number < BIG:
                        entry[0] += number
                    else:
                        entry[1] += number * SCALE
                    entry[2] += 1

    def result(self) -> dict[str, Any]:
        """``{avg_reward, avg_metrics, avg_error}`` for the episodes added so far."""
        pool = self._trainable if self._trainable_traces else self._others  # others: all traces, then
        traces = self._trainable_traces or self._traces
        return {
            "avg_reward": pool.reward(traces),
            "avg_metrics": pool.metrics(),
            "avg_error": self._errors / self._episodes if self._episodes else 0.0,
        }


def compute_summary(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The run summary of ``episodes`` (any iterable; consumed once, not held)."""
    accumulator = SummaryAccumulator()
    for episode in episodes:
        accumulator.add(episode)
    return accumulator.result()
