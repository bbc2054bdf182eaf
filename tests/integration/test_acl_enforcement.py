"""ACLs on a real broker (cluster mode, one broker, real ZooKeeper, SASL_SSL): a matrix of every
action a client can send, for an allowed principal, a denied one and an anonymous one (exactly
the allowed calls pass the authorizer), and a fuzzer of 1,000 random actions without credentials
and as a user with no ACLs (every one refused, the broker keeps serving, nothing changes on disk
or in ZooKeeper).

A call is "refused" when its answer, or every entry of it, carries an authorization or SASL
error code; listings may instead answer with nothing the caller may see (Kafka answers the
brokers to anyone authenticated, so ``brokers`` and ``controller_id`` are not counted)."""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgspec
import pyarrow as pa
import pytest

from logstore import Admin, NewTopic, Producer
from logstore.broker.acl_rules import RULES
from logstore.errors import ApiError, ErrorCode
from logstore.messages import REQUEST_TYPES, Request
from logstore.messages import cluster as c
from logstore.messages import groups as g
from logstore.messages import log as lg
from logstore.messages import metrics as mt
from logstore.messages import security as s
from logstore.messages import tiering as ti
from logstore.messages import topics as tp
from logstore.messages import transactions as tx
from logstore.messages.fetch import FetchPartition, FetchRequest
from logstore.messages.fetch_session import FetchSessionRequest, FetchSessionUpdate
from logstore.messages.produce import InitProducerIdRequest, ProduceBatchMetadata, ProduceRequest
from logstore.records import DEFAULT_SCHEMA
from logstore.rpc.client import BrokerConnection
from logstore.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
)
from logstore.security.config import INTER_BROKER_PASSWORD_ENV, client_security
from tests.brokers import BrokerFactory, BrokerProcess
from tests.helpers import wait_for
from tests.security import SecureBrokers, add_user, password
from tests.zookeeper import zk_client

TOPIC, GROUP, TXN_ID = "m-topic", "m-group", "m-txn"
REFUSALS = {int(c) for c in (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                             ErrorCode.GROUP_AUTHORIZATION_FAILED,
                             ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                             ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                             ErrorCode.SASL_AUTHENTICATION_FAILED,
                             ErrorCode.ILLEGAL_SASL_STATE)}
PUBLIC_FIELDS = {"brokers", "controller_id"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: Any
            ) -> Iterator[tuple[SecureBrokers, BrokerProcess, str]]:
    """One SASL_SSL broker in cluster mode, its ZooKeeper chroot, and the users: alice (ALL on
    m-* topics and groups, DESCRIBE on the cluster), bob (ALL on every topic and group but
    DENY ALL on m-*), mallory (no ACL at all)."""
    mp = pytest.MonkeyPatch()
    zk = f"{zookeeper.connect}/acl-{uuid.uuid4().hex[:8]}"
    factory = BrokerFactory(tmp_path_factory.mktemp("acl"))
    broker_password = password("broker")
    mp.setenv(INTER_BROKER_PASSWORD_ENV, broker_password)
    brokers = SecureBrokers(factory, "sasl_tls", super_users=["User:admin", "User:broker"],
                            inter_broker_sasl_username="broker", zk_connect=zk,
                            group_initial_rebalance_delay_ms=0,
                            offsets_topic_num_partitions=1)
    add_user("broker", broker_password, "--zookeeper", zk, mechanism="SCRAM-SHA-512")
    add_user("admin", brokers.admin_password, "--zookeeper", zk)
    broker = factory(1, **brokers.settings)
    _grant(brokers, broker)
    yield brokers, broker, zk
    factory.stop_all()
    mp.undo()


