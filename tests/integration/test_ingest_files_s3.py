"""jobs/ingest_files.py on s3:// (moto's server on 127.0.0.1, through s3fs): listing with
fresh results (no cached listing), reading lines, and errors naming the URL for a missing
bucket and an unreachable endpoint. Credentials come from the environment (the fixture's)."""

from __future__ import annotations

import socket
from typing import Any

import boto3
import pytest

from jobs.ingest_files import FileLog, IngestError, list_files, read_lines


def _put(moto_s3: Any, bucket: str, key: str, body: bytes) -> None:
    boto3.client("s3", endpoint_url=moto_s3.endpoint_url,
                 region_name="us-east-1").put_object(Bucket=bucket, Key=key, Body=body)


def test_s3_files_are_listed_fresh_admitted_once_and_read(moto_s3: Any, tmp_path: Any) -> None:
    bucket = moto_s3.create_bucket()
    url = f"s3://{bucket}/landing"
    options = moto_s3.options()
    assert list_files(url, options) == []  # no object under the prefix yet: empty, not missing
    _put(moto_s3, bucket, "landing/a.jsonl", b'{"n": 1}\nbad\n')
    _put(moto_s3, bucket, "landing/.partial", b"x")
    _put(moto_s3, bucket, "landing/deeper/b.jsonl", b"{}\n")
    log = FileLog(str(tmp_path / "log"))
    assert log.admit(list_files(url, options)) == 1
    assert log.files[0].url == f"s3://{bucket}/landing/a.jsonl"
    _put(moto_s3, bucket, "landing/c.jsonl", b'{"n": 2}\n')
    assert log.admit(list_files(url, options)) == 2  # seen although listed a moment ago
    rows = [r for b in read_lines([f.url for f in log.files], options)
            for r in b.column("value").to_pylist()]
    assert rows == [b'{"n": 1}', b"bad", b'{"n": 2}']


def test_a_missing_bucket_and_an_unreachable_endpoint_are_named(moto_s3: Any) -> None:
    with pytest.raises(IngestError,
                       match="source directory s3://no-such-bucket-x/in: bucket 'no-such-bucket-x'"
                             " not found"):
        list_files("s3://no-such-bucket-x/in", moto_s3.options())
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {**moto_s3.options(), "endpoint_url": f"http://127.0.0.1:{port}"}
    with pytest.raises(IngestError, match="source directory s3://b/in: cannot list"):
        list_files("s3://b/in", options)
