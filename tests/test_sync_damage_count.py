"""The count a damage line gives of the errored episodes held before the damage, in-process
against the real local platform: right for real damage, and a bug met while counting is the
run's internal error, never a count of 0 said without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.local_client import local_settings
from support.runs import RunBuilder
from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.platform_api.client import PlatformClient
from prime_runs_spool.sync.many import sync_run
from prime_runs_spool.sync.options import RunReport, SyncOptions
from prime_runs_spool.sync.sinks import base as sinks_base
from prime_runs_spool.sync.state import Destination

DEST = Destination(key="damage-count-dest", base_url="http://local")


def _damage_line(builder: RunBuilder, line: int) -> int:
    """Flip a bit inside the given line (0 is the header) of the run's first segment: a
    complete line that fails its check. Returns the line's byte offset."""
    segment = builder.run_dir / "spool" / "seg-000001.jsonl"
    data = bytearray(segment.read_bytes())
    offset = 0 if line == 0 else [i for i, b in enumerate(data) if b == 0x0A][line - 1] + 1
    data[offset + 20] ^= 0x04
    segment.write_bytes(bytes(data))
    return offset


def _held_before_damage(tmp_path: Path) -> RunBuilder:
    """Two ok episodes, two errored ones, two ok ones, sealed completed; the fifth episode's
    line damaged: the errored two are held (the run never completes as far as sync reads)."""
    builder = RunBuilder(tmp_path / "run", "damage-count")
    builder.open_segment()
    builder.add(2)
    builder.add(2, ok=False)
    builder.add(2)
    builder.seal()
    _damage_line(builder, 6)  # header, manifest, four episodes
    return builder


def _sync(tmp_path: Path, run_dir: Path, *, skip_corrupt: bool = False) -> RunReport:
    with EmbeddedPlatform(tmp_path / "platform.db") as platform:
        with PlatformClient(local_settings(platform)) as client:
            return sync_run(run_dir, client, DEST, SyncOptions(skip_corrupt=skip_corrupt))


def test_damage_counts_the_errored_episodes_held_before_it(tmp_path: Path) -> None:
    builder = _held_before_damage(tmp_path)
    report = _sync(tmp_path, builder.run_dir)
    assert (report.state, report.pushed_now) == ("corrupt", 2)
    assert report.error.endswith("everything before it was pushed but 2 errored ones, held until the run completes; "
                                 "sync again with --skip-corrupt to push the intact records after it (each stretch "
                                 "skipped is named, and recorded in the evaluation)"), report.error


def test_a_bug_met_while_counting_is_the_runs_internal_error_not_a_count_of_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting reads the held episodes again; anything but what the reader raises on a
    damaged or unreadable segment is a bug, told as one rather than read as 'none held'."""
    builder = _held_before_damage(tmp_path)

    def broken_reader(*args: object, **kwargs: object) -> None:
        raise TypeError("a bug in the reader")

    monkeypatch.setattr(sinks_base, "held_episodes", broken_reader)
    report = _sync(tmp_path, builder.run_dir)
    assert (report.state, report.error) == ("error", "internal error: TypeError: a bug in the reader")


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_damage_before_the_state_is_loaded_is_corrupt_with_nothing_held(tmp_path: Path, skip_corrupt: bool) -> None:
    """A damaged manifest stops the pass before its state exists: nothing pushed, none held.
    It said "everything before it was pushed" (nothing was), and with --skip-corrupt nothing
    said why the flag passed nothing."""
    builder = RunBuilder(tmp_path / "run", "damage-count-manifest")
    builder.open_segment()
    builder.add(2, ok=False)
    builder.seal()
    offset = _damage_line(builder, 1)
    report = _sync(tmp_path, builder.run_dir, skip_corrupt=skip_corrupt)
    assert (report.state, report.pushed_now) == ("corrupt", 0)
    assert report.error.endswith(f"corrupt at byte {offset}: a damaged line; a complete line that fails its check is "
                                 "never a torn tail; this pass pushed nothing: the damage is in a segment's header or "
                                 "manifest, which the run's evaluation and resumes are read from, so not even "
                                 "--skip-corrupt passes it"), report.error


def test_a_corrupt_run_says_how_to_push_past_the_damage_and_that_advice_works(tmp_path: Path) -> None:
    """A run stopped by damage says what to run next (a user otherwise meets `corrupt`, exit 1,
    and nothing in the line naming the way on); following it pushes the intact records after
    the damage, each once, and the advice is not repeated to a sync that already skips."""
    builder = RunBuilder(tmp_path / "run", "damage-advice")
    builder.open_segment()
    builder.add(4)
    builder.seal()
    _damage_line(builder, 3)  # header, manifest, the second episode
    stopped = _sync(tmp_path, builder.run_dir)
    assert (stopped.state, stopped.pushed_now) == ("corrupt", 1), stopped.error
    assert "; sync again with --skip-corrupt to push the intact records after it" in stopped.error, stopped.error
    skipped = _sync(tmp_path, builder.run_dir, skip_corrupt=True)
    assert (skipped.state, skipped.pushed_now, skipped.pushed_total) == ("synced", 2, 3), skipped
    assert "--skip-corrupt" not in (skipped.error or ""), skipped.error
