"""An ISR change names the topic incarnation its leader's replica is of (Kafka's AlterPartition
carries topic ids): the controller refuses one for a deleted topic, so a leader still holding a
deleted topic's replica cannot change the ISR of the topic created again under its name.

Goal: both incarnations start at leader epoch 0, so the leader epoch alone does not tell them
apart; ``alter_isr`` from a replica of another topic id than the topic's is INCONSISTENT_TOPIC_ID
naming both ids, changes nothing, and the change from the current incarnation (or from a leader
that sends no id, as before the field) still lands. Method: the controller (``ClusterController``)
on a real ZooKeeper metadata store, a topic deleted and created again with the same replicas and
the same first state.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from logstore.controller.cluster_controller import ClusterController
from logstore.controller.store import BrokerInfo, PartitionState, TopicRecord, new_topic_id
from logstore.controller.zookeeper import KazooMetadataStore
from logstore.errors import InconsistentTopicIdError
from logstore.messages import decode_request, encode
from logstore.messages.cluster import AlterIsrRequest

FIRST_STATE = PartitionState(leader=1, leader_epoch=0, isr=(1, 2))


@pytest.fixture
def controller(zk_connect: str) -> Iterator[tuple[ClusterController, KazooMetadataStore]]:
    stores = [KazooMetadataStore(zk_connect, b, session_timeout_ms=6000) for b in (1, 2)]
    for b, store in zip((1, 2), stores, strict=True):
        store.start()
        store.register_broker(BrokerInfo(b, "127.0.0.1", 9000 + b))
    store = stores[0]
    elected: list[int] = []
    store.elect_controller(elected.append)
    assert elected, "broker 1 is the only candidate"
    cc = ClusterController(store, 1, lambda broker, request: None)
    cc.on_elected(elected[0])
    yield cc, store
    cc.on_resigned()
    for s in stores:
        s.close()


def test_an_isr_change_from_a_deleted_topics_replica_is_refused(
        controller: tuple[ClusterController, KazooMetadataStore]) -> None:
    cc, store = controller
    old_id, new_id = new_topic_id(), new_topic_id()
    store.create_topic(TopicRecord("t", {0: (1, 2)}, topic_id=old_id), {0: FIRST_STATE})
    store.delete_topic("t")
    store.create_topic(TopicRecord("t", {0: (1, 2)}, topic_id=new_id), {0: FIRST_STATE})

    with pytest.raises(InconsistentTopicIdError, match=f"topic id {old_id}, but 't' is now "
                                                       f"topic id {new_id}"):
        cc.alter_isr(1, "t", 0, 0, (1,), old_id)
    assert store.partition_states("t")[0].isr == (1, 2)

    assert cc.alter_isr(1, "t", 0, 0, (1,), new_id).isr == (1,)
    assert cc.alter_isr(1, "t", 0, 0, (1, 2)).isr == (1, 2)  # no id: unchecked, as before


def test_the_request_carries_the_id_and_an_older_peers_decodes_as_unchecked() -> None:
    request = AlterIsrRequest(broker_id=1, topic="t", partition=0, leader_epoch=0, isr=[1],
                              topic_id="abc")
    assert decode_request(AlterIsrRequest, encode(request)).topic_id == "abc"
    # What a leader from before the field sends: the same message without the key.
    older = orjson.dumps({k: v for k, v in orjson.loads(encode(request)).items()
                          if k != "topic_id"})
    assert decode_request(AlterIsrRequest, older).topic_id is None