def _acl(rtype: ResourceType, name: str, principal: str, op: Operation,
         permission: Permission = Permission.ALLOW,
         pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(ResourcePattern(rtype, name, pattern),
                      AccessControlEntry(principal, "*", op, permission))


def _grant(brokers: SecureBrokers, broker: BrokerProcess) -> None:
    for user in ("alice", "bob", "mallory"):
        brokers.add_user(broker.bootstrap, user)
    T, G, P, D = ResourceType.TOPIC, ResourceType.GROUP, PatternType.PREFIXED, Permission.DENY
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1)])
        admin.create_acls([
            _acl(T, "m-", "User:alice", Operation.ALL, pattern=P),
            _acl(G, "m-", "User:alice", Operation.ALL, pattern=P),
            _acl(ResourceType.CLUSTER, "logstore-cluster", "User:alice", Operation.DESCRIBE),
            _acl(T, "*", "User:bob", Operation.ALL), _acl(G, "*", "User:bob", Operation.ALL),
            _acl(T, "m-", "User:bob", Operation.ALL, D, P),
            _acl(G, "m-", "User:bob", Operation.ALL, D, P)])
    with Producer(broker.bootstrap, **brokers.client()) as producer:
        producer.send(TOPIC, b"first", partition=0).result(10)


def error_codes(value: Any, field: str = "") -> list[int]:
    """Every error code in a response (one per entry), ignoring the public fields."""
    if field in PUBLIC_FIELDS:
        return []
    if isinstance(value, dict):
        own = [int(value["error_code"])] if "error_code" in value else []
        return own + [code for k, v in value.items() if k != "error_code"
                      for code in error_codes(v, k)]
    if isinstance(value, list):
        return [code for v in value for code in error_codes(v)]
    return []


def visible_entities(value: Any, field: str = "") -> int:
    """How many entries without an error a response shows (public fields aside)."""
    if field in PUBLIC_FIELDS:
        return 0
    if isinstance(value, list):
        return sum(visible_entities(v) if isinstance(v, dict) and v.get("error_code")
                   else 1 for v in value)
    if isinstance(value, dict):
        return sum(visible_entities(v, k) for k, v in value.items())
    return 0


def refused_response(name: str, response: Any) -> bool:
    """Whether an answered action refused everything: only actions authorized per entry or
    filtered answer at all (the others raise), and then with nothing visible."""
    rule = RULES[REQUEST_TYPES[name]]
    if rule.entities is None and rule.visible is None:
        return False
    return visible_entities(response) == 0 and all(
        code in REFUSALS for code in error_codes(response) if code)


def outcome(send: Callable[[], Any]) -> str:
    """'refused' (an authorization or SASL code), 'passed', or 'error' (another error)."""
    try:
        response = send()
    except ApiError as e:
        return "refused" if int(e.code) in REFUSALS else "error"
    codes = error_codes(msgspec.to_builtins(response)) if response is not None else []
    if codes and all(code in REFUSALS for code in codes):
        return "refused"
    return "passed"


def _requests(name: str) -> list[Request[Any]]:
    """A valid request of every action a client can send, on the matrix's resources."""
    fresh = f"m-new-{name}-{uuid.uuid4().hex[:6]}"
    member = g.JoinGroupRequest(group_id=GROUP, session_timeout_ms=10_000, protocols=[
        g.GroupProtocol(name="range", metadata={"topics": [TOPIC]})])
    acl = s.AclEntry(resource_type="TOPIC", name="m-x", principal="User:x", operation="READ")
    return [
        tp.MetadataRequest(topics=[TOPIC]),
        tp.CreateTopicsRequest(topics=[tp.CreatableTopic(name=fresh, num_partitions=1)]),
        tp.DeleteTopicsRequest(topics=[fresh]),
        tp.CreatePartitionsRequest(topics=[tp.PartitionCount(name=TOPIC, count=1)]),
        tp.DescribeConfigsRequest(topics=[TOPIC]),
        tp.AlterConfigsRequest(topics=[tp.TopicConfigChange(name=TOPIC, config={})]),
        lg.ListOffsetsRequest(topic=TOPIC, partitions=[
            lg.ListOffsetsPartition(partition=0, timestamp=-1)]),
        lg.DescribeLogDirsRequest(topic=TOPIC, partitions=[0]),
        lg.AwaitHighWatermarksRequest(topic=TOPIC, partitions=[
            lg.PartitionPosition(partition=0, offset=0)]),
        lg.BrokerStatsRequest(), InitProducerIdRequest(),
        c.LeaderAndIsrRequest(controller_epoch=0, partitions=[]),
        c.AlterIsrRequest(broker_id=1, topic=TOPIC, partition=0, leader_epoch=0, isr=[1]),
        c.ControlledShutdownRequest(broker_id=99),
        c.OffsetsForLeaderEpochRequest(topic=TOPIC, partitions=[]),
        g.FindCoordinatorRequest(group_id=GROUP), member,
        g.SyncGroupRequest(group_id=GROUP, member_id="m", generation_id=0),
        g.HeartbeatRequest(group_id=GROUP, member_id="m", generation_id=0),
        g.LeaveGroupRequest(group_id=GROUP, member_id="m"),
        g.OffsetCommitRequest(group_id=GROUP, offsets=[g.OffsetCommitEntry(
            topic=TOPIC, partition=0, offset=0)]),
        g.OffsetFetchRequest(group_id=GROUP), g.ListGroupsRequest(),
        g.DescribeGroupsRequest(group_ids=[GROUP]), g.DeleteGroupsRequest(group_ids=[GROUP]),
        s.CreateAclsRequest(creations=[acl]), s.DeleteAclsRequest(filters=[s.AclFilter(
            name="m-x")]), s.DescribeAclsRequest(),
        s.AlterUserScramCredentialsRequest(deletions=[s.ScramCredentialDeletion(
            name="nobody", mechanism="SCRAM-SHA-256")]),
        s.DescribeUserScramCredentialsRequest(),
        ti.DescribeLogTiersRequest(topic=TOPIC, partitions=[0]),
        ti.ListRemoteSegmentsRequest(topic=TOPIC, partitions=[]),
        c.LeaderEpochsRequest(topic=TOPIC, partitions=[]),
        mt.DescribeGroupLagRequest(group_id=GROUP), mt.DescribeBrokerMetricsRequest(),
        mt.OffsetTimestampsRequest(topic=TOPIC, partitions=[
            mt.OffsetPosition(partition=0, offset=0)]),
        *_transaction_requests(),
    ]


