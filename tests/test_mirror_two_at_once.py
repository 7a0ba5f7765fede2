"""Two mirrors of one spool at once: the sidecar ``prime-runs mirror ... &`` still running
when the job's last ``prime-runs mirror --once`` runs after the eval (docs/deploy.md)."""

from __future__ import annotations

import signal
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


@pytest.mark.slow
def test_a_mirror_waiting_for_another_mirrors_pass_stops_on_sigint(tmp_path: Path) -> None:
    """``prime-runs mirror`` waiting its turn at a run another mirror's pass holds (its
    ``spool/mirror.lock``: a sidecar uploading a large segment) did not stop on SIGINT until
    that pass ended, however long the upload. It stops at once, exit 0, having uploaded
    nothing of that run."""
    import fcntl
    import os
    import subprocess
    import time

    from support.children import reaped
    from support.env import CLI, child_env
    from support.runs import build_run

    bucket, outputs = tmp_path / "bucket", tmp_path / "outputs"
    bucket.mkdir()
    build_run(outputs / "a-free", "mirror-sigint-free", 2)
    build_run(outputs / "b-held", "mirror-sigint-held", 2)
    fd = os.open(outputs / "b-held" / "spool" / "mirror.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another mirror's pass over the run, under way
        proc = subprocess.Popen(CLI + ["mirror", str(outputs), f"file://{bucket}", "--interval", "0.1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        with reaped(proc):
            deadline = time.monotonic() + 60
            while not (bucket / "a-free" / "spool" / "seg-000001.jsonl").exists():  # the run before, copied
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                raise AssertionError("the mirror went on waiting for the other's pass after SIGINT") from None
    finally:
        os.close(fd)
    assert proc.returncode == 0, err
    assert not (bucket / "b-held").exists(), out
