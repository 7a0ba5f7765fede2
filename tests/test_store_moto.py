"""The server the object-store tests run against refuses conditional writes as sync relies on.

Sync's lease and state are only as safe as the store's conditional PUTs (docs/sync.md,
"Object stores"): a create-only write (``If-None-Match: *``) must be refused when the object
exists, and a replace (``If-Match: <etag>``) when the object changed since that etag. These
tests prove it of moto's server mode through the same library calls the code makes.
"""

from __future__ import annotations


import pytest

from prime_runs_spool.errors import StoreConflict
from prime_runs_spool.store.objects import ObjectStore
from support import moto_server


moto = moto_server.module_fixture()


@pytest.fixture
def store(moto: moto_server.MotoServer) -> ObjectStore:
    return ObjectStore(f"s3://{moto.new_bucket()}/prefix")


@pytest.mark.slow
def test_create_only_put_is_refused_when_the_object_exists(store: ObjectStore) -> None:
    store.create("lease.json", b"first")
    with pytest.raises(StoreConflict):
        store.create("lease.json", b"second")
    assert store.read("lease.json")[0] == b"first"


def test_if_match_put_is_refused_once_the_object_changed(store: ObjectStore) -> None:
    first = store.create("state.json", b"v1")
    second = store.replace("state.json", b"v2", first)
    assert second != first
    with pytest.raises(StoreConflict):
        store.replace("state.json", b"v3", first)  # a stale etag
    assert store.read("state.json")[0] == b"v2"
    store.replace("state.json", b"v3", second)
    assert store.read("state.json")[0] == b"v3"


def test_a_refused_write_that_holds_our_own_bytes_counts_as_ours(store: ObjectStore) -> None:
    """A lost answer retried by the library is refused although the first try landed: the
    object then holds exactly our bytes, and the write is ours."""
    etag = store.create("lease.json", b"mine")
    assert store.create("lease.json", b"mine") == etag


def test_ranged_reads_are_refused_for_a_replaced_object(store: ObjectStore) -> None:
    etag = store.create("seg", b"0123456789")
    assert store.read_range("seg", 2, 5, etag) == b"234"
    store.replace("seg", b"abcdefghij", etag)
    with pytest.raises(StoreConflict):
        store.read_range("seg", 2, 5, etag)