def _transaction_requests() -> list[Request[Any]]:
    """The transaction actions, on the matrix's transactional id (no one but the super users
    has an ACL on it) and group."""
    ids = {"transactional_id": TXN_ID, "producer_id": 1, "producer_epoch": 0}
    return [
        tx.AddPartitionsToTxnRequest(**ids, topics=[tx.TxnTopicPartitions(
            topic=TOPIC, partitions=[0])]),
        tx.AddOffsetsToTxnRequest(**ids, group_id=GROUP),
        tx.TxnOffsetCommitRequest(**ids, group_id=GROUP, offsets=[tx.TxnOffsetCommitEntry(
            topic=TOPIC, partition=0, offset=0)]),
        tx.EndTxnRequest(**ids, committed=False),
        tx.PrepareTxnRequest(**ids),
        tx.WriteTxnMarkersRequest(markers=[]),
        tx.DescribeTransactionsRequest(transactional_ids=[TXN_ID]),
        tx.ListTransactionsRequest(),
        tx.DescribeProducersRequest(topic=TOPIC, partitions=[0]),
    ]


ALICE_REFUSED = {"leader_and_isr", "alter_isr", "controlled_shutdown",
                 "offsets_for_leader_epoch", "leader_epochs", "create_acls", "delete_acls",
                 "alter_user_scram_credentials", "replica_fetch", "replica_fetch_session",
                 "write_txn_markers", "offset_timestamps",
                 # no ACL on the transactional id (txn_offset_commit needs WRITE on it
                 # too, as in Kafka)
                 "add_partitions_to_txn", "add_offsets_to_txn", "txn_offset_commit",
                 "end_txn", "prepare_txn", "describe_transactions"}


def _streams(conn: BrokerConnection) -> dict[str, Callable[[], Any]]:
    def produce() -> Any:
        stream = conn.open_produce(ProduceRequest(topic=TOPIC), DEFAULT_SCHEMA)
        batch = pa.RecordBatch.from_pylist([{"key": None, "value": b"v", "timestamp": 0,
                                             "headers": []}], schema=DEFAULT_SCHEMA)
        stream.send(batch, ProduceBatchMetadata(seq=0, partition=0))
        ack = stream.read_ack()
        stream.close()
        return ack

    def fetch(replica: int) -> Callable[[], Any]:
        return lambda: list(conn.fetch(FetchRequest(
            topic=TOPIC, replica_id=replica, max_wait_ms=0,
            partitions=[FetchPartition(partition=0, offset=0)])).partitions.values())

    def session(replica: int) -> Callable[[], Any]:
        def first_frame() -> Any:
            stream = conn.open_fetch_session(FetchSessionRequest(
                topic=TOPIC, replica_id=replica, credit_bytes=1 << 20,
                partitions=[FetchPartition(partition=0, offset=0)]))
            try:
                frame = stream.read()  # the topic holds a record: the session pushes it
                return getattr(frame, "state", frame)
            finally:
                stream.close()
        return first_frame
    return {"produce": produce, "fetch": fetch(-1), "replica_fetch": fetch(7),
            "fetch_session": session(-1), "replica_fetch_session": session(7)}


