"""Spools written under older masking rules: nothing they hold at today's credential
locations travels (content/remask.py, docs/masking.md "Spools written under older rules").

The spools here are written straight through the segment writer, the way an earlier
version of this package left them: a manifest without ``masking_version`` and episodes
holding credentials in clear text at locations that version did not mask. Sync must mask
them again before the rows, the metadata and the Prime Traces documents leave, while the
spool itself is left byte for byte as it was.
"""

from __future__ import annotations

import json
import string
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from prime_traces import TracesClient

from fixtures.episodes import make_episode
from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.content.masking import MaskRules, mask
from prime_runs_spool.content.remask import needs_remask, remask_manifest
from prime_runs_spool.spool.layout import list_segments
from prime_runs_spool.spool.writer import SegmentWriter
from prime_runs_spool.sync.rows import RowStream

from support import platform_process
from support.env import CLI, child_env
from support.files import all_bytes_under
from support.leaky import API_KEY, LEAKED, leaky_items, leaky_seat, write_leaky_spool

LAUNCH_SECRET = "ls_OLD_LAUNCH_FILE_SECRET_4242"
CONFIG_SECRET = "cs_OLD_CONFIG_SECRET_1357"
SECRETS = [*LEAKED.values(), LAUNCH_SECRET, CONFIG_SECRET]


def old_manifest(run_id: str) -> dict:
    """A manifest as an older writer recorded it: no ``masking_version``, its config and
    launch file holding what today's rules mask."""
    return {"run_id": run_id, "name": f"old-{run_id}", "environments": ["gsm8k"], "model": "m",
            "framework": "verifiers", "format_version": 1,
            "config": {"model": "m", **leaky_seat(), "env_vars": {"TOKEN": CONFIG_SECRET}},
            "config_source": {"format": "toml", "filename": "eval.toml",
                              "text": f'model = "m"\n[client.default_headers]\nX-Key = "{LAUNCH_SECRET}"\n'}}


def write_old_spool(run_dir: Path, run_id: str, episodes: int = 3, *, manifest: dict | None = None) -> bytes:
    """Returns the spool's bytes as written (the test checks sync leaves them alone)."""
    write_leaky_spool(run_dir, run_id, manifest if manifest is not None else old_manifest(run_id), range(episodes))
    return all_bytes_under(run_dir)


