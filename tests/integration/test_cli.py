"""The ``logstore`` command against a real broker process, run the way a user runs it: as a
subprocess, with stdin, stdout, stderr and exit codes checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.brokers import free_port, subprocess_env, write_broker_toml

CLI_TIMEOUT_S = 60


def logstore(*args: str, stdin: str | None = None, bootstrap: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "logstore", *args]
    if bootstrap is not None:
        command += ["--bootstrap-server", bootstrap]
    return subprocess.run(command, input=stdin, capture_output=True, text=True,
                          env=subprocess_env(), timeout=CLI_TIMEOUT_S)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr}"
    return result.stdout


def expected_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    return result.stderr


def new_topic() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def test_topic_lifecycle_create_list_describe_alter_delete(broker) -> None:
    """A topic created from the CLI is listed, described with one line per partition, takes a
    config change, and is gone after delete."""
    topic = new_topic()
    assert topic in ok(logstore("topics", "create", topic, "--partitions", "3",
                                "--config", "retention.ms=60000", bootstrap=broker.bootstrap))
    assert topic in ok(logstore("topics", "list", bootstrap=broker.bootstrap)).split()
    described = ok(logstore("topics", "describe", topic, bootstrap=broker.bootstrap))
    assert "PartitionCount: 3" in described and "retention_ms=60000" in described
    partition_lines = [line for line in described.splitlines() if "Partition:" in line]
    assert len(partition_lines) == 3
    assert all("Leader: 0" in line and "LogEndOffset: 0" in line for line in partition_lines)
    ok(logstore("topics", "alter", topic, "--config", "retention_ms=1000",
                bootstrap=broker.bootstrap))
    assert "retention_ms=1000" in ok(logstore("topics", "describe", topic,
                                              bootstrap=broker.bootstrap))
    ok(logstore("topics", "delete", topic, bootstrap=broker.bootstrap))
    assert topic not in ok(logstore("topics", "list", bootstrap=broker.bootstrap)).split()
    assert "UNKNOWN_TOPIC_OR_PARTITION" in expected_error(
        logstore("topics", "describe", topic, bootstrap=broker.bootstrap))


def test_produce_from_stdin_then_consume_from_beginning(broker) -> None:
    """Lines on stdin become records (key before the separator); consume prints each back as
    offset<TAB>key<TAB>value, and a record without a key prints its key as null."""
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "1", bootstrap=broker.bootstrap))
    lines = "".join(f"k{i}:value {i}\n" for i in range(50))
    ok(logstore("produce", topic, "--key-separator", ":", "--acks", "all", stdin=lines,
                bootstrap=broker.bootstrap))
    ok(logstore("produce", topic, "--acks", "1", stdin="no key here\n",
                bootstrap=broker.bootstrap))
    out = ok(logstore("consume", topic, "--from-beginning", "--max-messages", "51",
                      "--timeout-ms", "10000", bootstrap=broker.bootstrap))
    expected = [f"{i}\tk{i}\tvalue {i}" for i in range(50)] + ["50\tnull\tno key here"]
    assert out.splitlines() == expected


def test_consume_from_an_offset_and_stop_after_max_messages(broker) -> None:
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "2", bootstrap=broker.bootstrap))
    stdin = "".join(f"v{i}\n" for i in range(20))
    ok(logstore("produce", topic, "--partition", "1", stdin=stdin, bootstrap=broker.bootstrap))
    out = ok(logstore("consume", topic, "--partition", "1", "--offset", "15", "--max-messages",
                      "3", "--timeout-ms", "10000", bootstrap=broker.bootstrap))
    assert out.splitlines() == ["15\tnull\tv15", "16\tnull\tv16", "17\tnull\tv17"]


def test_consume_across_partitions_stops_after_timeout(broker) -> None:
    """Without --max-messages, consume ends once nothing arrived for --timeout-ms."""
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "3", bootstrap=broker.bootstrap))
    stdin = "".join(f"k{i}\tv{i}\n" for i in range(30))
    ok(logstore("produce", topic, "--key-separator", "\t", stdin=stdin,
                bootstrap=broker.bootstrap))
    out = ok(logstore("consume", topic, "--from-beginning", "--timeout-ms", "1500",
                      bootstrap=broker.bootstrap))
    pairs = sorted(tuple(line.split("\t")[1:]) for line in out.splitlines())
    assert pairs == sorted((f"k{i}", f"v{i}") for i in range(30))


@pytest.mark.parametrize("name", ["bad name!", "..", "x" * 250])
def test_invalid_topic_name_exits_1_with_a_clear_message(broker, name) -> None:
    err = expected_error(logstore("topics", "create", name, "--partitions", "1",
                                  bootstrap=broker.bootstrap))
    assert "INVALID_TOPIC_EXCEPTION" in err and "topic name" in err


def test_bad_topic_requests_exit_1_naming_the_problem(broker) -> None:
    assert "INVALID_PARTITIONS" in expected_error(
        logstore("topics", "create", new_topic(), "--partitions", "0",
                 bootstrap=broker.bootstrap))
    assert "'no_such_key'" in expected_error(
        logstore("topics", "create", new_topic(), "--partitions", "1", "--config",
                 "no_such_key=1", bootstrap=broker.bootstrap))
    assert "UNKNOWN_TOPIC_OR_PARTITION" in expected_error(
        logstore("consume", new_topic(), "--from-beginning", "--timeout-ms", "100",
                 bootstrap=broker.bootstrap))


def test_produce_line_without_separator_exits_1_after_sending_earlier_lines(broker) -> None:
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "1", bootstrap=broker.bootstrap))
    err = expected_error(logstore("produce", topic, "--key-separator", ":",
                                  stdin="a:1\nb:2\nno separator\nc:3\n",
                                  bootstrap=broker.bootstrap))
    assert "line 3" in err and "2 record(s)" in err
    out = ok(logstore("consume", topic, "--from-beginning", "--timeout-ms", "1000",
                      bootstrap=broker.bootstrap))
    assert out.splitlines() == ["0\ta\t1", "1\tb\t2"]


def test_unreachable_broker_exits_1_without_traceback(tmp_path: Path) -> None:
    err = expected_error(logstore("topics", "list", bootstrap=f"127.0.0.1:{free_port()}"))
    assert "NETWORK_EXCEPTION" in err or "BROKER_NOT_AVAILABLE" in err


def test_unknown_key_in_broker_toml_names_key_and_file(tmp_path: Path) -> None:
    config = write_broker_toml(tmp_path / "broker.toml", {
        "broker_id": 0, "listener": "127.0.0.1:0", "log_dirs": [str(tmp_path / "data")],
        "log_dir": "typo"})
    err = expected_error(logstore("broker", "start", "--config", str(config)))
    assert "'log_dir'" in err and str(config) in err
    assert not (tmp_path / "data").exists(), "a rejected config must not create log dirs"


def test_missing_broker_toml_is_reported(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert str(missing) in expected_error(logstore("broker", "start", "--config", str(missing)))


def test_broker_stops_cleanly_on_sigint_and_keeps_data_across_restart(broker_factory) -> None:
    """Ctrl-C (SIGINT) stops the broker with exit 0; after a restart on the same log dir the
    records produced before are still there."""
    broker = broker_factory()
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "1", bootstrap=broker.bootstrap))
    ok(logstore("produce", topic, stdin="one\ntwo\n", bootstrap=broker.bootstrap))
    assert broker.kill(signal.SIGINT) == 0, broker.stderr_tail()
    broker.restart()
    out = ok(logstore("consume", topic, "--from-beginning", "--max-messages", "2",
                      "--timeout-ms", "10000", bootstrap=broker.bootstrap))
    assert out.splitlines() == ["0\tnull\tone", "1\tnull\ttwo"]


def test_broker_start_sets_the_malloc_thresholds_unless_malloc_tuning_is_off(
        broker, broker_factory) -> None:
    """Goal: ``logstore broker start`` tunes glibc's malloc for its own process by default and
    leaves it alone with ``malloc_tuning = false``. Method: the startup log of the shared
    broker, and of one started with the key off."""
    line = "malloc: mmap threshold 16 MiB, trim threshold 64 MiB"
    assert line in broker.stderr_path.read_text()
    off = broker_factory(malloc_tuning=False)
    assert line not in off.stderr_path.read_text()


@pytest.mark.skipif("ARROW_DEFAULT_MEMORY_POOL" in os.environ,
                    reason="the environment chooses the brokers' pool")
@pytest.mark.skipif("jemalloc" not in pa.supported_memory_backends(),
                    reason="this pyarrow has no jemalloc")
def test_broker_start_chooses_arrows_memory_pool_before_pyarrow_is_imported(
        broker, broker_factory) -> None:
    """Goal: ``logstore broker start`` runs Arrow on the system allocator by default and on
    the one ``arrow_memory_pool`` names otherwise, which works only if the CLI chose it before
    anything imported pyarrow (libarrow makes its default pool at import). Method: the pool
    the startup log reports (read back from pyarrow in the broker's process), for the shared
    broker and for one started with jemalloc (mimalloc, pyarrow's default, would also be what
    a choice made too late gives)."""
    assert "arrow memory pool: system (arrow_memory_pool)" in broker.stderr_path.read_text()
    chosen = broker_factory(arrow_memory_pool="jemalloc")
    assert "arrow memory pool: jemalloc (arrow_memory_pool)" in chosen.stderr_path.read_text()


def test_broker_listener_and_log_dir_flags_override_the_file(tmp_path: Path) -> None:
    """--listener and --log-dir win over the TOML file; the startup line names the real port."""
    port = free_port()
    config = write_broker_toml(tmp_path / "broker.toml", {
        "broker_id": 7, "listener": "127.0.0.1:1", "log_dirs": [str(tmp_path / "unused")]})
    command = [sys.executable, "-m", "logstore", "broker", "start", "--config", str(config),
               "--listener", f"127.0.0.1:{port}", "--log-dir", str(tmp_path / "used")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=subprocess_env())
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded: the process either prints or exits
        assert line.strip() == f"logstore broker 7 listening on 127.0.0.1:{port}", \
            process.stderr.read() if process.poll() is not None else line
        assert (tmp_path / "used").is_dir() and not (tmp_path / "unused").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    assert process.returncode == 0, stderr


def test_broker_and_cli_run_where_pyspark_cannot_be_imported(tmp_path: Path) -> None:
    """Goal: the broker and the command need no pyspark (it is the ``spark`` extra). Method: a
    ``pyspark`` module that raises ImportError shadows the real one on PYTHONPATH; a broker
    started from the CLI with it serves a topic create, a produce and a consume, and stops
    with exit 0."""
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "pyspark.py").write_text(
        'raise ImportError("pyspark is not installed (test shadow)")\n')
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shadow"), env["PYTHONPATH"]])
    port = free_port()
    config = write_broker_toml(tmp_path / "broker.toml", {
        "broker_id": 0, "listener": f"127.0.0.1:{port}", "log_dirs": [str(tmp_path / "data")]})
    process = subprocess.Popen([sys.executable, "-m", "logstore", "broker", "start", "--config",
                                str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)

    def run(*args: str, stdin: str | None = None) -> str:
        return ok(subprocess.run([sys.executable, "-m", "logstore", *args, "--bootstrap-server",
                                  f"127.0.0.1:{port}"], input=stdin, capture_output=True,
                                 text=True, env=env, timeout=CLI_TIMEOUT_S))

    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded: the process either prints or exits
        assert "listening on" in line, process.stderr.read() if process.poll() is not None \
            else line
        run("topics", "create", "plain", "--partitions", "1")
        run("produce", "plain", stdin="one\n")
        assert run("consume", "plain", "--from-beginning", "--max-messages", "1",
                   "--timeout-ms", "10000").splitlines() == ["0\tnull\tone"]
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    assert process.returncode == 0, stderr

def test_consume_from_an_offset_past_the_end_names_the_valid_range(broker) -> None:
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "1", bootstrap=broker.bootstrap))
    ok(logstore("produce", topic, stdin="a\nb\n", bootstrap=broker.bootstrap))
    err = expected_error(logstore("consume", topic, "--partition", "0", "--offset", "5",
                                  "--timeout-ms", "2000", bootstrap=broker.bootstrap))
    assert "OFFSET_OUT_OF_RANGE" in err and "[0, 2]" in err



# -- consume --group, --print-partition, --print-timestamp -------------------------------------


def group_offsets(group: str, bootstrap: str) -> dict[tuple[str, int], tuple[str, str, str]]:
    """``groups describe``'s table: (topic, partition) -> (current offset, log end, lag)."""
    out = ok(logstore("groups", "describe", group, bootstrap=bootstrap))
    lines = out.splitlines()
    start = lines.index("TOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tLAG-SECONDS\t"
                        "MEMBER") + 1
    rows = [line.split("\t") for line in lines[start:] if not line.startswith("total lag")]
    return {(topic, int(p)): (current, end, lag) for topic, p, current, end, lag, _, _ in rows}


def test_consume_with_group_resumes_where_the_last_one_stopped_and_commits(broker) -> None:
    """Goal: ``consume --group`` commits what it printed, as kafka-console-consumer does.
    Method: 5 records in each of 2 partitions; a first group member prints 4 and exits, and
    ``groups describe`` shows 4 committed in all; a second one (--from-beginning again, which
    a committed offset overrides) prints exactly the 6 others; then every partition's
    committed offset is its log end and the lag is 0."""
    topic, group = new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    ok(logstore("topics", "create", topic, "--partitions", "2", bootstrap=broker.bootstrap))
    for p in (0, 1):
        ok(logstore("produce", topic, "--partition", str(p),
                    stdin="".join(f"p{p}-v{i}\n" for i in range(5)), bootstrap=broker.bootstrap))

    def consume(count: int) -> set[tuple[str, ...]]:
        out = ok(logstore("consume", topic, "--group", group, "--from-beginning",
                          "--print-partition", "--max-messages", str(count),
                          "--timeout-ms", "30000", bootstrap=broker.bootstrap))
        return {tuple(line.split("\t")) for line in out.splitlines()}

    first = consume(4)
    assert len(first) == 4
    committed = group_offsets(group, broker.bootstrap)
    assert sum(int(c) for c, _, _ in committed.values() if c != "-") == 4, committed
    second = consume(6)
    assert not first & second
    assert first | second == {(str(p), str(i), "null", f"p{p}-v{i}")
                              for p in (0, 1) for i in range(5)}
    assert group_offsets(group, broker.bootstrap) == {
        (topic, 0): ("5", "5", "0"), (topic, 1): ("5", "5", "0")}


@pytest.mark.parametrize("flags", [["--partition", "0"], ["--partition", "0", "--offset", "1"],
                                   ["--offset", "1"]])
def test_consume_group_with_partition_or_offset_is_a_usage_error(broker, flags) -> None:
    """A group member reads what the group assigns it from the committed offsets, so choosing
    a partition or an offset is refused before anything is sent (exit 2), as Kafka does."""
    result = logstore("consume", new_topic(), "--group", "g", *flags, bootstrap=broker.bootstrap)
    assert result.returncode == 2, result.stderr
    assert "--group cannot be combined with --partition or --offset" in result.stderr
    assert "Traceback" not in result.stderr


def test_print_partition_and_timestamp_tell_records_of_different_partitions_apart(
        broker) -> None:
    """Goal: two records at offset 0 of different partitions print differently. Method: one
    record into each of two partitions; with --print-partition and --print-timestamp each line
    is partition, offset, timestamp (ms, between before and after producing), key, value."""
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", "2", bootstrap=broker.bootstrap))
    before_ms = time.time_ns() // 1_000_000
    for p, value in ((0, "a"), (1, "b")):
        ok(logstore("produce", topic, "--partition", str(p), stdin=f"{value}\n",
                    bootstrap=broker.bootstrap))
    after_ms = time.time_ns() // 1_000_000
    out = ok(logstore("consume", topic, "--from-beginning", "--print-partition",
                      "--print-timestamp", "--max-messages", "2", "--timeout-ms", "10000",
                      bootstrap=broker.bootstrap))
    rows = sorted(line.split("\t") for line in out.splitlines())
    assert [(p, offset, key, value) for p, offset, _, key, value in rows] == [
        ("0", "0", "null", "a"), ("1", "0", "null", "b")]
    assert all(before_ms <= int(stamp) <= after_ms for _, _, stamp, _, _ in rows), rows


# -- typed topics: --value-schema, JSON lines in and out ---------------------------------------

TYPED_COLUMNS = ["id: int64", "name: string", "price: decimal128(10,2)", "tags: list<string>",
                 "at: timestamp[ms,UTC]", "day: date32", "addr: struct<city:string,zip:int32>",
                 "score: double"]
TYPED_SPEC = ",".join(c.replace(": ", ":", 1) for c in TYPED_COLUMNS)


def usage_error(result: subprocess.CompletedProcess[str]) -> str:
    """An argument argparse rejected: exit 2, a usage line, one error line, no traceback."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert "error: argument --value-schema: " in result.stderr, result.stderr
    return result.stderr


def create_typed(bootstrap: str, spec: str = TYPED_SPEC, partitions: int = 1) -> str:
    topic = new_topic()
    ok(logstore("topics", "create", topic, "--partitions", str(partitions), "--value-schema",
                spec, bootstrap=bootstrap))
    return topic


def described_columns(described: str) -> list[str]:
    lines = described.splitlines()
    start = lines.index("\tValueColumns:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("\t\t")]


def consume_json(topic: str, bootstrap: str, count: int) -> list[tuple[int, str, dict]]:
    out = ok(logstore("consume", topic, "--from-beginning", "--max-messages", str(count),
                      "--timeout-ms", "10000", bootstrap=bootstrap))
    rows = [line.split("\t", 2) for line in out.splitlines()]
    return [(int(offset), key, json.loads(value)) for offset, key, value in rows]


def test_typed_topic_is_described_in_the_syntax_create_takes(broker) -> None:
    """describe prints one ``name: type`` line per value column, in --value-schema syntax, so
    the columns read back are the spec; an untyped topic shows no such block."""
    topic = new_topic()
    out = ok(logstore("topics", "create", topic, "--partitions", "2", "--value-schema",
                      TYPED_SPEC, bootstrap=broker.bootstrap))
    assert f"{len(TYPED_COLUMNS)} value column(s)" in out
    described = ok(logstore("topics", "describe", topic, bootstrap=broker.bootstrap))
    assert described_columns(described) == TYPED_COLUMNS
    assert len([line for line in described.splitlines() if "Partition:" in line]) == 2
    untyped = new_topic()
    ok(logstore("topics", "create", untyped, "--partitions", "1", bootstrap=broker.bootstrap))
    assert "ValueColumns" not in ok(logstore("topics", "describe", untyped,
                                             bootstrap=broker.bootstrap))


def test_typed_produce_json_lines_then_consume_them_back_equal(broker) -> None:
    """JSON lines written the way consume prints them (timestamps, dates and decimals as text)
    come back equal, key included; absent and null columns come back null."""
    topic = create_typed(broker.bootstrap)
    rows = [{"id": i, "name": f"n{i}", "price": f"{i}.25", "tags": [f"t{i}", "x"],
             "at": f"2024-05-01 12:00:0{i}.000Z", "day": f"2024-05-0{i + 1}",
             "addr": {"city": "Oslo", "zip": 150 + i}, "score": i / 4} for i in range(5)]
    rows.append({name: None for name in rows[0]})
    keyed = [{"key": f"k{i}", **row} if i % 2 else row for i, row in enumerate(rows)]
    stdin = "".join(json.dumps(row) + "\n" for row in keyed)
    result = logstore("produce", topic, stdin=stdin, bootstrap=broker.bootstrap)
    assert "produced 6 record(s)" in ok(result) + result.stderr
    assert consume_json(topic, broker.bootstrap, 6) == [
        (i, f"k{i}" if i % 2 else "null", row) for i, row in enumerate(rows)]


def test_typed_produce_normalises_the_other_accepted_forms(broker) -> None:
    """Integer timestamps (in the column's unit), numbers for decimals, 1.0 for an integer, a
    column left out and a timestamp column mixing both forms are all stored as the type."""
    topic = create_typed(broker.bootstrap, "id:int64,price:decimal128(6,2),at:timestamp[ms,UTC]")
    stdin = ('{"id": 1.0, "price": 12.3, "at": 1714564800000}\n'
             '{"id": 2, "price": 7, "at": "2024-05-01T12:00:01Z"}\n'
             '\n'
             '{"price": "0.5"}\n')
    ok(logstore("produce", topic, stdin=stdin, bootstrap=broker.bootstrap))
    assert [value for _, _, value in consume_json(topic, broker.bootstrap, 3)] == [
        {"id": 1, "price": "12.30", "at": "2024-05-01 12:00:00.000Z"},
        {"id": 2, "price": "7.00", "at": "2024-05-01 12:00:01.000Z"},
        {"id": None, "price": "0.50", "at": None}]


@pytest.mark.parametrize(("line", "expected"), [
    ('{"id": "seven"}', ["column 'id'", '"seven"', "expected an integer, got a string"]),
    ('{"id": 1.5}', ["column 'id'", "1.5", "truncated"]),
    ('{"tags": "abc"}', ["column 'tags'", "expected a list"]),
    ('{"addr": {"city": "x", "street": "y"}}', ["column 'addr'", "unknown field 'street'"]),
    ('{"price": 0.125}', ["column 'price'", "0.125", "decimal128(10,2)"]),
    ('{"key": 5}', ["column 'key'", "expected a string"]),
    ('{"idd": 1}', ["unknown column(s) ['idd']"]),
    ("[1, 2]", ["expected a JSON object"]),
    ("{not json", ["is not JSON"]),
], ids=["string-for-int", "fraction-for-int", "string-for-list", "unknown-struct-field",
        "too-precise-decimal", "non-string-key", "unknown-column", "not-an-object", "not-json"])
def test_typed_produce_bad_line_names_line_and_column_after_sending_earlier_lines(
        broker, line, expected) -> None:
    """The lines before the bad one are sent (and counted in the message), the bad one and
    those after it are not, and the error names the line number and the column."""
    topic = create_typed(broker.bootstrap)
    stdin = f'{{"id": 1}}\n{{"id": 2, "key": "k"}}\n{line}\n{{"id": 4}}\n'
    err = expected_error(logstore("produce", topic, stdin=stdin, bootstrap=broker.bootstrap))
    assert "line 3" in err and "the 2 record(s) before it were sent" in err, err
    assert all(fragment in err for fragment in expected), err
    assert [(key, value["id"]) for _, key, value in consume_json(topic, broker.bootstrap, 2)] \
        == [("null", 1), ("k", 2)]


def test_typed_consume_prints_partition_and_timestamp_columns_before_key_and_value(
        broker) -> None:
    """A typed topic's lines take the same optional columns: --print-partition first,
    --print-timestamp after the offset, then the key and the value as a JSON object."""
    topic = create_typed(broker.bootstrap, "id:int64", partitions=2)
    ok(logstore("produce", topic, "--partition", "1", stdin='{"id": 7, "key": "k"}\n',
                bootstrap=broker.bootstrap))
    out = ok(logstore("consume", topic, "--from-beginning", "--print-partition",
                      "--print-timestamp", "--max-messages", "1", "--timeout-ms", "10000",
                      bootstrap=broker.bootstrap))
    partition, offset, stamp, key, value = out.rstrip("\n").split("\t")
    assert (partition, offset, key, json.loads(value)) == ("1", "0", "k", {"id": 7})
    assert int(stamp) > 0

def test_key_separator_is_refused_for_a_typed_topic(broker) -> None:
    topic = create_typed(broker.bootstrap, "id:int64")
    err = expected_error(logstore("produce", topic, "--key-separator", ":",
                                  stdin='k:{"id": 1}\n', bootstrap=broker.bootstrap))
    assert "--key-separator" in err and '"key"' in err


@pytest.mark.parametrize(("spec", "expected"), [
    ("id:int64,price:dobule", ["column 'price'", "unknown type 'dobule'"]),
    ("id:int64,name", ["column 'name' needs ':'"]),
    ("id int64", ["column 'id' needs ':'", "'int64'"]),
    ("id:int64,id:string", ["duplicate column 'id'"]),
    ("key:string", ["column 'key' is reserved"]),
    ("id:int64,timestamp:int64", ["column 'timestamp' is reserved"]),
    ("headers:binary", ["column 'headers' is reserved"]),
    ("tags:list<string", ["column 'tags'", "expected '>'"]),
    ("at:timestamp[minutes]", ["column 'at'", "unit", "'minutes]'"]),
    ("d:decimal128(50,2)", ["column 'd'", "precision"]),
    ("s:struct<a:int8,a:int8>", ["column 's'", "duplicate field 'a'"]),
    ("a:int64 b:string", ["after column 'a'", "'b:string'"]),
], ids=["unknown-type", "missing-colon-at-end", "missing-colon", "duplicate-column",
        "reserved-key", "reserved-timestamp", "reserved-headers", "unclosed-list",
        "bad-timestamp-unit", "bad-decimal", "duplicate-struct-field", "missing-comma"])
def test_bad_value_schema_exits_2_naming_column_and_text_and_creates_nothing(
        broker, spec, expected) -> None:
    topic = new_topic()
    err = usage_error(logstore("topics", "create", topic, "--partitions", "1",
                               "--value-schema", spec, bootstrap=broker.bootstrap))
    assert all(fragment in err for fragment in expected), err
    assert topic not in ok(logstore("topics", "list", bootstrap=broker.bootstrap)).split()


def test_value_schema_from_a_json_file(broker, tmp_path: Path) -> None:
    """``@file.json`` takes the same types, and any non-empty column name."""
    path = tmp_path / "schema.json"
    path.write_text(json.dumps([{"name": "user id", "type": "int64"},
                                {"name": "tags", "type": "list<struct<k:string,v:double>>"}]))
    topic = create_typed(broker.bootstrap, f"@{path}")
    assert described_columns(ok(logstore("topics", "describe", topic,
                                         bootstrap=broker.bootstrap))) == [
        "user id: int64", "tags: list<struct<k:string,v:double>>"]


def test_bad_value_schema_file_exits_2_naming_the_file_and_column(broker, tmp_path: Path
                                                                    ) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps([{"name": "id", "type": "int64"}, {"name": "x", "type": "int65"}]))
    err = usage_error(logstore("topics", "create", new_topic(), "--partitions", "1",
                               "--value-schema", f"@{path}", bootstrap=broker.bootstrap))
    assert str(path) in err and "column 'x'" in err and "'int65'" in err
    path.write_text(json.dumps([{"name": "id"}]))
    err = usage_error(logstore("topics", "create", new_topic(), "--partitions", "1",
                               "--value-schema", f"@{path}", bootstrap=broker.bootstrap))
    assert str(path) in err and "entry 1" in err
    missing = tmp_path / "nope.json"
    assert str(missing) in usage_error(logstore("topics", "create", new_topic(), "--partitions",
                                                "1", "--value-schema", f"@{missing}",
                                                bootstrap=broker.bootstrap))