def matrix(brokers: SecureBrokers, broker: BrokerProcess, user: str | None) -> dict[str, str]:
    conn = BrokerConnection(broker.bootstrap, timeout_s=15,
                            security=client_security(brokers.client(user)))
    try:
        sends: dict[str, Callable[[], Any]] = {
            r.ACTION: (lambda r=r: conn.call(r)) for r in _requests(user or "anon")}
        sends.update(_streams(conn))
        return {name: outcome(send) for name, send in sends.items()}
    finally:
        conn.close()


def test_matrix_exactly_the_allowed_calls_pass(
        cluster: tuple[SecureBrokers, BrokerProcess, str]) -> None:
    """Goal: every action a client can send is authorized as Kafka maps it. Method: every
    action once as alice (refused exactly where she lacks a right: the brokers' actions,
    ALTER on the cluster), as bob (DENY on m-* beats his ALLOW on everything) and without
    credentials; the matrix covers every action the broker serves."""
    brokers, broker, _ = cluster
    alice = matrix(brokers, broker, "alice")
    assert set(alice) == set(REQUEST_TYPES) | {"replica_fetch", "replica_fetch_session"}
    assert {a for a, o in alice.items() if o == "refused"} == ALICE_REFUSED, alice
    bob = matrix(brokers, broker, "bob")
    # bob may WRITE some topic (not m-*), so he may have an idempotent producer id
    # (a listing answers, with nothing bob may see in it)
    assert {a for a, o in bob.items() if o != "refused"} == {
        "list_groups", "list_transactions", "init_producer_id"}, bob
    anonymous = matrix(brokers, broker, None)
    assert set(anonymous.values()) == {"refused"}, anonymous


def test_txn_offset_commit_needs_write_on_the_transactional_id(
        cluster: tuple[SecureBrokers, BrokerProcess, str]) -> None:
    """Goal: as Kafka's handleTxnOffsetCommitRequest, txn_offset_commit needs WRITE on the
    transactional id besides READ on the group and the topics. Method: alice (READ on the
    m-* group and topic) commits under a transactional id she may not WRITE (refused with
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, naming it), then under one she may (it passes the
    authorizer: whatever the coordinator answers is not a refusal)."""
    brokers, broker, _ = cluster
    granted = _acl(ResourceType.TRANSACTIONAL_ID, "a-txn", "User:alice", Operation.WRITE)
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_acls([granted])
    conn = BrokerConnection(broker.bootstrap, timeout_s=15,
                            security=client_security(brokers.client("alice")))
    try:
        def commit(txn_id: str) -> Any:
            return conn.call(tx.TxnOffsetCommitRequest(
                transactional_id=txn_id, producer_id=1, producer_epoch=0, group_id=GROUP,
                offsets=[tx.TxnOffsetCommitEntry(topic=TOPIC, partition=0, offset=0)]))
        with pytest.raises(ApiError, match=TXN_ID) as refused:
            commit(TXN_ID)
        assert refused.value.code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert outcome(lambda: commit("a-txn")) != "refused"
    finally:
        conn.close()
        with brokers.admin(broker.bootstrap) as admin:
            admin.delete_acls([AclBindingFilter(
                resource_type=ResourceType.TRANSACTIONAL_ID, name="a-txn")])


# -- the fuzzer --------------------------------------------------------------------------------

POOL = [TOPIC, GROUP, "m-", "other", "__consumer_offsets", "", "x" * 300, "User:alice",
        "SCRAM-SHA-256", "TOPIC", "READ", "*"]