@pytest.mark.slow
def test_an_old_spool_reaches_the_platform_masked_and_is_left_as_it_was(tmp_path: Path) -> None:
    written = {}
    for destination in ("samples", "traces"):  # a run goes to one destination: one run each
        written[destination] = write_old_spool(tmp_path / destination / "old", f"old-{destination}")
        assert all(secret.encode() in written[destination] for secret in LEAKED.values())  # it does hold them
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    outputs = []
    with platform_process.running(db, "--token", API_KEY, "--traces") as server:
        for destination in ("samples", "traces"):
            result = subprocess.run(
                CLI + ["sync", str(tmp_path / destination), "--base-url", server.base_url, "--to", destination,
                       "--json"], capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
            assert result.returncode == 0, result.stdout + result.stderr
            (report,) = json.loads(result.stdout)["runs"]
            assert (report["state"], report["pushed_now"]) == ("synced", 3), report
            outputs.append(result.stdout + result.stderr)
            if destination == "samples":
                with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {API_KEY}"}) as api:
                    evaluation = api.get(f"/evaluations/{report['evaluation_id']}").json()
                    rows = api.get(f"/evaluations/{report['evaluation_id']}/samples").json()["samples"]
            else:
                with TracesClient(api_key=API_KEY, base_url=server.base_url) as traces:
                    (member, *_) = traces.list(run_id=report["evaluation_id"], limit=100).items
                    document = json.loads(traces.get_raw(member.trace_id))
    # what arrived is masked where today's rules mask, and still says what was set
    assert len(rows) == 3
    assert evaluation["metadata"]["env_vars"] == {"TOKEN": "***"}
    assert "config_source" not in evaluation["metadata"]  # today's check refuses that launch file
    seat = rows[0]["info"]["native_wrapper"]["traces"][0]["agent"]["config"]
    assert seat["client"]["extra_headers"] == {"X-Extra": "***"} and seat["client"]["api_key"] == "***"
    assert document["agent"]["config"]["env_vars"] == {"TOKEN": "***"}
    places = {"platform database": all_bytes_under(db.parent), "sync output": "".join(outputs).encode()}
    for secret in SECRETS:
        for where, data in places.items():
            assert secret.encode() not in data, f"a secret of the old spool reached the {where}"
    for destination, before in written.items():  # the user's spool itself is left as it was
        segments = [path for _, path in list_segments(tmp_path / destination / "old")]
        assert segments and all(path.read_bytes() in before for path in segments)


def test_a_current_spool_is_not_masked_again(tmp_path: Path, monkeypatch) -> None:
    """A spool recorded under today's rules was masked at append: sync passes its records
    through untouched rather than walk every config again."""
    import prime_runs_spool.sync.records as records_module

    calls = []
    monkeypatch.setattr(records_module, "remask_episode", lambda record: calls.append(record) or record)
    manifest = {**old_manifest("new-run"), "masking_version": MASKING_VERSION}
    assert not needs_remask(manifest) and needs_remask(old_manifest("x"))
    for claimed in (MASKING_VERSION + 1, 10**9, -1, "1", True, 1.0, None):  # only today's exact version is trusted
        assert needs_remask({**manifest, "masking_version": claimed}), claimed
    write_old_spool(tmp_path, "new-run", manifest=manifest)
    assert len(list(RowStream(tmp_path, None, "ev", 1 << 22, remask=False).rows())) == 3
    assert calls == []
    assert len(list(RowStream(tmp_path, None, "ev", 1 << 22, remask=True).rows())) == 3
    assert len(calls) == 3


secret_text = st.text(string.ascii_letters + string.digits, min_size=8, max_size=16).map(lambda s: f"zq-{s}")
locations = st.sampled_from([
    ("client", "headers"), ("client", "extra_headers"), ("client", "default_headers"), ("client", "default_query"),
    ("sampling_args", "extra_headers"), ("harness", "env"), ("runtime", "env"), ("env_vars",), ("judge", "headers"),
])


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(placed=st.lists(st.tuples(locations, st.text(string.ascii_letters, min_size=1, max_size=8), secret_text),
                       min_size=1, max_size=5),
       api_key=secret_text)
def test_rows_of_an_old_spool_hold_no_credential_at_any_current_location(placed, api_key) -> None:
    """Property: whatever an old spool holds at today's locations, no row carries it, and
    re-masking an already masked record changes nothing."""
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder)
        writer = SegmentWriter.create(run_dir, "prop")
        writer.append("manifest", {"run_id": "prop", "name": "prop", "environments": ["e"], "config": {}})
        episode = make_episode(0, run_id="prop")
        config = episode["traces"][0]["agent"]["config"]
        config.setdefault("client", {})["api_key"] = api_key
        for path, key, secret in placed:
            table = config
            for part in path:
                table = table.setdefault(part, {})
            table[key] = secret
        writer.append_many([("episode", episode, {"episode_id": episode["id"], "rollout_number": 0})])
        writer.close()
        body = b"".join(row.data for row in RowStream(run_dir, None, "ev", 1 << 22, remask=True).rows())
    assert body
    for secret in [api_key, *(secret for _, _, secret in placed)]:
        assert secret.encode() not in body
    rules = MaskRules.defaults_for_episode()
    masked = mask(episode, rules)
    assert mask(masked, rules) == masked


def test_remask_manifest_keeps_a_launch_file_that_today_still_accepts() -> None:
    clean = {**old_manifest("r"), "config_source": {"format": "toml", "filename": "eval.toml", "text": 'model = "m"\n'}}
    warnings: list[str] = []
    again = remask_manifest(clean, warnings)
    assert again["config_source"] == clean["config_source"] and warnings == []
    refused = remask_manifest(old_manifest("r"), warnings)
    assert "config_source" not in refused and "client.default_headers" in warnings[0]
    assert refused["config"]["client"]["api_key"] == "***"


def write_old_spool_with_errors(run_dir: Path, run_id: str, manifest: dict | None = None) -> None:
    """An old spool (no masking_version) whose run completed with one errored episode."""
    write_leaky_spool(run_dir, run_id, manifest if manifest is not None else old_manifest(run_id), range(3),
                      errored={1})


