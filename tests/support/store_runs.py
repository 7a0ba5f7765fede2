"""Put local spools into a bucket, as ``aws s3 cp -r`` or a CI artifact step would."""

from __future__ import annotations

from pathlib import Path

from prime_runs_spool.spool.layout import list_segments


def raw_store(url: str):  # noqa: ANN201  (obstore's store type)
    from obstore.store import from_url

    return from_url(url)


def upload_run(url: str, run_dir: Path, relative: str) -> None:
    """Copy every segment of ``run_dir`` to ``<url>/<relative>/spool/`` (plain PUTs)."""
    import obstore

    store = raw_store(url)
    for _, path in list_segments(run_dir):
        obstore.put(store, f"{relative}/spool/{path.name}", path.read_bytes())


def put_object(url: str, key: str, data: bytes) -> None:
    import obstore

    obstore.put(raw_store(url), key, data)


def get_object(url: str, key: str) -> bytes | None:
    import obstore

    try:
        return bytes(obstore.get(raw_store(url), key).bytes())
    except FileNotFoundError:
        return None
