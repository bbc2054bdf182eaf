"""Bad input gets a clear error with a stable code; the broker keeps serving and loses nothing."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from logstore.errors import ApiError, ErrorCode
from logstore.records import DEFAULT_SCHEMA
from logstore.rpc.codec import SUMMARY_TAG


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


# -- raw Flight requests ----------------------------------------------------------------------
#
# The tests below speak the wire protocol (logstore/rpc/codec.py) with a bare Flight client, so
# they can send what no LogStore client would.

CALL_OPTIONS = flight.FlightCallOptions(timeout=10)
INVALID_REQUEST = int(ErrorCode.INVALID_REQUEST)


def _flight_error_code(e: flight.FlightError) -> int | None:
    """The wire code a Flight error carries in its extra_info, None if it carries none."""
    try:
        code = orjson.loads(e.extra_info or b"")["error_code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return code if isinstance(code, int) else None


def _codes_in(obj: Any) -> Iterator[Any]:
    """Every ``error_code`` anywhere in a decoded JSON response."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from ([v] if k == "error_code" else _codes_in(v))
    elif isinstance(obj, list):
        for v in obj:
            yield from _codes_in(v)


# An answer is a list of (where, code): ("error", code) for a request-level Flight error,
# ("entry", code) for each code in a response, summary or ack.
Answer = list[tuple[str, Any]]


def _action_answer(client: flight.FlightClient, action: str, body: bytes) -> Answer:
    try:
        results = list(client.do_action(flight.Action(action, body), CALL_OPTIONS))
    except flight.FlightError as e:
        return [("error", _flight_error_code(e))]
    return [("entry", c) for r in results for c in _codes_in(orjson.loads(r.body.to_pybytes()))]


def _action_codes(client: flight.FlightClient, action: str, body: Any) -> list[Any]:
    """The request-level code if the action failed, else every per-entity code."""
    return [code for _, code in _action_answer(client, action, orjson.dumps(body))]


def _one_record(schema: pa.Schema = DEFAULT_SCHEMA, value: bytes = b"v") -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"key": b"k", "value": value}], schema=schema)


def _produce_descriptor(topic: str, acks: Any = 1) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(
        orjson.dumps({"type": "produce", "topic": topic, "acks": acks}))


@pytest.mark.parametrize("fields", [
    {"producer_id": 5, "producer_epoch": 40_000, "base_sequence": 0},
    {"producer_id": 5, "producer_epoch": 0, "base_sequence": 2**40},
    {"producer_id": 2**63 + 5, "producer_epoch": 0, "base_sequence": 0},
], ids=["producer-epoch-over-int16", "base-sequence-over-int32", "producer-id-over-int64"])
def test_out_of_range_producer_fields_get_an_error_ack_and_the_stream_goes_on(
        broker, fields) -> None:
    """Goal: a produce batch whose metadata has a producer field outside its header type's
    range is answered with INVALID_REQUEST for that batch alone: the stream stays usable.

    Method: on one DoPut stream with a valid descriptor, a batch with the bad field, then a
    valid batch. The first ack must carry error code 42, the second none and the base offset
    the log ended at; the log must grow by exactly the valid record."""
    topic = f"t-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        before = admin.list_offsets({tp: -1})[tp]
        client = flight.connect(f"grpc://{broker.bootstrap}")
        acks: list[dict[str, Any]] = []
        try:
            writer, reader = client.do_put(_produce_descriptor(topic), DEFAULT_SCHEMA,
                                           CALL_OPTIONS)
            try:
                writer.write_with_metadata(_one_record(value=b"bad"), pa.py_buffer(
                    orjson.dumps({"seq": 1, "partition": 0, **fields})))
                writer.write_with_metadata(_one_record(value=b"good"), pa.py_buffer(
                    orjson.dumps({"seq": 2, "partition": 0})))
                writer.done_writing()
                while len(acks) < 2 and (buf := reader.read()) is not None:
                    acks.append(orjson.loads(buf.to_pybytes()))
            finally:
                writer.close()
        except flight.FlightError as e:
            pytest.fail(f"the stream failed with code {_flight_error_code(e)} after acks "
                        f"{acks}: {str(e).splitlines()[0]}")
        finally:
            client.close()
        after = admin.list_offsets({tp: -1})[tp]
    assert len(acks) == 2, f"the stream ended after acks {acks}"
    assert (acks[0]["seq"], acks[0]["error_code"]) == (1, INVALID_REQUEST), acks[0]
    assert (acks[1]["seq"], acks[1]["error_code"]) == (2, 0), acks[1]
    assert acks[1]["base_offset"] == before and after == before + 1