def sync_to_platform(tmp_path: Path, to: str, *, traces: bool = True) -> tuple[subprocess.CompletedProcess, bytes]:
    """``prime-runs sync`` of ``tmp_path/runs`` to a platform process of its own (serving
    Prime Traces too where ``traces``): what the command did, and every byte of the
    platform's database files, read while it still runs."""
    db = tmp_path / "platform" / "platform.db"
    db.parent.mkdir()
    with platform_process.running(db, "--token", API_KEY, *(["--traces"] if traces else [])) as server:
        result = subprocess.run(
            CLI + ["sync", str(tmp_path / "runs"), "--base-url", server.base_url, "--to", to, "--json"],
            capture_output=True, text=True, timeout=120, env=child_env(PRIME_API_KEY=API_KEY))
        return result, all_bytes_under(db.parent)


def sync_and_collect(tmp_path: Path, to: str) -> tuple[dict, bytes, str]:
    """:func:`sync_to_platform`, which must succeed: its one run's report, the database's
    bytes, and all the command printed."""
    result, database = sync_to_platform(tmp_path, to)
    assert result.returncode == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["runs"]
    return report, database, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("to", ["samples", "traces"])
def test_errored_episode_released_at_completion_is_remasked(tmp_path: Path, to: str) -> None:
    write_old_spool_with_errors(tmp_path / "runs" / "old", "old-err")
    report, database, output = sync_and_collect(tmp_path, to)
    assert report["state"] == "synced", report
    leaked = [s for s in LEAKED.values() if s.encode() in database]
    assert not leaked, f"held-back (errored) episode released unmasked: {leaked}"


@pytest.mark.slow
def test_segment_resumed_by_an_older_writer_is_remasked(tmp_path: Path) -> None:
    """Segment 1 written by today's package (masking_version 1, nothing to mask), the run
    then resumed by an older package (its segment's manifest lacks masking_version and its
    episodes hold credentials at today's locations). Sync reads only the first manifest."""
    from prime_runs_spool.content.mask_locations import MASKING_VERSION
    run_dir = tmp_path / "runs" / "mixed"
    run_id = "mixed"
    first = SegmentWriter.create(run_dir, run_id)
    first.append("manifest", {**old_manifest(run_id), "config": {"model": "m"}, "masking_version": MASKING_VERSION,
                              "config_source": None})
    first.append_many([("episode", make_episode(0, run_id=run_id),
                        {"episode_id": make_episode(0, run_id=run_id)["id"], "rollout_number": 0})])
    first.close()  # crashed/stopped: no seal
    second = SegmentWriter.create(run_dir, run_id, expected_last=1, prior_episodes=1)
    second.append("manifest", {**old_manifest(run_id), "resumed": True})  # older writer: no masking_version
    second.append_many(leaky_items(run_id, range(1, 3)))
    second.seal("completed")
    report, database, output = sync_and_collect(tmp_path, "samples")
    assert report["state"] == "synced", report
    leaked = [s for s in LEAKED.values() if s.encode() in database]
    assert not leaked, f"episodes of a segment written under older rules reached the platform unmasked: {leaked}"


def _old_spool_with_config(run_dir: Path, run_id: str, config) -> None:
    write_leaky_spool(run_dir, run_id, {**old_manifest(run_id), "config": config, "config_source": None}, range(1))


@pytest.mark.slow
def test_an_old_manifest_whose_config_is_a_list_of_pairs_is_masked(tmp_path: Path) -> None:
    """remask_manifest masks only a Mapping config; v0_metadata then does dict(config), which
    turns a list of [key, value] pairs into a mapping that travels as the metadata unmasked."""
    _old_spool_with_config(tmp_path / "runs" / "pairs", "pairs",
                           [["model", "m"], ["client", {"api_key": LEAKED["client.api_key"]}],
                            ["env_vars", {"TOKEN": LEAKED["env_vars"]}]])
    _, database = sync_to_platform(tmp_path, "samples", traces=False)
    assert LEAKED["client.api_key"].encode() not in database, "an unmasked config reached the evaluation's metadata"
    assert LEAKED["env_vars"].encode() not in database, "an unmasked config reached the evaluation's metadata"


@pytest.mark.slow
def test_an_old_manifest_whose_config_is_a_string_is_one_line_not_a_crash(tmp_path: Path) -> None:
    _old_spool_with_config(tmp_path / "runs" / "str", "str", "not a table")
    result, _ = sync_to_platform(tmp_path, "samples", traces=False)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.returncode in (0, 1) and result.stdout, (result.returncode, result.stdout, result.stderr)