def random_value(rng: random.Random, hint: Any, depth: int = 0) -> Any:
    """A random value of the annotated type (pools of names and small numbers, so requests
    hit real resources as well as nonsense)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union or str(origin) == "types.UnionType":
        return random_value(rng, rng.choice(args), depth)
    if getattr(hint, "__metadata__", None) is not None:
        return random_value(rng, args[0], depth)
    if hint is type(None):
        return None
    if hint is str:
        return rng.choice(POOL)
    if hint is bool:
        return rng.random() < 0.5
    if hint is int:
        return rng.choice([-2, -1, 0, 0, 1, 2, 7, 2**31])
    if hint is bytes:
        return rng.randbytes(rng.randrange(0, 40))
    if origin in (list, tuple):
        n = 0 if depth > 2 else rng.randrange(0, 3)
        return [random_value(rng, args[0] if args else str, depth + 1) for _ in range(n)]
    if origin is dict:
        return {rng.choice(POOL): rng.choice(POOL)} if rng.random() < 0.5 else {}
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return random_struct(rng, hint, depth + 1)
    return None


def random_struct(rng: random.Random, cls: type[Any], depth: int = 0) -> dict[str, Any]:
    hints = get_type_hints(cls, include_extras=True)
    return {f.encode_name: random_value(rng, hints[f.name], depth)
            for f in msgspec.structs.fields(cls) if rng.random() < 0.9}


def random_action(rng: random.Random) -> tuple[str, bytes]:
    kind = rng.random()
    if kind < 0.05:
        return rng.choice(["nope", "", "metadata\x00"]), b"{}"
    name, cls = rng.choice(sorted(REQUEST_TYPES.items()))
    if kind < 0.1:
        return name, rng.randbytes(rng.randrange(0, 30))
    return name, msgspec.json.encode(random_struct(rng, cls))


def snapshot(broker: BrokerProcess, zk: str) -> dict[str, bytes]:
    """Every file under the broker's log directory and every znode under the chroot."""
    out: dict[str, bytes] = {}
    for path in sorted(Path(broker.log_dir).rglob("*")):
        if path.is_file():
            out[f"file:{path}"] = hashlib.sha256(path.read_bytes()).digest()
    with zk_client(zk) as client:
        todo = ["/"]
        while todo:
            node = todo.pop()
            data, _ = client.get(node)
            out[f"znode:{node}"] = data or b""
            todo += [f"{node.rstrip('/')}/{child}" for child in client.get_children(node)]
    return out


def _stream_leak(conn: BrokerConnection, rng: random.Random) -> str | None:
    """A random produce, fetch or fetch session stream; what it got through, if anything."""
    import pyarrow.flight as flight

    kind = rng.random()
    if kind < 0.25:
        body = msgspec.json.encode(random_struct(rng, FetchSessionRequest))
        try:
            _, reader = conn._client.do_exchange(flight.FlightDescriptor.for_command(body),
                                                 flight.FlightCallOptions(timeout=15))
        except flight.FlightError:
            return None
        try:
            chunk = reader.read_chunk()
        except (flight.FlightError, pa.ArrowException, StopIteration):
            return None
        finally:
            with suppress(flight.FlightError, pa.ArrowException, OSError):
                reader.cancel()
        return f"fetch session {body[:120]!r} pushed {chunk.app_metadata!r}"
    if kind < 0.5:
        body = msgspec.json.encode(random_struct(rng, FetchRequest))
        try:
            table = conn._client.do_get(flight.Ticket(body), flight.FlightCallOptions(
                timeout=15)).read_all()
        except (flight.FlightError, pa.ArrowException):
            return None
        return f"fetch {body[:120]!r} read {table.num_rows} rows" if table.num_rows else None
    body = msgspec.json.encode(random_struct(rng, ProduceRequest))
    batch = pa.RecordBatch.from_pylist([{"key": None, "value": b"x", "timestamp": 0,
                                         "headers": []}], schema=DEFAULT_SCHEMA)
    try:
        writer, reader = conn._client.do_put(flight.FlightDescriptor.for_command(body),
                                             DEFAULT_SCHEMA)
        writer.write_with_metadata(batch, pa.py_buffer(b'{"partition": 0}'))
        writer.done_writing()
        ack = reader.read()
        writer.close()
    except (flight.FlightError, pa.ArrowException, OSError):
        return None
    if ack is not None and b'"error_code":0' in ack.to_pybytes():
        return f"produce {body[:120]!r} acknowledged"
    return None


