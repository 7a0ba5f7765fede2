"""A run's sink under ``--local``: a later plain ``sync --local`` carries on where the run went.

``--local``'s ``auto`` means samples for a run that has no sink yet (the embedded platform
is not asked), but a run whose state records Prime Traces there (``--to traces`` earlier)
was refused by a plain ``--local`` ("not samples; sync it with --to traces"): its ``auto``
had been turned into ``--to samples``. The real ``prime-runs sync --local --db``, one database."""

from __future__ import annotations

import pytest

from support.runs import RunBuilder
from test_sync_advice import Local


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True])
def test_a_plain_local_sync_continues_a_run_in_the_sink_its_state_records(tmp_path, replay: bool) -> None:
    """Half a run synced ``--local --to traces`` (or its replay), then the rest with plain
    ``--local`` (``--replay`` alone): exit 0, the same evaluation, every episode in Prime
    Traces (a new run under plain ``--local`` goes to samples: tests/test_sync_e2e.py)."""
    builder = RunBuilder(tmp_path / "runs" / "run", f"carry-on-{replay}")
    builder.open_segment()
    builder.add(2)
    local = Local(tmp_path)
    again = ("--replay",) if replay else ()
    code, first = local(*again, "--to", "traces")
    assert (code, first["state"], first["store"]) == (0, "live", "traces"), first
    builder.add(3)
    builder.seal()
    code, later = local(*again)
    assert (code, later["state"], later["store"]) == (0, "synced", "traces"), later
    assert later["evaluation_id"] == first["evaluation_id"] and later["pushed_total"] == 5, later
    if not replay:  # a finished replay is not continued: --replay alone starts another
        code, third = local()
        assert (code, third["state"], third["store"]) == (0, "up_to_date", "traces"), third