@pytest.mark.parametrize("version", ["1", True, -1, 1.0, 0, None, [], {}, 1.5])
def test_bogus_masking_versions_are_masked_again(version) -> None:
    from prime_runs_spool.content.remask import needs_remask
    assert needs_remask({"masking_version": version})


@pytest.mark.parametrize("above", [1, 10**30])
def test_a_masking_version_this_package_does_not_know_is_masked_again(above) -> None:
    """A version above MASKING_VERSION is trusted as if this package knew its rules: a
    hand-edited manifest (or any producer) skips re-masking with masking_version: 999999."""
    from prime_runs_spool.content.mask_locations import MASKING_VERSION
    from prime_runs_spool.content.remask import needs_remask
    assert needs_remask({"masking_version": MASKING_VERSION + above})


@pytest.mark.slow
def test_an_export_of_an_old_spool_holds_no_credential(tmp_path: Path) -> None:
    """``prime-runs export --runs`` writes each run's config: a table is a file meant to be
    shared, so an old spool's config is masked by today's rules first, as sync masks it."""
    written = write_old_spool(tmp_path / "runs" / "old", "old-export")
    out = tmp_path / "runs.csv"
    result = subprocess.run(CLI + ["export", str(tmp_path / "runs"), "--runs", "-o", str(out)],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stdout + result.stderr
    table = out.read_text()
    assert "old-export" in table and "***" in table
    assert [secret for secret in SECRETS if secret in table] == []
    assert all_bytes_under(tmp_path / "runs" / "old") == written  # the spool itself is left as it was


@pytest.mark.slow
def test_the_viewer_never_shows_an_old_spools_launch_file_that_today_refuses(tmp_path: Path) -> None:
    """The run page lists the manifest's fields and the compare page diffs them: an old
    spool's ``config_source`` that sets a credential table today's rules mask is left out
    there, as sync leaves it out of the metadata (its config was masked already)."""
    for name in ("old", "older"):
        write_old_spool(tmp_path / "runs" / name, f"view-{name}")
    site = tmp_path / "site"
    result = subprocess.run(CLI + ["view", str(tmp_path / "runs"), "--export", str(site)], capture_output=True,
                            text=True, timeout=120, env=child_env(HOME=str(tmp_path / "home")))
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {page.name: page.read_text(errors="replace") for page in site.rglob("*.html")}
    assert any(name.startswith("run-") for name in pages) and any(name.startswith("compare-") for name in pages)
    assert {name: [s for s in SECRETS if s in text] for name, text in pages.items() if any(s in text for s in SECRETS)} == {}


@pytest.mark.slow
def test_a_seal_error_quoting_a_url_credential_reaches_the_platform_and_the_export_masked(tmp_path: Path) -> None:
    """A spool sealed before the runner masked its error (or by another producer) may quote a
    URL with its credentials: sync masks it before it becomes the evaluation's metadata and
    error message."""
    token = "ghp_OLD_SEAL_ERROR_TOKEN_3131"
    writer = SegmentWriter.create(tmp_path / "runs" / "failed", "old-seal-error")
    writer.append("manifest", old_manifest("old-seal-error"))
    writer.append("episode", make_episode(0, run_id="old-seal-error"), meta={"episode_id": "e0", "rollout_number": 0})
    writer.seal("failed", error=f"CalledProcessError: Command '['git', 'clone', 'https://x:{token}@example.com/r']' "
                                "returned non-zero exit status 128.")
    db = tmp_path / "platform.db"
    result = subprocess.run(CLI + ["sync", str(tmp_path / "runs"), "--local", "--db", str(db), "--json"],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0 and json.loads(result.stdout)["runs"][0]["state"] == "failed", result.stdout + result.stderr
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("platform.db*"))
    assert b"https://***@example.com/r" in stored and token.encode() not in stored
    # and so does a table of the runs, a file meant to be shared
    out = tmp_path / "runs.csv"
    exported = subprocess.run(CLI + ["export", str(tmp_path / "runs"), "--runs", "-o", str(out)],
                              capture_output=True, text=True, timeout=120, env=child_env())
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert "https://***@example.com/r" in out.read_text() and token not in out.read_text()
