"""jobs/ingest_files.py without Spark, on local directories: listing, the file log the
stream's offsets index (order, admission once, persistence, replays), micro-batch ends under
maxFilesPerTrigger, partition bins, reading lines, and the source's options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.ingest_files import (
    FileLog,
    IngestError,
    SourceFile,
    bins,
    files_of,
    list_files,
    next_end,
    parse_source_options,
    read_lines,
    storage_options_of,
)


def _land(directory: Path, name: str, text: str, mtime: float) -> Path:
    path = directory / name
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def test_listing_gives_file_urls_and_skips_hidden_files_and_subdirectories(
        tmp_path: Path) -> None:
    _land(tmp_path, "a.jsonl", "{}\n", 100)
    _land(tmp_path, ".b.jsonl.tmp", "{}\n", 100)
    _land(tmp_path, "_SUCCESS", "", 100)
    (tmp_path / "sub").mkdir()
    _land(tmp_path / "sub", "c.jsonl", "{}\n", 100)
    files = list_files(str(tmp_path), {})
    assert files == [SourceFile(f"file://{tmp_path}/a.jsonl", 100.0, 3)]


def test_a_missing_directory_or_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match=f"source directory {tmp_path}/nope: not found"):
        list_files(str(tmp_path / "nope"), {})
    _land(tmp_path, "f.jsonl", "{}\n", 1)
    with pytest.raises(IngestError, match="f.jsonl: is a file, not a directory"):
        list_files(str(tmp_path / "f.jsonl"), {})


def test_the_log_admits_each_file_once_in_mtime_then_path_order_and_persists(
        tmp_path: Path) -> None:
    """Goal: files are admitted in (mtime, URL) order, each once however often listed, and a
    reopened log (a restarted query) holds the same files at the same indexes."""
    landing = tmp_path / "landing"
    landing.mkdir()
    _land(landing, "z.jsonl", "1\n", 100)
    _land(landing, "b.jsonl", "2\n", 200)
    _land(landing, "a.jsonl", "3\n", 200)
    log = FileLog(str(tmp_path / "log"))
    assert log.admit(list_files(str(landing), {})) == 3
    assert [f.url.rsplit("/", 1)[1] for f in log.files] == ["z.jsonl", "a.jsonl", "b.jsonl"]
    assert log.admit(list_files(str(landing), {})) == 3  # listed again: nothing new
    _land(landing, "c.jsonl", "4\n", 50)  # lands late with an old mtime: still admitted, last
    assert log.admit(list_files(str(landing), {})) == 4
    reopened = FileLog(str(tmp_path / "log"))
    assert reopened.files == log.files
    assert reopened.admit(list_files(str(landing), {})) == 4
    assert [f.url.rsplit("/", 1)[1] for f in reopened.between(1, 4)] == \
        ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert sorted(os.listdir(tmp_path / "log")) == [f"{0:020d}.json", f"{3:020d}.json"]


def test_a_batch_beyond_the_log_or_a_gap_in_the_log_is_an_error(tmp_path: Path) -> None:
    log = FileLog(str(tmp_path / "log"))
    log.admit([SourceFile("file:///x/a", 1, 1), SourceFile("file:///x/b", 2, 1)])
    with pytest.raises(IngestError, match=r"holds 2 files, not the files \[1, 3\)"):
        log.between(1, 3)
    log.admit([SourceFile("file:///x/c", 3, 1)])
    (tmp_path / "log" / f"{0:020d}.json").unlink()
    with pytest.raises(IngestError, match="does not follow the 0 files before it"):
        FileLog(str(tmp_path / "log"))


def test_a_batch_ends_at_every_admitted_file_or_max_files_past_its_start() -> None:
    assert next_end(0, 5, None) == 5
    assert next_end(0, 5, 2) == 2
    assert next_end(4, 5, 2) == 5
    assert next_end(5, 5, 2) == 5
    assert files_of({"files": 3}) == 3
    with pytest.raises(IngestError, match="not an offset"):
        files_of({"index": 3})


def test_partitions_keep_the_order_and_cut_at_the_target_size() -> None:
    files = [SourceFile(f"u{i}", i, size) for i, size in enumerate([10, 10, 25, 5, 1])]
    assert bins(files, 20) == [["u0", "u1"], ["u2"], ["u3", "u4"]]
    assert bins([], 20) == []


def test_lines_are_read_whole_file_with_crlf_and_a_missing_last_newline(
        tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b'{"n": 1}\r\n\nlast')
    (tmp_path / "b").write_bytes(b"")
    (tmp_path / "c").write_bytes(b"x\ny\nz\n\xff\n")
    urls = [f"file://{tmp_path}/{n}" for n in "abc"]
    batches = list(read_lines(urls, {}, batch_rows=2))
    rows = [r for b in batches for r in zip(b.column("value").to_pylist(),
                                            b.column("file").to_pylist(), strict=True)]
    assert rows == [(b'{"n": 1}', urls[0]), (b"", urls[0]), (b"last", urls[0]),
                    (b"x", urls[2]), (b"y", urls[2]), (b"z", urls[2]), (b"\xff", urls[2])]
    assert max(b.num_rows for b in batches) == 2
    with pytest.raises(IngestError, match="source file file://.*/gone: gone"):
        list(read_lines([f"file://{tmp_path}/gone"], {}))


def test_options_refuse_credentials_bad_json_and_a_bad_limit() -> None:
    assert storage_options_of('{"endpoint_url": "http://h:1"}') == {"endpoint_url": "http://h:1"}
    with pytest.raises(IngestError, match="storageOptions.secret looks like a credential"):
        storage_options_of('{"secret": "s"}')
    with pytest.raises(IngestError, match="--source-options is not JSON"):
        storage_options_of("{", "--source-options")
    with pytest.raises(IngestError, match="must be a JSON object"):
        storage_options_of("[1]")
    with pytest.raises(IngestError, match="maxFilesPerTrigger must be a positive integer"):
        parse_source_options({"path": "/x", "maxFilesPerTrigger": "0"})
    with pytest.raises(IngestError, match="path .* is required"):
        parse_source_options({})
    parsed = parse_source_options({"path": "s3://b/p", "fileLog": "/cp/f",
                                   "maxFilesPerTrigger": "7"})
    assert (parsed.url, parsed.file_log, parsed.max_files_per_trigger) == ("s3://b/p", "/cp/f", 7)
