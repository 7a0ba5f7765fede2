"""What a test reads back from disk: every file under a folder, and all their bytes."""

from __future__ import annotations

from pathlib import Path


def all_bytes_under(root: Path) -> bytes:
    """Every byte of every file under ``root``, concatenated (for 'no secret anywhere' checks)."""
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


def run_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())
