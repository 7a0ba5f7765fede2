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
