"""The columns of the exported tables: their names, in order, and what each holds.

One table has a row per episode (``samples``), the other a row per run (``runs``). A
column's kind is one of :data:`KINDS`, the same in every format, so a column never changes
type from one row (or one Parquet row group) to the next: an example id, which may be a
number in one task set and a string in another, is text. Metrics are columns too, one per
name, named ``metric:<name>`` (the prefix keeps a metric called ``reward`` apart from the
``reward`` column); which names there are is known only once every run was read
(export/tables.py), so they sit between the fixed columns given here.
"""

from __future__ import annotations

from dataclasses import dataclass

TEXT, INT, FLOAT, BOOL = "text", "int", "float", "bool"
KINDS = (TEXT, INT, FLOAT, BOOL)
#: What a metric's column name starts with.
METRIC_PREFIX = "metric:"
#: The most distinct metric names a table takes (each is a column); a run reporting more is
#: refused by name rather than written as a table no tool opens comfortably.
MAX_METRIC_COLUMNS = 1_000


@dataclass(frozen=True)
class Column:
    name: str
    kind: str


def metric_column(name: str) -> Column:
    return Column(METRIC_PREFIX + name, FLOAT)


#: Per episode, before the metric columns.
SAMPLE_HEAD = (
    Column("run_id", TEXT),
    Column("run_name", TEXT),
    Column("model", TEXT),
    Column("environment", TEXT),
    Column("episode_id", TEXT),
    Column("example_id", TEXT),
    Column("rollout", INT),
    Column("reward", FLOAT),
)
#: Per episode, after the metric columns.
SAMPLE_TAIL = (
    Column("ok", BOOL),
    Column("error", TEXT),
    Column("stop_condition", TEXT),
    Column("is_truncated", BOOL),
    Column("prompt_tokens", INT),
    Column("completion_tokens", INT),
    Column("reasoning_tokens", INT),
    Column("started_at", FLOAT),
    Column("duration_s", FLOAT),
    Column("model_s", FLOAT),
    Column("scoring_s", FLOAT),
    Column("prompt", TEXT),
    Column("final_answer", TEXT),
    Column("reference_answer", TEXT),
)
#: Per run, before the metric columns (each metric's column holds its run average).
RUN_HEAD = (
    Column("run_id", TEXT),
    Column("run_name", TEXT),
    Column("model", TEXT),
    Column("environments", TEXT),
    Column("framework", TEXT),
    Column("created_at", TEXT),
    Column("status", TEXT),
    Column("episodes", INT),
    Column("avg_reward", FLOAT),
    Column("avg_error", FLOAT),
)
#: Per run, after the metric columns.
RUN_TAIL = (
    Column("finished_at", TEXT),
    Column("error", TEXT),
    Column("path", TEXT),
    Column("config", TEXT),
)


def table_columns(head: tuple[Column, ...], metric_names: list[str], tail: tuple[Column, ...]) -> list[Column]:
    return [*head, *(metric_column(name) for name in metric_names), *tail]
