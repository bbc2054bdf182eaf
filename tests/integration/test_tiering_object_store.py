"""The ObjectStore contract: the same tests against FsspecObjectStore on ``file://``,
``memory://`` and ``s3://`` (a moto server on 127.0.0.1, through s3fs's real HTTP path)."""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from logstore.tiering.fsspec_store import FsspecObjectStore
from logstore.tiering.store import RemoteObjectNotFoundError, RemoteStorageError

MiB = 1024 * 1024
# s3 needs parts of at least 5 MiB; the other backends stream in small parts to exercise it.
PART_BYTES = {"file": 64 * 1024, "memory": 64 * 1024, "s3": 5 * MiB}

MakeStore = Callable[..., FsspecObjectStore]


@pytest.fixture(params=["file", "memory", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    kind = request.param
    if kind == "file":
        url, options = f"file://{tmp_path}/remote", {}
    elif kind == "memory":
        url, options = f"memory://logstore-{uuid.uuid4().hex}", {}
    else:
        moto = request.getfixturevalue("moto_s3")
        url, options = request.getfixturevalue("s3_url"), moto.options()

    def make(cls: type[FsspecObjectStore] = FsspecObjectStore) -> FsspecObjectStore:
        return cls(url, options, part_bytes=PART_BYTES[kind])

    make.kind = kind  # type: ignore[attr-defined]
    yield make


def _file(tmp_path: Path, size: int, name: str = "segment.arrow") -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


def test_uploaded_files_read_back_whole_and_by_range(make_store: MakeStore,
                                                     tmp_path: Path) -> None:
    """Goal: what is put is read back exactly. Method: put a small file (one request) and one
    larger than a part (streamed, multipart on s3), and small bytes; read them whole, by range,
    and past the end (which returns the bytes there are)."""
    store = make_store()
    small, large = _file(tmp_path, 1000, "a"), _file(tmp_path, 2 * PART_BYTES[make_store.kind]
                                                      + 12345, "b")
    assert store.put_file("t-x/0/small", small) == 1000
    assert store.put_file("t-x/0/large", large) == large.stat().st_size
    store.put_bytes("t-x/0/tiny", b"epochs")
    assert store.read_object("t-x/0/small") == small.read_bytes()
    assert store.read_object("t-x/0/large") == large.read_bytes()
    assert store.read_range("t-x/0/large", PART_BYTES[make_store.kind] - 5, 10) == \
        large.read_bytes()[PART_BYTES[make_store.kind] - 5:PART_BYTES[make_store.kind] + 5]
    assert store.read_range("t-x/0/small", 990, 100) == small.read_bytes()[990:]
    assert store.read_object("t-x/0/tiny") == b"epochs"
    assert store.exists("t-x/0/small") and not store.exists("t-x/0/other")


def test_listing_is_recursive_by_prefix_with_sizes_and_times_and_never_stale(
        make_store: MakeStore, tmp_path: Path) -> None:
    """Goal: orphan cleanup can trust a listing. Method: list a prefix (sizes, modification
    times, nothing from a sibling prefix), then delete an object and add one and list again."""
    store = make_store()
    source = _file(tmp_path, 10)
    for key in ("t-x/0/a", "t-x/0/b", "t-x/1/c", "t-xy/0/d"):
        store.put_file(key, source)
    listed = store.list("t-x/0/")
    assert [(i.key, i.size) for i in listed] == [("t-x/0/a", 10), ("t-x/0/b", 10)]
    assert all(i.mtime_ms > 1_600_000_000_000 for i in listed)
    assert [i.key for i in store.list("t-x/")] == ["t-x/0/a", "t-x/0/b", "t-x/1/c"]
    store.delete("t-x/0/a")
    store.put_bytes("t-x/0/e", b"1")
    assert [i.key for i in store.list("t-x/0/")] == ["t-x/0/b", "t-x/0/e"]
    assert store.list("nothing/here/") == []


def test_delete_is_idempotent_and_missing_objects_are_named(make_store: MakeStore) -> None:
    """Goal: retried deletes are harmless and a missing object is reported as such. Method:
    delete twice; read a deleted key and check the error names it and is not retriable."""
    store = make_store()
    store.put_bytes("t-x/0/k", b"data")
    store.delete("t-x/0/k")
    store.delete("t-x/0/k")
    with pytest.raises(RemoteObjectNotFoundError, match="t-x/0/k") as raised:
        store.read_range("t-x/0/k", 0, 4)
    assert not isinstance(raised.value, RemoteStorageError)  # not a retriable wire error


class _FailingMidway(FsspecObjectStore):
    """Fails the local read of a streamed upload after its first part."""

    def _stream(self, source: BinaryIO, remote_path: str) -> None:
        class Source:
            reads = 0

            def read(self, n: int) -> bytes:
                Source.reads += 1
                if Source.reads > 1:
                    raise RuntimeError("the upload was cut off")
                return source.read(n)
        super()._stream(Source(), remote_path)  # type: ignore[arg-type]


def test_an_upload_failing_midway_leaves_no_object(make_store: MakeStore,
                                                    tmp_path: Path) -> None:
    """Goal: a failed upload never leaves a partial object (a multipart upload is aborted, a
    local one is never renamed into place). Method: stream a three-part file whose second read
    fails; the key does not exist afterwards and the error names it."""
    store = make_store(_FailingMidway)
    big = _file(tmp_path, 3 * PART_BYTES[make_store.kind])
    with pytest.raises(RemoteStorageError, match="t-x/0/big.*cut off"):
        store.put_file("t-x/0/big", big)
    assert not make_store().exists("t-x/0/big")


def test_store_pickles_as_its_url_for_spark_executors(make_store: MakeStore) -> None:
    """Goal: executors get a working store from the driver. Method: pickle and unpickle, then
    read an object through the copy."""
    store = make_store()
    store.put_bytes("t-x/0/p", b"payload")
    if make_store.kind == "memory":
        pytest.skip("memory:// is per process")
    copy: Any = pickle.loads(pickle.dumps(store))
    assert copy.url == store.url and copy.read_object("t-x/0/p") == b"payload"


def test_stopped_s3_fails_fast_with_a_retriable_error_naming_the_key(
        moto_s3: Any, s3_url: str, tmp_path: Path) -> None:
    """Goal: an unavailable object store is a retriable KAFKA_STORAGE_ERROR naming the key,
    quickly. Method: stop the moto server, read and upload (both fail), start it again and the
    same store works."""
    store = FsspecObjectStore(s3_url, moto_s3.options())
    store.put_bytes("t-x/0/k", b"v")
    moto_s3.stop()
    with pytest.raises(RemoteStorageError, match="t-x/0/k") as raised:
        store.read_object("t-x/0/k")
    assert raised.value.retriable and raised.value.code == 56
    with pytest.raises(RemoteStorageError, match="t-x/0/new"):
        store.put_file("t-x/0/new", _file(tmp_path, 100))
    moto_s3.start()
    assert store.read_object("t-x/0/k") == b"v"
