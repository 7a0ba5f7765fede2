"""The sample table's view state: filters, sort and page, read from and written to the URL.

The URL is the whole state (a link reopens the same view), so every field here has a
query parameter, and :meth:`TableQuery.params` writes back only what differs from the
default. Filtering and sorting run on the index's rows, server side: a page of the table
is ``PAGE_SIZE`` rows whatever the run's size.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from prime_runs_spool.viewer.index import RunIndex
from prime_runs_spool.viewer.rows import Row
from prime_runs_spool.viewer.spans import EqualBins, interval, mean

PAGE_SIZE = 50
#: The reward histogram has one bin per distinct reward up to this many, else this many equal bins.
HISTOGRAM_BINS = 10

#: Sortable columns and how each sorts; a metric sorts as ``metric:NAME``.
SORT_KEYS = {
    "n": lambda r: r.number,
    "example": lambda r: (r.example_id is None, str(r.example_id) if not isinstance(r.example_id, int) else "",
                          r.example_id if isinstance(r.example_id, int) else 0),
    "rollout": lambda r: (r.rollout is None, r.rollout or 0),
    "reward": lambda r: (r.reward is None, r.reward or 0.0),
    "error": lambda r: (r.error is None, r.error or ""),
    "truncated": lambda r: r.truncated,
    "stop": lambda r: (r.stop is None, r.stop or ""),
    "tokens": lambda r: (r.tokens is None, r.tokens or 0),
    "duration": lambda r: (r.duration is None, r.duration or 0.0),
}


def _float(raw: str | None) -> float | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(raw: str | None, default: int) -> int:
    try:
        return max(1, int(raw)) if raw is not None else default
    except ValueError:
        return default


def _flag(raw: str | None) -> bool:
    return raw is not None and raw not in ("", "0", "false", "off")


@dataclass(frozen=True)
class TableQuery:
    """One view of a run's table. ``rlt`` is an exclusive upper reward bound (a histogram bin)."""

    sort: str = "n"
    desc: bool = False
    page: int = 1
    rmin: float | None = None
    rmax: float | None = None
    rlt: float | None = None
    errors: bool = False
    truncated: bool = False
    q: str = ""
    example: str | None = None
    #: Rows whose stop condition is this, and whose error is of this kind (``error_kind``).
    stop: str | None = None
    ekind: str | None = None
    #: One metric's range: ``metric`` between ``mmin`` and ``mmax`` (either may be open).
    metric: str | None = None
    mmin: float | None = None
    mmax: float | None = None
    #: Full-text search over the run's messages, tool calls and tool output (``search.py``).
    text: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> TableQuery:
        sort = params.get("sort") or "n"
        if sort not in SORT_KEYS and not sort.startswith("metric:"):
            sort = "n"
        example = params.get("example")
        return cls(sort=sort, desc=_flag(params.get("desc")), page=_int(params.get("page"), 1),
                   rmin=_float(params.get("rmin")), rmax=_float(params.get("rmax")), rlt=_float(params.get("rlt")),
                   errors=_flag(params.get("errors")), truncated=_flag(params.get("truncated")),
                   q=(params.get("q") or "").strip()[:200], example=example if example not in (None, "") else None,
                   stop=params.get("stop") or None, ekind=params.get("ekind") or None,
                   metric=params.get("metric") or None, mmin=_float(params.get("mmin")), mmax=_float(params.get("mmax")),
                   text=(params.get("text") or "").strip()[:200])

    def params(self, **changes: Any) -> dict[str, str]:
        """The query parameters of this view with ``changes`` applied, defaults left out."""
        view = replace(self, **changes)
        out: dict[str, str] = {}
        default = TableQuery()
        for field in fields(self):
            value = getattr(view, field.name)
            if value == getattr(default, field.name):
                continue
            out[field.name] = ("1" if value else "0") if isinstance(value, bool) else (
                _fmt_float(value) if isinstance(value, float) else str(value))
        return out

    @property
    def filtered(self) -> bool:
        return any((self.rmin is not None, self.rmax is not None, self.rlt is not None, self.errors, self.truncated,
                    self.q, self.example is not None, self.stop is not None, self.ekind is not None,
                    self.metric is not None and (self.mmin is not None or self.mmax is not None), self.text))

    def cleared(self) -> dict[str, str]:
        """This view's parameters with every filter dropped (sort kept, first page)."""
        return self.params(rmin=None, rmax=None, rlt=None, errors=False, truncated=False, q="", example=None,
                           stop=None, ekind=None, metric=None, mmin=None, mmax=None, text="", page=1)

    def matches(self, row: Row, prompts: Mapping[Any, str], hits: Any = None) -> bool:
        """``hits``: the row numbers the full-text search found (``text`` set)."""
        reward = row.reward
        if self.rmin is not None and (reward is None or reward < self.rmin):
            return False
        if self.rmax is not None and (reward is None or reward > self.rmax):
            return False
        if self.rlt is not None and (reward is None or reward >= self.rlt):
            return False
        if self.errors and row.error is None:
            return False
        if self.truncated and not row.truncated:
            return False
        if self.example is not None and str(row.example_id) != self.example:
            return False
        if self.q and self.q.lower() not in prompts.get(row.example_id, ""):
            return False
        if self.stop is not None and row.stop != self.stop:
            return False
        if self.ekind is not None and error_kind(row.error) != self.ekind:
            return False
        if self.metric is not None and (self.mmin is not None or self.mmax is not None):
            value = row.metrics.get(self.metric)
            if value is None or (self.mmin is not None and value < self.mmin) or \
                    (self.mmax is not None and value > self.mmax):
                return False
        if self.text and (hits is None or row.number not in hits):
            return False
        return True


