"""The mirror's live marker (store/mirror.py): what a sync of the store listing it at any
moment of a mirror's pass takes a live run for."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_runs_spool.content.remask import copy_masking
from prime_runs_spool.store.mirror import mirror_pass
from prime_runs_spool.store.objects import ObjectStore
from support.runs import RunBuilder
from support.store_runs import Fleet
from support.sync_e2e import api, assert_exactly_once, server  # noqa: F401  (fixtures)


@pytest.mark.slow
def test_a_sync_between_a_live_segments_upload_and_its_marker_says_live_not_crashed(
        tmp_path: Path, server, api, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The mirror uploaded a live segment, then wrote its live marker: a sync of the store
    listing it between the two found an unsealed segment with no marker, a run whose mirror
    had died, and recorded it ``crashed`` on the platform (its evaluation closed FAILED)
    while its eval still ran. The marker goes first; each sync made right after an upload
    of the live segment says ``live``."""
    fleet = Fleet(tmp_path, server.base_url, monkeypatch)
    builder = RunBuilder(fleet.outputs / "eval-1", "marker-before-bytes")
    builder.open_segment()
    builder.add(3)
    said: list[str] = []

    class SyncedRightAfterEachUpload(ObjectStore):
        def upload_prefix(self, key: str, path, size: int) -> None:  # noqa: ANN001
            super().upload_prefix(key, path, size)
            said.append(fleet.sync("m").state)

    def mirror() -> None:
        [report] = mirror_pass([fleet.outputs], SyncedRightAfterEachUpload(fleet.url), fleet.memory,
                               masking=copy_masking)
        assert report.error is None, report.error

    mirror()
    builder.add(2)
    mirror()
    builder.seal()
    mirror()
    assert said == ["live", "live", "synced"], said
    assert fleet.sync("m").state == "up_to_date"
    assert_exactly_once(api, builder)


def test_a_marker_written_before_a_long_upload_is_written_again_after_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Written before the segment's bytes, a marker is as old as the upload once they are up:
    an upload of a live segment lasting longer than the marker's lifetime (a large segment
    over a slow link) left a segment whose marker had gone stale, a run every sync took for
    crashed until the next pass. One that aged past a third of its lifetime meanwhile is
    written again after the upload; a quick upload writes it once."""
    import time
    import types

    from prime_runs_spool.store import mirror as mirror_module
    from prime_runs_spool.store.mirror import MirrorMemory
    from prime_runs_spool.store.source import LIVE_MARKER_TTL
    from support.store_runs import live_run

    (tmp_path / "bucket").mkdir()
    url, outputs = f"file://{tmp_path}/bucket", tmp_path / "outputs"
    builder, _ = live_run(outputs / "eval-1", "marker-after-long-upload", 3)
    skew = [0.0]
    monkeypatch.setattr(mirror_module, "time", types.SimpleNamespace(time=lambda: time.time() + skew[0]))
    upload_lasts = [0.0]
    writes: list[str] = []

    class Timed(ObjectStore):
        def upload_prefix(self, key: str, path, size: int) -> None:  # noqa: ANN001
            super().upload_prefix(key, path, size)
            skew[0] += upload_lasts[0]

        def overwrite(self, key: str, data: bytes) -> None:
            writes.append(key.rsplit("/", 1)[-1])
            super().overwrite(key, data)

    memory = MirrorMemory()

    def mirror() -> None:
        [report] = mirror_pass([outputs], Timed(url), memory, masking=copy_masking)
        assert report.error is None and report.uploaded, report

    mirror()
    assert writes == ["seg-000001.jsonl.live"]  # once, before the bytes
    writes.clear()
    skew[0] += LIVE_MARKER_TTL / 2  # the next pass finds it a third of its lifetime old
    builder.add(1)
    upload_lasts[0] = LIVE_MARKER_TTL * 1.5
    mirror()
    assert writes == ["seg-000001.jsonl.live"] * 2  # before the bytes, and again once they were up