@pytest.mark.parametrize("action, body", [
    ("metadata", {"topics": [["x"]]}),
    ("metadata", {"topics": [7]}),
    ("describe_configs", {"topics": [["x"]]}),
    ("describe_configs", {"topics": [7]}),
    ("create_topics", {"topics": [{"name": "schema-garbage", "num_partitions": 1,
                                   "value_schema": "not-a-schema"}]}),
], ids=["metadata-list-name", "metadata-int-name", "describe-configs-list-name",
        "describe-configs-int-name", "create-topics-garbage-value-schema"])
def test_malformed_fields_in_actions_are_invalid_request_not_unknown_server_error(
        broker, action, body) -> None:
    """Goal: a well-formed action whose fields have the wrong type or content (a topic name
    that is not a string, a value schema that does not decode) is the client's fault:
    INVALID_REQUEST (42), never UNKNOWN_SERVER_ERROR (-1).

    Method: send each action with a bare Flight client; the code is either the request-level
    one (Flight error) or the per-topic one in the response; every code seen must be 42. A
    topic with a garbage schema must not have been created."""
    client = flight.connect(f"grpc://{broker.bootstrap}")
    try:
        codes = _action_codes(client, action, body)
    finally:
        client.close()
    assert codes and all(c == INVALID_REQUEST for c in codes), f"{action} {body}: {codes}"
    if action == "create_topics":
        with Admin(broker.bootstrap) as admin:
            assert "schema-garbage" not in admin.list_topics()


def test_unknown_actions_and_newer_versions_are_unsupported_version(broker) -> None:
    """Goal: a client speaking an action this broker does not know, or a newer version of
    one it knows, learns exactly that (UNSUPPORTED_VERSION, 35, naming the action), not
    INVALID_REQUEST. Method: a bare Flight client sends an unknown action and a broker_stats
    request of version 99 (every action decodes its version first)."""
    client = flight.connect(f"grpc://{broker.bootstrap}")
    try:
        with pytest.raises(flight.FlightError) as unknown:
            list(client.do_action(flight.Action("no_such_action", b"{}"), CALL_OPTIONS))
        with pytest.raises(flight.FlightError) as newer:
            list(client.do_action(flight.Action("broker_stats", b'{"version": 99}'), CALL_OPTIONS))
    finally:
        client.close()
    unsupported = int(ErrorCode.UNSUPPORTED_VERSION)
    assert _flight_error_code(unknown.value) == unsupported
    assert "no_such_action" in str(unknown.value)
    assert _flight_error_code(newer.value) == unsupported
    assert "broker_stats v99" in str(newer.value)


# -- fuzz -----------------------------------------------------------------------------------

FUZZ_REQUESTS = 1200
# A Flight error must name what went wrong; an ack or response entry may also say NONE.
# UNKNOWN_SERVER_ERROR means the broker hit an unexpected exception: for bad input that is a
# missing validation, so the fuzz test counts it as a failure too.
ERROR_CODES = {int(c) for c in ErrorCode} - {ErrorCode.NONE, ErrorCode.UNKNOWN_SERVER_ERROR}
ENTRY_CODES = ERROR_CODES | {int(ErrorCode.NONE)}
BAD_VALUES: list[Any] = ["x", None, 1.5, [], {}, [["x"]], True, -1, "0", 2**40, 2**63 - 1,
                         -(2**63)]
# Fields that size or delay something get no huge valid ints: a fuzz run must stay bounded.
BAD_COUNTS: list[Any] = ["x", None, 1.5, [], {}, True, 0, -1, "3"]
BAD_WAITS: list[Any] = [0, -5, "x", 1.5, [], {}, True]
JUNK_BODIES = [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"topics": 5}', b'{"topic": []}',
               b'"produce"', b"{}"]

