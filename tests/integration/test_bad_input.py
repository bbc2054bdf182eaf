"""Bad input gets a clear error with a stable code; the broker keeps serving and loses nothing."""

from __future__ import annotations

import random
import uuid

import orjson
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import ApiError, ErrorCode

pytestmark = pytest.mark.integration


def _code(excinfo: pytest.ExceptionInfo) -> ErrorCode:
    assert isinstance(excinfo.value, ApiError), excinfo.value
    return excinfo.value.code


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "has space", "slash/topic"])
def test_invalid_topic_names_are_rejected(broker, name) -> None:
    with Admin(broker.bootstrap) as admin, pytest.raises(ApiError) as e:
        admin.create_topics([NewTopic(name, 1)])
    assert _code(e) == ErrorCode.INVALID_TOPIC_EXCEPTION


@pytest.mark.parametrize("count", [0, -3])
def test_non_positive_partition_counts_are_rejected(broker, count) -> None:
    with Admin(broker.bootstrap) as admin, pytest.raises(ApiError) as e:
        admin.create_topics([NewTopic("ok-name", count)])
    assert _code(e) == ErrorCode.INVALID_PARTITIONS and "ok-name" in str(e.value)


def test_unknown_config_key_names_the_key(broker) -> None:
    with Admin(broker.bootstrap) as admin, pytest.raises(ApiError) as e:
        admin.create_topics([NewTopic("cfg-topic", 1, config={"retention.mss": 5})])
    assert _code(e) == ErrorCode.INVALID_CONFIG and "retention.mss" in str(e.value)


def test_unknown_topic_and_partition(broker) -> None:
    with Producer(broker.bootstrap) as producer, pytest.raises(ApiError) as e:
        producer.send("no-such-topic", value=b"x")
    assert _code(e) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    name = f"t-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 2)])
    with Consumer(broker.bootstrap) as c, pytest.raises(ApiError) as e:
        c.assign([TopicPartition(name, 5)])
    assert "partition 5" in str(e.value)


def test_record_over_max_message_bytes_is_rejected_and_nothing_is_lost(broker) -> None:
    name = f"t-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1, config={"max_message_bytes": 10_000})])
    with Producer(broker.bootstrap) as producer:
        ok = producer.send(name, value=b"small").result(10)
        with pytest.raises(ApiError) as e:
            producer.send(name, value=b"x" * 50_000).result(10)
        assert _code(e) == ErrorCode.MESSAGE_TOO_LARGE and name in str(e.value)
        after = producer.send(name, value=b"after").result(10)
    assert (ok.offset, after.offset) == (0, 1)


def test_offset_out_of_range_names_the_valid_range(broker) -> None:
    name = f"t-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1)])
    with Producer(broker.bootstrap) as producer:
        producer.send(name, value=b"a").result(10)
    tp = TopicPartition(name, 0)
    with Consumer(broker.bootstrap, auto_offset_reset="none") as c:
        c.assign([tp])
        c.seek(tp, 50)
        with pytest.raises(ApiError) as e:
            c.poll(timeout_ms=2000)
    assert _code(e) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert "50" in str(e.value) and "[0, 1]" in str(e.value)


def test_wrong_column_types_in_send_batch(broker) -> None:
    name = f"t-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1)])
    with Producer(broker.bootstrap) as producer:
        with pytest.raises(ApiError) as e:
            producer.send_batch(name, pa.table({"value": pa.array([1.5, 2.5])}))
        assert _code(e) == ErrorCode.INVALID_RECORD and "'value'" in str(e.value)
        with pytest.raises(ApiError, match="missing column"):
            producer.send_batch(name, pa.table({"key": pa.array([b"k"])}))


def _malformed_requests(rng: random.Random, topic: str):
    junk = [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"topics": 5}', b'{"topic": []}',
            orjson.dumps({"topic": topic, "partitions": [{"partition": "x"}]}),
            orjson.dumps({"topic": topic, "partitions": [{"partition": 0, "offset": -7}]}),
            orjson.dumps({"topic": topic, "max_bytes": -1, "partitions": []}),
            orjson.dumps({"topics": [{"name": 7, "num_partitions": "3"}]}),
            bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))]
    actions = ["metadata", "create_topics", "delete_topics", "list_offsets", "alter_configs",
               "create_partitions", "describe_configs", "nope", ""]
    kind = rng.choice(["action", "get", "put"])
    body = rng.choice(junk)
    if kind == "action":
        name = rng.choice(actions)
        if name == "delete_topics" and topic.encode() in body:
            name = "metadata"  # never delete the topic whose data we check afterwards
        return kind, name, body
    return kind, None, body


def test_fuzzed_malformed_requests_leave_the_broker_serving_correct_data(broker) -> None:
    """1200 random malformed Flight calls, then every record written before is still there."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    name = f"fuzz-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 2)])
    with Producer(broker.bootstrap) as producer:
        for i in range(500):
            producer.send(name, value=b"%d" % i, partition=i % 2)
        producer.flush(10)
    client = flight.connect(f"grpc://{broker.bootstrap}")
    schema = pa.schema([("value", pa.binary())])
    for _ in range(1200):
        kind, action, body = _malformed_requests(rng, name)
        try:
            if kind == "action":
                list(client.do_action(flight.Action(action, body)))
            elif kind == "get":
                client.do_get(flight.Ticket(body)).read_all()
            else:
                writer, reader = client.do_put(flight.FlightDescriptor.for_command(body), schema)
                writer.write_with_metadata(pa.record_batch([pa.array([b"z"])], schema=schema),
                                           pa.py_buffer(body))
                writer.done_writing()
                reader.read()
                writer.close()
        except (flight.FlightError, pa.ArrowException, OSError):
            pass
    client.close()
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(name, 0), TopicPartition(name, 1)])
        values = []
        for _ in range(20):
            for records in c.poll(timeout_ms=500, max_records=10_000).values():
                values += [int(r.value) for r in records]
            if len(values) >= 500:
                break
    assert sorted(values) == list(range(500)), f"seed {seed}"