def fuzz(conn: BrokerConnection, rng: random.Random, rounds: int) -> list[str]:
    """Send ``rounds`` random actions (one in ten a produce, fetch or fetch session stream);
    the ones that were not refused."""
    import pyarrow.flight as flight

    from logstore.rpc.codec import from_flight_error

    leaks = []
    conn._authenticated()
    for i in range(rounds):
        if rng.random() < 0.1:
            if (leak := _stream_leak(conn, rng)) is not None:
                leaks.append(f"{i}: {leak}")
            continue
        name, body = random_action(rng)
        try:
            results = list(conn._client.do_action(flight.Action(name, body),
                                                  flight.FlightCallOptions(timeout=15)))
        except flight.FlightError as e:
            if from_flight_error(e, name).code is ErrorCode.UNKNOWN_SERVER_ERROR:
                leaks.append(f"{i}: {name} {body[:120]!r}: {e}")
            continue
        response = msgspec.json.decode(results[0].body.to_pybytes())
        if not refused_response(name, response):
            leaks.append(f"{i}: {name} {body[:120]!r} -> {response}")
    return leaks


@pytest.mark.parametrize("user", [None, "mallory"])
def test_fuzzer_is_refused_everything_and_changes_nothing(
        cluster: tuple[SecureBrokers, BrokerProcess, str], user: str | None, seed: int) -> None:
    """Goal: an attacker without credentials, or with a user that has no ACL, gets nothing and
    changes nothing. Method: 1,000 random actions (random action names, garbage bodies,
    requests of every type filled with random values from pools of real and odd names, and
    one in ten a produce, fetch or fetch session stream of random descriptors and tickets),
    each refused with an error code (never UNKNOWN_SERVER_ERROR), answered with nothing to see;
    the log directory's files and every znode are the same afterwards, and the broker still
    answers the admin."""
    brokers, broker, zk = cluster
    before = snapshot(broker, zk)
    conn = BrokerConnection(broker.bootstrap, timeout_s=15,
                            security=client_security(brokers.client(user)))
    try:
        leaks = fuzz(conn, random.Random(seed), 1000)
    finally:
        conn.close()
    assert leaks == [], f"seed {seed}: {len(leaks)} not refused, first {leaks[:5]}"
    assert snapshot(broker, zk) == before, f"seed {seed}"
    with Admin(broker.bootstrap, **brokers.client()) as admin:
        assert TOPIC in admin.list_topics()


def test_a_session_whose_read_acl_is_deleted_ends_at_its_next_update(
        cluster: tuple[SecureBrokers, BrokerProcess, str]) -> None:
    """Goal: a fetch session is authorized at each client frame, not only at open, so deleting a
    user's READ ends its session. Method: mallory gets READ on a topic of her own and opens
    a session that pushes its record; the ACL is deleted (until a plain fetch of hers is
    refused); her next update ends the session with TOPIC_AUTHORIZATION_FAILED."""
    brokers, broker, _ = cluster
    topic = f"s-revoke-{uuid.uuid4().hex[:6]}"
    with brokers.admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
        admin.create_acls([_acl(ResourceType.TOPIC, topic, "User:mallory", Operation.READ)])
    with Producer(broker.bootstrap, **brokers.client()) as producer:
        producer.send(topic, b"r", partition=0).result(10)
    conn = BrokerConnection(broker.bootstrap, timeout_s=15,
                            security=client_security(brokers.client("mallory")))
    try:
        stream = conn.open_fetch_session(FetchSessionRequest(
            topic=topic, credit_bytes=1 << 20, partitions=[FetchPartition(partition=0,
                                                                          offset=0)]))
        assert stream.read() is not None
        with brokers.admin(broker.bootstrap) as admin:
            admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, topic)])
        wait_for(lambda: outcome(lambda: conn.fetch(FetchRequest(
            topic=topic, max_wait_ms=0, partitions=[FetchPartition(partition=0, offset=0)]
        ))) == "refused", "the deletion to take effect")
        stream.send(FetchSessionUpdate(seq=1, add=[FetchPartition(partition=1, offset=0)]))
        with pytest.raises(ApiError) as refused:
            while stream.read() is not None:
                pass
        assert refused.value.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
    finally:
        conn.close()