Call = Callable[[flight.FlightClient], Answer]


class _Fuzz:
    """Random malformed requests. Reads may target ``checked`` (whose data is verified after
    the run); anything that writes, alters or deletes targets ``sink`` or a bad name."""

    def __init__(self, rng: random.Random, checked: str, sink: str) -> None:
        self.rng, self.checked, self.sink = rng, checked, sink

    def bad(self, *good: Any, pool: list[Any] = BAD_VALUES) -> Any:
        """A bad value, or now and then one of the ``good`` ones."""
        return self.rng.choice(good) if good and self.rng.random() < 0.3 else \
            self.rng.choice(pool)

    def junk(self) -> bytes:
        if self.rng.random() < 0.5:
            return self.rng.choice(JUNK_BODIES)
        return bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(1, 64)))

    def request(self) -> tuple[str, Call]:
        kind = self.rng.choice([self.junk_action, self.action, self.junk_ticket, self.ticket,
                                self.junk_put, self.put, self.put])
        return kind()

    # -- actions --

    def junk_action(self) -> tuple[str, Call]:
        name = self.rng.choice(["metadata", "create_topics", "delete_topics", "list_offsets",
                                "alter_configs", "create_partitions", "describe_configs",
                                "init_producer_id", "nope", ""])
        body = self.junk()
        return f"action {name!r} {body!r}", lambda c: _action_answer(c, name, body)

    def action(self) -> tuple[str, Call]:
        sink, bad = self.sink, self.bad
        name, body = self.rng.choice([
            ("metadata", lambda: {"topics": bad() if self.rng.random() < 0.5 else [bad()]}),
            ("describe_configs", lambda: {"topics": [bad(sink)]}),
            ("create_topics", lambda: {"topics": [{
                "name": bad(f"fz-{self.rng.randrange(20)}"),
                "num_partitions": bad(1, pool=BAD_COUNTS),
                "replication_factor": bad(1, pool=BAD_COUNTS),
                "config": bad({}, {"retention_ms": bad()}, {"nope": 1}),
                "value_schema": bad("not-a-schema")}]}),
            ("delete_topics", lambda: {"topics": [bad("no-such-topic")]}),
            ("create_partitions", lambda: {"topics": [{"name": bad(sink),
                                                       "count": bad(1, pool=BAD_COUNTS)}]}),
            ("alter_configs", lambda: {"incremental": bad(True), "topics": [{
                "name": bad(sink),
                "config": bad({"segment_bytes": bad()}, {"nope": 1}, {"retention_ms": bad()})}]}),
            ("list_offsets", lambda: {"topic": bad(self.checked), "partitions": [
                {"partition": bad(0), "timestamp": bad(-1, -2, 0)}]}),
        ])
        request = body()
        return f"action {name!r} {request!r}", lambda c: _action_answer(c, name, orjson.dumps(request))

    # -- fetch --

    def junk_ticket(self) -> tuple[str, Call]:
        body = self.junk()
        return f"fetch {body!r}", lambda c: _fetch_answer(c, body)

    def ticket(self) -> tuple[str, Call]:
        """A valid fetch of the checked topic with one or two fields wrongly typed, out of
        range or missing (``max_wait_ms`` is never dropped: its default would long-poll)."""
        part = {"partition": self.rng.randrange(2), "offset": self.rng.choice([0, 100]),
                "max_bytes": 1 << 20}
        request: dict[str, Any] = {"topic": self.checked, "max_wait_ms": 0,
                                   "max_bytes": 1 << 20, "min_bytes": 1, "isolation_level": 0,
                                   "replica_id": -1, "partitions": [part]}
        fields = [(request, k) for k in request] + [(part, k) for k in part]
        for target, key in self.rng.sample(fields, self.rng.randint(1, 2)):
            if key != "max_wait_ms" and self.rng.random() < 0.2:
                del target[key]
            else:
                target[key] = self.bad(pool=BAD_WAITS if key == "max_wait_ms" else BAD_VALUES)
        body = orjson.dumps(request)
        return f"fetch {request!r}", lambda c: _fetch_answer(c, body)

    # -- produce --

    def junk_put(self) -> tuple[str, Call]:
        if self.rng.random() < 0.5:
            descriptor = self.junk()
        else:
            descriptor = orjson.dumps({"type": self.bad("produce"), "topic": self.bad(self.sink),
                                       "acks": self.bad(1, -1), "timeout_ms": self.bad(100)})
        metas = [orjson.dumps({"seq": 1, "partition": 0})]
        return f"put descriptor {descriptor!r}", lambda c: _put_answer(
            c, flight.FlightDescriptor.for_command(descriptor), DEFAULT_SCHEMA, metas, None)

    def put(self) -> tuple[str, Call]:
        """A valid produce descriptor; bad batch metadata or a batch of the wrong schema."""
        schema = self.rng.choice([DEFAULT_SCHEMA] * 3 + [
            pa.schema([("value", pa.binary())]),
            pa.schema([("key", pa.int64()), ("value", pa.binary())]),
            pa.schema([("key", pa.binary()), ("value", pa.string())]),
            DEFAULT_SCHEMA.append(pa.field("extra", pa.int32()))])
        metas = [self.batch_metadata(seq) for seq in range(1, self.rng.randint(1, 3) + 1)]
        return f"put schema {schema.names} metadata {metas!r}", lambda c: _put_answer(
            c, _produce_descriptor(self.sink), schema, metas, len(metas))

    def batch_metadata(self, seq: int) -> bytes | None:
        meta: dict[str, Any] = {"seq": seq, "partition": 0}
        choice = self.rng.randrange(6)
        if choice == 0:
            return self.rng.choice([None, self.junk()])  # no metadata, or not a JSON object
        if choice == 1:
            del meta["partition"]
        elif choice == 2:
            meta["partition"] = self.bad()
        elif choice == 3:
            meta["seq"] = self.bad()
        elif choice == 4:
            meta.update(producer_id=self.bad(5, 2**63 + 5), producer_epoch=self.bad(0, 40_000),
                        base_sequence=self.bad(0, 2**40))
        return orjson.dumps(meta)  # choice 5: a valid batch now and then


