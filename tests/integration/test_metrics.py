"""The broker's Prometheus endpoint, consumer lag and the clients' metrics, against a real
broker process scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from logstore import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.brokers import BrokerFactory, BrokerProcess, free_port, subprocess_env
from tests.helpers import wait_for
from tests.scrape import Scrape, http_get, scrape
from tests.tiered import create_tiered_topic, remote_settings, wait_tiered
from tests.tiered import produce as produce_segments

DAY_MS = 24 * 3600 * 1000


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    """One broker with a metrics listener, and that listener's address."""
    factory = BrokerFactory(tmp_path_factory.mktemp("metered"))
    address = f"127.0.0.1:{free_port()}"
    yield factory(metrics_listener=address, group_initial_rebalance_delay_ms=0), address
    factory.stop_all()


def produce(bootstrap: str, topic: str, counts: dict[int, int], first_ts: int) -> None:
    """``counts[p]`` records into partition p, the i-th stamped ``first_ts + i`` seconds."""
    with Producer(bootstrap, acks="all") as producer:
        for p, n in counts.items():
            producer.send_batch(topic, pa.table({
                "key": [None] * n, "value": [b"v%d" % i for i in range(n)],
                "timestamp": pa.array([first_ts + i * 1000 for i in range(n)],
                                      pa.timestamp("ms"))}), partition=p).result(30)


def consume_all(bootstrap: str, topic: str, counts: dict[int, int]) -> int:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(topic, p) for p in counts]
        consumer.assign(tps)
        read = 0
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < counts[tp.partition] for tp in tps):
            assert time.monotonic() < deadline, "not every record was read back"
            read += sum(t.num_rows for t in consumer.poll_arrow(timeout_ms=500).values())
    return read


def new_topic(bootstrap: str, partitions: int) -> str:
    name = f"m-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions)])
    return name


