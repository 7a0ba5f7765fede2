"""Build spool bytes by hand (with ``framing.encode_line``) for reader tests.

Building in memory, without the writer, lets a test cut or damage a spool at any byte and
know exactly which records a correct reader must return.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prime_runs_spool.spool.format import FORMAT_VERSION, encode_line
from prime_runs_spool.spool.layout import ensure_spool_dir, segment_path

#: (offset, end_offset, seq, type, data, meta) of one line a test wrote.
Written = tuple[int, int, int, str, Any, Any]


def header(run_id: str = "run-1", index: int = 1, version: int = FORMAT_VERSION) -> dict[str, Any]:
    return {
        "format_version": version,
        "run_id": run_id,
        "segment_id": f"seg-{index}",
        "segment_index": index,
        "created_at": "2026-01-01T00:00:00Z",
        "writer": {"pid": 1, "hostname": "test", "package_version": "0"},
    }


def build_segment(
    episodes: list[Any], *, seal: str | None = "completed", index: int = 1, version: int = FORMAT_VERSION
) -> tuple[bytes, list[Written]]:
    """A whole segment: header, manifest, episodes, optional seal; and its lines after the header."""
    lines: list[tuple[str, Any, Any]] = [("manifest", {"name": "test"}, None)]
    # Episode ids are unique within the run (a later segment repeating one is corruption).
    lines += [("episode", ep, {"episode_id": str(i) if index == 1 else f"{index}-{i}", "rollout_number": i})
              for i, ep in enumerate(episodes)]
    if seal is not None:
        lines.append(("seal", {"status": seal, "last_seq": len(lines), "episodes": len(episodes),
                               "finished_at": "2026-01-01T00:00:01Z", "summary": None, "error": None}, None))
    out = bytearray(encode_line(header(index=index, version=version), 0, "header"))
    written: list[Written] = []
    for seq, (record_type, data, meta) in enumerate(lines, start=1):
        line = encode_line(data, seq, record_type, meta)
        written.append((len(out), len(out) + len(line), seq, record_type, data, meta))
        out += line
    return bytes(out), written


def write_segment(run_dir: Path, data: bytes, index: int = 1) -> Path:
    ensure_spool_dir(run_dir)
    path = segment_path(run_dir, index)
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def as_tuples(records: Any) -> list[tuple[int, str, Any, Any]]:
    return [(r.seq, r.type, r.data, r.meta) for r in records]