def _fetch_answer(client: flight.FlightClient, ticket: bytes) -> Answer:
    """A fetch's request-level error, or every code in the stream's summary."""
    codes: Answer = []
    try:
        reader = client.do_get(flight.Ticket(ticket), CALL_OPTIONS)
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return codes
            meta = chunk.app_metadata.to_pybytes() if chunk.app_metadata else b""
            if meta[:1] == SUMMARY_TAG:
                codes += [("entry", c) for c in _codes_in(orjson.loads(meta[1:]))]
    except flight.FlightError as e:
        return [("error", _flight_error_code(e))]


def _put_answer(client: flight.FlightClient, descriptor: flight.FlightDescriptor,
                schema: pa.Schema, metas: list[bytes | None], expect_acks: int | None
                ) -> Answer:
    """A DoPut's stream error, or the code of every ack. With a valid descriptor
    (``expect_acks``), every batch must get exactly one ack."""
    batch = _one_record(schema) if "key" in schema.names and schema.field("key").type == \
        pa.binary() else pa.RecordBatch.from_pylist(
            [{n: None for n in schema.names}], schema=schema)
    try:
        writer, reader = client.do_put(descriptor, schema, CALL_OPTIONS)
        try:
            for meta in metas:
                if meta is None:
                    writer.write_batch(batch)
                else:
                    writer.write_with_metadata(batch, pa.py_buffer(meta))
            writer.done_writing()
            acks = []
            while (buf := reader.read()) is not None:
                acks.append(buf.to_pybytes())
        except flight.FlightError:
            writer.close()  # raises the stream's final status, which carries the code
            raise
        writer.close()
    except flight.FlightError as e:
        return [("error", _flight_error_code(e))]
    if expect_acks is not None and len(acks) != expect_acks:
        return [("entry", f"{len(acks)} acks for {expect_acks} batches")]
    codes: Answer = []
    for ack in acks:
        try:
            codes.append(("entry", orjson.loads(ack)["error_code"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            codes.append(("entry", f"unreadable ack {ack[:80]!r}"))
    return codes


def _is_known(code: Any, allowed: set[int]) -> bool:
    return isinstance(code, int) and not isinstance(code, bool) and code in allowed


def test_fuzzed_malformed_requests_get_known_codes_and_the_broker_keeps_serving(
        broker, seed: int) -> None:
    """Goal: no malformed request crashes the broker or gets an answer without a stable code,
    and nothing already written is lost.

    Method: 500 records in a 2-partition topic, then 1200 random requests over a bare Flight
    client: junk bodies for every action, fetch and produce; well-formed actions and fetch
    tickets with wrongly typed or missing fields; valid produce descriptors with bad batch
    metadata (missing or wrongly typed partition, out-of-range producer fields, no metadata)
    or batches of the wrong schema. Every Flight error must carry a wire code other than NONE
    and UNKNOWN_SERVER_ERROR; every ack and response entry a wire code other than
    UNKNOWN_SERVER_ERROR; every batch on a valid produce stream exactly one ack. Afterwards the
    broker still runs and returns the 500 records. The seed is printed on failure;
    LOGSTORE_TEST_SEED replays one."""
    rng = random.Random(seed)
    name, sink = f"fuzz-{uuid.uuid4().hex[:6]}", f"fuzz-sink-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 2), NewTopic(sink, 2)])
    with Producer(broker.bootstrap) as producer:
        for i in range(500):
            producer.send(name, value=b"%d" % i, partition=i % 2)
        producer.flush(10)
    fuzz = _Fuzz(rng, name, sink)
    violations: list[str] = []
    client = flight.connect(f"grpc://{broker.bootstrap}")
    try:
        for n in range(FUZZ_REQUESTS):
            what, call = fuzz.request()
            answer = call(client)
            unknown = [(where, code) for where, code in answer if not _is_known(
                code, ERROR_CODES if where == "error" else ENTRY_CODES)]
            if unknown:
                violations.append(f"#{n} {what[:300]} -> {unknown[:5]}")
            if not broker.running:
                violations.append(f"#{n} {what[:300]}: the broker died")
                break
    finally:
        client.close()
    assert not violations, f"seed {seed}: {len(violations)} of {FUZZ_REQUESTS} requests " \
                           f"answered without a known code:\n" + "\n".join(violations[:15])
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(name, 0), TopicPartition(name, 1)])
        values = []
        for _ in range(20):
            for records in c.poll(timeout_ms=500, max_records=10_000).values():
                values += [int(r.value) for r in records]
            if len(values) >= 500:
                break
    assert sorted(values) == list(range(500)), f"seed {seed}"


@pytest.mark.parametrize("action, body", [
    ("delete_topics", lambda t: {"topics": [t, t]}),
    ("create_partitions", lambda t: {"topics": [{"name": t, "count": 3},
                                                {"name": t, "count": 2}]}),
    ("alter_configs", lambda t: {"topics": [{"name": t, "config": {"retention_ms": 1000}},
                                            {"name": t, "config": {"retention_ms": 2000}}]}),
], ids=["delete-topics", "create-partitions", "alter-configs"])
def test_a_topic_named_twice_in_one_request_is_invalid_in_each_copy_and_left_alone(
        broker, action, body: Callable[[str], Any]) -> None:
    """Goal: a topic given twice in one delete_topics, create_partitions or alter_configs is
    INVALID_REQUEST in both copies and left as it was (Kafka's "Duplicate topic in request"):
    before, the copies were applied one after the other (a delete then "does not exist"; the
    last config wins). Method: a bare Flight client sends the request; the topic is then
    described."""
    topic = f"twice-{uuid.uuid4().hex[:6]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        client = flight.connect(f"grpc://{broker.bootstrap}")
        try:
            codes = _action_codes(client, action, body(topic))
        finally:
            client.close()
        assert codes == [INVALID_REQUEST, INVALID_REQUEST], f"{action}: {codes}"
        assert len(admin.describe_topics([topic])[0].partitions) == 1
        assert admin.describe_configs([topic])[topic]["retention_ms"] != 1000
        assert admin.describe_configs([topic])[topic]["retention_ms"] != 2000