def test_scrape_counts_what_was_produced_and_consumed(metered: tuple[BrokerProcess, str]
                                                      ) -> None:
    """Goal: the endpoint's counters and offsets are what happened. Method: 500 records into
    partition 0 and 300 into partition 1, read back once by a consumer; one scrape, parsed by
    prometheus_client, shows 800 in and 800 out for the topic, each partition's offsets,
    nothing under-replicated, the produce requests counted without failures, and this broker
    as the controller."""
    broker, address = metered
    topic, counts = new_topic(broker.bootstrap, 2), {0: 500, 1: 300}
    produce(broker.bootstrap, topic, counts, int(time.time() * 1000))
    assert consume_all(broker.bootstrap, topic, counts) == 800
    s = wait_for(lambda: (s := scrape(address)).value(
        "kafka_server_brokertopicmetrics_messagesout_total", topic=topic) == 800 and s,
        "the fetches to be counted")
    assert s.value("kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 800
    assert s.value("kafka_server_brokertopicmetrics_bytesout_total", topic=topic) == \
        s.value("kafka_server_brokertopicmetrics_bytesin_total", topic=topic) > 0
    assert s.value("kafka_server_brokertopicmetrics_totalproducerequests_total", topic=topic) == 2
    assert s.value("kafka_server_brokertopicmetrics_failedproducerequests_total",
                   topic=topic) == 0
    for p, n in counts.items():
        for name in ("kafka_log_log_logendoffset", "kafka_log_log_highwatermark",
                     "kafka_log_log_laststableoffset"):
            assert s.value(name, topic=topic, partition=p) == n, name
        assert s.value("kafka_log_log_logstartoffset", topic=topic, partition=p) == 0
        assert s.value("kafka_log_log_numlogsegments", topic=topic, partition=p) == 1
        assert s.value("kafka_log_log_size", topic=topic, partition=p) > 0
        assert s.value("kafka_cluster_partition_underreplicated", topic=topic, partition=p) == 0
    assert s.value("kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert s.value("kafka_network_requestmetrics_requests_total", request="produce") >= 2
    # the consumer fetched over a push session: its opening is the request counted
    assert s.value("kafka_network_requestmetrics_totaltime_seconds_count",
                   request="fetch_session") >= 1
    assert s.value("kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert s.value("process_open_fds") > 0


def test_errors_are_counted_by_code_and_unknown_actions_share_one_series(
        metered: tuple[BrokerProcess, str]) -> None:
    """Goal: failed requests are counted by Kafka's error name, and a client cannot grow the
    series by inventing action names. Method: call two made-up actions over a bare Flight
    client; the scrape counts both under ``request="unknown"`` with UNSUPPORTED_VERSION and
    no series names them."""
    broker, address = metered
    key = {"request": "unknown", "error": "UNSUPPORTED_VERSION"}
    before = scrape(address).value("kafka_network_requestmetrics_errors_total", **key) or 0
    client = flight.connect(f"grpc://{broker.bootstrap}")
    try:
        for name in ("no_such_action_1", "no_such_action_2"):
            with pytest.raises(flight.FlightError):
                list(client.do_action(flight.Action(name, b"{}")))
    finally:
        client.close()
    s = scrape(address)
    assert s.value("kafka_network_requestmetrics_errors_total", **key) == before + 2
    assert not any("no_such_action" in str(labels) for _, labels in s.samples)


def test_group_lag_is_the_same_on_the_endpoint_in_admin_and_in_groups_describe(
        metered: tuple[BrokerProcess, str]) -> None:
    """Goal: lag per (group, topic, partition) in offsets and in seconds, the way
    kafka-lag-exporter computes it, and the same figures in Admin and the CLI, for a group
    that only commits (as a Spark query committing its progress does). Method: 300 records
    per partition stamped a day ago, one a second; the group commits offset 200 of partition 0
    and 300 (the end) of partition 1 with no members; the record at offset 200 is 300 s
    younger than the first, so its lag in seconds is at least a day less 200 s."""
    broker, address = metered
    topic, group = new_topic(broker.bootstrap, 2), f"g-{uuid.uuid4().hex[:8]}"
    first_ts = int(time.time() * 1000) - DAY_MS
    produce(broker.bootstrap, topic, {0: 300, 1: 300}, first_ts)
    with Admin(broker.bootstrap) as admin:
        admin.alter_group_offsets(group, {TopicPartition(topic, 0): 200,
                                          TopicPartition(topic, 1): 300})
        lags = admin.list_consumer_group_lag(group)
    floor_s = (DAY_MS - 200_000) / 1000
    p0, p1 = lags[TopicPartition(topic, 0)], lags[TopicPartition(topic, 1)]
    assert (p0.committed_offset, p0.log_end_offset, p0.lag) == (200, 300, 100)
    assert (p1.committed_offset, p1.log_end_offset, p1.lag, p1.lag_seconds) == (300, 300, 0, 0)
    assert p0.lag_seconds is not None and p0.lag_seconds >= floor_s
    s = scrape(address)
    labels = {"group": group, "topic": topic}
    assert s.value("kafka_consumergroup_group_offset", partition=0, **labels) == 200
    assert s.value("kafka_consumergroup_group_lag", partition=0, **labels) == 100
    assert s.value("kafka_consumergroup_group_lag", partition=1, **labels) == 0
    assert s.value("kafka_consumergroup_group_lag_seconds", partition=0, **labels) >= floor_s
    assert s.value("kafka_consumergroup_group_lag_seconds", partition=1, **labels) == 0
    assert s.value("kafka_partition_latest_offset", topic=topic, partition=0) == 300
    assert s.value("kafka_consumergroup_group_sum_lag", group=group) == 100
    out = cli("groups", "describe", group, "--bootstrap-server", broker.bootstrap)
    rows = {tuple(line.split("\t")[:5]): line.split("\t")[5] for line in out.splitlines()
            if line.startswith(topic)}
    assert float(rows[(topic, "0", "200", "300", "100")]) >= floor_s
    assert rows[(topic, "1", "300", "300", "0")] == "0.0"


def test_a_deleted_topics_series_disappear(metered: tuple[BrokerProcess, str]) -> None:
    """Goal: per-partition, per-topic and lag series are bounded by what exists. Method:
    produce to a topic and commit a group's offset on it, see its series, delete it, and wait
    until no series names it."""
    broker, address = metered
    topic, group = new_topic(broker.bootstrap, 1), f"g-{uuid.uuid4().hex[:8]}"
    produce(broker.bootstrap, topic, {0: 10}, int(time.time() * 1000))
    with Admin(broker.bootstrap) as admin:
        admin.alter_group_offsets(group, {TopicPartition(topic, 0): 4})
    s = scrape(address)
    assert s.value("kafka_log_log_logendoffset", topic=topic, partition=0) == 10
    assert s.value("kafka_consumergroup_group_lag", group=group, topic=topic, partition=0) == 6
    with Admin(broker.bootstrap) as admin:
        admin.delete_topics([topic])
    wait_for(lambda: not any(dict(labels).get("topic") == topic
                             for _, labels in scrape(address).samples),
             f"the series of {topic} to go")


def test_unknown_path_is_404_and_metrics_is_served_at_metrics_and_root(
        metered: tuple[BrokerProcess, str]) -> None:
    """Goal: only the metrics paths answer. Method: GET /nope, /metrics/extra, / and
    /metrics."""
    _, address = metered
    assert http_get(address, "/nope")[0] == 404
    assert http_get(address, "/metrics/extra")[0] == 404
    assert http_get(address, "/")[0] == 200
    assert "kafka_server_replicamanager_leadercount" in http_get(address, "/metrics")[1]


def test_many_concurrent_scrapes_leave_produce_and_fetch_serving(
        metered: tuple[BrokerProcess, str]) -> None:
    """Goal: scrapers cannot starve the broker. Method: 32 threads scrape back to back (50
    scrapes each, bounded) while 20,000 records are produced with acks=all and read back;
    every record is acknowledged and read, and every scrape answered 200."""
    broker, address = metered
    topic = new_topic(broker.bootstrap, 2)
    statuses: list[int] = []
    stop = threading.Event()

    def scraper() -> None:
        for _ in range(50):
            if stop.is_set():
                return
            statuses.append(http_get(address)[0])

    threads = [threading.Thread(target=scraper, daemon=True) for _ in range(32)]
    for t in threads:
        t.start()
    try:
        with Producer(broker.bootstrap, acks="all") as producer:
            futures = [producer.send(topic, value=b"%d" % i, partition=i % 2)
                       for i in range(20_000)]
            producer.flush(60)
        assert all(f.exception(0) is None for f in futures)
        assert consume_all(broker.bootstrap, topic, {0: 10_000, 1: 10_000}) == 20_000
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert statuses and set(statuses) == {200}


def test_metrics_listener_on_a_taken_port_fails_start_naming_the_key_and_port(
        tmp_path: Path) -> None:
    """Goal: a port conflict is a clear error at start, not a broker without metrics.
    Method: hold a listening socket, start a broker whose metrics_listener names its port;
    the process exits 1 before listening and says which key and port."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        broker = BrokerProcess(tmp_path, metrics_listener=f"127.0.0.1:{port}")
        with pytest.raises(RuntimeError, match="exited with 1 before listening") as failed:
            broker.start()
    message = str(failed.value)
    assert "metrics_listener" in message and str(port) in message, message
    assert "Traceback" not in message


def test_top_once_prints_brokers_topics_and_the_most_lagging_groups(
        metered: tuple[BrokerProcess, str]) -> None:
    """Goal: ``logstore top --once`` is one plain snapshot a script can read. Method: a
    topic with 40 records and a group 30 behind; the output names the broker as controller
    with its metrics address, the topic, and the group with lag 30; no escape sequences."""
    broker, address = metered
    topic, group = new_topic(broker.bootstrap, 1), f"g-{uuid.uuid4().hex[:8]}"
    produce(broker.bootstrap, topic, {0: 40}, int(time.time() * 1000))
    with Admin(broker.bootstrap) as admin:
        admin.alter_group_offsets(group, {TopicPartition(topic, 0): 10})
    out = cli("top", "--once", "--interval", "0.2", "--rows", "1000",
              "--bootstrap-server", broker.bootstrap)
    assert "\x1b" not in out
    lines = [line.split() for line in out.splitlines()]
    assert next(ln for ln in lines if ln[:1] == ["0"])[:2] == ["0", "yes"]
    assert any(ln[-1:] == [address] for ln in lines)
    assert any(ln[:1] == [topic] for ln in lines)
    assert [group, "Empty", "30"] in [ln[:3] for ln in lines]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("key", ["q", "C-c"])
def test_top_in_a_terminal_draws_the_live_view_and_quits_on_q_or_ctrl_c(
        metered: tuple[BrokerProcess, str], tmp_path: Path, key: str) -> None:
    """Goal: the interactive view works in a real terminal (as over SSH): it draws on the
    alternate screen, redraws, and exits 0 on ``q`` or Ctrl-C with the screen restored.
    Method: ``logstore top`` in a pane of a private tmux server (its own socket, no user
    config, panes kept when their process exits); wait until the pane shows the broker's
    metrics address and the quit hint twice (two refreshes), send the key; top exits 0 and
    the pane is back on the main screen (the hint is gone)."""
    broker, address = metered
    (tmp_path / "tmux.conf").write_text("set -g remain-on-exit on\n")
    tmux = ["tmux", "-L", f"logstore-top-{uuid.uuid4().hex[:8]}", "-f",
            str(tmp_path / "tmux.conf")]
    env = subprocess_env()

    def run(*args: str) -> str:
        return subprocess.run([*tmux, *args], capture_output=True, text=True, env=env,
                              check=True, timeout=30).stdout

    command = shlex.join([sys.executable, "-m", "logstore", "top", "--interval", "0.2",
                          "--bootstrap-server", broker.bootstrap])
    # bash keeps the exit status (tmux 3.3 does not always reap a pane's process); it runs
    # top in the foreground and, like any shell, goes on after a child that handled Ctrl-C.
    status_file = tmp_path / "status"
    shell = f"{command}; echo $? > {shlex.quote(str(status_file))}"
    run("new-session", "-d", "-s", "top", "-x", "160", "-y", "40",
        f"exec bash -c {shlex.quote(shell)}")
    try:
        stamps: set[str] = set()

        def redrawn() -> bool:
            screen = run("capture-pane", "-p", "-t", "top")
            if "q or Ctrl-C quits" in screen and address in screen:
                stamps.add(screen.splitlines()[0])  # "logstore top - HH:MM:SS - ..."
            return len(stamps) >= 2

        wait_for(redrawn, "logstore top to draw its view twice")
        run("send-keys", "-t", "top", key)
        status = wait_for(lambda: status_file.exists() and status_file.read_text().strip(),
                          f"logstore top to exit on {key}")
        assert status == "0"
        assert "q or Ctrl-C quits" not in run("capture-pane", "-p", "-t", "top")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, env=env, timeout=30)


def test_a_tiered_partitions_remote_bytes_and_copy_lag_are_exported(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """Goal: tiered partitions export Kafka's remote-storage figures (remote log size and
    segment count, copy lag) and a log start offset over both tiers; other partitions none.
    Method: a broker tiering to a file:// store; a tiered topic of small segments and a plain
    one; produce 12 batches and wait until every sealed segment is copied (topics describe);
    a scrape shows the same remote bytes and segments, copy lag 0, log start 0 while fewer
    segments are local, and no remote series for the plain topic."""
    address = f"127.0.0.1:{free_port()}"
    broker = broker_factory(metrics_listener=address,
                            **remote_settings(f"file://{tmp_path}/remote"))
    plain = new_topic(broker.bootstrap, 1)
    with Admin(broker.bootstrap) as admin:
        topic = create_tiered_topic(admin)
        end = produce_segments(broker.bootstrap, topic, 12)
        tiers = wait_tiered(admin, topic)
    s = scrape(address)
    tp = {"topic": topic, "partition": 0}
    assert s.value("kafka_server_brokertopicmetrics_remotelogsizebytes", **tp) == \
        tiers.remote_bytes > 0
    assert s.value("kafka_server_brokertopicmetrics_remotelogmetadatacount", **tp) == \
        tiers.remote_segments > 0
    assert s.value("kafka_server_brokertopicmetrics_remotecopylagsegments", **tp) == 0
    assert s.value("kafka_server_brokertopicmetrics_remotecopylagbytes", **tp) == 0
    assert s.value("kafka_log_log_logstartoffset", **tp) == 0
    assert s.value("kafka_log_log_logendoffset", **tp) == end
    assert s.value("kafka_server_brokertopicmetrics_remotelogsizebytes", topic=plain,
                   partition=0) is None


def test_client_metrics_report_what_was_sent_and_fetched_and_serve_them(
        metered: tuple[BrokerProcess, str]) -> None:
    """Goal: Producer.metrics() and Consumer.metrics() give kafka-python's figures, and a
    client's own endpoint serves them. Method: 1,000 records sent with a producer whose
    metrics_listener is port 0, read back by a consumer; the totals are exact, latencies and
    sizes positive, the lag 0 at the end, and a scrape of the producer's endpoint shows the
    same total under the Java client's JMX-exporter name."""
    broker, _ = metered
    topic = new_topic(broker.bootstrap, 1)
    with Producer(broker.bootstrap, acks="all", client_id="p1",
                  metrics_listener="127.0.0.1:0") as producer:
        for i in range(1000):
            producer.send(topic, value=b"%d" % i)
        producer.flush(30)
        m = producer.metrics()
        assert m["producer-metrics"]["record-send-total"] == 1000
        assert m[f"producer-topic-metrics.{topic}"]["record-send-total"] == 1000
        assert m["producer-metrics"]["record-send-rate"] > 0
        assert m["producer-metrics"]["batch-size-avg"] > 0
        assert m["producer-metrics"]["request-latency-max"] >= \
            m["producer-metrics"]["request-latency-avg"] > 0
        assert m["producer-metrics"]["record-error-total"] == 0
        s: Scrape = scrape(f"127.0.0.1:{producer.metrics_port}")
        assert s.value("kafka_producer_producer_metrics_record_send_total",
                       client_id="p1") == 1000
        assert s.value("kafka_producer_producer_topic_metrics_record_send_total",
                       client_id="p1", topic=topic) == 1000
    for session in (True, False):  # records pushed by a fetch session, then fetched
        with Consumer(broker.bootstrap, auto_offset_reset="earliest",
                      fetch_session=session) as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            read, deadline = 0, time.monotonic() + 60
            while read < 1000:
                assert time.monotonic() < deadline, f"read {read} of 1000 records"
                read += sum(t.num_rows for t in consumer.poll_arrow(timeout_ms=500).values())
            fetch = consumer.metrics()["consumer-fetch-manager-metrics"]
        assert fetch["records-consumed-total"] == 1000, session
        assert fetch["fetch-total"] >= 1 and fetch["bytes-consumed-total"] > 0, session
        assert fetch["records-lag-max"] >= 0 and fetch[f"{topic}-0.records-lag"] == 0, session
        # a push has no request, so no latency; a fetch request has one
        assert (fetch["fetch-latency-avg"] > 0) is not session, session


def cli(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "logstore", *args], capture_output=True,
                            text=True, env=subprocess_env(), timeout=60)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr}"
    return result.stdout


