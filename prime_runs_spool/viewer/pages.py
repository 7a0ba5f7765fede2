"""Each page of the viewer, from its view state (a dict of query parameters) to HTML.

Kept apart from the HTTP app so the static export renders exactly the same pages, only
with other links (:class:`~.render.ExportLinks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prime_runs_spool.errors import SpoolError, UnknownRunError
from prime_runs_spool.viewer.diff import config_diff
from prime_runs_spool.viewer.index import RunIndex
from prime_runs_spool.viewer.query import (COMPARE_SHOWS, RUN_GROUPS, RunsQuery, TableQuery, across_metrics,
                                           choices, compare,
                                           compare_summary, histogram, neighbour_pairs, plots, run_rewards, table_page)
from prime_runs_spool.viewer.render import Links, render
from prime_runs_spool.viewer.search import episode_text, passage, query_words
from prime_runs_spool.viewer.sources import Source
from prime_runs_spool.viewer.statuses import meaning
from prime_runs_spool.viewer.rows import Row
from prime_runs_spool.viewer.transcript import Glance, episode_of, final_answer, glance, trace_views

#: How long a page request may spend reading new lines of its runs (seconds); whatever is
#: left is read by the index's background thread.
RUN_BUDGET = 0.05
RUNS_PAGE_BUDGET = 0.02
#: The group view shows at most this many rollouts side by side.
MAX_GROUP = 32
#: The side-by-side of two runs offers at most this many rollouts of the example per run.
MAX_PAIR_ROLLOUTS = 32
#: The columns of the sample table before and after the run's metrics: (sort key, label).
COLUMNS_BEFORE = (("n", "#"), ("example", "example"), ("rollout", "rollout"), ("prompt", "prompt"),
                  ("answer", "answer"), ("reward", "reward"))
COLUMNS_AFTER = (("error", "error"), ("truncated", "truncated"), ("stop", "stop"), ("tokens", "tokens"),
                 ("duration", "time"))


class Pages:
    def __init__(self, source: Source, links: Links) -> None:
        self.source = source
        self.links = links

    def _run(self, key: str | None, budget: float = RUN_BUDGET) -> RunIndex:
        if not key:
            raise UnknownRunError("no run given (add ?run=KEY)")
        run = self.source.get(key)
        run.refresh(budget)
        run.catch_up_in_background()
        return run

    def message(self, title: str, message: str) -> str:
        return render("message.html", links=self.links, title=title, message=message)

    def runs(self, params: Mapping[str, str], fragment_url: str | None) -> str:
        runs = self.source.runs()
        for run in runs:
            run.refresh(RUNS_PAGE_BUDGET)
            run.catch_up_in_background()
        query = RunsQuery.from_params(params)
        statuses = sorted(dict.fromkeys(run.status for run in runs))
        everything, runs = runs, query.apply(runs)
        shown = dict.fromkeys(run.status for run in runs)
        legend = [(status, meaning(status)) for status in shown if meaning(status)]
        standings = {run.key: run.standing() for run in runs}
        context = {"links": self.links, "runs": runs, "refresh": fragment_url, "legend": legend,
                   "standings": standings, "show_synced": any(s is not None for s in standings.values()),
                   "query": query, "statuses": statuses, "everything": everything,
                   # an export has no compare form: it lists the comparisons it carries instead
                   "comparisons": neighbour_pairs(everything) if self.links.static_export else []}
        if params.get("fragment"):
            return render("_runs_table.html", **context)
        return render("runs.html", **context)

    def run(self, params: Mapping[str, str], fragment_url: str | None) -> str:
        run = self._run(params.get("run"))
        query = TableQuery.from_params(params)
        metric_names = list(run.metric_names)
        columns = [*COLUMNS_BEFORE, *((f"metric:{name}", name) for name in metric_names), *COLUMNS_AFTER]
        summary = run.summary
        items = [(key, value) for key, value in summary.items() if not isinstance(value, Mapping)]
        for key, value in summary.items():
            if isinstance(value, Mapping):
                items += [(f"{key}.{name}", inner) for name, inner in value.items()]
        search = run.search() if query.text else None  # no index is made for a run nobody searches
        hits = search.hits(query.text) if search is not None else None
        table = table_page(run, query, hits)
        stops, error_kinds = choices(run)
        glances, snippets = self._glances(run, table.rows, query_words(query.text) if hits is not None else [])
        context = {
            "links": self.links, "run": run, "query": query, "table": table, "glances": glances,
            "bins": histogram(run, query), "metric_names": metric_names, "columns": columns,
            "summary_items": items, "identity": {k: v for k, v in run.manifest.items() if k != "config"},
            "refresh": fragment_url if (run.live or run.behind) else None, "status_meaning": meaning(run.status),
            "standing": run.standing(), "stops": stops, "error_kinds": error_kinds, "search": search,
            "searchable": run.searchable,
            "snippets": snippets,
        }
        if params.get("fragment"):
            return render("_run_body.html", **context)
        return render("run.html", **context)

    @staticmethod
    def _glances(run: RunIndex, rows: list[Row], words: list[str]) -> tuple[dict[int, Glance],
                                                                             dict[int, list[tuple[str, bool]]]]:
        """Each shown row's prompt and answer, read from its record: the page's rows only,
        one record at a time, so a table page costs its 50 records whatever the run's size.
        With ``words`` (a search's), each row's first passage holding one of them, too."""
        glances, snippets = {}, {}
        for row, record in run.records(rows):
            # a record that cannot be read shows nothing here: the row's error or the run's says why
            if isinstance(record, SpoolError):
                glances[row.number] = Glance("", "")
                continue
            episode = episode_of(record)
            glances[row.number] = glance(episode)
            if words:
                snippets[row.number] = passage(episode_text(episode), words)
        return glances, snippets

    def episode(self, params: Mapping[str, str]) -> str:
        run = self._run(params.get("run"))
        try:
            number = int(params.get("n") or "")
        except ValueError:
            raise UnknownRunError("no episode number given (add &n=NUMBER)") from None
        if not 1 <= number <= len(run.rows):
            raise UnknownRunError(f"run {run.key!r} has no episode {number} (it has {len(run.rows)})")
        row = run.rows[number - 1]
        raw = run.record(row)
        episode = episode_of(raw)
        traces = trace_views(episode)
        seen = glance(episode)
        expected = next((trace.answer for trace in traces if trace.task_prompt == seen.prompt), None)
        lead = {"prompt": seen.prompt, "expected": expected} if seen.prompt else None
        return render("episode.html", links=self.links, run=run, row=row, raw=raw, episode=episode,
                      traces=traces, lead=lead, status_meaning=meaning(run.status),
                      hl_words=query_words(params.get("hl") or "")[:20],
                      prev=number - 1 if number > 1 else None, next=number + 1 if number < len(run.rows) else None)

    def group(self, params: Mapping[str, str]) -> str:
        run = self._run(params.get("run"))
        example = params.get("example")
        rows = [row for row in run.rows if str(row.example_id) == example]
        if not rows:
            raise UnknownRunError(f"run {run.key!r} has no example {example!r}")
        rows.sort(key=lambda r: (r.rollout is None, r.rollout or 0, r.number))
        shown = rows[:MAX_GROUP]
        cards = [{"row": row, "answer": final_answer(episode_of(run.record(row)))} for row in shown]
        prompt = None
        if cards:
            traces = trace_views(episode_of(run.record(shown[0])))
            prompt = next((t.task_prompt for t in traces if t.task_prompt), None)
        return render("group.html", links=self.links, run=run, example=example, cards=cards, prompt=prompt,
                      more=len(rows) - len(shown))

    def pair(self, params: Mapping[str, str]) -> str:
        """One example's transcripts in runs A and B, side by side: one rollout of each
        (``ra``, ``rb``: its place among the run's rollouts of the example, 1 by default)."""
        a, b = self._run(params.get("a")), self._run(params.get("b"))
        example = params.get("example")
        sides = [self._side(run, example, params.get(pick)) for run, pick in ((a, "ra"), (b, "rb"))]
        if not any(side["rows"] for side in sides):
            raise UnknownRunError(f"neither run has an example {example!r}")
        prompt = next((side["glance"].prompt for side in sides if side["glance"] and side["glance"].prompt), "")
        return render("pair.html", links=self.links, a=a, b=b, example=example, sides=sides, prompt=prompt)

    @staticmethod
    def _side(run: RunIndex, example: str | None, pick: str | None) -> dict[str, Any]:
        rows = sorted((row for row in run.rows if str(row.example_id) == example),
                      key=lambda r: (r.rollout is None, r.rollout or 0, r.number))[:MAX_PAIR_ROLLOUTS]
        try:
            chosen = min(max(1, int(pick or "1")), max(1, len(rows)))
        except ValueError:
            chosen = 1
        side: dict[str, Any] = {"run": run, "rows": rows, "chosen": chosen, "row": None, "traces": [],
                                "glance": None, "problem": None}
        if rows:
            row = side["row"] = rows[chosen - 1]
            try:
                episode = episode_of(run.record(row))
            except SpoolError as exc:  # one side unreadable: the other is still shown
                side["problem"] = str(exc)
            else:
                side["traces"], side["glance"] = trace_views(episode), glance(episode)
        return side

    def plots(self, params: Mapping[str, str]) -> str:
        run = self._run(params.get("run"))
        shown = plots(run, lambda bin_params: self.links.run(run.key, bin_params))
        return render("plots.html", links=self.links, run=run, plots=shown,
                      data={plot.key: plot.as_data() for plot in shown})

    def across(self, params: Mapping[str, str]) -> str:
        """Mean reward (or one metric's mean: ``metric``) per run with its interval, grouped
        by model or environment."""
        group = params.get("group") if params.get("group") in RUN_GROUPS else RUN_GROUPS[0]
        runs = self.source.runs()
        for run in runs:
            run.refresh(RUNS_PAGE_BUDGET)
            run.catch_up_in_background()
        metrics = across_metrics(runs)
        metric = params.get("metric") if params.get("metric") in metrics else None
        shown = run_rewards(runs, group, metric)
        groups = list(dict.fromkeys(r.group for r in shown))
        value = metric if metric is not None else "reward"
        data = {"labels": [f"{r.name} ({r.key})" for r in shown], "groups": groups,
                "group_of": [groups.index(r.group) for r in shown], "means": [r.mean for r in shown],
                "lows": [r.low for r in shown], "highs": [r.high for r in shown], "by": group, "value": value,
                "links": [self.links.run(r.key) for r in shown]}
        return render("across.html", links=self.links, rewards=shown, group=group, groups=RUN_GROUPS, data=data,
                      metric=metric, metrics=metrics, value=value, behind=any(run.behind for run in runs))

    def compare(self, params: Mapping[str, str]) -> str:
        a, b = self._run(params.get("a")), self._run(params.get("b"))
        show = params.get("show") if params.get("show") in COMPARE_SHOWS else "all"
        everything = compare(a, b, "all")
        counts = {name: (len(everything) if name == "all" else sum(r.kind == name for r in everything))
                  for name in COMPARE_SHOWS}
        rows = everything if show == "all" else compare(a, b, show)
        shows = [("all", "all"), ("improved", "improved"), ("regressed", "regressed"), ("only", "only in one")]
        prompts = {str(row.example_id): a.prompt_heads.get(row.example_id) or b.prompt_heads.get(row.example_id) or ""
                   for row in rows}
        config = config_diff(a.manifest, b.manifest)
        return render("compare.html", links=self.links, a=a, b=b, show=show, rows=rows, counts=counts,
                      shows=shows, summary=compare_summary(everything), prompts=prompts, config=config,
                      differing=[line for line in config if not line.same])

