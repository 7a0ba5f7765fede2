"""Two mirrors of one spool at once: the sidecar ``prime-runs mirror ... &`` still running
when the job's last ``prime-runs mirror --once`` runs after the eval (docs/deploy.md)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from prime_runs_spool.content.remask import copy_masking
from prime_runs_spool.store.mirror import MirrorMemory, mirror_pass
from prime_runs_spool.store.objects import ObjectStore
from support.store_runs import live_run


@pytest.mark.slow
def test_a_mirror_still_uploading_an_older_size_never_lands_it_over_the_last_mirrors_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar's pass took the live segment's durable size and was uploading it when
    the eval sealed the run and the last mirror uploaded all of it and took the live
    marker away. Its upload then landed the older, shorter copy over the whole one and put
    the live marker back: a machine shut down then left the bucket without the run's last
    episodes and its seal (the run crashed, for every sync), and a sync that had read the
    whole copy found the lines it pushed lost."""
    (tmp_path / "bucket").mkdir()
    url, outputs = f"file://{tmp_path}/bucket", tmp_path / "outputs"
    builder, segment = live_run(outputs / "eval-1", "two-mirrors", 3)
    uploading, go_on = threading.Event(), threading.Event()
    upload = ObjectStore.upload_prefix

    def held_upload(self, key, path, size):  # noqa: ANN001, ANN202
        if threading.current_thread().name == "sidecar":
            uploading.set()
            assert go_on.wait(30)
        return upload(self, key, path, size)

    monkeypatch.setattr(ObjectStore, "upload_prefix", held_upload)
    errors: list[BaseException] = []

    def run(name: str) -> threading.Thread:
        def body() -> None:
            try:
                [report] = mirror_pass([outputs], ObjectStore(url), MirrorMemory(), masking=copy_masking)
                assert report.error is None, report.error
            except BaseException as exc:  # noqa: BLE001 - told by the test's thread
                errors.append(exc)
        thread = threading.Thread(target=body, name=name)
        thread.start()
        return thread

    sidecar = run("sidecar")
    assert uploading.wait(30)
    builder.add(2)
    builder.seal()
    last = run("last")
    last.join(3)  # done, or waiting for the sidecar's pass
    go_on.set()
    sidecar.join(30)
    last.join(30)
    assert not errors, errors
    stored = tmp_path / "bucket" / "eval-1" / "spool"
    assert (stored / segment.name).read_bytes() == segment.read_bytes()
    assert not (stored / f"{segment.name}.live").exists()