def test_the_lso_series_stops_at_an_open_transaction(metered: tuple[BrokerProcess, str]
                                                     ) -> None:
    """Goal: kafka_log_log_laststableoffset is the LSO, not the high watermark: it stays at
    the first offset of an open transaction and joins the high watermark once it commits.
    Method: 5 plain records, then a transaction of 3 left open; scrape; commit; scrape."""
    broker, address = metered
    topic = new_topic(broker.bootstrap, 1)
    produce(broker.bootstrap, topic, {0: 5}, int(time.time() * 1000))
    producer = Producer(broker.bootstrap, transactional_id=f"m-tx-{uuid.uuid4().hex[:8]}",
                        linger_ms=1)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, b"t%d" % i, partition=0)
        producer.flush(30)

        def offsets() -> tuple[float | None, float | None]:
            s = scrape(address)
            return (s.value("kafka_log_log_highwatermark", topic=topic, partition=0),
                    s.value("kafka_log_log_laststableoffset", topic=topic, partition=0))

        assert wait_for(lambda: offsets() == (8, 5), "HW 8 and LSO 5 while the transaction "
                        "is open")
        producer.commit_transaction()
        # the commit marker takes one offset: both end at 9
        assert wait_for(lambda: offsets() == (9, 9), "HW and LSO 9 after the commit")
    finally:
        producer.close()
