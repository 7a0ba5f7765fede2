"""``prime-runs view --export DIR`` stopped on the way: what it leaves must not pass for a
whole export.

The runs page (``index.html``) was written second, right after the stylesheet, so an export
stopped by a full disk (or a quota, or Ctrl-C) left an entry page that opened as if the
export were whole, its links leading to pages never written. It is written last now. The
real command, in a child process whose file size limit (``RLIMIT_FSIZE``; Python ignores
``SIGXFSZ``, so a write past it fails with ``EFBIG``) stops it at the one big episode page.
"""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

from support.env import CLI, child_env
from support.runs import RunBuilder

#: Bytes any one file may reach: the pages and the chart script (210 KB) fit, the big episode's page does not.
FILE_LIMIT = 400_000


def test_an_export_stopped_by_a_full_disk_leaves_no_index_page(tmp_path: Path) -> None:
    builder = RunBuilder(tmp_path / "runs" / "run", "export-stopped")
    builder.open_segment()
    builder.add(2)
    builder.add(1, size=4 * FILE_LIMIT)  # its episode page cannot be written
    builder.seal()
    out = tmp_path / "site"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

    done = subprocess.run([*CLI, "view", str(tmp_path / "runs"), "--export", str(out)], capture_output=True,
                          text=True, timeout=120, env=child_env(), preexec_fn=limit)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("prime-runs: view --export: ") and "File too large" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert (out / "static").is_dir() and not (out / "index.html").exists()

    whole = subprocess.run([*CLI, "view", str(tmp_path / "runs"), "--export", str(out)], capture_output=True,
                           text=True, timeout=120, env=child_env())
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.strip() == (out / "index.html").resolve().as_uri() and (out / "index.html").is_file()