def error_kind(error: str | None) -> str | None:
    """The kind of a row's error: its type (the text before ``: ``), or the whole short text."""
    if error is None:
        return None
    kind = error.split(": ", 1)[0]
    return kind[:80]


def _fmt_float(value: float) -> str:
    """Shortest text that reads back as the same float (``1`` rather than ``1.0``)."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _sort_key(sort: str) -> Any:
    if sort.startswith("metric:"):
        name = sort[len("metric:"):]
        return lambda r: (name not in r.metrics, r.metrics.get(name, 0.0))
    return SORT_KEYS[sort]


@dataclass
class TablePage:
    rows: list[Row]
    total: int
    page: int
    pages: int


def table_page(index: RunIndex, query: TableQuery, hits: Any = None) -> TablePage:
    """The rows of ``query``'s page, and how many rows match in all. ``hits``: the row
    numbers of the full-text search's matches, when ``query.text`` is set."""
    rows = index.rows
    if query.text and hits is not None:
        # Only the search's hits can match: a rare word's hundred rows are filtered, not the run's
        # every row (rows are numbered by their place in the run).
        everything = rows
        rows = [everything[n - 1] for n in sorted(hits) if 0 < n <= len(everything) and everything[n - 1].number == n]
    if query.filtered:
        rows = [row for row in rows if query.matches(row, index.prompts, hits)]
    if query.sort != "n" or query.desc:
        rows = sorted(rows, key=_sort_key(query.sort), reverse=query.desc)
    total = len(rows)
    pages = max(1, -(-total // PAGE_SIZE))
    page = min(query.page, pages)
    start = (page - 1) * PAGE_SIZE
    return TablePage(rows[start:start + PAGE_SIZE], total, page, pages)


@dataclass
class Bin:
    label: str
    count: int
    params: dict[str, str]
    active: bool


def histogram(index: RunIndex, query: TableQuery) -> list[Bin]:
    """Reward bins over the whole run (unfiltered), each carrying the filter it applies."""
    rewards = [row.reward for row in index.rows if row.reward is not None]
    if not rewards:
        return []
    counts = Counter(rewards)
    distinct = sorted(counts)
    base = {"rmin": None, "rmax": None, "rlt": None, "page": 1}
    if len(distinct) <= HISTOGRAM_BINS:
        return [Bin(_fmt_float(value), counts[value], query.params(**{**base, "rmin": value, "rmax": value}),
                    query.rmin == value and query.rmax == value) for value in distinct]
    low, high = distinct[0], distinct[-1]
    equal = EqualBins(low, high, HISTOGRAM_BINS)
    bins = [0] * HISTOGRAM_BINS
    for reward in rewards:
        bins[equal.index(reward)] += 1
    out = []
    for i, count in enumerate(bins):
        a = equal.edge(i)
        b = high if i == HISTOGRAM_BINS - 1 else equal.edge(i + 1)
        last = i == HISTOGRAM_BINS - 1
        change = {**base, "rmin": a, "rmax": b} if last else {**base, "rmin": a, "rlt": b}
        active = query.rmin == a and ((query.rmax == b) if last else (query.rlt == b))
        out.append(Bin(f"{a:.3g}–{b:.3g}", count, query.params(**change), active))
    return out


# -- compare --------------------------------------------------------------------------

COMPARE_SHOWS = ("all", "improved", "regressed", "only")


@dataclass
class CompareRow:
    example_id: Any
    a: float | None
    b: float | None
    a_count: int
    b_count: int

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def kind(self) -> str:
        if self.a_count == 0 or self.b_count == 0:
            return "only"
        delta = self.delta
        if delta is None or delta == 0:
            return "same"
        return "improved" if delta > 0 else "regressed"


def _means(index: RunIndex) -> dict[str, tuple[Any, float | None, int]]:
    rewards: dict[str, tuple[Any, list[float], list[int]]] = {}
    for row in index.rows:
        example, values, count = rewards.setdefault(str(row.example_id), (row.example_id, [], [0]))
        count[0] += 1
        if row.reward is not None:
            values.append(row.reward)
    return {key: (example, mean(values) if values else None, count[0])
            for key, (example, values, count) in rewards.items()}


#: Resamples of the paired bootstrap (a fixed seed: the same runs give the same interval).
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclass
class CompareSummary:
    """B against A over the examples both ran: mean of the per-example differences (B − A),
    wins, losses, ties, and a 95% paired bootstrap interval of the mean difference."""

    paired: int
    mean_a: float | None
    mean_b: float | None
    mean_delta: float | None
    wins: int
    losses: int
    ties: int
    low: float | None
    high: float | None


def compare_summary(rows: list[CompareRow]) -> CompareSummary:
    import random

    pairs = [(row.a, row.b) for row in rows if row.a is not None and row.b is not None]
    if not pairs:
        return CompareSummary(0, None, None, None, 0, 0, 0, None, None)
    deltas = [b - a for a, b in pairs]
    n = len(deltas)
    rng = random.Random(BOOTSTRAP_SEED)
    means = sorted(sum(rng.choices(deltas, k=n)) / n for _ in range(BOOTSTRAP_RESAMPLES))
    return CompareSummary(
        paired=n, mean_a=mean([a for a, _ in pairs]), mean_b=mean([b for _, b in pairs]), mean_delta=mean(deltas), wins=sum(d > 0 for d in deltas), losses=sum(d < 0 for d in deltas),
        ties=sum(d == 0 for d in deltas), low=means[int(0.025 * BOOTSTRAP_RESAMPLES)],
        high=means[int(0.975 * BOOTSTRAP_RESAMPLES) - 1])


def compare(a: RunIndex, b: RunIndex, show: str) -> list[CompareRow]:
    """Per example id: each run's mean reward over its rollouts; ``show`` filters by kind."""
    left, right = _means(a), _means(b)
    out = []
    for key in sorted(set(left) | set(right), key=lambda k: (len(k), k)):
        la, ra = left.get(key), right.get(key)
        example = (la or ra)[0]  # type: ignore[index]
        row = CompareRow(example, la[1] if la else None, ra[1] if ra else None, la[2] if la else 0,
                         ra[2] if ra else 0)
        if show == "all" or row.kind == show:
            out.append(row)
    if show in ("improved", "regressed"):
        out.sort(key=lambda r: r.delta or 0.0, reverse=show == "improved")
    return out


def neighbour_pairs(runs: list[RunIndex]) -> list[tuple[RunIndex, RunIndex]]:
    """The comparisons a static export carries: each run against the one started just
    before it on the same environments (B the later run), so a rerun is compared with what
    it reran. As many as there are runs, where every pair would be their square."""
    by_environment: dict[tuple[str, ...], list[RunIndex]] = {}
    for run in runs:
        by_environment.setdefault(tuple(run.environments), []).append(run)
    out = []
    for group in by_environment.values():
        group.sort(key=lambda r: (str(r.started or ""), r.key))
        out += list(zip(group, group[1:]))
    return out


def choices(index: RunIndex) -> tuple[list[str], list[str]]:
    """The stop conditions and error kinds of the run's rows (what the filters offer)."""
    stops: dict[str, None] = {}
    kinds: dict[str, None] = {}
    for row in index.rows:
        if row.stop is not None:
            stops[row.stop] = None
        if row.error is not None:
            kinds[error_kind(row.error) or ""] = None
    return sorted(stops)[:200], sorted(kinds)[:200]


# -- the runs page -----------------------------------------------------------------------

#: The runs page's sortable columns and how each sorts (a run with no value last).
RUN_SORTS: dict[str, Any] = {
    "name": lambda r: (r.name.lower(),),
    "status": lambda r: (r.status,),
    "model": lambda r: (r.model is None, str(r.model or "").lower()),
    "environment": lambda r: (not r.environments, ", ".join(r.environments).lower()),
    "episodes": lambda r: (r.episodes,),
    "reward": lambda r: (not isinstance(r.summary.get("avg_reward"), (int, float)),
                         r.summary.get("avg_reward") if isinstance(r.summary.get("avg_reward"), (int, float)) else 0),
    "started": lambda r: (r.started is None, str(r.started or "")),
}


@dataclass(frozen=True)
class RunsQuery:
    """The runs page's view: a sort, a text filter over name, key, model and environment,
    and a status. Like the table's, it is all in the URL."""

    sort: str | None = None
    desc: bool = False
    q: str = ""
    status: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RunsQuery:
        sort = params.get("sort")
        return cls(sort=sort if sort in RUN_SORTS else None, desc=_flag(params.get("desc")),
                   q=(params.get("q") or "").strip()[:200], status=params.get("status") or None)

    def params(self, **changes: Any) -> dict[str, str]:
        view = replace(self, **changes)
        out = {}
        if view.sort:
            out["sort"] = view.sort
        if view.desc:
            out["desc"] = "1"
        if view.q:
            out["q"] = view.q
        if view.status:
            out["status"] = view.status
        return out

    @property
    def filtered(self) -> bool:
        return bool(self.q or self.status)

    def apply(self, runs: list[RunIndex]) -> list[RunIndex]:
        needle = self.q.lower()
        shown = [run for run in runs if (not self.status or run.status == self.status) and (
            not needle or any(needle in str(text).lower()
                              for text in (run.name, run.key, run.model or "", *run.environments)))]
        if self.sort:
            shown.sort(key=RUN_SORTS[self.sort], reverse=self.desc)
        return shown


# -- plots -------------------------------------------------------------------------------

#: A distribution has one bar per distinct value up to this many, else this many equal bins.
PLOT_BINS = 20
#: At most this many metrics get a plot of their own.
MAX_METRIC_PLOTS = 12


@dataclass
class Plot:
    """One distribution: bars with their labels and counts, and the axes' names. ``links``:
    for each bar, the filtered table it opens (None where there is none)."""

    key: str
    title: str
    x_label: str
    labels: list[str]
    counts: list[int]
    links: list[str | None]
    note: str = ""

    def as_data(self) -> dict[str, Any]:
        return {"title": self.title, "x": self.x_label, "y": "episodes" if self.key != "examples" else "examples",
                "labels": self.labels, "counts": self.counts, "links": self.links}


def distribution(values: list[float], bins: int = PLOT_BINS) -> tuple[list[str], list[int]]:
    """Bar labels and counts of ``values``: one bar per distinct value when there are few,
    else ``bins`` equal-width bins from the least to the greatest."""
    if not values:
        return [], []
    distinct = sorted(set(values))
    if len(distinct) <= bins:
        counts: dict[float, int] = {}
        for value in values:
            counts[value] = counts.get(value, 0) + 1
        return [f"{value:.4g}" for value in distinct], [counts[value] for value in distinct]
    equal = EqualBins(distinct[0], distinct[-1], bins)
    out = [0] * bins
    for value in values:
        out[equal.index(value)] += 1
    return [f"{equal.edge(i):.3g}–{equal.edge(i + 1):.3g}" for i in range(bins)], out


def plots(index: RunIndex, bin_link: Any) -> list[Plot]:
    """The run's distributions: reward (each bar opening the table filtered to it), each
    metric, the mean reward per example over its rollouts, tokens and time.
    ``bin_link``: turns a reward bin's filter parameters into a URL."""
    rows = list(index.rows)
    out = []
    bins = histogram(index, TableQuery())
    if bins:
        out.append(Plot("reward", "Reward", "reward", [b.label for b in bins], [b.count for b in bins],
                        [bin_link(b.params) for b in bins]))
    for name in list(index.metric_names)[:MAX_METRIC_PLOTS]:
        labels, counts = distribution([row.metrics[name] for row in rows if name in row.metrics])
        out.append(Plot(f"metric:{name}", f"Metric {name}", name, labels, counts, [None] * len(labels)))
    per_example: dict[str, list[float]] = {}
    for row in rows:
        if row.reward is not None:
            per_example.setdefault(str(row.example_id), []).append(row.reward)
    if per_example:
        means = [mean(values) for values in per_example.values()]
        labels, counts = distribution(means)
        any_solved = sum(1 for values in per_example.values() if any(v > 0 for v in values))
        all_solved = sum(1 for values in per_example.values() if all(v > 0 for v in values))
        rollouts = sum(len(values) for values in per_example.values()) / len(per_example)
        note = (f"{len(per_example)} examples, {rollouts:.3g} rollouts each on average; reward above 0 in at least "
                f"one rollout: {any_solved} ({any_solved / len(per_example):.1%}, pass@k-style), in every "
                f"rollout: {all_solved} ({all_solved / len(per_example):.1%})")
        out.append(Plot("examples", "Mean reward per example", "mean reward over the example's rollouts",
                        labels, counts, [None] * len(labels), note))
    for key, title, x_label, values in (
            ("tokens", "Tokens", "prompt + completion tokens", [float(r.tokens) for r in rows if r.tokens is not None]),
            ("duration", "Time", "seconds", [r.duration for r in rows if r.duration is not None])):
        labels, counts = distribution(values)
        if labels:
            out.append(Plot(key, title, x_label, labels, counts, [None] * len(labels)))
    return out


# -- across runs -------------------------------------------------------------------------

#: What the across-runs plot groups runs by (URL ``group``).
RUN_GROUPS = ("model", "environment")


@dataclass
class RunReward:
    """One run's mean of a value (its reward, or one metric) over its episodes that have
    it, and a 95% interval of the mean (normal approximation: mean ± 1.96 standard errors)."""

    key: str
    name: str
    group: str
    episodes: int
    mean: float
    low: float
    high: float


def across_metrics(runs: list[RunIndex]) -> list[str]:
    """The metrics any of ``runs`` has (the across-runs page offers each), at most MAX_METRIC_PLOTS."""
    names: dict[str, None] = {}
    for run in runs:
        names.update(dict.fromkeys(run.metric_names))
    return sorted(names)[:MAX_METRIC_PLOTS]


def _value(row: Row, metric: str | None) -> float | None:
    value = row.reward if metric is None else row.metrics.get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def run_rewards(runs: list[RunIndex], group: str, metric: str | None = None) -> list[RunReward]:
    """The runs that have a reward (``metric``: that metric instead), grouped (``group``:
    model or environment) then by name."""
    out = []
    for run in runs:
        values = [v for v in (_value(row, metric) for row in list(run.rows)) if v is not None]
        if not values:
            continue
        centre = mean(values)
        low, high = interval(values, centre, 1.96)
        label = (run.model or "–") if group == "model" else (", ".join(run.environments) or "–")
        out.append(RunReward(run.key, run.name, label, len(values), centre, low, high))
    out.sort(key=lambda r: (r.group, r.name, r.key))
    return out
